"""`stallprobe watch ...` against a pool of simulated engines on loopback.

Every engine is a small HTTP server whose counters move (or not) with each scrape, so what the watch sees
depends on its polls, never on how fast the machine is. Time passes on a fake clock: the command runs in
this process with every clock it reads made one (conftest.WatchOnFakeClock), or its Watch is polled one
poll at a time on one (Polling, for the hooks), so a window or a cooldown passes without anyone waiting.
Only what a hook process does takes real time (the runner waits for it on the real clock, at most
--hook-timeout), and a test waits for it with a bounded poll. The real command runs as a process where
only it can show the wiring: the terminal view, read back through a pseudo-terminal and a minimal screen
that understands only the few sequences the watch is allowed to send; --help; a usage error; one --once.
"""

from __future__ import annotations

import codecs
import fcntl
import json
import os
import re
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import FakeClock, RawServer, WatchOnFakeClock, clean_env, refused_url, vllm_engines_page
from stallprobe.cli import main as cli_main
from stallprobe.detector import DEFAULT_WINDOW
from stallprobe.errors import ExitCode
from stallprobe.options import DEFAULT_COOLDOWN
from stallprobe.watch.command import configure, help_text
from stallprobe.watch.loop import Flights
from stallprobe.watch.poll import Row, Watch, WatchConfig
from stallprobe.watch.view import endpoint_name, once_code, table
from stubengine import StubEngine

Behave = Callable[[socket.socket, threading.Event], None]
StartRaw = Callable[[Behave], RawServer]
WAIT = 60.0  # the bound on any wait for an eventual state: far above what a loaded 2-core machine needs

# running, waiting, generation tokens added per scrape
MODES = {"idle": (0, 0, 0), "saturated": (12, 99, 7), "wedged": (21, 0, 0), "moving": (4, 0, 5), "queued": (0, 3, 0)}


def dp_page(engine: StubEngine) -> bytes:
    """Data parallelism: engine 0 wedged, engine 1 moving."""
    moving = 600 + 5 * engine.count("/metrics")
    return vllm_engines_page({"0": (3, 0, 70, 500), "1": (4, 0, 70, moving)}, model="m")


def fork_page(engine: StubEngine) -> bytes:
    """A fork that renamed every family and labels its engines by "rank". No token counter moves; rank
    0's step counter does."""
    ranks = (("0", engine.count("/metrics")), ("1", 9))
    return "".join(
        f'fork:busy{{rank="{r}"}} 2\n'
        f'fork:queue{{rank="{r}"}} 0\n'
        f'fork:prefilled_total{{rank="{r}"}} 70\n'
        f'fork:decoded_total{{rank="{r}"}} 500\n'
        f'fork:steps_total{{rank="{r}"}} {steps}\n'
        for r, steps in ranks
    ).encode()


PAGES: dict[str, Callable[[StubEngine], bytes]] = {
    "html": lambda _: b"<!doctype html><html><body>login</body></html>\n",
    "dp": dp_page,
    "fork": fork_page,
}


def become(engine: StubEngine, mode: str) -> None:
    """Put a simulated engine in a mode: one of MODES, its counters going on from where they are (a wedged
    engine's stay where they were when it wedged, as a real one's do), or a page of PAGES."""
    if mode in PAGES:
        engine.route("/metrics", lambda: PAGES[mode](engine))
        return
    running, waiting, step = MODES[mode]
    engine.set(running, waiting=waiting, generation_step=step)
    engine.route("/metrics", engine.metrics_page)


@pytest.fixture
def pool() -> Iterator[Callable[[str], StubEngine]]:
    engines: list[StubEngine] = []

    def start(mode: str) -> StubEngine:
        engines.append(StubEngine(generation=1000, prompt=400))
        become(engines[-1], mode)
        return engines[-1]

    yield start
    for engine in engines:
        engine.close()


def watch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "stallprobe", "watch", *args]


def start(
    argv: list[str], stdin: int | None = None, stdout: int = subprocess.PIPE, stderr: int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """Popen, with SIGINT deliverable in the child even when this test run was started with it ignored (a
    shell starts `pytest &` so, and children inherit it): these tests press Ctrl-C."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a handled signal is reset at exec
    try:
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, text=True, env=clean_env())
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_once(*args: str, timeout: float = WAIT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        watch_command("--once", *args), capture_output=True, text=True, env=clean_env(), timeout=timeout, check=False
    )


class Polling:
    """The watch's loop in this process, one poll at a time, on a fake clock: the command's own
    configuration and its Watch (which takes the clock), the clock moved by --interval after each poll, as
    the loop's sleep moves the real one. The hooks are real processes: `ended()` waits for the runs in
    flight to end (the runner's own wait, bounded by --hook-timeout on the real clock)."""

    def __init__(self, *args: str) -> None:
        config = configure(list(args), clean_env())
        assert isinstance(config, WatchConfig)
        self.interval = config.interval
        self.clock = FakeClock()
        self.watch = Watch(config, clean_env(), flights=Flights(self.clock))
        self.seen: list[tuple[float, Row]] = []  # every row so far, with the time of its poll

    def poll(self) -> list[Row]:
        at = self.clock()
        rows = self.watch.poll()
        self.seen += [(at, row) for row in rows]
        self.clock.sleep(self.interval)
        return rows

    def until(self, what: str, done: Callable[[], bool], most: int = 40) -> None:
        """Poll until `done()`; fail if `most` polls do not get there (on the fake clock they always
        take the same number)."""
        for _ in range(most):
            if done():
                return
            self.poll()
        pytest.fail(f"not {what} after {most} polls")

    def of(self, url: str, engine: str | None = None) -> list[tuple[float, Row]]:
        return [(at, row) for at, row in self.seen if row.url == url and row.engine == engine]

    def latest(self, url: str, engine: str | None = None) -> Row:
        return self.of(url, engine)[-1][1]

    def pid(self, url: str, kind: str = "stalled") -> int | None:
        """The pid of the endpoint's latest run of a hook (None before its first)."""
        return self.watch.runner.report((kind, url))[0]

    def ended(self) -> None:
        self.watch.runner.wait()
        assert not self.watch.runner.running()


@pytest.fixture
def polling() -> Iterator[Callable[..., Polling]]:
    started: list[Polling] = []

    def begin(*args: str) -> Polling:
        started.append(Polling(*args))
        return started[-1]

    yield begin
    for one in started:
        one.ended()
        one.watch.flights.close()


def eventually(what: str, done: Callable[[], bool]) -> None:
    """Wait for a real process to get somewhere: a bounded poll of an eventual state, not time made to pass."""
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


# The hook: appends its STALLPROBE_* environment, pid and time to a log; then behaves as the behaviour file
# (URL -> "hang" or "fail") says for its URL.
HOOK = """
import json, os, sys, time
record = {k: v for k, v in os.environ.items() if k.startswith("STALLPROBE_")}
record.update(pid=os.getpid(), t=time.monotonic())
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(record) + "\\n")
behaviour = json.loads(open(sys.argv[2]).read()).get(os.environ["STALLPROBE_URL"]) if len(sys.argv) > 2 else None
if behaviour == "hang":  # until the runner kills it (bounded: a runner that never does leaves nothing behind)
    time.sleep(120)
if behaviour == "fail":
    print("restart failed: boom")
    sys.exit(3)
"""


class Hook:
    def __init__(self, folder: Path, name: str, behaviour: dict[str, str] | None = None) -> None:
        script = folder / "hook.py"
        script.write_text(HOOK)
        self.log = folder / f"{name}.log"
        argv = [sys.executable, str(script), str(self.log)]
        if behaviour is not None:
            (folder / f"{name}.json").write_text(json.dumps(behaviour))
            argv.append(str(folder / f"{name}.json"))
        self.command = shlex.join(argv)

    def runs(self) -> list[dict[str, object]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.endswith("}")]


REQUIRED = {"url", "engine", "verdict", "running", "waiting", "prompt_tokens_per_s", "generation_tokens_per_s"}


# --- verdicts


def test_a_pool_gets_the_right_verdict_per_engine_in_json_lines(
    pool: Callable[[str], StubEngine], fake_watch: WatchOnFakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    idle, saturated, wedged, dp, html = (pool(m) for m in ("idle", "saturated", "wedged", "dp", "html"))
    dead = refused_url()
    urls = [idle.url, saturated.url, wedged.url, dp.url, html.url, dead]
    expected = {
        (idle.url, None): "idle",
        (saturated.url, None): "saturated",
        (wedged.url, None): "stalled",
        (dp.url, "0"): "stalled",
        (dp.url, "1"): "progressing",
        (html.url, None): "error",
        (dead, None): "unreachable",
    }
    # Eight polls 0.3 s apart: 2.1 s of the fake clock, past the window (1 s) since the first.
    assert fake_watch.run("--json", "--interval", "0.3", "--window", "1", *urls, polls=8) == 0
    out = capsys.readouterr()
    assert out.err == ""
    rows = [json.loads(line) for line in out.out.splitlines()]
    for row in rows:
        assert set(row) >= REQUIRED, row
    # One line per engine per poll, every endpoint in every poll: none hides another.
    polls = [rows[i : i + len(expected)] for i in range(0, len(rows), len(expected))]
    assert len(polls) == 8
    for one in polls:
        assert [(row["url"], row["engine"]) for row in one] == list(expected)
        assert len({row["time"] for row in one}) == 1
    assert {(row["url"], row["engine"]): row["verdict"] for row in polls[-1]} == expected
    # The first poll has nothing to compare with.
    assert {row["verdict"] for row in polls[0]} == {"baseline", "error", "unreachable"}

    def last(url: str, engine: str | None = None) -> dict[str, object]:
        return next(row for row in polls[-1] if (row["url"], row["engine"]) == (url, engine))

    sat = last(saturated.url)
    assert (sat["running"], sat["waiting"], sat["prompt_tokens_per_s"]) == (12, 99, 0)
    assert isinstance(sat["generation_tokens_per_s"], float)
    assert sat["generation_tokens_per_s"] > 0
    assert last(idle.url)["generation_tokens_per_s"] == 0
    stuck = last(wedged.url)
    assert (stuck["running"], stuck["generation_tokens_per_s"], stuck["exit_code"]) == (21, 0, 1)
    assert isinstance(stuck["stalled_for"], float)
    assert stuck["stalled_for"] >= 1
    assert str(stuck["message"]).startswith("stalled: 21 running, 0 waiting; no token progress for ")
    moving = last(dp.url, "1")["generation_tokens_per_s"]
    assert isinstance(moving, float)
    assert moving > 0
    gone = last(dead)
    assert (gone["running"], gone["waiting"], gone["generation_tokens_per_s"], gone["exit_code"]) == (
        None,
        None,
        None,
        3,
    )
    assert "connection refused" in str(gone["error"])
    page = last(html.url)
    assert (page["exit_code"], page["error"]) == (4, "not a metrics page: the server sent HTML")
    # held_for: how long the verdict has held, growing by the interval while it holds.
    held = [float(str(row["held_for"])) for row in rows if row["url"] == idle.url and row["verdict"] == "idle"]
    assert held == pytest.approx([0.3 * n for n in range(len(held))])
    assert len(held) == 7


ONCE = [
    (["idle", "saturated"], 0),
    (["idle", "saturated", "refused"], 3),
    (["idle", "html", "refused"], 4),
    (["wedged", "html", "refused", "saturated"], 1),
]


@pytest.mark.parametrize(("modes", "code"), ONCE, ids=["+".join(m) for m, _ in ONCE])
def test_once_exits_with_the_worst_endpoint_code(
    pool: Callable[[str], StubEngine],
    fake_watch: WatchOnFakeClock,
    capsys: pytest.CaptureFixture[str],
    modes: list[str],
    code: int,
) -> None:
    urls = [refused_url() if mode == "refused" else pool(mode).url for mode in modes]
    # A stall needs the window to fit in the one interval between the two polls.
    assert fake_watch.run("--once", "--json", "--interval", "1", "--window", "0.1", *urls) == code
    out = capsys.readouterr()
    assert out.err == ""
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert [row["url"] for row in rows] == urls  # the second poll only, one line per endpoint
    verdicts = {"refused": "unreachable", "html": "error", "wedged": "stalled"}
    assert [row["verdict"] for row in rows] == [verdicts.get(mode, mode) for mode in modes]
    assert fake_watch.clock.pauses == [1.0]  # --once: two polls, one --interval apart


def test_once_piped_writes_one_line_per_engine(
    pool: Callable[[str], StubEngine], fake_watch: WatchOnFakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    idle, dp = pool("idle"), pool("dp")
    dead = refused_url()
    assert fake_watch.run("--once", "--interval", "1", "--window", "0.1", idle.url, dp.url, dead) == ExitCode.STALLED
    out = capsys.readouterr()
    assert out.err == ""
    lines = out.out.splitlines()
    assert len(lines) == 4
    assert lines[0] == f"{idle.url}: idle: 0 running, 0 waiting; held 0.0 s"
    assert lines[1] == (
        f"{dp.url} engine 0: stalled: 3 running, 0 waiting; no token progress for 1.0 s "
        # Stalled under a window shorter than the drain window: out of routing too (the earlier of the two).
        "(window 0.1 s); held 0.0 s; not ready"
    )
    assert lines[2].startswith(f"{dp.url} engine 1: progressing: 4 running, 0 waiting; +0 prompt and +5 generation")
    assert lines[3].startswith(f"{dead}: unreachable: scrape {dead}: connection refused")


def hangs(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(WAIT)


def test_slow_endpoints_are_scraped_side_by_side(
    pool: Callable[[str], StubEngine],
    raw_server: StartRaw,
    fake_watch: WatchOnFakeClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    slow = [raw_server(hangs).url for _ in range(4)]
    idle = pool("idle")
    fake_watch.silent = len(slow)
    started = fake_watch.clock()
    code = fake_watch.run("--once", "--json", "--interval", "0.3", "--timeout", "2", *slow, idle.url)
    # No answer in time is no sample, judged as the probe judges it: suspect until the window, not a failure.
    assert code == ExitCode.OK
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["verdict"] for row in rows] == ["suspect"] * 4 + ["idle"]
    for row, url in zip(rows, slow):
        assert str(row["message"]).startswith(
            f"suspect: scrape {url}: no complete answer within 2 s; nothing answered for "
        )
    # Two polls of four endpoints that never answer: 16 s one after another, 4 s side by side.
    assert fake_watch.clock() - started == pytest.approx(4.0)


# --- the watchdog


def test_stalled_hook_runs_once_per_episode_and_never_for_saturated(
    pool: Callable[[str], StubEngine], polling: Callable[..., Polling], tmp_path: Path
) -> None:
    saturated, wedged, dp = pool("saturated"), pool("wedged"), pool("dp")
    on_stalled, on_saturated = Hook(tmp_path, "stalled"), Hook(tmp_path, "saturated")
    polls = polling(
        "--interval",
        "0.2",
        "--window",
        "0.6",
        "--cooldown",
        "3600",
        "--on-stalled",
        on_stalled.command,
        "--on-saturated",
        on_saturated.command,
        saturated.url,
        wedged.url,
        dp.url,
    )
    polls.until(
        "both stalled hooks and the saturated one started",
        lambda: None not in (polls.pid(wedged.url), polls.pid(dp.url), polls.pid(saturated.url, "saturated")),
    )
    polls.ended()
    # Five more polls of the same episodes change nothing.
    for _ in range(5):
        polls.poll()
    polls.ended()
    runs = sorted(on_stalled.runs(), key=lambda r: str(r["STALLPROBE_URL"]))
    assert [(r["STALLPROBE_URL"], r["STALLPROBE_ENGINE"], r["STALLPROBE_VERDICT"]) for r in runs] == sorted(
        [(wedged.url, "", "stalled"), (dp.url, "0", "stalled")]
    )
    assert all(str(r["STALLPROBE_MESSAGE"]).startswith("stalled: ") for r in runs)
    assert [(r["STALLPROBE_URL"], r["STALLPROBE_VERDICT"]) for r in on_saturated.runs()] == [
        (saturated.url, "saturated")
    ]
    # Each hook started in a poll that saw the engine stalled (never suspect on the way there).
    for run in runs:
        engine = str(run["STALLPROBE_ENGINE"]) or None
        started = [row for _, row in polls.of(str(run["STALLPROBE_URL"]), engine) if f"(pid {run['pid']})" in row.hook]
        assert started
        assert started[0].verdict == "stalled"
        assert any("exited 0" in row.hook for row in started)

    # A second episode inside the cooldown: the engine moves, then wedges again. The hook waits.
    become(wedged, "moving")
    polls.poll()
    assert polls.latest(wedged.url).verdict == "progressing"
    become(wedged, "wedged")
    moved = len(polls.of(wedged.url))
    polls.until("the second stall", lambda: polls.latest(wedged.url).verdict == "stalled")
    for _ in range(5):
        polls.poll()
    held = [row for _, row in polls.of(wedged.url)[moved:] if row.verdict == "stalled"]
    assert len(held) == 6
    assert all("--on-stalled held by --cooldown" in row.hook for row in held)
    assert len([r for r in on_stalled.runs() if r["STALLPROBE_URL"] == wedged.url]) == 1
    assert len(on_saturated.runs()) == 1


def test_after_the_cooldown_a_new_episode_runs_the_hook_again(
    pool: Callable[[str], StubEngine], polling: Callable[..., Polling], tmp_path: Path
) -> None:
    cooldown, interval = 2.0, 0.2
    engine = pool("wedged")
    hook = Hook(tmp_path, "stalled")
    args = ("--interval", str(interval), "--window", "0.6", "--cooldown", str(cooldown))
    polls = polling(*args, "--on-stalled", hook.command, engine.url)
    polls.until("the first run", lambda: polls.pid(engine.url) is not None)
    first_pid, (one, _) = polls.pid(engine.url), polls.of(engine.url)[-1]
    polls.ended()
    become(engine, "moving")
    polls.poll()
    assert polls.latest(engine.url).verdict == "progressing"
    become(engine, "wedged")
    polls.until("the second stall", lambda: polls.latest(engine.url).verdict == "stalled")
    # Stalled again inside the cooldown (1 s after the first run, on the fake clock): held.
    second_stall, row = polls.of(engine.url)[-1]
    assert second_stall < one + cooldown
    assert row.hook.startswith("--on-stalled held by --cooldown, ")
    assert polls.pid(engine.url) == first_pid
    # Run at the first poll once the cooldown has ended, and only then.
    polls.until("the second run", lambda: polls.pid(engine.url) != first_pid)
    two, row = polls.of(engine.url)[-1]
    assert one + cooldown <= two < one + cooldown + interval + 1e-6
    assert row.verdict == "stalled"
    assert f"(pid {polls.pid(engine.url)}) running for 0.0 s" in row.hook
    for _ in range(5):
        polls.poll()
    polls.ended()
    # Once per episode: the second episode goes on, and runs nothing more.
    assert [run["pid"] for run in hook.runs()] == [first_pid, polls.pid(engine.url)]


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_hook_that_hangs_or_fails_does_not_stop_the_watch(
    pool: Callable[[str], StubEngine], polling: Callable[..., Polling], tmp_path: Path
) -> None:
    hanging, failing = pool("wedged"), pool("wedged")
    hook = Hook(tmp_path, "stalled", {hanging.url: "hang", failing.url: "fail"})
    args = ("--interval", "0.2", "--window", "0.4", "--hook-timeout", "3")
    polls = polling(*args, "--on-stalled", hook.command, hanging.url, failing.url)
    polls.until("both runs", lambda: None not in (polls.pid(hanging.url), polls.pid(failing.url)))
    failed = ("stalled", failing.url)
    eventually("the failing hook's end", lambda: polls.watch.runner.report(failed)[1] is not None)
    polls.poll()
    assert re.fullmatch(
        r"--on-stalled \(pid \d+\) ran [\d.]+ s ago: failed with exit 3: restart failed: boom",
        polls.latest(failing.url).hook,
    )
    # The watch goes on polling while the hook hangs.
    assert re.fullmatch(r"--on-stalled \(pid \d+\) running for [\d.]+ s", polls.latest(hanging.url).hook)
    # The runner kills it after --hook-timeout, on the real clock (it waits for a process, with no clock).
    polls.ended()
    polls.poll()
    assert re.fullmatch(
        r"--on-stalled \(pid \d+\) ran [\d.]+ s ago: killed after 3 s \(--hook-timeout\)",
        polls.latest(hanging.url).hook,
    )
    (run,) = [r for r in hook.runs() if r["STALLPROBE_URL"] == hanging.url]
    pid = polls.pid(hanging.url)
    assert pid is not None
    assert run["pid"] == pid
    assert pid_gone(pid)  # killed and reaped
    for _ in range(3):
        polls.poll()
    polls.ended()
    assert len(hook.runs()) == 2


# --- the terminal


class Screen:
    """Just enough of a terminal to read back what the watch draws: text, CR, LF, and the few control
    sequences it is allowed to send. Anything else fails the test."""

    SEQUENCE = re.compile(r"\x1b\[(\??)([0-9;]*)([A-Za-z])")
    PARTIAL = re.compile(r"\x1b(\[\??[0-9;]*)?")

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.grid = [[" "] * cols for _ in range(rows)]
        self.row = self.col = 0
        self.cursor_visible = True
        self.pending = ""
        self.frame_done = False  # the last thing fed ended a frame (the erase below that closes it)

    def feed(self, text: str) -> None:
        text, self.pending = self.pending + text, ""
        i = 0
        while i < len(text):
            self.frame_done = False
            ch = text[i]
            if ch == "\x1b":
                match = self.SEQUENCE.match(text, i)
                if match is None:
                    assert self.PARTIAL.fullmatch(text, i), f"unexpected escape {text[i : i + 12]!r}"
                    self.pending = text[i:]  # cut between two reads
                    return
                self.control(match[1], match[2], match[3])
                i = match.end()
                continue
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                if self.row == self.rows - 1:
                    self.grid = [*self.grid[1:], [" "] * self.cols]
                else:
                    self.row += 1
            elif ch >= " ":
                if self.col < self.cols:
                    self.grid[self.row][self.col] = ch
                    self.col += 1
            else:
                raise AssertionError(f"unexpected control character {ch!r}")
            i += 1

    def control(self, private: str, params: str, final: str) -> None:
        if (private, params, final) in (("?", "25", "l"), ("?", "25", "h")):
            self.cursor_visible = final == "h"
        elif not private and final == "H" and params in ("", "1;1"):
            self.row = self.col = 0
        elif not private and final == "K" and params in ("", "0"):
            self.grid[self.row][self.col :] = [" "] * (self.cols - self.col)
        elif not private and final == "J" and params in ("", "0"):
            self.grid[self.row][self.col :] = [" "] * (self.cols - self.col)
            for below in range(self.row + 1, self.rows):
                self.grid[below] = [" "] * self.cols
            self.frame_done = True
        elif not private and final == "J" and params == "2":
            self.grid = [[" "] * self.cols for _ in range(self.rows)]
        else:
            raise AssertionError(f"unexpected sequence ESC[{private}{params}{final}")

    def lines(self) -> list[str]:
        return ["".join(row).rstrip() for row in self.grid]

    def text(self) -> str:
        return "\n".join(self.lines()).rstrip()


def on_terminal(
    args: list[str], ready: Callable[[Screen], bool], rows: int = 30, cols: int = 200
) -> tuple[Screen, int, Screen]:
    """Run the watch on a pseudo-terminal until the screen is `ready`, then Ctrl-C it (SIGINT).

    The screen when it was ready, the exit code, and the screen as the watch left it.
    """
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = start(watch_command(*args), stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    screen = Screen(rows, cols)
    decoder = codecs.getincrementaldecoder("utf-8")()

    def pump(until: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if until():
                return True
            if select.select([master], [], [], 0.05)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the watch is gone and the terminal with it
                    data = b""
                if not data:
                    return until()
                screen.feed(decoder.decode(data))
        return False

    try:
        # Judged only between frames, never on one half redrawn.
        if not pump(lambda: screen.frame_done and ready(screen)):
            pytest.fail(f"the screen never got there:\n{screen.text()}")
        seen = Screen(rows, cols)
        seen.grid = [row[:] for row in screen.grid]
        proc.send_signal(signal.SIGINT)
        pump(lambda: False)  # to the end of its output
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        os.close(master)
    return seen, code, screen


def test_terminal_table_redraws_one_row_per_engine_and_a_total(pool: Callable[[str], StubEngine]) -> None:
    idle, saturated, wedged = pool("idle"), pool("saturated"), pool("wedged")
    dead = refused_url()
    urls = [idle.url, saturated.url, wedged.url, dead]
    names = [endpoint_name(url) for url in urls]
    verdicts = ["idle", "saturated", "stalled", "unreachable"]

    def row_of(screen: Screen, name: str) -> list[list[str]]:
        return [line.split() for line in screen.lines() if line.startswith(name + " ")]

    def ready(screen: Screen) -> bool:
        rows = [row_of(screen, name) for name in names]
        total = row_of(screen, "total")
        shown = [row[0][2] if len(row) == 1 and len(row[0]) > 2 else None for row in rows]
        return shown == verdicts and len(total) == 1 and total[0][1:3] == ["stalled", "2/4"]

    seen, code, after = on_terminal(["--interval", "0.3", "--window", "1", "--drain-after", "0.5", *urls], ready)
    assert code == 0
    lines = seen.lines()
    assert re.fullmatch(
        r"stallprobe watch  4 endpoints  every 0\.3 s  window 1 s  \d\d:\d\d:\d\d  Ctrl-C quits", lines[0]
    )
    assert lines[1].split() == [
        "ENDPOINT",
        "ENGINE",
        "VERDICT",
        "READY",
        "HELD",
        "RUNNING",
        "WAITING",
        "PROMPT/S",
        "GEN/S",
        "NOTE",
    ]
    # Each endpoint exactly once: the table is redrawn in place, not scrolled.
    assert [line.split()[0] for line in lines[2:7]] == [*names, "total"]
    held = r"(\d+\.\d s|\d+ s|\dm\d\ds)"
    # engine, verdict, ready, held, running, waiting, prompt and generation tok/s, note
    assert re.fullmatch(rf"\S+ +- +idle +yes +{held} +0 +0 +0\.0 +0\.0", lines[2])
    busy = rf"\S+ +- +saturated +yes +{held} +12 +99 +0\.0 +[\d.]+ +busy, not stuck: do not restart"
    assert re.fullmatch(busy, lines[3])
    assert re.fullmatch(rf"\S+ +- +stalled +out +{held} +21 +0 +0\.0 +0\.0 +no token progress for [\d.]+ s", lines[4])
    assert re.fullmatch(rf"\S+ +- +unreachable +out +{held} +- +- +- +- +connection refused .*", lines[5])
    # The pool: its worst verdict, how many may take requests, the sums, and how many of each.
    assert re.fullmatch(
        r"total +stalled +2/4 +33 +99 +0\.0 +[\d.]+ +1 stalled, 1 unreachable, 1 saturated, 1 idle", lines[6]
    )
    assert all(line == "" for line in lines[7:])
    # Ctrl-C: exit 0, the cursor back, the last table left on the screen, no traceback.
    assert after.cursor_visible
    assert [line.split()[0] for line in after.lines()[2:7]] == [*names, "total"]
    assert "Traceback" not in after.text()


def test_terminal_table_fits_the_terminal() -> None:
    config = WatchConfig([f"http://10.0.0.{i}:8000/metrics" for i in range(30)], interval=1, window=2)
    rows = [Row(url, "", "idle", 0, "idle: 0 running, 0 waiting", running=0, waiting=0) for url in config.urls]
    lines = table(rows, config, width=40, height=12)
    assert len(lines) == 12 - 1  # the cursor's line stays free, so nothing scrolls
    assert lines[-2] == "... 23 more rows: enlarge the terminal"
    assert lines[-1].split()[:2] == ["total", "idle"]
    assert all(len(line) < 40 for line in lines)
    assert lines[2].split()[:3] == ["10.0.0.0:8000", "-", "idle"]


# --- the probe's engine and metric flags


FORK = ["--engine", "vllm", "--running-metric", "fork:busy", "--waiting-metric", "fork:queue"]
FORK += ["--prompt-metric", "fork:prefilled_total", "--generation-metric", "fork:decoded_total"]
# (mode, flags, the second poll's rows as (engine, verdict))
ENGINE_FLAGS: list[tuple[str, list[str], list[tuple[str | None, str]]]] = [
    ("fork", [], [(None, "error")]),
    ("fork", FORK, [(None, "stalled")]),
    ("fork", [*FORK, "--engine-label", "rank"], [("0", "stalled"), ("1", "stalled")]),
    (
        "fork",
        [*FORK, "--engine-label", "rank", "--progress-metric", "fork:steps_total"],
        [("0", "progressing"), ("1", "stalled")],
    ),
    ("dp", ["--engine-label", "none"], [(None, "progressing")]),
    ("queued", [], [(None, "idle")]),
    ("queued", ["--include-waiting"], [(None, "stalled")]),
    ("saturated", [], [(None, "saturated")]),
    ("saturated", ["--saturation", "100"], [(None, "progressing")]),
    ("wedged", ["--engine", "sglang"], [(None, "error")]),
]


@pytest.mark.parametrize(
    ("mode", "flags", "expected"), ENGINE_FLAGS, ids=[f"{m} {' '.join(f)}" for m, f, _ in ENGINE_FLAGS]
)
def test_watch_reads_a_page_as_the_probe_flags_say(
    pool: Callable[[str], StubEngine], mode: str, flags: list[str], expected: list[tuple[str | None, str]]
) -> None:
    engine = pool(mode)
    config = configure([engine.url, "--window", "0.000001", *flags], clean_env())
    assert isinstance(config, WatchConfig)
    watch = Watch(config, clean_env())
    watch.poll()
    rows = watch.poll()
    assert [(row.engine, row.verdict) for row in rows] == expected, [row.message for row in rows]


def test_a_renamed_engine_through_the_real_command(pool: Callable[[str], StubEngine]) -> None:
    fork = pool("fork")
    flags = [*FORK, "--engine-label", "rank", "--progress-metric", "fork:steps_total"]
    result = run_once("--json", "--interval", "0.2", "--window", "0.1", *flags, fork.url)
    assert (result.returncode, result.stderr) == (ExitCode.STALLED, "")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(row["engine"], row["verdict"], row["dialect"]) for row in rows] == [
        ("0", "progressing", "vllm"),
        ("1", "stalled", "vllm"),
    ]
    assert str(rows[1]["message"]).startswith("stalled: 2 running, 0 waiting; no token progress for ")


def test_watch_reads_no_environment_variables() -> None:
    """A hook inherits STALLPROBE_URL (and maybe more): a watch it starts must not be reconfigured by it."""
    env = {**clean_env(), "STALLPROBE_WINDOW": "0", "STALLPROBE_JSON": "1", "STALLPROBE_ENGINE": "tgi"}
    env.update(STALLPROBE_URL="ftp://elsewhere/metrics", STALLPROBE_RUNNING_METRIC="x:y")
    config = configure(["http://h/metrics"], env)
    assert isinstance(config, WatchConfig)
    assert (config.urls, config.window, config.json, config.engine, config.names) == (
        ("http://h/metrics",),
        DEFAULT_WINDOW,
        False,
        "auto",
        {},
    )


# --- flags


def test_once_code_is_stalled_first_then_the_highest() -> None:
    def rows(*codes: int) -> list[Row]:
        return [Row("http://h/metrics", "", "x", code, "") for code in codes]

    assert [once_code(rows(*codes)) for codes in [(0, 0), (0, 3), (4, 3, 0), (4, 1, 3), (1,)]] == [0, 3, 4, 1, 1]


def test_endpoint_names_drop_the_scheme_and_the_usual_path() -> None:
    assert endpoint_name("http://vllm-a:8000/metrics") == "vllm-a:8000"
    assert endpoint_name("http://vllm-a:8000/v2/metrics") == "vllm-a:8000/v2/metrics"
    assert endpoint_name("http://[::1]:8000/metrics") == "[::1]:8000"


USAGE: list[tuple[list[str], str]] = [
    ([], "at least one URL is required"),
    (["ftp://x/metrics"], "URL must be an http:// URL (got 'ftp://x/metrics')"),
    (["http://:80/metrics"], "URL has no host (got 'http://:80/metrics')"),
    (["http://h/metrics", "http://h/metrics"], "URL 'http://h/metrics' given 2 times"),
    (["http://h/metrics", "--interval", "0"], "--interval must be a number > 0 (got '0')"),
    (["http://h/metrics", "--interval=soon"], "--interval must be a number > 0 (got 'soon')"),
    (["http://h/metrics", "--window", "-1"], "--window must be a number > 0 (got '-1')"),
    (["http://h/metrics", "--timeout", "inf"], "--timeout must be a number > 0 (got 'inf')"),
    (["http://h/metrics", "--saturation", "0"], "--saturation must be a number > 0 (got '0')"),
    (["http://h/metrics", "--cooldown", "-5"], "--cooldown must be a number >= 0 (got '-5')"),
    (["http://h/metrics", "--cooldown", "nan"], "--cooldown must be a number >= 0 (got 'nan')"),
    (["http://h/metrics", "--hook-timeout", "0"], "--hook-timeout must be a number > 0 (got '0')"),
    (
        ["http://h/metrics", "--engine", "tgi"],
        "--engine must be one of auto, vllm, sglang, llamacpp, lmdeploy, trtllm (got 'tgi')",
    ),
    (["http://h/metrics", "--interval", "1", "--interval", "2"], "--interval given 2 times"),
    (["http://h/metrics", "--on-stalled", "restart 'vllm"], "--on-stalled cannot be split into words: No closing"),
    (["http://h/metrics", "--on-stalled", " "], "--on-stalled must name a command (got ' ')"),
    (
        ["http://h/metrics", "--on-saturated", "no-such-pager-x7 --now"],
        "--on-saturated: no executable 'no-such-pager-x7' on PATH (got 'no-such-pager-x7 --now')",
    ),
    (["http://h/metrics", "--bogus"], "unknown option '--bogus'"),
    (["http://h/metrics", "--interval"], "--interval needs a value"),
]


@pytest.mark.parametrize(("argv", "message"), USAGE, ids=[" ".join(u[0]) or "none" for u in USAGE])
def test_usage_errors_name_the_flag_and_value(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert cli_main(["watch", *argv], clean_env()) == ExitCode.USAGE
    out = capsys.readouterr().out
    assert out.startswith("error: " + message)
    assert out.count("\n") == 1


def test_usage_error_through_the_real_command() -> None:
    result = run_once("http://h/metrics", "--json", "--window", "0")
    assert (result.returncode, result.stderr) == (ExitCode.USAGE, "")
    assert json.loads(result.stdout) == {
        "verdict": "error",
        "error": "--window must be a number > 0 (got '0')",
        "exit_code": 2,
    }


def test_help_names_every_flag_and_the_drain_advice() -> None:
    result = subprocess.run(watch_command("--help"), capture_output=True, text=True, env=clean_env(), check=False)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == help_text() + "\n"
    flags = ["--interval", "--window", "--timeout", "--engine", "--saturation", "--include-waiting", "--once"]
    flags += ["--json", "--every", "--on-stalled", "--on-saturated", "--cooldown", "--hook-timeout", "--help"]
    for flag in flags:
        assert flag in result.stdout
    text = " ".join(result.stdout.split())
    assert "Drain the load balancer before restarting one member of a pool" in text
    assert "STALLPROBE_URL, STALLPROBE_ENGINE (empty when the page has one engine), STALLPROBE_VERDICT" in text
    assert f"(default {DEFAULT_COOLDOWN:g})" in text


def test_an_endpoint_silent_for_the_window_is_stalled(
    raw_server: StartRaw, fake_watch: WatchOnFakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two polls one interval apart, no answer to either: silent for longer than the window."""
    slow = raw_server(hangs).url
    fake_watch.silent = 1
    code = fake_watch.run("--once", "--json", "--interval", "0.3", "--window", "0.2", "--timeout", "0.5", slow)
    out = capsys.readouterr().out
    assert code == ExitCode.STALLED, out
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert (row["verdict"], row["exit_code"]) == ("stalled", ExitCode.STALLED)
    assert str(row["message"]).startswith(f"stalled: scrape {slow}: no complete answer within 0.5 s; nothing answered")


def test_a_paused_engine_is_shown_paused(
    pool: Callable[[str], StubEngine], fake_watch: WatchOnFakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    asleep = pool("idle")
    asleep.set(4, 100, 50)
    asleep.sleep()
    code = fake_watch.run("--once", "--json", "--interval", "0.3", "--window", "0.1", asleep.url)
    out = capsys.readouterr().out
    assert code == ExitCode.OK, out
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["verdict"] == "paused"
    assert str(row["message"]).startswith("paused: 4 running, 0 waiting; asleep (sleep mode), paused for ")
