"""`stallprobe doctor`, through the real command (`python -m stallprobe doctor ...`) against the suite's stub
engine on loopback (tests/stubengine.py) serving real pages (tests/fixtures/real, tests/fixtures/built):
what it says of each engine, its exit code, and that the probe command it prints works against the same
engine. --seconds is a fraction of a second or two, so each run is two to three looks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import REPO, fixture_page, vllm_page
from stallprobe.doctor import DoctorConfig, configure, help_text
from stallprobe.errors import EXIT_TABLE, ExitCode
from stallprobe.options import DOCTOR
from stubengine import Route, StubEngine

BUILT = REPO / "tests" / "fixtures" / "built"
# The engines' answers on their other routes, as they give them: vLLM 0.32 (entrypoints/serve), SGLang
# 0.5.23's /v1/loads (managers/load_snapshot.py: one snapshot per data-parallel rank), llama.cpp's /health.
NOT_FOUND = b'{"detail":"Not Found"}'
SGLANG_LOADS = json.dumps(
    {"loads": [{"dp_rank": 0, "num_running_reqs": 162, "num_waiting_reqs": 2826, "queues": {"waiting": 2826}}]}
).encode()
LLAMACPP_HEALTH = b'{"status":"ok"}'


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


def moving(page: bytes, family: str, step: float) -> Callable[[], bytes]:
    """The page, with every series of `family` `step` higher at each request: an engine at work. Only
    those numbers change; the rest of the real page stays as it was captured."""
    count = [0]
    pattern = re.compile(rb"^(" + re.escape(family.encode()) + rb"(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)

    def make() -> bytes:
        count[0] += 1
        return pattern.sub(lambda m: m.group(1) + b" " + repr(float(m.group(2)) + step * count[0]).encode(), page)

    return make


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STALLPROBE_", "VLLM_", "LLAMA_"))}
    return {**env, **extra}


class Run:
    """One run of the doctor: its exit code, its output, and the output's topics (label -> its text,
    the wrapped lines joined)."""

    def __init__(self, result: subprocess.CompletedProcess[str]) -> None:
        self.code = result.returncode
        self.out = result.stdout
        self.err = result.stderr
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

    def command(self) -> list[str]:
        """The exec command of the liveness stanza it printed."""
        found = re.search(r"^\s+command: (\[.*\])$", self.out, re.MULTILINE)
        assert found, self.out
        command: list[str] = json.loads(found.group(1))
        return command


def doctor(url: str, *args: str, env: dict[str, str] | None = None, seconds: str = "1") -> Run:
    result = subprocess.run(
        [sys.executable, "-m", "stallprobe", "doctor", "--url", url, "--seconds", seconds, "--timeout", "2", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(**(env or {})),
        check=False,
    )
    assert "Traceback" not in result.stderr
    return Run(result)


def run_printed(command: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The printed command, word for word, with this interpreter first on PATH (its `python3` has
    stallprobe installed, as the engine's image would) and the state file under tmp_path."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(PATH=path, TMPDIR=str(tmp_path), **(env or {})),
        check=False,
    )
    assert result.stderr == ""
    return result.returncode, result.stdout.strip()


# --- engines it can read


def test_a_busy_vllm_that_moves_is_fit_and_its_printed_probe_runs(
    serve: Callable[..., StubEngine], tmp_path: Path
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
    assert run["health"] == "/health answers 200: readiness (--ready) can use it"
    assert run["verdicts"] == "baseline, then progressing x2 (window 120 s)"
    last = r"progressing: 4 running, 0 waiting; \+0 prompt and \+4 generation tokens in \d\.\d s"
    assert re.fullmatch(last, run["last look"])
    assert run["readiness"].startswith("ready")
    assert run["in short"] == "the probe can read and judge this engine: use the command above"
    command = run.command()
    assert command == [
        "python3",
        "-c",
        "from stallprobe.cli import run; run()",
        "--url",
        stub.url,
        "--window",
        "120",
        "--timeout",
        "2",
        "--server-load",
    ]
    assert "timeoutSeconds: 7" in run.out  # 2 s for the scrape, 2 s for /load, 1 s for /is_paused, 2 s to start
    assert "stallprobe inject -f your-deployment.yaml --server-load --timeout 2 | kubectl apply -f -" in run["inject"]
    code, line = run_printed(command, tmp_path)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "baseline: 4 running, 0 waiting")
    code, line = run_printed(command, tmp_path)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "progressing: 4 running, 0 waiting")


def test_an_idle_vllm_says_nothing_had_to_move_and_what_load_cannot_tell(
    serve: Callable[..., StubEngine], tmp_path: Path
) -> None:
    """The multiprocess page declares the running and waiting gauges and gives them no samples when idle."""
    stub = serve(
        {
            "/metrics": Route(fixture_page("vllm-0.32.0-cpu-multiprocess-idle.prom")),
            "/health": Route(b""),
            "/load": Route(b'{"server_load": 0}'),
        }
    )
    run = doctor(stub.url)
    assert run.code == ExitCode.OK, run.out
    assert "vllm:kv_cache_usage_perc (declared, no samples yet)" in run["progress"]
    assert run["moved"] == "nothing: nothing ran, so nothing had to move. Look again while it serves requests."
    assert run["load"].startswith("/load said 0, and nothing ran: vLLM counts requests only with")
    assert run["verdicts"] == "baseline, then idle (window 120 s)"
    assert run["last look"] == "idle: 0 running, 0 waiting"
    command = run.command()
    assert "--server-load" not in command
    assert "--server-load" not in run["inject"]
    assert "timeoutSeconds: 5" in run.out
    code, line = run_printed(command, tmp_path)
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


def test_llamacpp_idle(serve: Callable[..., StubEngine], tmp_path: Path) -> None:
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
    assert run_printed(run.command(), tmp_path)[0] == ExitCode.OK


def test_sglang_under_load_is_saturated_and_its_loads_route_answers(
    serve: Callable[..., StubEngine], tmp_path: Path
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
    assert "--engine" not in run.command()
    assert run_printed(run.command(), tmp_path)[0] == ExitCode.OK


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


def test_a_busy_engine_frozen_past_the_window_is_stalled_now(serve: Callable[..., StubEngine], tmp_path: Path) -> None:
    """The real page served unchanged: four requests running and nothing moving. With dev mode on,
    /is_paused answers false, so it is not paused either."""
    stub = serve(
        {"/metrics": Route(fixture_page("vllm-0.32.0-cpu-busy.prom")), "/is_paused": Route(b'{"is_paused":false}')}
    )
    run = doctor(stub.url, "--window", "0.5", seconds="1")
    assert run.code == ExitCode.STALLED, run.out
    assert run["moved"] == "nothing, while the engine owed work (requests running, or waiting for capacity)"
    assert run["verdicts"] == "baseline, then stalled (window 0.5 s)"
    assert re.fullmatch(
        r"stalled: 4 running, 0 waiting; no token progress for 1\.\d s \(window 0\.5 s\)", run["last look"]
    )
    assert run["pause"].startswith("/is_paused answers (VLLM_SERVER_DEV_MODE=1): the probe asks it")
    assert run["readiness"].startswith("ready")  # stuck for 1 s, under the 30 s drain window
    assert run["in short"] == "stalled now: busy with no progress for the window, so the probe would fail it"
    assert run.command()[5:7] == ["--window", "0.5"]


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


# --- API keys


def test_a_page_that_wants_a_key_says_how_to_give_it(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))}, key="sk-doctor")
    run = doctor(stub.url)
    assert run.code == ExitCode.SCRAPE, run.out
    assert run["engine"] == f"unknown: {stub.url} answered HTTP 401 Unauthorized"
    assert run["api key"].startswith("needed: the page wants one; give it with --api-key-file PATH")
    assert "sk-doctor" not in run.out
    assert stub.count("/metrics") == 1  # it did not go on looking


def test_a_key_file_that_works_goes_into_the_printed_command(serve: Callable[..., StubEngine], tmp_path: Path) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))}, key="sk-doctor")
    key_file = tmp_path / "key"
    key_file.write_text("sk-doctor\n")
    run = doctor(stub.url, "--api-key-file", str(key_file), seconds="0.2")
    assert run.code == ExitCode.OK, run.out
    assert run["api key"] == f"needed for the page, and the one given (--api-key-file {key_file}) works"
    command = run.command()
    assert command[-2:] == ["--api-key-file", str(key_file)]
    assert "Mount the key file at that path in the container." in run["probe"]
    assert f"--api-key-file {key_file}" in run["inject"]
    assert "sk-doctor" not in run.out
    assert run_printed(command, tmp_path)[0] == ExitCode.OK


def test_the_engines_own_key_variable_is_read_as_the_probe_reads_it(
    serve: Callable[..., StubEngine], tmp_path: Path
) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))}, key="sk-doctor")
    run = doctor(stub.url, env={"LLAMA_API_KEY": "sk-doctor"}, seconds="0.2")
    assert run.code == ExitCode.OK, run.out
    assert run["api key"] == "needed for the page, and the one given (LLAMA_API_KEY) works"
    command = run.command()
    assert "--api-key-file" not in command
    assert "The probe reads LLAMA_API_KEY in the engine's container, as the engine does." in run["probe"]
    assert run_printed(command, tmp_path, env={"LLAMA_API_KEY": "sk-doctor"})[0] == ExitCode.OK


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
        "port? (by default: vllm 8000, sglang 30000, llamacpp 8080)"
    )
    assert "probe" not in run.topics


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
            "The probe reads vLLM, SGLang and llama.cpp's server; for another engine, name its families",
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
    assert stub.count("/metrics") == 1
    assert "probe" not in run.topics


def test_an_engine_named_on_a_page_that_is_not_its_says_why_at_the_first_look(serve: Callable[..., StubEngine]) -> None:
    """--engine skips the choice at the door, so the first look's reading is what finds the page wrong."""
    stub = serve({"/metrics": Route(b"<!doctype html><html></html>", content_type="text/html")})
    run = doctor(stub.url, "--engine", "vllm")
    assert (run.code, run["engine"].split(".")[0]) == (
        ExitCode.METRICS,
        "none: not a metrics page, the server sent HTML",
    )
    assert "probe" not in run.topics


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
    serve: Callable[..., StubEngine], tmp_path: Path
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
    code, line = run_printed(run.command(), tmp_path)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "baseline: 0 running, 0 waiting")


def test_an_engine_named_that_auto_finds_anyway_is_left_out_of_the_command(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))})
    run = doctor(stub.url, "--engine", "llamacpp", seconds="0.2")
    assert "--engine" not in run.command()


# --- the command itself


def test_the_probes_environment_is_read_and_carried_into_the_command(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))})
    run = doctor(stub.url, env={"STALLPROBE_WINDOW": "60", "STALLPROBE_SATURATION": "4"}, seconds="0.2")
    assert run["verdicts"] == "baseline, then idle (window 60 s)"
    assert run.command()[5:] == ["--window", "60", "--timeout", "2", "--saturation", "4"]
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
    command = f"{sys.executable} -m stallprobe doctor --url {stub.url} --seconds 1 | head -1; echo ${{PIPESTATUS[0]}}"
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, env=clean_env(), check=False
    )
    assert result.stdout == f"stallprobe doctor: reading {stub.url} for 1.0 s, 2 looks\n7\n"
    assert "Traceback" not in result.stderr


def test_ctrl_c_during_the_looks_reports_what_was_seen(serve: Callable[..., StubEngine]) -> None:
    stub = serve({"/metrics": Route(fixture_page("llamacpp-server-11434-local.prom"))})
    process = subprocess.Popen(
        [sys.executable, "-m", "stallprobe", "doctor", "--url", stub.url, "--seconds", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        deadline = time.monotonic() + 30
        # The door, the first look, and the second begun: the first is whole.
        while stub.count("/metrics") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == ExitCode.OK, out
    assert "Traceback" not in err
    assert re.search(r"^stopped: +interrupted after [12] looks$", out, re.MULTILINE), out
    assert re.search(r"^verdicts: +baseline(, then idle)? \(window 120 s\)$", out, re.MULTILINE), out


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
    for code, meanings in EXIT_TABLE.items():
        if "doctor" in meanings:
            assert re.search(rf"^  {code} +{re.escape(meanings['doctor'])}$", result.stdout, re.MULTILINE), code


def test_seconds_takes_fractions_and_the_key_is_read_as_the_probe_reads_it() -> None:
    config = configure(["--seconds", "0.25"], {"VLLM_API_KEY": "sk-x"})
    assert isinstance(config, DoctorConfig)
    assert (config.seconds, config.key, config.key_from) == (0.25, "sk-x", "VLLM_API_KEY")
