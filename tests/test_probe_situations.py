"""The situations real engines are in, through the real command against a stub engine on loopback: a
slow /metrics, a paused engine, requests hung at an engine that looks idle (the canary, the server's
load), and routes that want an API key. Time passes by rewinding the state file, never by sleeping."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import FIXTURES, fixture_page, load_states, probe_line, rewind, vllm_page
from stallprobe.errors import ExitCode
from stallprobe.statefile import read_boot_id
from stubengine import Route, StubEngine

# vLLM's answers, as 0.32 gives them (entrypoints/serve, entrypoints/rl/online).
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]}).encode()
COMPLETION = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "!"}]}).encode()
WINDOW = 120.0


def frozen_for(line: str) -> float:
    """How long a line says nothing moved: the time rewound, plus what the runs in between took."""
    match = re.search(r"no token progress for ([\d.]+) s", line)
    assert match, line
    return float(match.group(1))


@pytest.fixture
def stub() -> Iterator[StubEngine]:
    with StubEngine(generation=10, prompt=10) as engine:
        yield engine


# --- a slow /metrics is not a wedge


def test_a_busy_engine_whose_metrics_hold_past_the_deadline_is_suspect_until_the_window(
    stub: StubEngine, tmp_path: Path
) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50))
    assert probe_line(stub.url, state)[0] == ExitCode.OK  # baseline
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50), hang=True)
    for _ in range(3):
        code, line = probe_line(stub.url, state)
        assert code == ExitCode.OK, line
        assert line.startswith(f"suspect: scrape {stub.url}: no complete answer within 1 s; nothing answered for ")
    rewind(state, WINDOW)
    code, line = probe_line(stub.url, state)
    assert (code, line.split(";")[0]) == (
        ExitCode.STALLED,
        f"stalled: scrape {stub.url}: no complete answer within 1 s",
    )
    stub.routes["/metrics"] = Route(vllm_page(4, 110, 50))  # it answers, and it moved: alive
    code, line = probe_line(stub.url, state)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "progressing: 4 running, 0 waiting")


# --- paused on purpose: never restarted


def test_a_pause_that_only_is_paused_tells_is_paused_not_stalled(stub: StubEngine, tmp_path: Path) -> None:
    """vLLM's /pause?mode=keep freezes the page with requests running (a real page of it is a fixture):
    only GET /is_paused tells, and it is asked only when the engine would otherwise be suspect."""
    state = tmp_path / "probe.state"
    stub.routes["/metrics"] = Route(fixture_page("vllm-0.32.0-cpu-paused-keep.prom"))
    assert probe_line(stub.url, state)[0] == ExitCode.OK
    assert stub.count("/is_paused") == 0  # a baseline asks nothing
    stub.routes["/is_paused"] = Route(b'{"is_paused": true}')
    rewind(state, WINDOW * 3)
    code, line = probe_line(stub.url, state)
    assert (code, line) == (
        ExitCode.OK,
        "paused: 4 running, 0 waiting; paused by its operator (/is_paused), "
        "paused for 0.0 s: not judged until it resumes",
    )
    rewind(state, WINDOW * 3)
    code, line = probe_line(stub.url, state)
    assert (code, line) == (
        ExitCode.OK,
        "paused: 4 running, 0 waiting; paused by its operator (/is_paused), "
        "paused for 6m00s: not judged until it resumes",
    )
    # Resumed and still frozen: the clock starts afresh, from the first run after the pause.
    stub.routes["/is_paused"] = Route(b'{"is_paused": false}')
    code, line = probe_line(stub.url, state)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "suspect: 4 running, 0 waiting")
    assert "no token progress for 0." in line


@pytest.mark.parametrize(
    ("route", "why"),
    [
        (None, "the route is absent (404): not in dev mode"),
        (Route(b'{"is_paused": true}', hang=True), "no answer within its deadline: a wedged core never answers"),
        (Route(b"<html>paused</html>"), "not JSON"),
        (Route(b'{"is_paused": "yes"}'), "not the answer vLLM gives"),
        (Route(b'{"is_paused": true}', status=500), "an error"),
    ],
    ids=["absent", "hung", "html", "not_true", "error"],
)
def test_no_clear_answer_from_is_paused_is_never_paused(
    stub: StubEngine, tmp_path: Path, route: Route | None, why: str
) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50))
    if route is not None:
        stub.routes["/is_paused"] = route
    probe_line(stub.url, state)
    rewind(state, WINDOW)
    started = time.monotonic()
    code, line = probe_line(stub.url, state)
    assert (code, line.split(":")[0]) == (ExitCode.STALLED, "stalled"), why
    assert stub.count("/is_paused") == 1
    assert time.monotonic() - started < 20  # the question has its own deadline (1 s)


def test_an_engine_asleep_is_paused_from_its_page_alone(stub: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    asleep = vllm_page(4, 100, 50) + (
        b'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0\n'
        b'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 1.0\n'
    )
    stub.routes["/metrics"] = Route(asleep)
    for paused_for in ("0.0 s", "4m00s", "8m00s"):
        code, line = probe_line(stub.url, state)
        assert (code, line) == (
            ExitCode.OK,
            f"paused: 4 running, 0 waiting; asleep (sleep mode), paused for {paused_for}: not judged until it resumes",
        )
        rewind(state, WINDOW * 2)
    assert stub.count("/is_paused") == 0  # the page said it: nothing more to ask


def test_paused_in_json(stub: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50))
    stub.routes["/is_paused"] = Route(b'{"is_paused": true}')
    probe_line(stub.url, state)
    rewind(state, 30)
    code, line = probe_line(stub.url, state, "--json")
    fields = json.loads(line)
    assert (code, fields["verdict"], fields["paused"]) == (0, "paused", "paused by its operator (/is_paused)")
    assert fields["paused_for"] == 0


# --- requests hung at an engine that looks idle


def test_a_healthy_idle_engine_answers_the_canary_and_gets_few(stub: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/v1/models"] = Route(MODELS)
    stub.routes["/v1/completions"] = Route(COMPLETION)
    assert probe_line(stub.url, state, "--canary")[1].startswith("baseline: ")
    code, line = probe_line(stub.url, state, "--canary")
    assert code == ExitCode.OK
    assert line.startswith("idle: 0 running, 0 waiting; the canary was answered in ")
    for _ in range(3):  # within --canary-interval: no second canary
        assert probe_line(stub.url, state, "--canary") == (ExitCode.OK, "idle: 0 running, 0 waiting")
    assert stub.count("/v1/completions") == 1
    (canary,) = stub.received("/v1/completions")
    assert canary.method == "POST"
    rewind(state, 601)  # the default interval: 10 minutes
    assert probe_line(stub.url, state, "--canary")[1].startswith(
        "idle: 0 running, 0 waiting; the canary was answered in "
    )
    assert stub.count("/v1/completions") == 2


def test_requests_hung_at_an_idle_looking_engine_are_stalled_with_the_canary(stub: StubEngine, tmp_path: Path) -> None:
    """The engine core frozen while idle: requests hang, the page says 0 running, 0 waiting. Without the
    canary the probe cannot see it; with it, a canary that gets no answer starts the clock."""
    state = tmp_path / "probe.state"
    stub.routes["/v1/models"] = Route(MODELS)
    stub.routes["/v1/completions"] = Route(COMPLETION, hang=True)
    probe_line(stub.url, state, "--canary")
    code, line = probe_line(stub.url, state, "--canary")
    assert (code, line) == (
        ExitCode.OK,
        "suspect: 0 running, 0 waiting, 1 in flight outside them; no token progress for 0.0 s (window 120 s); "
        "the canary got no answer within 1.0 s",
    )
    code, line = probe_line(stub.url, state, "--canary")  # owed an answer: sent again at once, whatever the interval
    assert code == ExitCode.OK
    assert stub.count("/v1/completions") == 2
    rewind(state, WINDOW)
    code, line = probe_line(stub.url, state, "--canary")
    assert (code, line.split(";")[0]) == (ExitCode.STALLED, "stalled: 0 running, 0 waiting, 1 in flight outside them")
    # Without --canary the same engine is idle, forever: the README says so.
    other = tmp_path / "plain.state"
    probe_line(stub.url, other)
    rewind(other, WINDOW * 10)
    assert probe_line(stub.url, other) == (ExitCode.OK, "idle: 0 running, 0 waiting")


def test_an_answered_canary_ends_the_stall_clock(stub: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/v1/models"] = Route(MODELS)
    stub.routes["/v1/completions"] = Route(COMPLETION, hang=True)
    probe_line(stub.url, state, "--canary")
    assert probe_line(stub.url, state, "--canary")[1].startswith("suspect: ")
    stub.routes["/v1/completions"] = Route(COMPLETION)
    rewind(state, WINDOW - 10)
    code, line = probe_line(stub.url, state, "--canary")
    assert (code, line.split(";")[0]) == (ExitCode.OK, "idle: 0 running, 0 waiting")


def test_a_busy_engine_never_gets_a_canary(stub: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/v1/models"] = Route(MODELS)
    stub.routes["/v1/completions"] = Route(COMPLETION)
    for generation in (100, 100, 120, 120):
        stub.routes["/metrics"] = Route(vllm_page(3, generation, 50))
        probe_line(stub.url, state, "--canary")
    stub.routes["/metrics"] = Route(vllm_page(0, 120, 50, waiting=2))  # queued: not idle either
    probe_line(stub.url, state, "--canary")
    stub.routes["/metrics"] = Route(vllm_page(0, 130, 60))  # idle, but it just moved
    probe_line(stub.url, state, "--canary")
    assert stub.count("/v1/models") == stub.count("/v1/completions") == 0


@pytest.mark.parametrize(
    ("models", "completions", "code", "words"),
    [
        (Route(b"<html>login</html>"), Route(COMPLETION), ExitCode.METRICS, "canary "),
        (Route(b'{"data": []}'), Route(COMPLETION), ExitCode.METRICS, "the answer names no model"),
        (Route(b"not json"), Route(COMPLETION), ExitCode.METRICS, "the answer is not JSON"),
        (Route(MODELS), Route(b'{"error": "boom"}', status=500), ExitCode.SCRAPE, "HTTP 500"),
        (Route(MODELS), Route(b'{"error": "Unauthorized"}', status=401), ExitCode.SCRAPE, "needs an API key"),
        (Route(MODELS), Route(b'{"nothing": 1}'), ExitCode.METRICS, "not a completion"),
    ],
    ids=["html", "no_model", "not_json", "server_error", "unauthorized", "not_a_completion"],
)
def test_a_canary_that_gets_a_wrong_answer_is_one_line_and_its_code(
    stub: StubEngine, tmp_path: Path, models: Route, completions: Route, code: int, words: str
) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/v1/models"] = models
    stub.routes["/v1/completions"] = completions
    # --strict: the canary's own verdict (without it, the health route decides: tests/test_probe_health_fallback.py).
    probe_line(stub.url, state, "--canary", "--strict")
    got, line = probe_line(stub.url, state, "--canary", "--strict")
    assert got == code, line
    assert line.startswith("error: canary ")
    assert words in line


def test_requests_the_server_counts_in_flight_at_an_idle_looking_engine_are_stalled(
    stub: StubEngine, tmp_path: Path
) -> None:
    """vLLM's /load with --enable-server-load-tracking: no canary needed."""
    state = tmp_path / "probe.state"
    stub.routes["/load"] = Route(b'{"server_load": 3}')
    probe_line(stub.url, state, "--server-load")
    code, line = probe_line(stub.url, state, "--server-load")
    assert (code, line.split(";")[0]) == (ExitCode.OK, "suspect: 0 running, 0 waiting, 3 in flight outside them")
    assert line.endswith("the server has 3 requests in flight")
    rewind(state, WINDOW)
    assert probe_line(stub.url, state, "--server-load")[0] == ExitCode.STALLED
    stub.routes["/load"] = Route(b'{"server_load": 0}')  # tracking off says 0: nothing changes
    other = tmp_path / "other.state"
    probe_line(stub.url, other, "--server-load")
    rewind(other, WINDOW)
    assert probe_line(stub.url, other, "--server-load") == (ExitCode.OK, "idle: 0 running, 0 waiting")


# --- credentials


def test_the_engines_own_key_is_sent_and_never_shown(stub: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    code, line = probe_line(stub.url, state, env={"VLLM_API_KEY": "sk-secret-1"})
    assert code == ExitCode.OK
    assert stub.requests[-1].header("Authorization") == "Bearer sk-secret-1"
    assert "sk-secret" not in line
    probe_line(stub.url, state, env={"LLAMA_API_KEY": "k1,k2"})
    assert stub.requests[-1].header("Authorization") == "Bearer k1"


def test_a_key_file_wins_and_a_bad_one_is_a_usage_error(stub: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    key = tmp_path / "key"
    key.write_text("sk-from-file\n")
    probe_line(stub.url, state, "--api-key-file", str(key), env={"VLLM_API_KEY": "sk-env"})
    assert stub.requests[-1].header("Authorization") == "Bearer sk-from-file"
    code, line = probe_line(stub.url, state, "--api-key-file", str(tmp_path / "absent"))
    assert (code, line) == (ExitCode.USAGE, f"error: --api-key-file {tmp_path / 'absent'}: No such file or directory")
    # A file of keys, one a line (llama.cpp's --api-key-file): the first is sent.
    key.write_text("# the keys of the llama-server\n\nsk-first\nsk-second\n")
    probe_line(stub.url, state, "--api-key-file", str(key))
    assert stub.requests[-1].header("Authorization") == "Bearer sk-first"
    key.write_text("two words\nlines\n")
    code, line = probe_line(stub.url, state, "--api-key-file", str(key))
    assert code == ExitCode.USAGE
    assert line == "error: --api-key-file must hold one API key of printable ASCII characters (the key is not shown)"
    assert "two" not in line
    key.write_text("\n\n")
    assert probe_line(stub.url, state, "--api-key-file", str(key))[0] == ExitCode.USAGE


def test_the_key_is_read_from_the_variable_the_engine_s_flag_names(stub: StubEngine, tmp_path: Path) -> None:
    """llama-server --api-key $(API_KEY): inject writes --api-key-env API_KEY, read at every run."""
    state = tmp_path / "probe.state"
    probe_line(stub.url, state, "--api-key-env", "API_KEY", env={"API_KEY": "sk-a,sk-b", "VLLM_API_KEY": "sk-env"})
    assert stub.requests[-1].header("Authorization") == "Bearer sk-a"
    code, line = probe_line(stub.url, state, "--api-key-env", "API_KEY")
    assert (code, line) == (ExitCode.USAGE, "error: --api-key-env API_KEY: API_KEY is not set in the environment")


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (401, "HTTP 401 Unauthorized: the route needs an API key: give it with --api-key-file PATH"),
        (403, "HTTP 403 Forbidden: the route needs an API key"),
        (501, "HTTP 501 Not Implemented: the engine publishes no metrics (start llama-server with --metrics)"),
    ],
)
def test_a_route_that_wants_a_key_or_metrics_that_are_off_say_so(
    stub: StubEngine, tmp_path: Path, status: int, words: str
) -> None:
    stub.routes["/metrics"] = Route(b'{"error": "Invalid API Key"}', status=status)
    code, line = probe_line(stub.url, tmp_path / "probe.state", "--strict")
    assert code == ExitCode.SCRAPE
    assert line.startswith(f"error: scrape {stub.url}: {words}")


def test_watch_asks_a_stuck_looking_vllm_whether_it_is_paused_and_never_runs_its_stalled_hook(
    stub: StubEngine, tmp_path: Path
) -> None:
    """The watchdog's own first rule: a paused engine is shown paused, and --on-stalled does not run."""
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50))
    stub.routes["/is_paused"] = Route(b'{"is_paused": true}')
    marker = tmp_path / "restarted"
    watch = ["watch", "--once", "--json", "--interval", "0.3", "--window", "0.1", "--on-stalled", f"touch {marker}"]
    result = subprocess.run(
        [sys.executable, "-m", "stallprobe", *watch, stub.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert (row["verdict"], row["hook"]) == ("paused", None)
    assert str(row["message"]).startswith("paused: 4 running, 0 waiting; paused by its operator (/is_paused)")
    assert stub.count("/is_paused") == 1  # asked once: on the second poll, when it looked stuck
    assert not marker.exists()


# --- readiness: serving and not stuck, from the same history as liveness


def test_ready_when_serving_and_moving_and_a_saturated_engine_stays_ready(stub: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/health"] = Route(b"")
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50))
    assert probe_line(stub.url, state, "--ready")[1].startswith("ready: baseline: 4 running")
    stub.routes["/metrics"] = Route(vllm_page(12, 110, 50, waiting=99))
    code, line = probe_line(stub.url, state, "--ready")
    assert (code, line.split(";")[0]) == (ExitCode.OK, "ready: saturated: 12 running, 99 waiting")


def test_not_ready_while_the_engine_says_it_is_loading(stub: StubEngine, tmp_path: Path) -> None:
    stub.routes["/health"] = Route(b'{"error": {"message": "Loading model"}}', status=503)
    code, line = probe_line(stub.url, tmp_path / "probe.state", "--ready")
    assert (code, line) == (
        ExitCode.STALLED,
        f"not ready: health {stub.url.replace('/metrics', '/health')}: HTTP 503 Service Unavailable",
    )


def test_readiness_drains_a_wedged_engine_long_before_liveness_restarts_it(stub: StubEngine, tmp_path: Path) -> None:
    """One state file, two windows: readiness fails after --drain-after (30 s), liveness only after its
    window (120 s); each run of either judges the same stall clock."""
    state = tmp_path / "probe.state"
    stub.routes["/health"] = Route(b"")
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50))
    probe_line(stub.url, state)
    rewind(state, 20)
    assert probe_line(stub.url, state, "--ready")[0] == ExitCode.OK  # suspect for 20 s: still ready
    rewind(state, 15)
    code, line = probe_line(stub.url, state, "--ready")
    assert (code, line.split(";")[0]) == (ExitCode.STALLED, "not ready: stalled: 4 running, 0 waiting")
    assert "(window 30 s)" in line
    code, line = probe_line(stub.url, state)  # liveness: the same clock, 35 s, its own window
    assert (code, line.split(";")[0]) == (ExitCode.OK, "suspect: 4 running, 0 waiting")
    assert 35 <= frozen_for(line) < 40  # the rewound 35 s, and what the runs between took
    rewind(state, 90)
    assert probe_line(stub.url, state)[0] == ExitCode.STALLED
    stub.routes["/metrics"] = Route(vllm_page(4, 120, 50))  # it moves again: ready again
    assert probe_line(stub.url, state, "--ready")[1].startswith("ready: progressing: 4 running")


@pytest.mark.parametrize(("window", "drain_after", "ready_until"), [(20, 30, 20), (30, 30, 30), (120, 30, 30)])
def test_a_stalled_engine_is_never_ready_whichever_window_is_shorter(
    stub: StubEngine, tmp_path: Path, window: int, drain_after: int, ready_until: int
) -> None:
    """The exact pair of commands a pod runs, at window pairs an operator may choose: readiness is lost at
    the earlier of --drain-after and --window, so an engine the liveness probe is about to restart never
    keeps its traffic."""
    state = tmp_path / "probe.state"
    stub.routes["/health"] = Route(b"")
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50))
    flags = ("--window", str(window), "--drain-after", str(drain_after))
    probe_line(stub.url, state, *flags)
    rewind(state, ready_until - 1)
    assert probe_line(stub.url, state, *flags, "--ready")[0] == ExitCode.OK
    rewind(state, 1)
    code, line = probe_line(stub.url, state, *flags, "--ready")
    assert (code, line.split(";")[0]) == (ExitCode.STALLED, "not ready: stalled: 4 running, 0 waiting"), line
    live = probe_line(stub.url, state, *flags)[0]
    assert live == (ExitCode.STALLED if window <= ready_until else ExitCode.OK)


def test_a_paused_engine_is_alive_but_not_ready(stub: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/health"] = Route(b"")
    asleep = vllm_page(0, 100, 50) + b'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0\n'
    stub.routes["/metrics"] = Route(asleep)
    assert probe_line(stub.url, state)[0] == ExitCode.OK
    code, line = probe_line(stub.url, state, "--ready")
    assert (code, line.split(";")[0]) == (ExitCode.STALLED, "not ready: paused: 0 running, 0 waiting")


def test_liveness_and_readiness_at_once_never_lose_a_sample_nor_reset_the_clock(
    stub: StubEngine, tmp_path: Path
) -> None:
    """24 runs at once, half of each kind, against an engine whose counter moves on every scrape: the
    state ends with the highest counter served. Then the same against a frozen engine: the stall clock
    that the first run started is the one every later run keeps."""
    state = tmp_path / "probe.state"
    stub.routes["/health"] = Route(b"")
    served = [0]
    lock = threading.Lock()

    def moving() -> bytes:
        with lock:
            served[0] += 1
            number = served[0]
        if number % 3 == 1:
            # Held: this page was served early but its run finishes late, after runs that got higher
            # counters: the order in which runs save is not the order of their pages.
            time.sleep(0.3)
        return vllm_page(4, 100 + number, 50)

    stub.routes["/metrics"] = Route(moving)
    flags = [("--ready",) if n % 2 else () for n in range(24)]
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda extra: probe_line(stub.url, state, *extra)[0], flags))
    assert codes == [ExitCode.OK] * 24
    saved, _ = load_states(str(state), read_boot_id())
    assert saved is not None
    assert saved["0"].last.generation == 100 + served[0]

    stub.routes["/metrics"] = Route(vllm_page(4, 500, 50))  # frozen from here on
    probe_line(stub.url, state)
    probe_line(stub.url, state)
    first, _ = load_states(str(state), read_boot_id())
    assert first is not None
    since = first["0"].stall_since
    assert since is not None
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda extra: probe_line(stub.url, state, *extra)[0], flags))
    assert codes == [ExitCode.OK] * 24  # suspect, and ready, all: the clock is well under 30 s
    after, _ = load_states(str(state), read_boot_id())
    assert after is not None
    assert after["0"].stall_since == since


@pytest.mark.parametrize(
    ("completions", "verdict", "words"),
    [
        (Route(COMPLETION), "idle", "the canary was answered in "),
        (Route(COMPLETION, hang=True), "suspect", "the canary got no answer within 1.0 s"),
    ],
    ids=["answered", "hung"],
)
def test_watch_sends_the_canary_to_an_idle_looking_engine_as_the_probe_does(
    stub: StubEngine, completions: Route, verdict: str, words: str
) -> None:
    stub.routes["/v1/models"] = Route(MODELS)
    stub.routes["/v1/completions"] = completions
    watch = ["watch", "--once", "--json", "--interval", "0.3", "--timeout", "1", "--canary"]
    result = subprocess.run(
        [sys.executable, "-m", "stallprobe", *watch, stub.url], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert row["verdict"] == verdict
    assert words in str(row["message"])
    assert stub.count("/v1/completions") == 1  # the first poll is the baseline: nothing to compare yet


def test_readiness_of_an_engine_whose_metrics_stop_answering(stub: StubEngine, tmp_path: Path) -> None:
    """A slow /metrics keeps the engine ready until nothing has answered for the drain window."""
    state = tmp_path / "probe.state"
    stub.routes["/health"] = Route(b"")
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50))
    probe_line(stub.url, state, "--ready")
    stub.routes["/metrics"] = Route(vllm_page(4, 100, 50), hang=True)
    code, line = probe_line(stub.url, state, "--ready")
    assert code == ExitCode.OK
    assert line.startswith(f"ready: suspect: scrape {stub.url}: no complete answer within 1 s; nothing answered for ")
    assert line.endswith("(window 30 s)")
    rewind(state, 30)
    code, line = probe_line(stub.url, state, "--ready")
    assert code == ExitCode.STALLED
    assert line.startswith(f"not ready: stalled: scrape {stub.url}: no complete answer within 1 s")


# --- requests waiting while nothing runs: owed when waiting for capacity, never when deferred

BUILT = Path(__file__).parent / "fixtures" / "built"


@pytest.mark.parametrize(
    ("page", "waiting"),
    [
        (BUILT / "vllm-0.32-capacity-nothing-running.prom", 3),
        (FIXTURES / "vllm-0.32.0-cpu-wedged-capacity.prom", 3),
        # One grammar request queued behind the wedge stays "deferred" until it is scheduled, which it never is;
        # it holds no KV block (the cache is empty), so it holds back nothing the other three wait for.
        (FIXTURES / "vllm-0.32.0-cpu-wedged-sticky-deferred.prom", 4),
    ],
    ids=["built", "real", "real_with_a_deferred_request_behind_it"],
)
def test_requests_waiting_for_capacity_with_nothing_running_stall_with_default_flags(
    stub: StubEngine, tmp_path: Path, page: Path, waiting: int
) -> None:
    """The wedge users report most: running 0, 3 waiting for capacity, nothing moves, /health 200."""
    state = tmp_path / "probe.state"
    head = f"0 running, {waiting} waiting"
    stub.routes["/health"] = Route(b"")
    stub.routes["/metrics"] = Route(page.read_bytes())
    assert probe_line(stub.url, state)[1].startswith(f"baseline: {head}")
    rewind(state, 60)
    code, line = probe_line(stub.url, state)
    assert (code, line.split(";")[0]) == (ExitCode.OK, f"suspect: {head}")
    assert line.endswith("; 3 waiting for capacity, nothing running"), line
    assert stub.count("/is_paused") == 1  # asked, as for any engine that looks stuck: 404 is never paused
    code, line = probe_line(stub.url, state, "--ready")  # the load balancers drain it after --drain-after
    assert (code, line.split(";")[0]) == (ExitCode.STALLED, f"not ready: stalled: {head}")
    rewind(state, 60)
    code, line = probe_line(stub.url, state)
    assert (code, line.split(";")[0]) == (ExitCode.STALLED, f"stalled: {head}")
    assert 120 <= frozen_for(line) < 125  # the rewound 120 s, and what the runs between took
    assert line.endswith(" s (window 120 s); 3 waiting for capacity, nothing running"), line
    # The operator's override, both ways: never count them, or (for an older vLLM) count them all.
    assert probe_line(stub.url, state, "--include-waiting=never") == (ExitCode.OK, f"idle: {head}")
    rewind(state, 120)
    assert probe_line(stub.url, state, "--include-waiting", "always")[0] == ExitCode.STALLED


@pytest.mark.parametrize(
    ("page", "why"),
    [
        ("vllm-0.32-deferred-nothing-running.prom", "a grammar compiles: the engine's own reason"),
        ("vllm-0.32-kv-consumer-waiting-remote-kv.prom", "KV fetched from the prefill peer"),
    ],
)
def test_requests_the_engine_defers_are_never_owed(stub: StubEngine, tmp_path: Path, page: str, why: str) -> None:
    state = tmp_path / "probe.state"
    stub.routes["/metrics"] = Route((BUILT / page).read_bytes())
    probe_line(stub.url, state)
    rewind(state, 3600)
    code, line = probe_line(stub.url, state)
    assert (code, line) == (ExitCode.OK, "idle: 0 running, 2 waiting"), why
    # --include-waiting (always) is the operator's word against the engine's: then they count.
    assert probe_line(stub.url, state, "--include-waiting")[1].startswith("suspect: 0 running, 2 waiting")


def test_a_paused_engine_with_requests_queued_for_capacity_is_paused_not_stalled(
    stub: StubEngine, tmp_path: Path
) -> None:
    """vLLM's /pause?mode=wait ends in the wedge's shape (running 0, capacity 3, frozen): /is_paused tells."""
    state = tmp_path / "probe.state"
    stub.routes["/metrics"] = Route((BUILT / "vllm-0.32-capacity-nothing-running.prom").read_bytes())
    stub.routes["/is_paused"] = Route(b'{"is_paused": true}')
    probe_line(stub.url, state)
    rewind(state, 600)
    code, line = probe_line(stub.url, state)
    assert (code, line.split(";")[0]) == (ExitCode.OK, "paused: 0 running, 3 waiting")


def loads(running: int, waiting: int, **peer: int) -> bytes:
    """SGLang 0.5.23's /v1/loads answer (entrypoints/v1_loads.py, managers/load_snapshot.py) for one rank."""
    load: dict[str, object] = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": running}
    load["num_waiting_reqs"] = waiting
    if peer:
        load["disaggregation"] = {"mode": "decode", **peer}
    return json.dumps({"timestamp": "2026-12-01T00:00:00+00:00", "version": "0.5.23", "loads": [load]}).encode()


@pytest.mark.parametrize(
    ("live", "verdict"),
    [
        # Its scheduler waits on the prefill peer: nothing runs, nothing owed.
        (Route(loads(0, 5, decode_prealloc_queue_reqs=2, decode_transfer_queue_reqs=3)), "idle"),
        # Its scheduler says a batch is running and nothing moves: the page was right.
        (Route(loads(3, 0)), "stalled"),
        # No such route (an older SGLang): the page stands.
        (None, "stalled"),
    ],
    ids=["waiting_on_its_peer", "wedged_in_a_batch", "no_live_counts"],
)
def test_sglang_page_of_a_stale_batch_is_judged_by_the_schedulers_own_counts(
    stub: StubEngine, tmp_path: Path, live: Route | None, verdict: str
) -> None:
    """SGLang writes its gauges only after a batch: a decode instance waiting on its prefill peer shows the
    last batch running (3) with every counter frozen. /v1/loads has the scheduler's own numbers."""
    state = tmp_path / "probe.state"
    stub.routes["/metrics"] = Route((BUILT / "sglang-0.5.23-decode-disagg-stale-gauges.prom").read_bytes())
    if live is not None:
        stub.routes["/v1/loads"] = live
    probe_line(stub.url, state)
    rewind(state, 600)
    code, line = probe_line(stub.url, state)
    assert line.split(":")[0] == verdict, line
    assert code == (ExitCode.STALLED if verdict == "stalled" else ExitCode.OK)
    assert stub.count("/v1/loads") == 1  # asked once: when the page alone looked stuck


def test_a_health_route_that_gives_no_answer_is_excused_like_a_silent_page(stub: StubEngine, tmp_path: Path) -> None:
    """An API server that stalls for seconds at a time (a saturated vLLM): its page answered, its health
    route did not within --timeout. Not a reason to drain at once: only once it has given no answer for
    --drain-after; a refusal or an error status drains at once."""
    state = tmp_path / "probe.state"
    stub.set(running=4, generation_step=5)  # the engine moves: only the health route can drain it
    stub.routes["/health"] = Route(b"", delay=3)
    code, line = probe_line(stub.url, state, "--ready")
    assert (code, line.split(";")[0]) == (ExitCode.OK, "ready: baseline: 4 running, 0 waiting")
    assert f"; health {stub.base}/health: no complete answer within 1 s (for 0.0 s; drained at 30 s)" in line
    rewind(state, 20)
    assert probe_line(stub.url, state, "--ready")[0] == ExitCode.OK
    rewind(state, 15)
    code, line = probe_line(stub.url, state, "--ready")
    assert code == ExitCode.STALLED
    assert line.startswith(f"not ready: health {stub.base}/health: no complete answer within 1 s; no answer for 3")
    stub.routes["/health"] = Route(b"")  # it answers again: ready at once
    assert probe_line(stub.url, state, "--ready")[0] == ExitCode.OK
    stub.routes["/health"] = Route(b"", status=503)  # an error status: not serving, at once
    code, line = probe_line(stub.url, state, "--ready")
    assert (code, line) == (ExitCode.STALLED, f"not ready: health {stub.base}/health: HTTP 503 Service Unavailable")


# --- thrashing: tokens move, nothing finishes (vLLM #53130)


def thrashing_page(minute: int, finished: float = 100) -> bytes:
    """vLLM's page a minute into #53130's state: prefill at 1,946 tokens a second, decoding at 0.48, 487
    waiting, no request finished (every finished_reason summed), no preemption."""
    page = vllm_page(4, 29 * minute, 116760 * minute, waiting=487)
    labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    counts = "".join(
        f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {finished if reason == "stop" else 0.0}\n'
        for reason in ("stop", "length", "abort", "error", "repetition")
    )
    return page + counts.encode() + f"vllm:num_preemptions_total{{{labels}}} 0.0\n".encode()


def test_an_engine_that_moves_tokens_and_finishes_nothing_is_thrashing_said_not_acted_on(
    stub: StubEngine, tmp_path: Path
) -> None:
    state = tmp_path / "probe.state"
    verdicts = []
    for minute in range(12):
        stub.routes["/metrics"] = Route(thrashing_page(minute))
        code, line = probe_line(stub.url, state)
        verdicts.append((code, line.split(":")[0]))
        rewind(state, 60)
    assert verdicts == [(0, "baseline")] + [(0, "saturated")] * 9 + [(0, "thrashing")] * 2
    # 11 minutes rewound, and what the runs between took.
    assert re.search(r"; no request finished for 11m0\ds while its tokens moved: works and completes nothing", line)
    assert line.endswith(": page; restarted only with --fail-thrashing-after"), line
    # Readiness keeps it: a whole pool thrashing at once would be emptied.
    stub.routes["/metrics"] = Route(thrashing_page(12))
    assert probe_line(stub.url, state, "--ready")[0] == ExitCode.OK
    # The operator's opt-in: past that window, stalled (liveness fails, readiness drains).
    for minute, flags in ((13, ()), (14, ("--ready",))):
        stub.routes["/metrics"] = Route(thrashing_page(minute))
        code, line = probe_line(stub.url, state, "--fail-thrashing-after", "600", *flags)
        assert code == ExitCode.STALLED, line
        assert "thrashing: no request finished for 1" in line
        assert line.endswith("while its tokens moved, past --fail-thrashing-after"), line
    # A request finishes: a new period, and it is merely saturated again.
    stub.routes["/metrics"] = Route(thrashing_page(15, finished=101))
    code, line = probe_line(stub.url, state, "--fail-thrashing-after", "600")
    assert (code, line.split(":")[0]) == (ExitCode.OK, "saturated")
