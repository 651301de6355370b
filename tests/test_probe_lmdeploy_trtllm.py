"""LMDeploy and TensorRT-LLM through the exact command a pod runs, against the suite's stub engine serving
each engine's pages (tests/fixtures/built, rendered from its own definitions) at the engine's own routes:
LMDeploy's /metrics, /is_sleeping and /health; TensorRT-LLM's /prometheus/metrics, /health and
/health_generate (its /metrics is a JSON list of iteration statistics that every read empties: the probe
must never ask it). Time passes by rewinding the state file (conftest.rewind), never by sleeping."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, probe_line, rewind
from stallprobe.api import CONFIRM_TIMEOUT
from stallprobe.engines import LMDEPLOY, TRTLLM
from stallprobe.errors import ExitCode
from stubengine import PROMETHEUS, Route, StubEngine

BUILT = REPO / "tests" / "fixtures" / "built"
WINDOW = 120.0  # the probe's default window, LMDeploy's
TRT_WINDOW = 1800.0  # TensorRT-LLM's own, where --window is not given
assert TRTLLM.window == TRT_WINDOW
CAVEAT = TRTLLM.caveat

# What each engine's own routes answer (lmdeploy/serve/openai/endpoints/management.py in 0.18.0;
# tensorrt_llm/serve/openai_server.py).
LMDEPLOY_HEALTHY = b'{"status":"healthy","message":"Engine is healthy."}'
LMDEPLOY_SLEEPING = b'{"status":"sleeping","message":"Engine is sleeping."}'
LMDEPLOY_STALLED = b'{"status":"unhealthy","message":"Backend scheduler_tick has not advanced for 91.3s."}'
TRT_GENERATED = b"Generation health check OK"
TRT_ITERATION_STATS = b'[{"iter": 4121, "numActiveRequests": 1, "iterLatencyMS": 21.4}]'


def page(name: str) -> Route:
    return Route((BUILT / name).read_bytes(), content_type=PROMETHEUS)


# --- LMDeploy: lmdeploy serve api_server, its page at /metrics


@pytest.fixture
def lmdeploy(served: StubEngine) -> StubEngine:
    """An awake LMDeploy api_server (one dp rank) whose page is its busy one."""
    served.routes["/metrics"] = page("lmdeploy-0.18.0-busy.prom")
    served.routes["/is_sleeping"] = Route(b'{"is_sleeping":false}')
    served.routes["/health"] = Route(LMDEPLOY_HEALTHY)
    return served


def test_lmdeploy_whose_tokens_move_is_progressing(lmdeploy: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    assert probe_line(lmdeploy.url, state) == (
        ExitCode.OK,
        "baseline: 3 running, 1 waiting; first run, progress is judged from the next run",
    )
    lmdeploy.routes["/metrics"] = page("lmdeploy-0.18.0-busy-later.prom")  # the next 10-second tick
    code, line = probe_line(lmdeploy.url, state)
    assert (code, line.split(" in ")[0]) == (
        ExitCode.OK,
        "progressing: 3 running, 0 waiting; +512 prompt and +460 generation tokens",
    )
    assert lmdeploy.count("/is_sleeping") == 0  # a healthy look asks nothing more


def test_lmdeploy_frozen_is_suspect_then_stalled_at_the_window(lmdeploy: StubEngine, tmp_path: Path) -> None:
    """Its page served again and again: three requests "running" and nothing moving. Only a look that
    would be suspect asks /is_sleeping, and awake it changes nothing."""
    state = tmp_path / "probe.state"
    lmdeploy.routes["/metrics"] = page("lmdeploy-0.18.0-busy-later.prom")
    assert probe_line(lmdeploy.url, state)[0] == ExitCode.OK
    code, line = probe_line(lmdeploy.url, state)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "suspect: 3 running, 0 waiting")
    assert line.endswith(f"(window {WINDOW:.0f} s)")  # LMDeploy's page shows a long request: no caveat
    assert lmdeploy.count("/is_sleeping") == 1
    rewind(state, WINDOW)
    assert probe_line(lmdeploy.url, state) == (
        ExitCode.STALLED,
        "stalled: 3 running, 0 waiting; no token progress for 120 s (window 120 s)",
    )
    code, line = probe_line(lmdeploy.url, state, "--ready")
    assert (code, line) == (
        ExitCode.STALLED,
        "not ready: stalled: 3 running, 0 waiting; no token progress for 120 s (window 30 s)",
    )


def test_lmdeploy_asleep_is_paused_never_stalled_and_not_ready(lmdeploy: StubEngine, tmp_path: Path) -> None:
    """POST /sleep aborts every request, but its gauges keep the last 10-second tick's until the next
    one: frozen counters and three requests "running". /is_sleeping says it sleeps: paused, however long."""
    state = tmp_path / "probe.state"
    lmdeploy.routes["/metrics"] = page("lmdeploy-0.18.0-busy-later.prom")
    assert probe_line(lmdeploy.url, state)[0] == ExitCode.OK
    lmdeploy.routes["/metrics"] = page("lmdeploy-0.18.0-asleep-stale-gauges.prom")
    lmdeploy.routes["/is_sleeping"] = Route(b'{"is_sleeping":true}')
    lmdeploy.routes["/health"] = Route(LMDEPLOY_SLEEPING)  # 200: LMDeploy's /health says it serves
    code, line = probe_line(lmdeploy.url, state)  # the last outputs before the abort: it moved
    assert (code, line.split(";")[0]) == (ExitCode.OK, "progressing: 3 running, 0 waiting")
    assert probe_line(lmdeploy.url, state) == (
        ExitCode.OK,
        "paused: 3 running, 0 waiting; paused by its operator (/is_sleeping), paused for 0.0 s: not judged until "
        "it resumes",
    )
    rewind(state, WINDOW * 3)
    assert probe_line(lmdeploy.url, state) == (
        ExitCode.OK,
        "paused: 3 running, 0 waiting; paused by its operator (/is_sleeping), paused for 6m00s: not judged until "
        "it resumes",
    )
    code, line = probe_line(lmdeploy.url, state, "--ready")
    assert (code, line.split(";")[0]) == (ExitCode.STALLED, "not ready: paused: 3 running, 0 waiting")


def test_lmdeploy_asleep_with_its_gauges_caught_up_is_not_ready(lmdeploy: StubEngine, tmp_path: Path) -> None:
    """Asleep, with its gauges caught up, nothing on LMDeploy's page says so, and /is_sleeping is asked
    only of an engine that looks stuck; but its /health, which readiness asks anyway, answers 200
    `{"status": "sleeping"}`: out of routing (every generation would be answered 503), and liveness,
    which never asks /health, reads it idle (nothing to restart)."""
    state = tmp_path / "probe.state"
    lmdeploy.routes["/metrics"] = page("lmdeploy-0.18.0-asleep.prom")
    lmdeploy.routes["/is_sleeping"] = Route(b'{"is_sleeping":true}')
    lmdeploy.routes["/health"] = Route(LMDEPLOY_SLEEPING)
    assert probe_line(lmdeploy.url, state)[0] == ExitCode.OK
    code, line = probe_line(lmdeploy.url, state, "--ready")
    assert (code, line.split(";")[0]) == (ExitCode.STALLED, "not ready: paused: 0 running, 0 waiting")
    assert "paused by its operator (/health says status sleeping)" in line
    code, line = probe_line(lmdeploy.url, state)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "idle: 0 running, 0 waiting")
    lmdeploy.routes["/health"] = Route(LMDEPLOY_HEALTHY)  # woken up
    code, line = probe_line(lmdeploy.url, state, "--ready")
    assert (code, line.split(";")[0]) == (ExitCode.OK, "ready: idle: 0 running, 0 waiting")
    assert lmdeploy.count("/is_sleeping") == 0


def test_lmdeploy_health_503_drains_readiness_and_leaves_liveness_to_the_page(
    lmdeploy: StubEngine, tmp_path: Path
) -> None:
    """LMDeploy's own /health answers 503 once its scheduler has not ticked for 90 s with requests
    dispatched: readiness takes the engine out of routing at once; liveness still judges the page (a
    restart comes only from the window), and a page that moves is progressing."""
    state = tmp_path / "probe.state"
    lmdeploy.routes["/health"] = Route(LMDEPLOY_STALLED, 503)
    code, line = probe_line(lmdeploy.url, state, "--ready")
    assert (code, line) == (ExitCode.STALLED, f"not ready: health {lmdeploy.base}/health: HTTP 503 Service Unavailable")
    lmdeploy.routes["/metrics"] = page("lmdeploy-0.18.0-busy-later.prom")
    code, line = probe_line(lmdeploy.url, state)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "progressing: 3 running, 0 waiting")
    lmdeploy.routes["/health"] = Route(LMDEPLOY_HEALTHY)
    code, line = probe_line(lmdeploy.url, state, "--ready")
    assert (code, line.split(";")[0]) == (ExitCode.OK, "ready: suspect: 3 running, 0 waiting")


def test_each_lmdeploy_rank_is_its_own_server_and_page(tmp_path: Path) -> None:
    """--dp 2 runs one api_server per rank, each on its own port, each page naming its own rank: a probe
    reads the rank behind its port, and nothing of the other."""
    with StubEngine() as rank0, StubEngine() as rank1:
        rank0.routes["/metrics"] = page("lmdeploy-0.18.0-busy-later.prom")
        rank1.routes["/metrics"] = page("lmdeploy-0.18.0-dp-rank1-busy.prom")
        for stub, running in ((rank0, 3), (rank1, 2)):
            state = tmp_path / f"{stub.port}.state"
            code, line = probe_line(stub.url, state, "--json")
            assert code == ExitCode.OK
            assert f'"running": {running}.0' in line
        assert probe_line(rank1.url, tmp_path / f"{rank1.port}.state")[1].startswith("suspect: 2 running, 0 waiting")


# --- TensorRT-LLM: trtllm-serve, its Prometheus page at /prometheus/metrics


@pytest.fixture
def trtllm(served: StubEngine) -> Iterator[StubEngine]:
    """trtllm-serve with return_perf_metrics and enable_iter_perf_stats, during one long generation that
    finishes nothing: every series of its page frozen, one request running. Its /metrics is the JSON
    iteration statistics, which the probe must never read."""
    served.routes["/prometheus/metrics"] = page("trtllm-iter-stats-long-generation.prom")
    served.routes["/metrics"] = Route(TRT_ITERATION_STATS)
    served.routes["/health"] = Route(b"")
    served.routes["/health_generate"] = Route(TRT_GENERATED)
    yield served
    assert served.count("/metrics") == 0


def trt_url(stub: StubEngine) -> str:
    return f"{stub.base}{TRTLLM.metrics_path}"


def test_trtllm_long_generation_is_never_stalled_while_health_generate_answers(
    trtllm: StubEngine, tmp_path: Path
) -> None:
    """No --window: TensorRT-LLM's own (1800 s), said in the line with what its page cannot show. Once
    the frozen page would be stalled, /health_generate (a one-token generation through the whole engine)
    is asked, and its answer is life: never stalled, window after window."""
    state = tmp_path / "probe.state"
    url = trt_url(trtllm)
    assert probe_line(url, state) == (
        ExitCode.OK,
        "baseline: 1 running, 0 waiting; first run, progress is judged from the next run",
    )
    rewind(state, 600)
    assert probe_line(url, state) == (
        ExitCode.OK,
        f"suspect: 1 running, 0 waiting; no token progress for 600 s (window 1800 s); {CAVEAT}",
    )
    assert trtllm.count("/health_generate") == 0  # asked only of an engine that would be stalled
    for confirmations in range(1, 4):
        rewind(state, TRT_WINDOW)
        code, line = probe_line(url, state)
        assert (code, line.split(";")[0]) == (ExitCode.OK, "progressing: 1 running, 0 waiting"), line
        assert "its page held still, and /health_generate answered" in line
        assert trtllm.count("/health_generate") == confirmations
        rewind(state, 60)
        code, line = probe_line(url, state)  # the answer counts once: the clock runs again from it
        assert (code, line.split(";")[:2]) == (
            ExitCode.OK,
            ["suspect: 1 running, 0 waiting", " no token progress for 60 s (window 1800 s)"],
        ), line


def test_trtllm_wedged_is_stalled_past_its_window_when_health_generate_fails(
    trtllm: StubEngine, tmp_path: Path
) -> None:
    state = tmp_path / "probe.state"
    url = trt_url(trtllm)
    trtllm.routes["/health_generate"] = Route(b"", 500)
    assert probe_line(url, state)[0] == ExitCode.OK
    rewind(state, TRT_WINDOW - 1)
    code, line = probe_line(url, state)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "suspect: 1 running, 0 waiting")
    assert trtllm.count("/health_generate") == 0
    rewind(state, 1)
    code, line = probe_line(url, state)
    assert code == ExitCode.STALLED, line
    assert line.startswith("stalled: 1 running, 0 waiting; no token progress for 18")
    assert line.endswith(f"(window 1800 s); {CAVEAT}")
    assert trtllm.count("/health_generate") == 1


def test_trtllm_whose_health_generate_never_answers_is_stalled_within_its_deadline(
    trtllm: StubEngine, tmp_path: Path
) -> None:
    """The real wedge: the one-token generation never comes back. The question has its own deadline
    (api.CONFIRM_TIMEOUT), after which the page's verdict stands, with --window the operator's."""
    state = tmp_path / "probe.state"
    url = trt_url(trtllm)
    trtllm.routes["/health_generate"] = Route(TRT_GENERATED, hang=True)
    assert probe_line(url, state, "--window", "300")[0] == ExitCode.OK
    rewind(state, 300)
    started = time.monotonic()
    assert probe_line(url, state, "--window", "300") == (
        ExitCode.STALLED,
        f"stalled: 1 running, 0 waiting; no token progress for 300 s (window 300 s); {CAVEAT}",
    )
    assert CONFIRM_TIMEOUT <= time.monotonic() - started < CONFIRM_TIMEOUT + 20


def test_trtllm_decoding_moves_by_its_kv_blocks_between_finishes(trtllm: StubEngine, tmp_path: Path) -> None:
    """With its statistics collector awake, the blocks allocated while generating move though no request
    finished (its token counters do not): progressing."""
    state = tmp_path / "probe.state"
    url = trt_url(trtllm)
    trtllm.routes["/prometheus/metrics"] = page("trtllm-iter-stats-decoding.prom")
    assert probe_line(url, state)[0] == ExitCode.OK
    trtllm.routes["/prometheus/metrics"] = page("trtllm-iter-stats-decoding-later.prom")
    code, line = probe_line(url, state)
    assert (code, line.split(" in ")[0]) == (
        ExitCode.OK,
        "progressing: 4 running, 0 waiting; +0 prompt and +0 generation tokens",
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (
            "trtllm-request-metrics-only.prom",
            "required metric missing from the trtllm page: trtllm_num_requests_running",
        ),
        (
            "trtllm-iter-stats-fresh.prom",
            "required metric missing from the trtllm page: trtllm_prompt_tokens_total, trtllm_generation_tokens_total",
        ),
    ],
)
def test_trtllm_whose_page_cannot_show_progress_is_left_to_its_health_route(
    trtllm: StubEngine, tmp_path: Path, name: str, why: str
) -> None:
    """Without enable_iter_perf_stats there is no running gauge, and before a request finishes no token
    counter: the probe cannot judge, and says so; /health decides, as an httpGet of it would."""
    state = tmp_path / "probe.state"
    url = trt_url(trtllm)
    trtllm.routes["/prometheus/metrics"] = page(name)
    assert probe_line(url, state) == (
        ExitCode.OK,
        f"unjudged: {why}; /health answers 2xx, so the engine serves (the probe cannot judge its progress)",
    )
    trtllm.routes["/health"] = Route(b"LLM is unavailable. Please check the server logs for more details.", 503)
    assert probe_line(url, state) == (
        ExitCode.METRICS,
        f"error: {why}; and health {trtllm.base}/health: HTTP 503 Service Unavailable",
    )
    assert trtllm.count("/health_generate") == 0


def test_trtllm_long_generation_stays_ready_while_health_generate_answers(trtllm: StubEngine, tmp_path: Path) -> None:
    """During any long generation TensorRT-LLM's page holds still: readiness asks /health_generate at its
    own window (--drain-after, 30 s), else a healthy engine would leave routing 30 s into every long
    request. Asked only then, and the answer counts once."""
    state = tmp_path / "probe.state"
    url = trt_url(trtllm)
    assert probe_line(url, state, "--ready")[0] == ExitCode.OK
    rewind(state, 20)
    assert probe_line(url, state, "--ready")[0] == ExitCode.OK
    assert trtllm.count("/health_generate") == 0
    rewind(state, 10)
    code, line = probe_line(url, state, "--ready")
    assert code == ExitCode.OK, line
    assert "/health_generate answered" in line
    assert trtllm.count("/health_generate") == 1
    trtllm.routes["/health_generate"] = Route(b"", 503)
    rewind(state, 30)
    code, line = probe_line(url, state, "--ready")
    assert code == ExitCode.STALLED, line
    assert trtllm.count("/health_generate") == 2


def test_the_dialects_routes_are_the_ones_these_tests_serve() -> None:
    assert (LMDEPLOY.metrics_path, LMDEPLOY.pause_route, LMDEPLOY.health_route) == (
        "/metrics",
        "/is_sleeping",
        "/health",
    )
    assert (TRTLLM.metrics_path, TRTLLM.confirm_route, TRTLLM.health_route) == (
        "/prometheus/metrics",
        "/health_generate",
        "/health",
    )
