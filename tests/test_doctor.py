"""`stallprobe doctor` against the suite's stub engine on loopback (tests/stubengine.py) serving real pages
(tests/fixtures/real, tests/fixtures/built): what it says of each engine, its exit code, that the probes it
prints are the ones `stallprobe inject` writes, and that their command works against the same engine.

The doctor runs in this process on a clock of its own (`main(..., clock=, sleep=)`): a pause between two
looks moves that clock, so ten seconds of looks take no time and a stall clock reads exact seconds. What
only the real command shows (a closed stdout, `| head -1`, --help, a usage error) runs it as a process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, FakeClock, clean_env, configmap_volume, fixture_page, vllm_page
from stallprobe.doctor import DoctorConfig, configure, help_text, main
from stallprobe.errors import EXIT_TABLE, ExitCode
from stallprobe.launcher import launcher
from stallprobe.options import DOCTOR
from stallprobe.pyz import build
from stallprobe.serving import LAUNCHER_KEY, PYZ_KEY, TERMINATION_LOG
from stallprobe.stanza import LAUNCHER_PATH, PYZ_DIR
from stubengine import Route, StubEngine

BUILT = REPO / "tests" / "fixtures" / "built"
# The engines' answers on their other routes, as they give them: vLLM 0.32 (entrypoints/serve), SGLang
# 0.5.23's /v1/loads (managers/load_snapshot.py: one snapshot per data-parallel rank), llama.cpp's /health.
NOT_FOUND = b'{"detail":"Not Found"}'
SGLANG_LOADS = json.dumps(
    {"loads": [{"dp_rank": 0, "num_running_reqs": 162, "num_waiting_reqs": 2826, "queues": {"waiting": 2826}}]}
).encode()
LLAMACPP_HEALTH = b'{"status":"ok"}'
LAUNCHED = ["python3", "-I", "-S", LAUNCHER_PATH]  # the pod's command before its flags: the launcher's file
# The flags only the liveness probe carries, last: the termination message file, the kill switch's file.
LIVENESS_ONLY = ["--termination-log", TERMINATION_LOG, "--report-only-file", "/opt/stallprobe/report-only"]


@pytest.fixture
def serve() -> Iterator[Callable[..., StubEngine]]:
    """Start a stub engine whose routes are the stub's own (/health answering 200, /v1/models, ...) with
    `routes` over them, and an API key when `key` is given."""
    stubs: list[StubEngine] = []

    def start(routes: dict[str, Route], key: str = "") -> StubEngine:
        stub = StubEngine()
        stub.routes.update(routes)
        stub.key = key
        stubs.append(stub)
        return stub

    yield start
    for stub in stubs:
        stub.close()


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ConfigMap inject ships (the single-file build and its launcher) where its volume mounts them:
    the printed probes run the launcher, which runs the archive beside it."""
    files: dict[str, bytes | str] = {PYZ_KEY: build(None), LAUNCHER_KEY: launcher()}
    return configmap_volume(tmp_path_factory.mktemp("opt") / "stallprobe", files)


def moving(page: bytes, family: str, step: float) -> Callable[[], bytes]:
    """The page, with every series of `family` `step` higher at each request: an engine at work. Only
    those numbers change; the rest of the real page stays as it was captured."""
    count = [0]
    pattern = re.compile(rb"^(" + re.escape(family.encode()) + rb"(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)

    def make() -> bytes:
        count[0] += 1
        return pattern.sub(lambda m: m.group(1) + b" " + repr(float(m.group(2)) + step * count[0]).encode(), page)

    return make


class Run:
    """One run of the doctor: its exit code, its output, and the output's topics (label -> its text,
    the wrapped lines joined)."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code = code
        self.out = out
        self.err = err
        self.topics: dict[str, str] = {}
        label = ""
        for line in self.out.splitlines()[1:]:
            head = line[:12]
            if head.strip():
                label = head.strip().rstrip(":")
                self.topics[label] = line[12:].strip()
            else:
                self.topics[label] += " " + line.strip()

    def __getitem__(self, label: str) -> str:
        return self.topics[label]

    def probes(self) -> dict[str, Any]:
        """The probes it printed, parsed as YAML: the indented block under its `probes` topic."""
        lines = self.out.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("probes:"))
        block = []
        for line in lines[start + 1 :]:
            if line[:12].strip():
                break
            if line.startswith(" " * 14):
                block.append(line)
        parsed = yaml.safe_load(textwrap.dedent("\n".join(block)))
        assert isinstance(parsed, dict), self.out
        return parsed

    def command(self) -> list[str]:
        """The exec command of the liveness probe it printed, but for the flags only liveness carries (where
        a failing run leaves its evidence, the kill switch's file: checked here), as inject writes them."""
        command: list[str] = self.probes()["livenessProbe"]["exec"]["command"]
        assert command[-4:] == LIVENESS_ONLY
        return command[:-4]


def doctor(
    url: str, *args: str, env: dict[str, str] | None = None, seconds: str = "1", clock: FakeClock | None = None
) -> Run:
    """The doctor, in this process, on a clock of its own; --timeout 2 unless given."""
    clock = clock or FakeClock()
    out, err = io.StringIO(), io.StringIO()
    timeout = [] if "--timeout" in args else ["--timeout", "2"]
    argv = ["--url", url, "--seconds", seconds, *timeout, *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv, env or {}, clock=clock, sleep=clock.sleep)
    return Run(code, out.getvalue(), err.getvalue())


def run_printed(
    command: list[str], archive: Path, tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """The printed command, word for word, as the kubelet runs it in the engine's container: `python3`
    is this interpreter, and the ConfigMap inject ships is mounted where the command names it."""
    assert command[:4] == LAUNCHED
    termination = tmp_path / "dev-termination-log"  # the kubelet makes it, empty, for the container
    termination.touch()
    local = {"python3": sys.executable, TERMINATION_LOG: str(termination)}
    words = [local.get(word, word.replace(PYZ_DIR, str(archive))) for word in command]
    result = subprocess.run(
        words,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(TMPDIR=str(tmp_path), **(env or {})),
        check=False,
    )
    assert result.stderr == ""
    return result.returncode, result.stdout.strip()


# --- engines it can read


def test_a_busy_vllm_that_moves_is_fit_and_its_printed_probe_runs(
    serve: Callable[..., StubEngine], archive: Path, tmp_path: Path
) -> None:
    page = fixture_page("vllm-0.32.0-cpu-busy.prom")
    stub = serve(
        {
            "/metrics": Route(moving(page, "vllm:generation_tokens_total", 4)),
            "/health": Route(b""),
            "/load": Route(b'{"server_load": 4}'),  # --enable-server-load-tracking, 4 generations in flight
        }
    )
    run = doctor(stub.url, seconds="1.5")
    assert run.code == ExitCode.OK, run.out
    assert run.err == ""
    assert run.out.splitlines()[0] == f"stallprobe doctor: reading {stub.url} for 1.5 s, 3 looks"
    assert run["engine"] == "vllm, one engine on the page"
    assert "heartbeats vllm:kv_cache_usage_perc" in run["progress"]
    assert run["moved"] == ("vllm:generation_tokens_total (+8); not vllm:prompt_tokens_total, vllm:kv_cache_usage_perc")
    assert run["waiting"].startswith("the page tells requests waiting for capacity from those the engine defers")
    assert run["api key"] == "none needed for the page"
    assert run["pause"].startswith("/is_paused answers 404, as vLLM does without VLLM_SERVER_DEV_MODE=1")
    assert "vllm:engine_sleep_state" in run["pause"]
    assert run["load"].startswith("/load counts requests in flight (up to 4")
    assert run["health"] == "/health says the engine serves: readiness (--ready) can use it"
    assert run["verdicts"] == "baseline, then progressing x2 (window 120 s)"
    assert run["last look"] == "progressing: 4 running, 0 waiting; +0 prompt and +4 generation tokens in 0.8 s"
    assert run["readiness"].startswith("ready: progressing: 4 running")
    assert run["in short"] == "the probe can read and judge this engine: use the probes above"
    command = run.command()
    assert command[4:] == [
        "--url",
        stub.url,
        "--window",
        "120",
        "--timeout",
        "2",
        "--engine",
        "vllm",
        "--server-load",
    ]
    # 2 s for the scrape, 2 s for /load, 1 s for /is_paused, 2 s to start
    assert run.probes()["livenessProbe"]["timeoutSeconds"] == 7
    assert run["inject"] == "stallprobe inject -f your-deployment.yaml --server-load --timeout 2 | kubectl apply -f -"
    code, line = run_printed(command, archive, tmp_path)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "baseline: 4 running, 0 waiting")
    code, line = run_printed(command, archive, tmp_path)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "progressing: 4 running, 0 waiting")


def test_a_page_whose_running_gauge_has_no_sample_cannot_be_judged_as_the_probe_says(
    serve: Callable[..., StubEngine], tmp_path: Path
) -> None:
    """The multiprocess page (--api-server-count 2, before its first request) declares the running and
    waiting gauges and gives them no sample: a value the probe cannot read, never a 0."""
    page = fixture_page("vllm-0.32.0-cpu-multiprocess-idle.prom")
    stub = serve({"/metrics": Route(page), "/health": Route(b"", 503)})
    run = doctor(stub.url)
    assert run.code == ExitCode.METRICS, run.out
    why = "required metric missing from the vllm page: vllm:num_requests_running (declared, with no sample)"
    assert run["engine"] == f"vllm, but the probe cannot read its page: {why}"
    probe = subprocess.run(
        [sys.executable, "-m", "stallprobe", "--url", stub.url, "--state-file", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    assert (probe.returncode, probe.stdout.startswith(f"error: {why}; and health ")) == (ExitCode.METRICS, True)


def test_an_idle_vllm_says_nothing_had_to_move_and_what_load_cannot_tell(
    serve: Callable[..., StubEngine], archive: Path, tmp_path: Path
) -> None:
    stub = serve(
        {
            "/metrics": Route(vllm_page(0, 0, 0)),
            "/health": Route(b""),
            "/load": Route(b'{"server_load": 0}'),
        }
    )
    run = doctor(stub.url)
    assert run.code == ExitCode.OK, run.out
    assert "no heartbeat on the page" in run["progress"]
    assert run["moved"] == "nothing: nothing ran, so nothing had to move. Look again while it serves requests."
    assert run["load"].startswith("/load said 0, and nothing ran: vLLM counts requests only with")
    assert run["verdicts"] == "baseline, then idle (window 120 s)"
    assert run["last look"] == "idle: 0 running, 0 waiting"
    command = run.command()
    assert "--server-load" not in command
    assert "--server-load" not in run["inject"]
    assert run.probes()["livenessProbe"]["timeoutSeconds"] == 5
    code, line = run_printed(command, archive, tmp_path)
    assert (code, line) == (
        ExitCode.OK,
        "baseline: 0 running, 0 waiting; first run, progress is judged from the next run",
    )


def test_load_that_says_0_while_requests_run_would_not_help(serve: Callable[..., StubEngine]) -> None:
    page = fixture_page("vllm-0.32.0-cpu-busy.prom")
    stub = serve(
        {
            "/metrics": Route(moving(page, "vllm:generation_tokens_total", 4)),
            "/load": Route(b'{"server_load": 0}'),  # vLLM without --enable-server-load-tracking
        }
    )
    run = doctor(stub.url, seconds="0.5")
    assert run.code == ExitCode.OK, run.out
    assert run["load"] == (
        "/load said 0 while requests ran: vLLM counts them only with --enable-server-load-tracking, "
        "and without it --server-load adds nothing."
    )
    assert "--server-load" not in run.command()


@pytest.mark.parametrize(
    ("page", "waiting"),
    [
        (
            "vllm-v1-ahasannn-hwrouter-f7a8250.prom",
            "the page has no vllm:num_requests_waiting_by_reason (an older vllm), so waiting requests cannot be "
            "told apart: a queue with nothing running is not judged unless --include-waiting=always",
        ),
        (
            "vllm-v1-inferstack-0.29.0-651cd61.prom",
            "the page tells requests waiting for capacity from those the engine defers "
            "(vllm:num_requests_waiting_by_reason): requests waiting for capacity while nothing runs are owed "
            "work, and judged",
        ),
        (
            "llamacpp-server-11434-local.prom",
            "every waiting request (llamacpp:requests_deferred) is owed work, and judged",
        ),
    ],
)
def test_which_waiting_requests_count_is_read_off_the_page(
    serve: Callable[..., StubEngine], page: str, waiting: str
) -> None:
    stub = serve({"/metrics": Route(fixture_page(page))})
    run = doctor(stub.url, seconds="0.2")
    assert run.code == ExitCode.OK, run.out
    assert run["waiting"] == waiting


def test_include_waiting_given_is_said_and_carried_into_the_command(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("vllm-v1-ahasannn-hwrouter-f7a8250.prom"))})
    run = doctor(stub.url, "--include-waiting=always", seconds="0.2")
    assert run["waiting"] == "--include-waiting=always: every waiting request counts as work the engine owes"
    assert run.command()[-1] == "--include-waiting=always"
    assert "--include-waiting=always --timeout 2 |" in run["inject"]


def test_llamacpp_idle(serve: Callable[..., StubEngine], archive: Path, tmp_path: Path) -> None:
    stub = serve(
        {"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom")), "/health": Route(LLAMACPP_HEALTH)}
    )
    run = doctor(stub.url, seconds="0.5")
    assert run.code == ExitCode.OK, run.out
    assert run["engine"] == "llamacpp, one engine on the page"
    assert run["progress"] == (
        "the token counters llamacpp:prompt_tokens_total and llamacpp:tokens_predicted_total; heartbeats "
        "llamacpp:n_decode_total. Any change of one is progress."
    )
    assert not {"pause", "load", "loads"} & set(run.topics)
    assert run["verdicts"] == "baseline, then idle (window 120 s)"
    assert run_printed(run.command(), archive, tmp_path)[0] == ExitCode.OK


def test_sglang_under_load_is_saturated_and_its_loads_route_answers(
    serve: Callable[..., StubEngine], archive: Path, tmp_path: Path
) -> None:
    page = fixture_page("sglang-docs-production-metrics-00b08c4.prom")
    stub = serve(
        {
            "/metrics": Route(moving(page, "sglang:generation_tokens_total", 96)),
            "/health": Route(b""),
            "/v1/loads": Route(SGLANG_LOADS),
        }
    )
    run = doctor(stub.url, seconds="1")
    assert run.code == ExitCode.OK, run.out
    assert run["engine"] == "sglang, one engine on the page"
    assert "heartbeats sglang:num_used_tokens, sglang:token_usage" in run["progress"]
    assert run["moved"].startswith("sglang:generation_tokens_total (+96)")
    assert run["loads"].startswith("/v1/loads answers: when the page looks stuck, the probe reads the scheduler")
    assert run["verdicts"] == "baseline, then saturated (window 120 s)"
    assert run["last look"].endswith("busy, not stuck: do not restart")
    assert run.command()[-2:] == ["--engine", "sglang"]  # inject names the engine its container runs
    assert "--engine" not in run["inject"]  # and reads it off the container
    assert run_printed(run.command(), archive, tmp_path)[0] == ExitCode.OK


def test_an_sglang_without_its_loads_route_is_told_what_that_costs(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("sglang-docs-production-metrics-00b08c4.prom"))})
    run = doctor(stub.url, seconds="0.2")
    assert run["loads"].startswith("/v1/loads answers HTTP 404 Not Found: a page that shows a stale batch cannot")


def test_data_parallel_engines_are_counted(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(vllm_page(4, 100, 50, engines=2))})
    run = doctor(stub.url, seconds="0.2")
    assert run["engine"] == (
        "vllm, 2 engines on one page (data parallelism: its engine label says 0, 1). Each is judged on its own, "
        "and the page is as bad as its worst."
    )


# --- what it judges


def test_a_busy_engine_frozen_past_the_window_is_stalled_now(serve: Callable[..., StubEngine]) -> None:
    """The real page served unchanged: four requests running and nothing moving. With dev mode on,
    /is_paused answers false, so it is not paused either."""
    stub = serve(
        {"/metrics": Route(fixture_page("vllm-0.32.0-cpu-busy.prom")), "/is_paused": Route(b'{"is_paused":false}')}
    )
    run = doctor(stub.url, "--window", "0.5", seconds="1")
    assert run.code == ExitCode.STALLED, run.out
    assert run["moved"] == "nothing, while the engine owed work (requests running, or waiting for capacity)"
    assert run["verdicts"] == "baseline, then stalled (window 0.5 s)"
    assert run["last look"] == "stalled: 4 running, 0 waiting; no token progress for 1.0 s (window 0.5 s)"
    assert run["pause"].startswith("/is_paused answers (VLLM_SERVER_DEV_MODE=1): the probe asks it")
    # Stuck for 1 s, under the 30 s drain window, but stalled: an engine about to be restarted takes nothing.
    assert run["readiness"] == "not ready: stalled: 4 running, 0 waiting; no token progress for 1.0 s (window 30 s)"
    assert run["in short"] == (
        "stalled now: busy with no progress for 1.0 s (window 0.5 s), so the probe fails it now; the kubelet "
        "restarts it about 20.5 s after its last progress (window 0.5 s + period 10 s x (failureThreshold 3 - 1))"
    )
    assert run.command()[6:8] == ["--window", "0.5"]
    assert run.err == (  # its readiness is judged with the default drain window, which the window undercuts
        "stallprobe doctor: --drain-after 30 s is not shorter than --window 0.5 s: a wedged engine keeps its "
        "traffic until it is stalled, so the load balancer no longer drains it before the restart\n"
    )


def test_requests_waiting_for_capacity_with_nothing_running_are_judged(serve: Callable[..., StubEngine]) -> None:
    """The reported wedge (running 0, waiting 3, all for capacity): busy to the probe, and frozen."""
    stub = serve({"/metrics": Route((BUILT / "vllm-0.32-capacity-nothing-running.prom").read_bytes())})
    run = doctor(stub.url, seconds="1")
    assert run.code == ExitCode.OK, run.out
    assert run["moved"] == "nothing, while the engine owed work (requests running, or waiting for capacity)"
    assert run["verdicts"] == "baseline, then suspect (window 120 s)"
    assert run["last look"].endswith("(window 120 s); 3 waiting for capacity, nothing running")


def test_an_engine_its_operator_paused_is_paused_and_fit(serve: Callable[..., StubEngine]) -> None:
    """The page of vLLM 0.32 2.5 s after /pause?mode=keep: frozen with requests running; /is_paused says so."""
    stub = serve(
        {
            "/metrics": Route(fixture_page("vllm-0.32.0-cpu-paused-keep.prom")),
            "/is_paused": Route(b'{"is_paused":true}'),
        }
    )
    run = doctor(stub.url, seconds="1")
    assert run.code == ExitCode.OK, run.out
    assert run["verdicts"] == "baseline, then paused (window 120 s)"
    assert "and says it is paused now" in run["pause"]
    assert run["readiness"].startswith("not ready: paused")


# --- LMDeploy and TensorRT-LLM: their pages, built from their own definitions (tests/fixtures/built)

LMDEPLOY_HEALTHY = b'{"status":"healthy","message":"Engine is healthy."}'
TRT_ITERATION_STATS = b'[{"iter": 4121, "numActiveRequests": 1, "iterLatencyMS": 21.4}]'


def test_lmdeploy_at_work_is_told_what_moves_when_and_what_its_own_health_catches(
    serve: Callable[..., StubEngine],
) -> None:
    page = (BUILT / "lmdeploy-0.18.0-busy-later.prom").read_bytes()
    stub = serve(
        {
            "/metrics": Route(moving(page, "lmdeploy:generation_tokens_total", 6)),
            "/is_sleeping": Route(b'{"is_sleeping":false}'),
            "/health": Route(LMDEPLOY_HEALTHY),
        }
    )
    run = doctor(stub.url, seconds="2")
    assert run.code == ExitCode.OK, run.out
    assert run["engine"].startswith("lmdeploy, one engine on the page (rank 0): with --dp N LMDeploy runs one")
    assert "so a probe on this port watches this rank alone" in run["engine"]
    assert run["progress"].startswith(
        "the token counters lmdeploy:prompt_tokens_total and lmdeploy:generation_tokens_total; heartbeats "
        "lmdeploy:gpu_cache_usage_perc."
    )
    assert run["moved"] == (
        "lmdeploy:generation_tokens_total (+12); not lmdeploy:prompt_tokens_total, lmdeploy:gpu_cache_usage_perc"
    )
    moves = run["moves when"]
    assert moves.startswith("lmdeploy:generation_tokens_total on every streamed output")
    assert "are set by a 10-second tick: they lag by up to 10 s" in moves
    assert moves.endswith("Its request_success_total moves only for requests that end FINISH (aborted and "
                          "cancelled ones never count), so the probe reads no thrashing from it.")  # fmt: skip
    assert run["waiting"] == (
        "lmdeploy:num_requests_waiting counts requests that wait on a peer too, and the page cannot tell them apart: "
        "a queue with nothing running is not judged unless --include-waiting=always"
    )
    assert run["pause"].startswith(
        "/is_sleeping answers: the probe asks it before it calls a frozen engine stuck, so an engine put to sleep "
        "on purpose is never restarted. Nothing on its page says it sleeps"
    )
    own = run["own health"]
    assert own.startswith("LMDeploy's own /health answers 503 once its scheduler has not ticked for 90 s")
    assert "never sees one that ticks and produces nothing" in own
    assert "readiness that drains at --drain-after long before the restart" in own
    assert run["verdicts"] == "baseline, then progressing x2 (window 120 s)"
    assert "generate" not in run.topics
    assert "config" not in run.topics
    assert "drain" not in run.topics
    assert run.command()[4:] == ["--url", stub.url, "--window", "120", "--timeout", "2", "--engine", "lmdeploy"]


def test_lmdeploy_asleep_says_so_and_is_never_failed(serve: Callable[..., StubEngine]) -> None:
    """POST /sleep: frozen with the last tick's gauges; /is_sleeping says it sleeps."""
    stub = serve(
        {
            "/metrics": Route((BUILT / "lmdeploy-0.18.0-asleep-stale-gauges.prom").read_bytes()),
            "/is_sleeping": Route(b'{"is_sleeping":true}'),
            "/health": Route(b'{"status":"sleeping","message":"Engine is sleeping."}'),
        }
    )
    run = doctor(stub.url, seconds="2")
    assert run.code == ExitCode.OK, run.out
    assert run["verdicts"] == "paused x3 (window 120 s)"  # its /health says so from the first look
    assert run["pause"].startswith("/is_sleeping answers, and says it is asleep now: the probe asks it")
    assert run["readiness"].startswith("not ready: paused: 3 running, 0 waiting; paused by its operator (/is_sleeping)")
    assert run["in short"].startswith("paused: paused by its operator (/is_sleeping). The probe never fails")


@pytest.fixture
def trtllm(serve: Callable[..., StubEngine]) -> Iterator[StubEngine]:
    """trtllm-serve during one long generation: its page frozen at /prometheus/metrics, its JSON /metrics
    (never to be read), /health and /health_generate answering."""
    stub = serve(
        {
            "/prometheus/metrics": Route((BUILT / "trtllm-iter-stats-long-generation.prom").read_bytes()),
            "/metrics": Route(TRT_ITERATION_STATS),
            "/health_generate": Route(b"Generation health check OK"),
        }
    )
    yield stub
    assert stub.count("/metrics") == 0


def test_trtllm_during_a_long_generation_is_judged_with_its_own_window_and_told_why(trtllm: StubEngine) -> None:
    url = f"{trtllm.base}/prometheus/metrics"
    run = doctor(url, seconds="2")
    assert run.code == ExitCode.OK, run.out
    assert run["engine"] == "trtllm, one engine on the page"
    assert run["verdicts"] == "baseline, then suspect x2 (window 1800 s)"
    assert run["last look"].startswith("suspect: 1 running, 0 waiting; no token progress for 2.0 s (window 1800 s); "
                                       "trtllm counts tokens only when a request finishes")  # fmt: skip
    moves = run["moves when"]
    assert moves.startswith(
        "trtllm_prompt_tokens_total, trtllm_generation_tokens_total and trtllm_request_success_total only when a "
        "request finishes; trtllm_num_requests_running, trtllm_num_requests_waiting and "
        "trtllm_kv_cache_gen_alloc_blocks_total only while its statistics collector is awake"
    )
    assert "So its window is its own, 1800 s, where --window does not say" in moves
    assert moves.endswith("is asked /health_generate first.")
    config = run["config"]
    assert config.startswith(
        "trtllm-serve serves /prometheus/metrics only with return_perf_metrics: true in its config (--config or "
        "--extra_llm_api_options, a YAML file)"
    )
    assert "enable_iter_perf_stats: true adds the per-iteration ones: trtllm_num_requests_running" in config
    assert "On this page: the iteration statistics are on." in config
    assert config.endswith(
        "TensorRT-LLM's /metrics is not a Prometheus page but a JSON list of iteration statistics that every read "
        "empties (each reader takes them from every other): point nothing at it, neither the probe nor Prometheus."
    )
    assert run["generate"].startswith("/health_generate answers 200 (a one-token generation through the whole engine)")
    assert run["generate"].endswith("It is itself a request that finishes: it moves the page's counters")
    assert trtllm.count("/health_generate") == 1  # asked once, after the looks
    assert run["drain"] == (
        "this page holds still through a long generation, so readiness, once an engine has been busy with nothing "
        "moving for --drain-after (30 s), asks /health_generate (a one-token generation through the whole engine) "
        "before it takes the engine out of routing: an answer within 5 s keeps it in, none drains it (an engine "
        "too busy to answer in time leaves routing until a request finishes). Give --drain-after above the longest "
        "request to ask it less often"
    )
    assert run["in short"].startswith("suspect: busy with no progress for 2.0 s. If nothing moves, readiness takes it")
    assert (
        "the probe fails it at 1800 s, and the kubelet restarts it about 1820 s after its last progress"
        in run["in short"]
    )
    command = run.command()
    assert command[4:] == ["--url", url, "--window", "1800", "--timeout", "2", "--engine", "trtllm"]
    # inject writes the engine's own window itself (inject.decide.own_window): the command does not say it
    # 2 s for the scrape, 5 s for /health_generate (api.CONFIRM_TIMEOUT), 2 s to start
    assert run.probes()["livenessProbe"]["timeoutSeconds"] == 9
    assert run["inject"] == "stallprobe inject -f your-deployment.yaml --timeout 2 | kubectl apply -f -"


def test_trtllm_with_a_window_given_is_judged_with_it(trtllm: StubEngine) -> None:
    run = doctor(f"{trtllm.base}/prometheus/metrics", "--window", "600", seconds="1")
    assert run["verdicts"] == "baseline, then suspect (window 600 s)"
    assert "So its window is its own, 1800 s, where --window does not say" in run["moves when"]
    assert run.command()[6:8] == ["--window", "600"]
    assert run["inject"].endswith("--window 600 --timeout 2 | kubectl apply -f -")
    assert "drain" in run.topics
    patient = doctor(f"{trtllm.base}/prometheus/metrics", "--window", "600", "--drain-after", "600", seconds="1")
    assert "drain" not in patient.topics


def test_trtllm_whose_health_generate_fails_is_told_what_that_costs(trtllm: StubEngine) -> None:
    trtllm.routes["/health_generate"] = Route(b"", 500)
    run = doctor(f"{trtllm.base}/prometheus/metrics", seconds="1")
    assert run["generate"] == (
        "/health_generate answers HTTP 500 Internal Server Error: an engine whose page holds still for the window "
        "would be stalled, with nothing to tell a long generation from a wedge"
    )


@pytest.mark.parametrize(
    ("path", "name", "body", "code", "said"),
    [
        (
            "/prometheus/metrics",
            "trtllm-request-metrics-only.prom",
            None,
            ExitCode.METRICS,
            "trtllm, but the probe cannot read its page: required metric missing from the trtllm page: "
            "trtllm_num_requests_running. trtllm-serve serves /prometheus/metrics only with return_perf_metrics: true",
        ),
        (
            "/prometheus/metrics",
            "trtllm-iter-stats-fresh.prom",
            None,
            ExitCode.METRICS,
            "trtllm, but the probe cannot read its page: required metric missing from the trtllm page: "
            "trtllm_prompt_tokens_total, trtllm_generation_tokens_total. Its token counters appear when a request "
            "first finishes; its health route decides till then.",
        ),
        (
            "/prometheus/metrics",
            "trtllm-no-iter-stats-fresh.prom",
            None,
            ExitCode.METRICS,
            "trtllm, it seems (its trtllm_ families), with none of the families the probe reads: trtllm-serve serves",
        ),
        (
            "/metrics",
            "",
            TRT_ITERATION_STATS,
            ExitCode.METRICS,
            "none: a JSON list, not a metrics page. TensorRT-LLM's /metrics is not a Prometheus page but a JSON list",
        ),
        (
            "/prometheus/metrics",
            "",
            NOT_FOUND,
            ExitCode.SCRAPE,
            "TensorRT-LLM serves its page at /prometheus/metrics, and only with return_perf_metrics: true in its "
            "config.",
        ),
    ],
    ids=["request-metrics-only", "fresh", "no-iteration-statistics-fresh", "json-metrics", "404"],
)
def test_a_trtllm_page_the_probe_cannot_read_says_which_option_it_needs(
    serve: Callable[..., StubEngine], path: str, name: str, body: bytes | None, code: int, said: str
) -> None:
    answer = (BUILT / name).read_bytes() if name else body or b""
    stub = serve({path: Route(answer, 404 if answer == NOT_FOUND else 200)})
    run = doctor(f"{stub.base}{path}")
    assert run.code == code, run.out
    assert said in run["engine"], run["engine"]
    assert "probes" not in run.topics


# --- thrashing: tokens move, nothing finishes


def thrashing(page: bytes) -> Callable[[], bytes]:
    """vLLM's real busy page with its prompt counter 1000 and its generation counter 2 higher at each
    request, and its finished requests (vllm:request_success_total) where they were: prefill far ahead of
    decoding, nothing finished."""
    prompt, generation = moving(page, "vllm:prompt_tokens_total", 1000), moving(page, "vllm:generation_tokens_total", 2)
    pattern = re.compile(rb"^vllm:generation_tokens_total\{.*$", re.MULTILINE)

    def make() -> bytes:
        moved = pattern.search(generation())
        assert moved is not None
        return pattern.sub(lambda _: moved.group(0), prompt())

    return make


def test_a_vllm_that_prefills_and_finishes_nothing_is_thrashing_and_said_not_failed(
    serve: Callable[..., StubEngine],
) -> None:
    stub = serve({"/metrics": Route(thrashing(fixture_page("vllm-0.32.0-cpu-busy.prom")))})
    run = doctor(stub.url, "--thrash-window", "5", seconds="10")
    assert run.code == ExitCode.OK, run.out
    assert run["verdicts"] == "baseline, then progressing x4, then thrashing x6 (window 120 s)"
    assert run["moved"].startswith("vllm:prompt_tokens_total (+10000), vllm:generation_tokens_total (+20)")
    assert run["last look"].endswith(
        "no request finished for 10 s while its tokens moved: works and completes nothing: page; restarted only "
        "with --fail-thrashing-after"
    )
    assert run["readiness"].startswith("ready: thrashing: 4 running, 0 waiting")
    assert run["in short"] == (
        "thrashing: no request finished for 10 s while its tokens moved. Said, not acted on: exit 0, and ready. "
        "With --fail-thrashing-after S the probe fails it (and readiness drains it) once it has thrashed S s; off by "
        "default, as a whole pool overloaded at once thrashes together, and draining every member would empty it"
    )


def test_thrashing_past_fail_thrashing_after_is_stalled_now(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(thrashing(fixture_page("vllm-0.32.0-cpu-busy.prom")))})
    run = doctor(stub.url, "--thrash-window", "5", "--fail-thrashing-after", "8", seconds="10")
    assert run.code == ExitCode.STALLED, run.out
    assert run["verdicts"] == "baseline, then progressing x4, then thrashing x3, then stalled x3 (window 120 s)"
    assert run["in short"] == (
        "stalled now: thrashing, no request finished for 10 s while its tokens moved, past --fail-thrashing-after "
        "8 s, so the probe fails it now and readiness drains it; the kubelet restarts it about 140 s after its last "
        "progress (window 120 s + period 10 s x (failureThreshold 3 - 1))"
    )
    assert run.command()[-4:] == ["--thrash-window", "5", "--fail-thrashing-after", "8"]


# --- every state an engine can be in, on the one stub engine: what the probe would do now


def _idle(stub: StubEngine) -> None:
    pass


def _progressing(stub: StubEngine) -> None:
    stub.set(running=2, generation_step=7)


def _saturated(stub: StubEngine) -> None:
    stub.set(running=4, waiting=9, generation_step=7)


def _frozen(stub: StubEngine) -> None:
    stub.set(running=4, generation=900, prompt=300)


def _paused(stub: StubEngine) -> None:
    stub.set(running=2, generation_step=7)
    stub.pause()


def _owed(stub: StubEngine) -> None:
    stub.set(waiting=3, waiting_by_reason={"capacity": 3, "deferred": 0})


SUSPECT_10 = (
    "If nothing moves, readiness takes it out of routing at 30 s (the earlier of --drain-after 30 s and the window), "
    "the probe fails it at 120 s, and the kubelet restarts it about 140 s after its last progress (window 120 s + "
    "period 10 s x (failureThreshold 3 - 1))"
)
STATES = [
    # (id, how the engine is, doctor's extra flags, exit code, verdicts, the summary)
    (
        "idle",
        _idle,
        (),
        ExitCode.OK,
        "baseline, then idle x10",
        "the probe can read and judge this engine: use the probes above",
    ),
    (
        "progressing",
        _progressing,
        (),
        ExitCode.OK,
        "baseline, then progressing x10",
        "the probe can read and judge this engine: use the probes above",
    ),
    (
        "saturated",
        _saturated,
        (),
        ExitCode.OK,
        "baseline, then saturated x10",
        "the probe can read and judge this engine: use the probes above",
    ),
    (
        "suspect",
        _frozen,
        (),
        ExitCode.OK,
        "baseline, then suspect x10",
        f"suspect: busy with no progress for 10 s. {SUSPECT_10}",
    ),
    (
        "stalled",
        _frozen,
        ("--window", "6"),
        ExitCode.STALLED,
        "baseline, then suspect x5, then stalled x5",
        "stalled now: busy with no progress for 10 s (window 6 s), so the probe fails it now; the kubelet restarts "
        "it about 26 s after its last progress (window 6 s + period 10 s x (failureThreshold 3 - 1))",
    ),
    (
        "paused",
        _paused,
        (),
        ExitCode.OK,
        "baseline, then paused x10",
        "paused: paused by its operator (/is_paused). The probe never fails a paused engine (readiness keeps it out "
        "of routing) and judges it afresh once it resumes",
    ),
    (
        "owed",
        _owed,
        (),
        ExitCode.OK,
        "baseline, then suspect x10",
        f"suspect: busy with no progress for 10 s. {SUSPECT_10}",
    ),
]


@pytest.mark.parametrize(
    ("how", "flags", "code", "verdicts", "short"), [state[1:] for state in STATES], ids=[state[0] for state in STATES]
)
def test_what_the_probe_would_do_now_in_every_state(
    how: Callable[[StubEngine], None], flags: tuple[str, ...], code: int, verdicts: str, short: str
) -> None:
    """Ten seconds of looks on the doctor's own clock: each state's verdicts, the summary that says what the
    probe would do now, and one health question per look (observe asks it; the doctor never again)."""
    assert STATES
    with StubEngine() as stub:
        how(stub)
        run = doctor(stub.url, *flags, seconds="10")
        assert run.code == code, run.out
        assert run["verdicts"] == f"{verdicts} (window {flags[1] if flags else '120'} s)"
        assert run["in short"] == short
        assert stub.count("/health") == 11
        assert stub.count("/metrics") == 11


def test_a_busy_frozen_engine_is_told_how_long_it_has_not_moved_and_the_owed_work(
    serve: Callable[..., StubEngine],
) -> None:
    with StubEngine() as stub:
        _owed(stub)
        run = doctor(stub.url, seconds="10")
    assert run["moved"] == "nothing, while the engine owed work (requests running, or waiting for capacity)"
    assert run["last look"] == (
        "suspect: 0 running, 3 waiting; no token progress for 10 s (window 120 s); 3 waiting for capacity, nothing "
        "running"
    )
    assert run["readiness"] == (
        "ready: suspect: 0 running, 3 waiting; no token progress for 10 s (window 30 s); 3 waiting for capacity, "
        "nothing running"
    )


def test_a_page_that_goes_silent_is_suspect_from_its_last_answer() -> None:
    """The page answers the first look, then nothing answers within --timeout: no numbers, and the stall
    clock runs from the last answer."""
    with StubEngine() as stub:
        _progressing(stub)

        def hang(clock: FakeClock) -> None:
            stub.route("/metrics", hang=True)

        run = doctor(stub.url, "--timeout", "0.2", seconds="3", clock=FakeClock(then=hang))
    assert run.code == ExitCode.OK, run.out
    assert run["verdicts"] == "baseline, then suspect x3 (window 120 s)"
    assert run["last look"] == (
        "suspect: scrape " + stub.url + ": no complete answer within 0.2 s; nothing answered for 3.0 s (window 120 s)"
    )
    assert run["in short"].startswith("suspect: no answer for 3.0 s. If nothing moves, readiness takes it out")


def test_a_page_too_slow_at_the_first_contact_says_so() -> None:
    with StubEngine() as stub:
        stub.route("/metrics", hang=True)
        run = doctor(stub.url, "--timeout", "0.2")
    assert run.code == ExitCode.SCRAPE, run.out
    assert run["engine"].startswith(f"unknown: scrape {stub.url}: no complete answer within 0.2 s. A busy engine")
    assert run["in short"] == (
        "no answer within --timeout 0.2 s: the probe would call it suspect, and fail it once nothing has answered "
        "for the window (120 s)"
    )


def test_include_waiting_always_makes_a_queue_owed_work_and_the_doctor_says_so() -> None:
    """A queue that never moves, with nothing running, on a page that cannot tell which requests are owed:
    not judged by default, owed work with --include-waiting=always (the detector's rule, the doctor's words)."""
    with StubEngine(waiting=3) as stub:
        plain = doctor(stub.url, seconds="3")
        always = doctor(stub.url, "--include-waiting=always", seconds="3")
    assert (plain["verdicts"], plain["moved"]) == (
        "baseline, then idle x3 (window 120 s)",
        "nothing: nothing ran, so nothing had to move. Look again while it serves requests.",
    )
    assert (always["verdicts"], always["moved"]) == (
        "baseline, then suspect x3 (window 120 s)",
        "nothing, while the engine owed work (requests running, or waiting for capacity)",
    )
    assert always["in short"].startswith("suspect: busy with no progress for 3.0 s.")


def test_a_heartbeat_that_appears_is_progress_and_is_said_to_have_moved() -> None:
    """The KV-cache gauge shows up on the page at the second look: a change the detector counts as life."""
    with StubEngine(running=2) as stub:

        def appear(clock: FakeClock) -> None:
            stub.set(kv_cache=0.25)

        run = doctor(stub.url, seconds="1", clock=FakeClock(then=appear))
    assert run["verdicts"] == "baseline, then progressing (window 120 s)"
    assert run["moved"] == "vllm:kv_cache_usage_perc; not vllm:prompt_tokens_total, vllm:generation_tokens_total"
    assert run["in short"] == "the probe can read and judge this engine: use the probes above"


def test_the_canary_and_the_server_load_are_asked_as_the_probe_asks_them() -> None:
    """--canary and --server-load are look options like any other: an idle-looking engine is asked its
    load and sent the canary (once per --canary-interval), and the probes carry both."""
    with StubEngine() as stub:
        stub.route("/load", b'{"server_load": 0}')
        run = doctor(stub.url, "--canary", "--canary-interval", "600", "--server-load", seconds="3")
        assert stub.count("/v1/completions") == 1
    assert run["verdicts"] == "baseline, then idle x3 (window 120 s)"
    assert run["last look"] == "idle: 0 running, 0 waiting"
    assert run.command()[-4:] == ["--canary", "--canary-interval", "600", "--server-load"]
    assert run.probes()["livenessProbe"]["timeoutSeconds"] == 9  # the page, the load, the canary, /is_paused, 2
    assert run["inject"] == (
        "stallprobe inject -f your-deployment.yaml --canary --canary-interval 600 --server-load --timeout 2 | "
        "kubectl apply -f -"
    )


def test_drain_after_not_shorter_than_the_window_is_said_once_on_stderr() -> None:
    with StubEngine() as stub:
        run = doctor(stub.url, "--window", "20", "--drain-after", "20", seconds="2")
        quiet = doctor(stub.url, "--window", "20", "--drain-after", "10", seconds="2")
    assert run.err == (
        "stallprobe doctor: --drain-after 20 s is not shorter than --window 20 s: a wedged engine keeps its traffic "
        "until it is stalled, so the load balancer no longer drains it before the restart\n"
    )
    assert quiet.err == ""
    with StubEngine() as stub:
        default = doctor(stub.url, "--window", "20", seconds="1")
    assert default.err.startswith("stallprobe doctor: --drain-after 30 s is not shorter than --window 20 s")
    assert default.probes()["readinessProbe"]["exec"]["command"][-2:] == ["--drain-after", "30"]  # as inject
    assert run.probes()["readinessProbe"]["exec"]["command"][-2:] == ["--drain-after", "20"]


# --- the probes are inject's


def deployment(engine: str, port: int) -> str:
    """A Deployment of one engine serving on `port`, as a person writes it (no probes of its own)."""
    container: dict[str, Any]
    if engine == "vllm":
        container = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model", "m", "--port", str(port)]}
    else:
        container = {
            "name": "llama",
            "image": "ghcr.io/ggml-org/llama.cpp:full",  # the one with python3; tools.sh runs the server
            "args": ["--server", "-m", "/models/m.gguf", "--port", str(port), "--metrics"],
        }
    labels = {"app": "llm"}
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("engine", "flags"),
    [
        ("vllm", ()),
        ("vllm", ("--window", "60", "--saturation", "4", "--include-waiting=always", "--drain-after", "20")),
        ("vllm", ("--progress-metric", "vllm:kv_cache_usage_perc", "--canary", "--server-load", "--timeout", "4")),
        ("llamacpp", ("--window", "300", "--drain-after", "45")),
    ],
    ids=["plain", "judging", "asking", "llamacpp-loopback"],
)
def test_the_printed_probes_are_what_inject_writes_for_the_same_engine(
    engine: str, flags: tuple[str, ...], tmp_path: Path
) -> None:
    """The printed `stallprobe inject` command, run on a Deployment of that engine on that port, writes the
    probes the doctor printed, field for field."""
    with StubEngine(engine) as stub:
        run = doctor(stub.url, *flags, seconds="0.2")
        port = stub.port
    assert run.code == ExitCode.OK, run.out
    printed = run.probes()
    command = run["inject"].removesuffix(" | kubectl apply -f -").split()
    assert command[:4] == ["stallprobe", "inject", "-f", "your-deployment.yaml"]
    manifest = tmp_path / "deploy.json"
    manifest.write_text(deployment(engine, port))
    result = subprocess.run(
        [sys.executable, "-m", "stallprobe", "inject", "-f", str(manifest), "--pyz", os.devnull, *command[4:]],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    assert result.returncode == ExitCode.OK, result.stderr
    written = json.loads(result.stdout)["items"][0]["spec"]["template"]["spec"]["containers"][0]
    probes = {key: written[key] for key in ("livenessProbe", "startupProbe", "readinessProbe") if key in written}
    assert printed == probes
    assert "readinessProbe" in printed  # inject writes it unless told not to


# --- API keys

# What the doctor says of an engine whose page the probe cannot read: its every run falls back to the
# engine's health route.
UNREADABLE = (
    "the probe cannot judge this engine: every run falls back to its health route (exit 0, unjudged, while "
    "that answers 2xx; exit {code} when it does not, or with --strict), no more than an httpGet of it: "
    "mend what is said above before adopting it"
)


def test_a_page_that_wants_a_key_says_how_to_give_it(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))}, key="sk-doctor")
    run = doctor(stub.url)
    assert run.code == ExitCode.SCRAPE, run.out
    assert run["engine"] == f"unknown: {stub.url} answered HTTP 401 Unauthorized"
    assert run["api key"].startswith("needed: the page wants one; give it with --api-key-file PATH")
    assert run["in short"] == UNREADABLE.format(code=3)
    assert "sk-doctor" not in run.out
    assert stub.count("/metrics") == 1  # it did not go on looking


def test_a_key_file_that_works_goes_into_the_printed_command(
    serve: Callable[..., StubEngine], archive: Path, tmp_path: Path
) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))}, key="sk-doctor")
    key_file = tmp_path / "key"
    key_file.write_text("sk-doctor\n")
    run = doctor(stub.url, "--api-key-file", str(key_file), seconds="0.2")
    assert run.code == ExitCode.OK, run.out
    assert run["api key"] == f"needed for the page, and the one given (--api-key-file {key_file}) works"
    command = run.command()
    assert command[-2:] == ["--api-key-file", str(key_file)]
    assert "Mount the key file at that path in the container." in run["probes"]
    assert f"--api-key-file {key_file}" in run["inject"]
    assert "sk-doctor" not in run.out
    assert run_printed(command, archive, tmp_path)[0] == ExitCode.OK


def test_the_engines_own_key_variable_is_read_as_the_probe_reads_it(
    serve: Callable[..., StubEngine], archive: Path, tmp_path: Path
) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))}, key="sk-doctor")
    run = doctor(stub.url, env={"LLAMA_API_KEY": "sk-doctor"}, seconds="0.2")
    assert run.code == ExitCode.OK, run.out
    assert run["api key"] == "needed for the page, and the one given (LLAMA_API_KEY) works"
    command = run.command()
    assert "--api-key-file" not in command
    assert "The probe reads LLAMA_API_KEY in the engine's container, as the engine does." in run["probes"]
    assert run_printed(command, archive, tmp_path, env={"LLAMA_API_KEY": "sk-doctor"})[0] == ExitCode.OK


def test_a_key_the_engine_refuses_is_said_so(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))}, key="sk-doctor")
    run = doctor(stub.url, env={"VLLM_API_KEY": "sk-wrong"})
    assert run.code == ExitCode.SCRAPE, run.out
    assert run["api key"] == "refused: the engine does not take the key from VLLM_API_KEY"


def test_a_key_the_page_does_not_need_stays_out_of_the_command(serve: Callable[..., StubEngine]) -> None:
    """vLLM's --api-key guards its /v1 routes, not /metrics."""
    stub = serve({"/metrics": Route(fixture_page("vllm-0.32.0-cpu-busy.prom"))})
    run = doctor(stub.url, env={"VLLM_API_KEY": "sk-doctor"}, seconds="0.2")
    assert run["api key"] == "not needed for the page (the one given, VLLM_API_KEY, is sent anyway)"
    assert "--api-key-file" not in run.command()


# --- no engine the probe can read


def test_nothing_listening(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago, and is closed now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = doctor(f"http://127.0.0.1:{port}/metrics")
    assert run.code == ExitCode.SCRAPE, run.out
    assert run["engine"] == (
        f"none: nothing listens on 127.0.0.1:{port} (connection refused). Is the engine up, and is that its "
        "port? (by default: vllm 8000, sglang 30000, llamacpp 8080, lmdeploy 23333, trtllm 8000)"
    )
    assert "probes" not in run.topics
    # No server, no health route to fall back on: every run of the probe would fail.
    assert run["in short"] == (
        "nothing answers there: every run would exit 3, a failed probe to the kubelet, which restarts the "
        "container after failureThreshold of them: mend what is said above before adopting it"
    )


@pytest.mark.parametrize(
    ("route", "code", "said"),
    [
        (Route(NOT_FOUND, 404), ExitCode.SCRAPE, "SGLang serves /metrics only when started with --enable-metrics."),
        (
            # llama.cpp's server without --metrics (tools/server: "This server does not support metrics endpoint.")
            Route(b'{"error":{"code":501,"message":"This server does not support metrics endpoint."}}', 501),
            ExitCode.SCRAPE,
            "Start llama-server with --metrics (or LLAMA_ARG_ENDPOINT_METRICS=1).",
        ),
        (
            Route(b"<!doctype html><html><head><title>Open WebUI</title></head></html>", content_type="text/html"),
            ExitCode.METRICS,
            "none: not a metrics page, the server sent HTML.",
        ),
        (
            Route(b"up 1\n"),
            ExitCode.METRICS,
            "The probe reads vllm, sglang, llamacpp, lmdeploy, trtllm; for another engine, name its families",
        ),
    ],
    ids=["404", "llamacpp_501", "html", "unknown"],
)
def test_a_url_that_is_no_engine_page_says_why(
    serve: Callable[..., StubEngine], route: Route, code: int, said: str
) -> None:
    stub = serve({"/metrics": route})
    run = doctor(stub.url)
    assert run.code == code, run.out
    assert said in run["engine"]
    assert run["in short"] == UNREADABLE.format(code=code)
    assert stub.count("/metrics") == 1
    assert "probes" not in run.topics


def test_an_engine_named_on_a_page_that_is_not_its_says_why_at_the_first_look(serve: Callable[..., StubEngine]) -> None:
    """--engine skips the choice at the door, so the first look's reading is what finds the page wrong."""
    stub = serve({"/metrics": Route(b"<!doctype html><html></html>", content_type="text/html")})
    run = doctor(stub.url, "--engine", "vllm")
    assert (run.code, run["engine"].split(".")[0]) == (
        ExitCode.METRICS,
        "none: not a metrics page, the server sent HTML",
    )
    assert "probes" not in run.topics


@pytest.mark.parametrize("engine", [(), ("--engine", "vllm")], ids=["auto", "named"])
def test_a_vllm_started_with_disable_log_stats_publishes_nothing_to_read(
    serve: Callable[..., StubEngine], engine: tuple[str, ...]
) -> None:
    """vLLM with --disable-log-stats makes no stat logger: its page keeps the python, process and http_*
    families of its API server and has no vllm: family. Here: the real page of 0.32 without them."""
    page = fixture_page("vllm-0.32.0-cpu-busy.prom")
    lines = page.decode().splitlines(keepends=True)
    bare = "".join(line for line in lines if "vllm:" not in line).encode()
    assert b"http_request_duration_highr_seconds" in bare
    assert b"python_gc" in bare
    stub = serve({"/metrics": Route(bare)})
    run = doctor(stub.url, *engine)
    assert run.code == ExitCode.METRICS, run.out
    assert run["engine"] == (
        "vLLM's API server, it seems (its http_* families), with no vllm: family on the page: vLLM started "
        "with --disable-log-stats publishes none, so the probe could only fail. Start vLLM without "
        "--disable-log-stats."
    )


def test_a_page_two_engines_fit_needs_engine_and_the_command_carries_it(
    serve: Callable[..., StubEngine], archive: Path, tmp_path: Path
) -> None:
    both = fixture_page("vllm-0.32.0-cpu-busy.prom") + fixture_page("llamacpp-server-11434-local.prom")
    stub = serve({"/metrics": Route(both)})
    run = doctor(stub.url)
    assert run.code == ExitCode.METRICS, run.out
    assert run["engine"] == "none: the page fits vllm and llamacpp: pass --engine to choose"
    run = doctor(stub.url, "--engine", "llamacpp", seconds="0.2")
    assert run.code == ExitCode.OK, run.out
    assert run["engine"] == "llamacpp (--engine llamacpp), one engine on the page"
    assert run.command()[-2:] == ["--engine", "llamacpp"]
    assert "inject -f your-deployment.yaml --engine llamacpp" in run["inject"]
    code, line = run_printed(run.command(), archive, tmp_path)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "baseline: 0 running, 0 waiting")


def test_an_engine_named_that_auto_finds_anyway_is_left_out_of_the_inject_command(
    serve: Callable[..., StubEngine],
) -> None:
    """inject reads the engine off the container and writes it into the probe, as the doctor prints it."""
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))})
    run = doctor(stub.url, "--engine", "llamacpp", seconds="0.2")
    assert "--engine" not in run["inject"]
    assert run.command()[-2:] == ["--engine", "llamacpp"]


# --- the command itself


def test_the_probes_environment_is_read_and_carried_into_the_command(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))})
    run = doctor(stub.url, env={"STALLPROBE_WINDOW": "60", "STALLPROBE_SATURATION": "4"}, seconds="0.2")
    assert run["verdicts"] == "baseline, then idle (window 60 s)"
    flags = ["--window", "60", "--timeout", "2", "--engine", "llamacpp", "--saturation", "4"]
    assert run.command()[4:] == ["--url", stub.url, *flags]
    assert "--saturation 4 --window 60 --timeout 2 |" in run["inject"]


def test_a_closed_stdout_is_exit_7_without_a_traceback(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))})
    read, write = os.pipe()
    os.close(read)  # `| head -1` that has gone: every write fails
    try:
        result = subprocess.run(
            [sys.executable, "-m", "stallprobe", "doctor", "--url", stub.url, "--seconds", "0.2"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=clean_env(),
            check=False,
        )
    finally:
        os.close(write)
    assert result.returncode == ExitCode.OUTPUT
    assert result.stderr == "error: stdout was closed before the report was whole\n"


def test_head_1_gets_the_first_line_and_the_doctor_exits_7(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))})
    command = f"{sys.executable} -m stallprobe doctor --url {stub.url} --seconds 0.2 | head -1; echo ${{PIPESTATUS[0]}}"
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, env=clean_env(), check=False
    )
    assert result.stdout == f"stallprobe doctor: reading {stub.url} for 0.2 s, 2 looks\n7\n"
    assert "Traceback" not in result.stderr


def test_ctrl_c_during_the_looks_reports_what_was_seen(serve: Callable[..., StubEngine]) -> None:
    """Ctrl-C while the doctor waits for its second look: the first is whole, and reported."""
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))})

    def interrupt(clock: FakeClock) -> None:
        raise KeyboardInterrupt

    run = doctor(stub.url, seconds="60", clock=FakeClock(then=interrupt))
    assert run.code == ExitCode.OK, run.out
    assert re.search(r"^stopped: +interrupted after 1 looks$", run.out, re.MULTILINE), run.out
    assert re.search(r"^verdicts: +baseline \(window 120 s\)$", run.out, re.MULTILINE), run.out
    assert stub.count("/metrics") == 1


def test_ctrl_c_before_the_first_look_is_130(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))})

    class Interrupted(FakeClock):
        def __call__(self) -> float:
            raise KeyboardInterrupt

    run = doctor(stub.url, clock=Interrupted())
    assert (run.code, run.err) == (ExitCode.INTERRUPTED, "stallprobe doctor: interrupted\n")
    assert "interrupted before its first look" in EXIT_TABLE[ExitCode.INTERRUPTED]["doctor"]


# --- flags, help


def test_usage_errors_are_one_line_and_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stallprobe", "doctor", "--seconds", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    assert result.returncode == ExitCode.USAGE
    assert result.stdout == "error: --seconds must be a number > 0 (got '0')\n"


def test_help_lists_its_options_and_exit_codes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stallprobe", "doctor", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    assert result.returncode == ExitCode.OK
    assert result.stdout == help_text() + "\n"
    assert result.stdout.startswith("usage: stallprobe doctor")
    for option in DOCTOR:
        assert re.search(rf"^  {option.flag}[ \[]", result.stdout, re.MULTILINE), option.flag
    rows = {code: meanings["doctor"] for code, meanings in EXIT_TABLE.items() if "doctor" in meanings}
    assert len(rows) >= 5
    for code, meaning in rows.items():
        assert re.search(rf"^  {code} +{re.escape(meaning)}$", result.stdout, re.MULTILINE), code


def test_seconds_takes_fractions_and_the_key_is_read_as_the_probe_reads_it() -> None:
    config = configure(["--seconds", "0.25"], {"VLLM_API_KEY": "sk-x"})
    assert isinstance(config, DoctorConfig)
    assert (config.seconds, config.key, config.key_from) == (0.25, "sk-x", "VLLM_API_KEY")


def test_the_output_quoted_in_the_kubernetes_page_is_what_it_prints() -> None:
    """docs/kubernetes.md quotes a run on a simulated vLLM with a deep queue at port 8002: the same engine
    on the stub, its port read as 8002, gives the same lines."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    found = re.search(r"```\n\$ stallprobe doctor --url (\S+) --seconds 3\n(.*?)```", text, re.DOTALL)
    assert found, "docs/kubernetes.md quotes no doctor run"
    url, quoted = found.groups()
    with StubEngine(running=12, waiting=99, generation=48210, prompt=91544) as stub:
        stub.set(generation_step=28, waiting_by_reason={"capacity": 99, "deferred": 0}, kv_cache=0.91)
        out, err = io.StringIO(), io.StringIO()
        clock = FakeClock()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["--url", stub.url, "--seconds", "3"], {}, clock=clock, sleep=clock.sleep)
        printed = out.getvalue().replace(stub.url, url).replace(f"port: {stub.port}\n", "port: 8002\n")
    assert (code, err.getvalue()) == (ExitCode.OK, "")
    assert printed == quoted
