"""A real load balancer in front of stub engines: HAProxy runs each configuration of deploy/haproxy as it
is (its example addresses replaced by the test's engines), while a client sends completions through it
without pause, each numbered:

- stallprobe-pool.cfg: each server's health check asks `stallprobe watch --listen` about its own engine;
- stallprobe-agent.cfg: each server's health check asks its engine's /health, and its agent check asks
  `stallprobe watch --agent`, which drains it or puts it back, and which may go away without a server
  leaving the pool.

Each engine counts what it received; when HAProxy took a server out or put it back is read from its
admin socket, polled every 0.1 s. Every wait reads the clock against a deadline: the bounds on "within"
are generous (a loaded 2-core machine), the ones on "never" strict (a numbered request sent after
HAProxy showed a server out must never reach that engine).
"""

from __future__ import annotations

import csv
import http.client
import itertools
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import IO

import pytest

from conftest import REPO
from stallprobe.watch.agent import agent_line
from stallprobe.watch.serve import Readiness
from stallprobe.watch.view import endpoint_name
from stubengine import Route, StubEngine

CONFIG = REPO / "deploy" / "haproxy" / "stallprobe-pool.cfg"
AGENT_CONFIG = REPO / "deploy" / "haproxy" / "stallprobe-agent.cfg"
EXAMPLES = ["10.0.0.11:8000", "10.0.0.12:8000"]  # the example engines' addresses in both files
INTERVAL = 0.5  # watch --interval
DRAIN_AFTER = 3.0  # watch --drain-after
# watch --window: far beyond the drain (DRAIN_AFTER + INTERVAL + the check's interval + SLACK), so the
# test can tell the drain from the restart; the restart hook is waited for, so no larger than that.
WINDOW = 20.0
# What a loaded 2-core machine may add to a "within": a late poll, a late check, a late look at the socket.
SLACK = 5.0
WAIT = 60.0  # the bound on any wait for an eventual state
SEQ = "X-Request-Seq"  # the client's number for each request


def haproxy() -> str:
    """The binary; the tests that run it are marked needs("haproxy"), so it is on PATH."""
    found = shutil.which("haproxy")
    assert found is not None
    return found


def check_timing(config: Path, *words: str) -> list[float]:
    """What the configuration sets for every server (default-server), word by word: an interval in
    seconds (`inter 1s`), or a count (`fall 1`)."""
    line = next(line for line in config.read_text().splitlines() if line.strip().startswith("default-server"))
    found = [re.search(rf"(?<![\w-]){word} (\d+)s?\b", line) for word in words]
    assert all(found), (words, line)
    return [float(match[1]) for match in found if match]


INTER, FALL, RISE = check_timing(CONFIG, "inter", "fall", "rise")
OUT_WITHIN = DRAIN_AFTER + INTERVAL + FALL * INTER + SLACK  # wedged, to out of rotation
BACK_WITHIN = INTERVAL + RISE * INTER + SLACK  # moving again, to back in
# The agent's configuration: the engines' own checks, and the agent's interval.
OWN_INTER, OWN_FALL, AGENT_INTER = check_timing(AGENT_CONFIG, "inter", "fall", "agent-inter")
DRAINED_WITHIN = DRAIN_AFTER + INTERVAL + AGENT_INTER + SLACK  # wedged, to drained by the agent
AGENT_BACK_WITHIN = INTERVAL + AGENT_INTER + SLACK  # moving again (or paused), to put back (or drained)


def until(what: str, done: Callable[[], bool], timeout: float = WAIT, log: Callable[[], str] = str) -> float:
    """Poll `done` until it holds; the monotonic time it was seen to. Fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:g} s\n{log()}")
        time.sleep(0.05)  # a bounded poll of an eventual state, not time made to pass
    return time.monotonic()


class Client:
    """Threads sending completions through the load balancer without pause, each numbered in a header.
    A request that gets no answer within a second is given up (a wedged engine never answers)."""

    def __init__(self, port: int, workers: int = 3) -> None:
        self.port = port
        self.numbers = itertools.count(1)
        self.lock = threading.Lock()
        self.last = 0  # the highest number handed out
        self.answers: dict[int, int] = {}  # number -> HTTP status (0: no answer)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._send, daemon=True) for _ in range(workers)]
        for thread in self.threads:
            thread.start()

    def mark(self) -> int:
        """The highest number handed out so far: every request numbered above it is sent after now."""
        with self.lock:
            return self.last

    def _send(self) -> None:
        body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 1}).encode()
        while not self.stop.is_set():
            with self.lock:
                number = self.last = next(self.numbers)
            status = 0
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1.0)
            try:
                headers = {"Content-Type": "application/json", SEQ: str(number)}
                connection.request("POST", "/v1/completions", body=body, headers=headers)
                answer = connection.getresponse()
                answer.read()
                status = answer.status
            except (OSError, http.client.HTTPException):
                pass
            finally:
                connection.close()
            with self.lock:
                self.answers[number] = status
            self.stop.wait(0.02)  # a steady stream that leaves the two cores to the pool

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)


def numbers(engine: StubEngine) -> list[int]:
    """The numbers of the client's completions that reached this engine."""
    return [int(seen.header(SEQ)) for seen in engine.received("/v1/completions") if seen.header(SEQ)]


def reached(engine: StubEngine, above: int) -> bool:
    """Whether a completion numbered above `above` reached the engine."""
    return max(numbers(engine), default=0) > above


class Pool:
    """Stub engines, `stallprobe watch` over them (--listen for stallprobe-pool.cfg, --agent for
    stallprobe-agent.cfg), HAProxy in front (that configuration, its servers named by the engines'
    host:port as it asks), and a client. Everything it starts is registered before it can fail, so
    close() stops all of it."""

    def __init__(self, folder: Path, config: Path = CONFIG) -> None:
        self.folder = folder
        self.config = config
        self.agent = config == AGENT_CONFIG
        self.engines: dict[str, StubEngine] = {}
        self.name: dict[str, str] = {}  # role -> server name
        self.history: dict[str, list[tuple[float, str, int]]] = {}  # server -> (seen at, status, mark)
        self.stats: dict[str, dict[str, str]] = {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.watcher: subprocess.Popen[bytes] | None = None
        self.client: Client | None = None
        self.looking = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socket = folder / "admin.sock"
        self.watch_log, self.haproxy_log = folder / "watch.log", folder / "haproxy.log"
        self.watch = ""  # where the watch serves: http://host:port (--listen), or host:port (--agent)

    def add(self, role: str, engine: StubEngine) -> StubEngine:
        self.engines[role] = engine
        self.name[role] = endpoint_name(engine.url)
        return engine

    def start(self, hook: Hook | None) -> Client:
        """The watch, then HAProxy once the watch calls every engine ready, then the client once every
        engine has answered one of its requests."""
        self.start_watch(hook)
        self.start_lb()
        self.client = Client(self.port)
        for role, engine in self.engines.items():
            until(f"a request at {role}", partial(reached, engine, 0), log=self.logs)
        return self.client

    def start_lb(self) -> None:
        """HAProxy with the configuration, asking the watch (or what serves on its address); returns once
        every server is up."""
        config = self.folder / "pool.cfg"
        config.write_text(with_servers(self.config.read_text(), list(self.name.values())))
        env = {**os.environ, "LB_BIND": f"fd@{self.listener.fileno()}", "LB_SOCKET": str(self.socket)}
        host, port = self.watch.removeprefix("http://").split(":")
        env.update(WATCH_HOST=host, **{"WATCH_AGENT_PORT" if self.agent else "WATCH_PORT": port})
        lb = self._start(
            [haproxy(), "-db", "-f", str(config)], self.haproxy_log, env=env, fds=(self.listener.fileno(),)
        )
        until("HAProxy's admin socket", lambda: self.socket.exists() or lb.poll() is not None, log=self.logs)
        if lb.poll() is not None:
            pytest.fail(f"HAProxy exited ({lb.returncode}) at its start\n{self.logs()}")
        threading.Thread(target=self._look, daemon=True).start()
        until("every server up", lambda: all(self.status(role) == "UP" for role in self.engines), log=self.logs)

    def start_watch(self, hook: Hook | None = None) -> float:
        """The watch (on the port it had, when it is started again), returned from once it calls every
        engine ready; the time just before it was started."""
        where = "127.0.0.1:" + (self.watch.rsplit(":", 1)[1] if self.watch else "0")
        command = [sys.executable, "-m", "stallprobe", "watch", "--agent" if self.agent else "--listen", where]
        command += ["--interval", str(INTERVAL), "--drain-after", str(DRAIN_AFTER), "--window", str(WINDOW)]
        command += ["--timeout", "1", *(["--on-stalled", hook.command] if hook else [])]
        command += [engine.url for engine in self.engines.values()]
        before = time.monotonic()
        watch = self.watcher = self._start(command, self.watch_log, subprocess.PIPE)
        assert watch.stderr is not None
        # Its first line says where it serves (bounded: a watch that says nothing fails the test).
        if not select.select([watch.stderr], [], [], WAIT)[0]:
            pytest.fail(f"watch said nothing within {WAIT:g} s")
        line = watch.stderr.readline().decode()
        # Read on, so that the pipe never fills; what comes goes into the log.
        threading.Thread(target=self._drain, args=(watch.stderr,), daemon=True).start()
        said = "answering HAProxy's agent checks on " if self.agent else "serving http://"
        if not line.startswith(f"stallprobe watch: {said}127.0.0.1:"):
            watch.wait(WAIT)
            pytest.fail(f"watch did not start: {line}{self.logs()}")
        self.watch = line.split()[-1] if self.agent else line.split()[3].removesuffix("/metrics")
        for role, engine in self.engines.items():
            until(f"a first ready from the watch for {role}", partial(self.ready, engine), log=self.logs)
        return before

    def kill_watch(self) -> None:
        """SIGKILL: as the OOM killer ends it, with no word to anyone."""
        assert self.watcher is not None
        self.watcher.kill()
        self.watcher.wait(WAIT)

    def _start(
        self,
        command: list[str],
        log: Path,
        stderr: int | None = None,
        env: dict[str, str] | None = None,
        fds: tuple[int, ...] = (),
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=stderr or subprocess.STDOUT, env=env, pass_fds=fds, start_new_session=True
            )
        self.processes.append(process)
        return process

    def _drain(self, stream: IO[bytes]) -> None:
        with self.watch_log.open("ab") as log:
            for line in iter(stream.readline, b""):
                log.write(line)

    def ready(self, engine: StubEngine) -> bool:
        """Whether the watch calls the engine ready, as the load balancer asks it: /ready answers 200, or
        the agent `ready`."""
        if self.agent:
            return self.agent_says(self.name_of(engine)).startswith("ready up #ready: ")
        url = f"{self.watch}/ready?url={engine.url}"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return int(answer.status) == 200
        except OSError:  # HTTPError (404 before the first poll, 503) included
            return False

    def name_of(self, engine: StubEngine) -> str:
        return next(self.name[role] for role, mine in self.engines.items() if mine is engine)

    def agent_says(self, name: str) -> str:
        """What the agent answers a server that sends `name` (as agent-send does): its line ("" if none)."""
        host, port = self.watch.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=5) as agent:
                agent.sendall(f"{name}\n".encode())
                return agent.makefile("rb").readline().decode()
        except OSError:
            return ""

    def admin(self, command: str) -> str:
        """One command on HAProxy's admin socket; its answer."""
        with socket.socket(socket.AF_UNIX) as admin:
            admin.settimeout(5)
            admin.connect(str(self.socket))
            admin.sendall(f"{command}\n".encode())
            data = b""
            while chunk := admin.recv(65536):
                data += chunk
        return data.decode()

    def show_stat(self) -> dict[str, dict[str, str]]:
        """HAProxy's own view of each server of the pool (the admin socket's `show stat`)."""
        rows = csv.DictReader(self.admin("show stat").removeprefix("# ").splitlines())
        return {row["svname"]: row for row in rows if row["pxname"] == "engines" and row["svname"] != "BACKEND"}

    def _look(self) -> None:
        """Every 0.1 s: each server's status, kept when it changes, with the client's mark read right
        after the answer (every request numbered above it was sent when HAProxy already said so)."""
        while not self.looking.wait(0.1):
            try:
                stats = self.show_stat()
            except OSError:
                continue
            mark = self.client.mark() if self.client else 0
            seen = time.monotonic()
            self.stats = stats
            for name, row in stats.items():
                history = self.history.setdefault(name, [])
                if not history or history[-1][1] != row["status"]:
                    history.append((seen, row["status"], mark))

    def status(self, role: str) -> str:
        return self.stats.get(self.name[role], {}).get("status", "")

    def statuses(self, role: str, before: float = float("inf"), since: float = 0.0) -> list[str]:
        """The server's statuses as seen, in order (each change kept), from `since` up to `before`."""
        return [status for seen, status, _ in self.history.get(self.name[role], []) if since <= seen < before]

    def went(self, role: str, status: str, since: float) -> tuple[float, int] | None:
        """When the server was first seen in `status` (UP, DOWN or DRAIN: a prefix) after `since`, and the
        mark."""
        for seen, now, mark in self.history.get(self.name[role], []):
            if seen >= since and now.startswith(status):
                return seen, mark
        return None

    def wait_for(self, role: str, status: str, since: float) -> tuple[float, int]:
        until(f"{role} {status}", lambda: self.went(role, status, since) is not None, log=self.logs)
        went = self.went(role, status, since)
        assert went is not None
        return went

    def logs(self) -> str:
        history = {name: [(round(t, 1), s) for t, s, _ in h] for name, h in self.history.items()}
        logs = (path for path in (self.watch_log, self.haproxy_log) if path.exists())
        tail = {path.name: path.read_text(errors="replace")[-3000:] for path in logs}
        return f"servers: {self.name}\nstatuses: {history}\n" + "".join(f"--- {n}\n{t}" for n, t in tail.items())

    def close(self) -> None:
        if self.client:
            self.client.close()
        self.looking.set()
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self.listener.close()
        for engine in self.engines.values():
            engine.close()


def with_servers(config: str, names: list[str]) -> str:
    """The configuration with its example `server` lines replaced by one line per engine: the first
    example's line, its address replaced by the engine's (nothing else changes)."""
    lines = config.splitlines()
    servers = [i for i, line in enumerate(lines) if line.startswith("    server ")]
    assert [lines[i] for i in servers] == [lines[servers[0]].replace(EXAMPLES[0], one) for one in EXAMPLES]
    assert servers == list(range(servers[0], servers[0] + len(EXAMPLES)))
    ours = [lines[servers[0]].replace(EXAMPLES[0], name) for name in names]
    return "\n".join([*lines[: servers[0]], *ours, *lines[servers[-1] + 1 :]]) + "\n"


HOOK = """
import os, sys, time
with open(sys.argv[1], "a") as runs:
    runs.write(f"{os.environ['STALLPROBE_URL']} {time.monotonic()}\\n")
"""


class Hook:
    """--on-stalled: appends the engine's URL and the monotonic time (one clock for every process)."""

    def __init__(self, folder: Path) -> None:
        script = folder / "restart.py"
        script.write_text(HOOK)
        self.path = folder / "restarts"
        self.command = shlex.join([sys.executable, str(script), str(self.path)])

    def runs(self) -> list[tuple[str, float]]:
        text = self.path.read_text() if self.path.exists() else ""
        return [(url, float(t)) for url, t in (line.split() for line in text.splitlines())]


@pytest.fixture
def lb(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path)
    try:
        yield pool
    finally:
        pool.close()


def comes_back(lb: Pool, client: Client, victim: StubEngine, within: float, out_mark: int) -> tuple[float, int]:
    """Unwedge the victim: HAProxy puts it back within `within` seconds and a request reaches it, and no
    request sent after `out_mark` (HAProxy showed it out) reached it before it moved again. When it was
    unwedged, and the client's mark then."""
    unwedged, unwedged_mark = time.monotonic(), client.mark()
    victim.unwedge()
    back, back_mark = lb.wait_for("victim", "UP", unwedged)
    assert back - unwedged <= within, f"back after {back - unwedged:.2f} s\n{lb.logs()}"
    until("a request at the engine put back", partial(reached, victim, back_mark), log=lb.logs)
    assert [n for n in numbers(victim) if out_mark < n <= unwedged_mark] == [], lb.logs()
    return unwedged, unwedged_mark


def three_engines(lb: Pool) -> tuple[StubEngine, StubEngine, StubEngine]:
    """The pool both HAProxy timelines start from: a steady llama.cpp, a saturated SGLang (a deep queue,
    decoding slowly, answering slowly) and the vLLM that will wedge, each moving."""
    steady = lb.add("steady", StubEngine("llamacpp", running=2))
    steady.set(generation_step=5)
    saturated = lb.add("saturated", StubEngine("sglang", running=12, waiting=99))
    saturated.set(generation_step=1)  # a deep queue, decoding slowly
    saturated.routes["/v1/completions"] = Route(saturated.completion, delay=0.2)
    victim = lb.add("victim", StubEngine(running=4))
    victim.set(generation_step=5, kv_cache=0.4)
    return steady, saturated, victim


@pytest.mark.needs("haproxy")
def test_a_wedged_engine_is_drained_long_before_it_is_restarted_and_a_saturated_one_stays_in(
    lb: Pool, tmp_path: Path
) -> None:
    steady, saturated, victim = three_engines(lb)
    hook = Hook(tmp_path)
    client = lb.start(hook)

    wedged = time.monotonic()
    victim.wedge()  # busy, its counters frozen, its completions never answered
    out, out_mark = lb.wait_for("victim", "DOWN", wedged)
    assert out - wedged <= OUT_WITHIN, f"out after {out - wedged:.2f} s\n{lb.logs()}"
    assert victim.moved_at is not None
    assert out >= victim.moved_at + DRAIN_AFTER  # ready until busy without progress for --drain-after

    until("the restart hook", lambda: bool(hook.runs()), timeout=WINDOW + WAIT, log=lb.logs)
    ((url, restarted),) = hook.runs()
    assert url == victim.url
    assert restarted >= victim.moved_at + WINDOW  # only at the window
    assert restarted > out, f"restarted {restarted - wedged:.2f} s, out {out - wedged:.2f} s after the wedge"

    # Restarted, it moves again, and comes back; never did a request sent after HAProxy showed the victim
    # out reach it before it moved again.
    unwedged, unwedged_mark = comes_back(lb, client, victim, BACK_WITHIN, out_mark)
    assert lb.statuses("victim", before=unwedged) == ["UP", "DOWN"], lb.logs()
    # Each check asked about its own engine: the others stayed in and served all along, the saturated
    # one included (HAProxy's own count of its servers' downs says so too).
    stats = lb.show_stat()
    for role, engine in (("steady", steady), ("saturated", saturated)):
        assert lb.statuses(role) == ["UP"], lb.logs()
        assert stats[lb.name[role]]["chkdown"] == "0"
        assert any(out_mark < n <= unwedged_mark for n in numbers(engine)), role
    assert stats[lb.name["victim"]]["chkdown"] == "1"
    # Nor did the pool answer any of them with an error: 200, or (a loaded machine) not within a second.
    drained = {n: status for n, status in client.answers.items() if out_mark < n <= unwedged_mark}
    assert set(drained.values()) <= {200, 0}, drained
    assert 200 in drained.values()


@pytest.mark.needs("haproxy")
def test_paused_asleep_and_queued_behind_nothing_leave_the_rotation_until_they_move(lb: Pool, tmp_path: Path) -> None:
    steady = lb.add("steady", StubEngine(running=2))
    paused = lb.add("paused", StubEngine(running=3))
    asleep = lb.add("asleep", StubEngine(running=3))
    queued = lb.add("queued", StubEngine(running=3))
    for engine in (steady, paused, asleep, queued):
        engine.set(generation_step=5, waiting_by_reason={"capacity": 0, "deferred": 0})
    hook = Hook(tmp_path)
    client = lb.start(hook)

    stopped = time.monotonic()
    paused.pause()  # /is_paused says so; its counters freeze with requests running
    asleep.sleep()  # its page says so: engine_sleep_state{sleep_state="awake"} 0
    # The wedge users report most: nothing running, 3 waiting for capacity, every counter frozen.
    queued.set(0, waiting=3, waiting_by_reason={"capacity": 3, "deferred": 0})
    queued.wedge()
    outs = {role: lb.wait_for(role, "DOWN", stopped) for role in ("paused", "asleep", "queued")}
    for role, (out, _) in outs.items():
        assert out - stopped <= OUT_WITHIN, f"{role} out after {out - stopped:.2f} s\n{lb.logs()}"
    assert queued.moved_at is not None
    assert outs["queued"][0] >= queued.moved_at + DRAIN_AFTER  # a wedge, so only after --drain-after

    resumed, resumed_mark = time.monotonic(), client.mark()
    paused.resume()
    asleep.wake()
    queued.set(3, waiting=0, waiting_by_reason={"capacity": 0, "deferred": 0})
    queued.unwedge()
    for role, engine in (("paused", paused), ("asleep", asleep), ("queued", queued)):
        back, back_mark = lb.wait_for(role, "UP", resumed)
        assert back - resumed <= BACK_WITHIN, f"{role} back after {back - resumed:.2f} s\n{lb.logs()}"
        until(f"a request at {role} come back", partial(reached, engine, back_mark), log=lb.logs)
        assert [n for n in numbers(engine) if outs[role][1] < n <= resumed_mark] == [], lb.logs()
    stats = lb.show_stat()
    assert [stats[lb.name[role]]["chkdown"] for role in lb.engines] == ["0", "1", "1", "1"]
    assert lb.statuses("steady") == ["UP"], lb.logs()
    assert hook.runs() == []  # drained, and never restarted: the window is far off


@pytest.mark.needs("haproxy")
def test_the_configuration_is_valid_as_it_is() -> None:
    result = subprocess.run([haproxy(), "-c", "-f", str(CONFIG)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def agent_lb(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path, AGENT_CONFIG)
    try:
        yield pool
    finally:
        pool.close()


def health_checks(engine: StubEngine, since: float) -> int:
    """HAProxy's checks of the engine's own /health since `since` (the watch asks /health too, but it is
    dead whenever this is counted)."""
    return sum(seen.t >= since for seen in engine.received("/health"))


@pytest.mark.needs("haproxy")
def test_the_agent_drains_and_puts_back_and_a_dead_watch_takes_no_server_out(agent_lb: Pool) -> None:
    lb = agent_lb
    steady, saturated, victim = three_engines(lb)
    paused = lb.add("paused", StubEngine(running=3))
    paused.set(generation_step=5)
    client = lb.start(None)
    begun = time.monotonic()

    # Wedged, and paused: drained (no new requests), after --drain-after for the wedge, at once for the pause.
    stopped = time.monotonic()
    victim.wedge()
    paused.pause()
    out, out_mark = lb.wait_for("victim", "DRAIN", stopped)
    assert out - stopped <= DRAINED_WITHIN, f"drained after {out - stopped:.2f} s\n{lb.logs()}"
    assert victim.moved_at is not None
    assert out >= victim.moved_at + DRAIN_AFTER  # ready until busy without progress for --drain-after
    paused_out, paused_mark = lb.wait_for("paused", "DRAIN", stopped)
    assert paused_out - stopped <= AGENT_BACK_WITHIN, f"drained after {paused_out - stopped:.2f} s\n{lb.logs()}"
    # HAProxy shows why (`show stat`'s last_agt): the text after the agent's `#`.
    shown = "via agent : up (not ready: stalled: 4 running"
    until("the reason shown", lambda: lb.stats[lb.name["victim"]]["last_agt"].startswith(shown), log=lb.logs)

    # Moving again: put back at the next agent check.
    comes_back(lb, client, victim, AGENT_BACK_WITHIN, out_mark)

    # The watch is killed. HAProxy's agent checks find nobody, which changes nothing: for longer than the
    # engines' own checks take to take a server out, no server leaves and requests flow on to every
    # engine in rotation. The paused one, drained, stays drained even once it resumes: nobody says so.
    killed, killed_mark = time.monotonic(), client.mark()
    lb.kill_watch()

    def refused() -> bool:
        return all(lb.stats[lb.name[role]]["agent_status"] == "L4CON" for role in lb.engines)

    def checked() -> bool:
        return all(health_checks(engine, killed) > OWN_FALL for engine in lb.engines.values())

    until("every agent check refused", refused, log=lb.logs)
    paused.resume()
    until("more than fall of the engines' own checks", checked, timeout=WAIT + OWN_FALL * OWN_INTER, log=lb.logs)
    for role, engine in (("steady", steady), ("saturated", saturated), ("victim", victim)):
        until(f"a request at {role} with the watch dead", partial(reached, engine, killed_mark), log=lb.logs)
    away = time.monotonic()
    for role in lb.engines:
        assert lb.statuses(role, since=killed) == [], lb.logs()  # not one change
    assert lb.status("paused").startswith("DRAIN"), lb.logs()

    # Started again, the watch judges again: the paused engine, moving now, is put back once the new watch
    # has read it for --drain-after (before that it has no history, and says nothing); a new wedge drains.
    restart_mark = client.mark()
    restarted = lb.start_watch()
    resumed, resumed_mark = lb.wait_for("paused", "UP", away)
    assert resumed >= restarted + DRAIN_AFTER, lb.logs()
    assert resumed - restarted <= DRAIN_AFTER + AGENT_BACK_WITHIN, lb.logs()
    until("a request at the engine put back", partial(reached, paused, resumed_mark), log=lb.logs)
    assert [n for n in numbers(paused) if paused_mark < n <= restart_mark] == [], lb.logs()
    wedged = time.monotonic()
    victim.wedge()
    again, _ = lb.wait_for("victim", "DRAIN", wedged)
    assert again - wedged <= DRAINED_WITHIN, f"drained after {again - wedged:.2f} s\n{lb.logs()}"

    # Drained is never down: no server's own check failed, and the saturated one never left.
    stats = lb.show_stat()
    assert [stats[lb.name[role]]["chkdown"] for role in lb.engines] == ["0"] * 4
    assert lb.statuses("saturated", since=begun) == [], lb.logs()
    assert lb.statuses("steady", since=begun) == [], lb.logs()
    assert any(resumed_mark < n for n in numbers(saturated)), lb.logs()


class Agent:
    """An agent that answers every connection with the line set last, and counts them: HAProxy's reading
    of each kind of line the watch sends, without a watch."""

    def __init__(self) -> None:
        self.line = ""
        self.answered = 0
        self.asked: dict[str, int] = {}  # the name sent -> the times it was
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return  # closed
            with sock:
                sock.settimeout(5)
                try:
                    name = sock.recv(4096).decode().strip()
                    sock.sendall(f"{self.line}\n".encode())
                except OSError:
                    continue
            self.asked[name] = self.asked.get(name, 0) + 1
            self.answered += 1

    def says(self, line: str) -> int:
        """From now on, answer `line`; how many were answered before."""
        self.line = line
        return self.answered

    def close(self) -> None:
        self.server.close()


@pytest.mark.needs("haproxy")
def test_each_word_the_agent_sends_does_what_the_watch_means(agent_lb: Pool) -> None:
    """HAProxy 2.6 with stallprobe-agent.cfg and the lines the watch writes (agent_line): `drain up`
    drains, `ready up` puts back, a comment changes nothing, and `up` neither keeps up an engine whose
    own /health fails nor puts it back before that check does; a drain set by hand holds only with the
    server's agent disabled."""
    lb = agent_lb
    engine = lb.add("engine", StubEngine(running=1))
    lb.add("other", StubEngine(running=1))
    agent = Agent()
    try:
        url = engine.url
        ready = agent_line(url, Readiness(True, ("ready: progressing",), DRAIN_AFTER), DRAIN_AFTER)
        drain = agent_line(url, Readiness(False, ("not ready: stalled",), DRAIN_AFTER), DRAIN_AFTER)
        nothing = agent_line(url, None, DRAIN_AFTER)
        assert (ready.split()[:2], drain.split()[:2], nothing[0]) == (["ready", "up"], ["drain", "up"], "#")
        agent.says(ready)
        lb.watch = f"127.0.0.1:{agent.port}"
        lb.start_lb()
        begun = since = time.monotonic()
        agent.says(drain)
        lb.wait_for("engine", "DRAIN", since)
        # A comment, many times over: nothing changes.
        since, count = time.monotonic(), agent.says(nothing)
        until("three comments answered", lambda: agent.answered >= count + 3, log=lb.logs)
        until("HAProxy's reading", lambda: lb.stats[lb.name["engine"]]["agent_desc"] == "No status change")
        assert lb.statuses("engine", since=since) == [], lb.logs()
        assert lb.status("engine").startswith("DRAIN"), lb.logs()
        since = time.monotonic()
        agent.says(ready)
        lb.wait_for("engine", "UP", since)
        # Its own health fails: down, whatever the agent says, and not up again until its own check says so.
        since = time.monotonic()
        engine.route("/health", b"", 503)
        down, _ = lb.wait_for("engine", "DOWN", since)
        assert down - since <= OWN_FALL * OWN_INTER + SLACK, lb.logs()
        count = agent.answered
        until("three more `ready up` answered", lambda: agent.answered >= count + 3, log=lb.logs)
        assert lb.status("engine") == "DOWN", lb.logs()
        since = time.monotonic()
        engine.route("/health", b"")
        lb.wait_for("engine", "UP", since)

        # A drain set by hand is ended by the agent's next `ready`, unless its agent is disabled first
        # (what the configuration and pools.md tell an operator to do).
        server = f"engines/{lb.name['engine']}"
        since = time.monotonic()
        lb.admin(f"set server {server} state drain")
        lb.wait_for("engine", "DRAIN", since)
        lb.wait_for("engine", "UP", since)
        lb.admin(f"disable agent {server}")
        since, count = time.monotonic(), agent.asked[lb.name["engine"]]
        lb.admin(f"set server {server} state drain")
        lb.wait_for("engine", "DRAIN", since)
        until("two of its own checks", lambda: health_checks(engine, since) >= 2, log=lb.logs)
        assert lb.statuses("engine", since=since) == ["DRAIN"], lb.logs()
        assert agent.asked[lb.name["engine"]] <= count + 1, "asked with its agent disabled"  # one under way
        assert lb.statuses("other", since=begun) == [], lb.logs()
    finally:
        agent.close()


@pytest.mark.needs("haproxy")
def test_the_agent_configuration_is_valid_as_it_is() -> None:
    result = subprocess.run([haproxy(), "-c", "-f", str(AGENT_CONFIG)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_pools_page_quotes_the_agent_configuration_as_shipped() -> None:
    """Each HAProxy block of docs/pools.md that names its file (```haproxy file=PATH) is made of lines of
    that file, and the agent's block has the lines that make the agent check; the blocks without a file
    are tests/test_docs.py's (the /ready configuration)."""
    text = (REPO / "docs" / "pools.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```haproxy file=(\S+)\n(.*?)```", text, flags=re.DOTALL)
    assert [path for path, _ in blocks] == ["deploy/haproxy/stallprobe-agent.cfg"]
    for path, block in blocks:
        shipped = {line.strip() for line in (REPO / path).read_text().splitlines()}
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        assert [line for line in lines if line not in shipped] == []
        assert "http-check send meth GET uri /health" in lines
        assert any(" agent-check agent-addr " in line and " agent-inter " in line for line in lines)
        assert any(line.startswith("server ") and line.endswith('agent-send "10.0.0.11:8000\\n"') for line in lines)
