"""The exact command a pod runs, `python3 -m stallprobe ...`, against real HTTP servers on loopback: the
CLI's contract (one line, its words, exit codes, flags and their environment variables, JSON, errors).
The detector's rules are tested as tables (tests/test_detector.py); here a few verdicts cross the real
command end to end, and the rest is what only the command does.

Stalls are made without waiting out a real window: the previous sample is written into the state file
with a time in the past. CLOCK_MONOTONIC is one clock for every process, so the probe in its own
process reads it exactly as it would have written it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import (
    RawServer,
    fixture_page,
    llamacpp_page,
    load_states,
    refused_url,
    run_probe,
    save_states,
    sglang_page,
    vllm_engines_page,
    vllm_page,
)
from stallprobe import Sample, State
from stallprobe.cli import main
from stallprobe.errors import EXIT_TABLE, ExitCode, StallprobeError
from stallprobe.probe import help_text
from stallprobe.statefile import read_boot_id
from stubengine import StubEngine

Behave = Callable[[socket.socket, threading.Event], None]
StartRaw = Callable[[Behave], RawServer]


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The probe's whole output: exactly one line on stdout, nothing on stderr (no traceback)."""
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    return lines[0]


@pytest.fixture
def state_file(tmp_path: Path) -> str:
    return str(tmp_path / "probe.state")


def remember(path: str, sample: Sample, stall_since: float | None = None, engine: str = "0") -> None:
    """Leave a previous sample in the state file, as an earlier probe run would have.

    The stub engine's pages are vLLM V1's, whose series carry `engine="0"`: that is the engine's name.
    """
    save_states(path, {engine: State(sample, stall_since)}, read_boot_id())


def ago(seconds: float) -> float:
    return time.monotonic() - seconds


# --- the verdicts, through the real command


def test_first_run_is_a_baseline(served: StubEngine, state_file: str) -> None:
    served.set(21, 900, 400)
    result = run_probe("--url", served.url, "--state-file", state_file)
    assert result.returncode == ExitCode.OK
    assert one_line(result) == "baseline: 21 running, 0 waiting; first run, progress is judged from the next run"
    saved, _ = load_states(state_file, read_boot_id())
    assert saved is not None
    assert list(saved) == ["0"]
    assert (saved["0"].last.running, saved["0"].last.generation, saved["0"].last.prompt) == (21, 900, 400)


def test_frozen_busy_engine_is_suspect_then_stalled(served: StubEngine, state_file: str) -> None:
    from conftest import rewind

    served.set(21, 900, 400)
    args = ("--url", served.url, "--state-file", state_file)
    assert run_probe(*args).returncode == ExitCode.OK
    suspect = run_probe(*args, "--window", "600")
    assert suspect.returncode == ExitCode.OK
    assert re.fullmatch(
        r"suspect: 21 running, 0 waiting; no token progress for \d\.\d s \(window 600 s\)", one_line(suspect)
    )
    rewind(state_file, 0.5)  # the stall clock started at the first run: make 0.5 s more pass
    stalled = run_probe(*args, "--window", "0.4")
    assert stalled.returncode == ExitCode.STALLED
    assert one_line(stalled).startswith("stalled: 21 running, 0 waiting; no token progress for ")


def test_stalled_line_names_the_time_and_the_window(served: StubEngine, state_file: str) -> None:
    served.set(21, 900, 400)
    remember(state_file, Sample(21, 900, 400, ago(134)))
    result = run_probe("--url", served.url, "--state-file", state_file)
    assert result.returncode == ExitCode.STALLED
    assert re.fullmatch(
        r"stalled: 21 running, 0 waiting; no token progress for 13[45] s \(window 120 s\)", one_line(result)
    )


def test_saturated_engine_is_alive_and_says_do_not_restart(served: StubEngine, state_file: str) -> None:
    served.set(12, 5035, 900, waiting=99)
    remember(state_file, Sample(12, 5000, 900, ago(200), 80))
    result = run_probe("--url", served.url, "--state-file", state_file)
    assert result.returncode == ExitCode.OK
    line = one_line(result)
    assert line.startswith("saturated: 12 running, 99 waiting; +0 prompt and +35 generation tokens in ")
    assert line.endswith("; busy, not stuck: do not restart")


def test_real_vllm_page_gives_its_numbers(served: StubEngine, state_file: str) -> None:
    served.route("/metrics", fixture_page("vllm-0.32.0-cpu-busy.prom"))
    result = run_probe("--url", served.url, "--state-file", state_file, "--json")
    assert result.returncode == ExitCode.OK
    fields = json.loads(one_line(result))
    assert fields["verdict"] == "baseline"
    assert (fields["running"], fields["waiting"], fields["prompt_tokens"], fields["generation_tokens"]) == (
        4,
        0,
        173,
        907,
    )
    assert (fields["stalled_for"], fields["window"]) == (0, 120)


def test_json_output_of_a_stall(served: StubEngine, state_file: str) -> None:
    served.set(21, 900, 400)
    remember(state_file, Sample(21, 900, 400, ago(134)))
    result = run_probe("--url", served.url, "--state-file", state_file, "--json", "--window", "60")
    assert result.returncode == ExitCode.STALLED
    fields = json.loads(one_line(result))
    assert fields["verdict"] == "stalled"
    assert 134 <= fields["stalled_for"] < 140
    assert fields["window"] == 60
    assert fields["message"].startswith("stalled: 21 running")


# --- exit codes for everything that is not a verdict


def test_connection_refused_is_a_scrape_failure(state_file: str) -> None:
    result = run_probe("--url", refused_url(), "--state-file", state_file)
    assert result.returncode == ExitCode.SCRAPE
    assert re.fullmatch(r"error: scrape http://127\.0\.0\.1:\d+/metrics: connection refused .*", one_line(result))
    # No sample to remember: only what the run said on the container's log.
    assert load_states(state_file, read_boot_id()) == (None, "")


@pytest.mark.parametrize(("status", "words"), [(500, "HTTP 500"), (404, "HTTP 404"), (401, "HTTP 401")])
def test_non_2xx_is_a_scrape_failure(served: StubEngine, state_file: str, status: int, words: str) -> None:
    served.route("/metrics", served.metrics_page, status)
    result = run_probe("--url", served.url, "--state-file", state_file, "--strict")
    assert result.returncode == ExitCode.SCRAPE
    assert words in one_line(result)


def test_redirect_is_not_followed(served: StubEngine, state_file: str) -> None:
    served.route("/metrics", b"", 302, headers={"Location": "http://example.invalid/metrics"})
    result = run_probe("--url", served.url, "--state-file", state_file, "--strict")
    assert result.returncode == ExitCode.SCRAPE
    assert "HTTP 302" in one_line(result)
    assert "not followed" in one_line(result)


def trickle(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    while not stop.wait(0.1):
        conn.sendall(b"#")


def silence(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(60)  # far longer than any allowance below: only the probe's deadline can end the wait


def reset(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 100000\r\n\r\nvllm:num_requests_running 1\n")
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def cut_short(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1000\r\n\r\nvllm:num_requests_running 1\n")


def not_http(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")


def nothing(conn: socket.socket, stop: threading.Event) -> None:
    return


@pytest.mark.parametrize("behave", [trickle, silence])
def test_a_slow_answer_is_no_sample_and_the_run_ends_within_the_deadline(
    raw_server: StartRaw, state_file: str, behave: Behave
) -> None:
    """A saturated engine's server can be slow: no answer in time is `suspect` (exit 0), not a failure."""
    server = raw_server(behave)
    started = time.monotonic()
    result = run_probe("--url", server.url, "--state-file", state_file, "--timeout", "0.5")
    elapsed = time.monotonic() - started
    assert result.returncode == ExitCode.OK
    assert one_line(result) == (
        f"suspect: scrape {server.url}: no complete answer within 0.5 s; nothing answered for 0.0 s (window 120 s)"
    )
    assert elapsed < 20  # the deadline covers connect to last byte; wide for a loaded machine


@pytest.mark.parametrize(
    ("behave", "words"),
    [
        (reset, "connection reset|closed after"),
        (cut_short, "closed after 28 of 1000 bytes"),
        (not_http, "not an HTTP answer"),
        (nothing, "closed the connection without an answer"),
    ],
)
def test_misbehaving_server_is_a_scrape_failure_within_the_deadline(
    raw_server: StartRaw, state_file: str, behave: Behave, words: str
) -> None:
    server = raw_server(behave)
    started = time.monotonic()
    result = run_probe("--url", server.url, "--state-file", state_file, "--timeout", "0.5")
    elapsed = time.monotonic() - started
    assert result.returncode == ExitCode.SCRAPE
    assert re.search(words, one_line(result))
    # The deadline covers connect to last byte: a trickling or silent server cannot hold the probe. The
    # allowance is wide for a loaded machine, and still far below what the servers would hold it for.
    assert elapsed < 20


@pytest.mark.parametrize(
    ("page", "words"),
    [
        (
            b"<!DOCTYPE html><html><body>It works!</body></html>",
            "error: not a metrics page: the server sent HTML",
        ),
        (b"\x00\x01garbage\xff", "error: no known engine's metrics on the page"),
        (
            vllm_page(1, 2, 3).replace(b"vllm:generation_tokens", b"vllm:other_tokens"),
            "error: required metric missing from the vllm page: vllm:generation_tokens_total",
        ),
        (vllm_page(1, 2, 3) + b"vllm:num_requests_running{model_name=oops} 1\n", "malformed label set"),
    ],
)
def test_not_a_metrics_page(served: StubEngine, state_file: str, page: bytes, words: str) -> None:
    served.route("/metrics", page)
    result = run_probe("--url", served.url, "--state-file", state_file, "--strict")
    assert result.returncode == ExitCode.METRICS
    assert words in one_line(result)


def test_corrupt_state_restarts_the_baseline_and_is_rewritten(served: StubEngine, state_file: str) -> None:
    served.set(2, 5, 5)
    Path(state_file).write_bytes(b"\x00\xffgarbage{")
    result = run_probe("--url", served.url, "--state-file", state_file)
    assert result.returncode == ExitCode.OK
    assert one_line(result) == (
        "baseline: 2 running, 0 waiting; state file is not text, progress is judged from the next run"
    )
    saved, why = load_states(state_file, read_boot_id())
    assert (saved is not None, why) == (True, "")


def test_unwritable_state_file_is_exit_5(served: StubEngine, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = run_probe("--url", served.url, "--state-file", str(tmp_path / "file" / "probe.state"), "--strict")
    assert result.returncode == ExitCode.STATE
    assert one_line(result).endswith("mount an emptyDir at /tmp or point --state-file elsewhere")


def test_sixteen_probes_at_once_leave_a_valid_file(served: StubEngine, state_file: str) -> None:
    served.set(5, 100, 100)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: run_probe("--url", served.url, "--state-file", state_file), range(16)))
    assert [r.returncode for r in results] == [0] * 16
    for result in results:
        assert re.match(r"(baseline|suspect): 5 running", one_line(result))
    saved, why = load_states(state_file, read_boot_id())
    assert saved is not None
    assert why == ""
    # No temporaries left behind; the lock file stays (removing it could let two probes lock two files).
    assert sorted(os.listdir(os.path.dirname(state_file))) == ["probe.state", "probe.state.lock"]


# --- flags and environment


def test_environment_variables_configure_the_probe(served: StubEngine, state_file: str) -> None:
    served.set(21, 900, 400)
    remember(state_file, Sample(21, 900, 400, ago(50)))
    env = {
        "STALLPROBE_URL": served.url,
        "STALLPROBE_STATE_FILE": state_file,
        "STALLPROBE_WINDOW": "30",
        "STALLPROBE_TIMEOUT": "2",
        "STALLPROBE_JSON": "1",
    }
    result = run_probe(env=env)
    assert result.returncode == ExitCode.STALLED
    assert json.loads(one_line(result))["window"] == 30


def test_flags_win_over_the_environment(served: StubEngine, state_file: str) -> None:
    served.set(21, 900, 400)
    remember(state_file, Sample(21, 900, 400, ago(50)))
    env = {"STALLPROBE_URL": refused_url(), "STALLPROBE_WINDOW": "30", "STALLPROBE_STATE_FILE": "/nonexistent/x"}
    result = run_probe("--url", served.url, "--window", "300", "--state-file", state_file, env=env)
    assert result.returncode == ExitCode.OK
    assert one_line(result).startswith("suspect: ")


def test_saturation_threshold_flag(served: StubEngine, state_file: str) -> None:
    served.set(4, 20, 20, waiting=3)
    remember(state_file, Sample(4, 10, 20, ago(10)))
    result = run_probe("--url", served.url, "--state-file", state_file, "--saturation", "4")
    assert one_line(result).startswith("progressing: 4 running, 3 waiting")
    remember(state_file, Sample(4, 10, 20, ago(10)))
    result = run_probe("--url", served.url, "--state-file", state_file, env={"STALLPROBE_SATURATION": "3"})
    assert one_line(result).startswith("saturated: 4 running, 3 waiting")


def test_default_state_file_is_per_url_in_tmpdir(served: StubEngine, tmp_path: Path) -> None:
    served.set(1, 1, 1)
    run_probe("--url", served.url, env={"TMPDIR": str(tmp_path)})
    other = served.url.replace("/metrics", "/metrics?x=1")
    run_probe("--url", other, env={"TMPDIR": str(tmp_path)})
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert len(names) == 2
    assert all(n.startswith("stallprobe-127.0.0.1_") and n.endswith(".state") for n in names)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".lock")) == [f"{n}.lock" for n in names]


USAGE: list[tuple[list[str], dict[str, str], str]] = [
    (["--window", "0"], {}, "--window must be a number > 0 (got '0')"),
    (["--window", "-5"], {}, "--window must be a number > 0 (got '-5')"),
    (["--window", "soon"], {}, "--window must be a number > 0 (got 'soon')"),
    (["--window=nan"], {}, "--window must be a number > 0 (got 'nan')"),
    (["--timeout", "0"], {}, "--timeout must be a number > 0 (got '0')"),
    (["--timeout", "inf"], {}, "--timeout must be a number > 0 (got 'inf')"),
    (["--saturation", "0"], {}, "--saturation must be a number > 0 (got '0')"),
    ([], {"STALLPROBE_WINDOW": "abc"}, "STALLPROBE_WINDOW must be a number > 0 (got 'abc')"),
    ([], {"STALLPROBE_TIMEOUT": "-1"}, "STALLPROBE_TIMEOUT must be a number > 0 (got '-1')"),
    ([], {"STALLPROBE_JSON": "maybe"}, "STALLPROBE_JSON must be 1 or 0 (got 'maybe')"),
    (
        ["--url", "https://127.0.0.1/metrics"],
        {},
        "--url must be an http:// URL (got 'https://127.0.0.1/metrics')",
    ),
    (["--url", "127.0.0.1:8000"], {}, "--url must be an http:// URL"),
    (["--url", "http://:8000/metrics"], {}, "--url has no host"),
    (["--url", "http://localhost:99999/metrics"], {}, "--url has an invalid port '99999'"),
    (["--url", "http://localhost:\u00b2/metrics"], {}, "--url has an invalid port '\u00b2'"),
    (["--url", "http://\u00fc" + "a" * 70 + "/metrics"], {}, "--url has a host name that cannot be encoded for DNS"),
    ([], {"STALLPROBE_URL": "ftp://x"}, "STALLPROBE_URL must be an http:// URL"),
    (["--state-file", ""], {}, "--state-file must not be empty"),
    (["--window"], {}, "--window needs a value"),
    (["--json=1"], {}, "--json takes no value"),
    (["--bogus"], {}, "unknown option '--bogus'"),
    (["extra"], {}, "unexpected argument 'extra'"),
]


@pytest.mark.parametrize(("argv", "env", "message"), USAGE, ids=[" ".join(u[0]) or str(u[1]) for u in USAGE])
def test_usage_errors_name_the_flag_and_value(
    capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str], message: str
) -> None:
    assert main(argv, env) == ExitCode.USAGE
    out = capsys.readouterr().out
    assert out.startswith("error: " + message)
    assert out.count("\n") == 1


def test_usage_error_through_the_real_command() -> None:
    result = run_probe("--window", "0")
    assert result.returncode == 2
    assert one_line(result) == "error: --window must be a number > 0 (got '0')"


def test_usage_error_in_json() -> None:
    result = run_probe("--json", "--timeout", "x")
    assert result.returncode == ExitCode.USAGE
    assert json.loads(one_line(result)) == {
        "verdict": "error",
        "error": "--timeout must be a number > 0 (got 'x')",
        "exit_code": 2,
    }


def test_scrape_error_in_json(state_file: str) -> None:
    result = run_probe("--url", refused_url(), "--state-file", state_file, env={"STALLPROBE_JSON": "true"})
    fields = json.loads(one_line(result))
    assert (fields["verdict"], fields["exit_code"], result.returncode) == ("error", 3, 3)
    assert "connection refused" in fields["error"]


def test_help_lists_every_flag_env_and_exit_code() -> None:
    result = run_probe("--help")
    assert result.returncode == ExitCode.OK
    assert result.stdout == help_text() + "\n"
    for flag in ("--url", "--window", "--timeout", "--state-file", "--saturation", "--json", "--version"):
        assert flag in result.stdout
    rows = [f"  {code}  {meanings['probe']}\n" for code, meanings in EXIT_TABLE.items() if "probe" in meanings]
    assert len(rows) >= 7
    assert [row for row in rows if row not in result.stdout] == []


def test_version() -> None:
    result = run_probe("--version")
    assert result.returncode == ExitCode.OK
    assert re.fullmatch(r"stallprobe \d+\.\d+\.\d+", one_line(result))


def test_exit_codes_are_the_documented_numbers() -> None:
    codes = [(name, value) for name, value in vars(ExitCode).items() if name.isupper()]
    assert codes == [
        ("OK", 0),
        ("STALLED", 1),
        ("USAGE", 2),
        ("SCRAPE", 3),
        ("METRICS", 4),
        ("STATE", 5),
        ("CHANGES", 6),
        ("OUTPUT", 7),
        ("INTERRUPTED", 130),
    ]
    probe_codes = [code for code, meanings in EXIT_TABLE.items() if "probe" in meanings]
    assert probe_codes == [value for _, value in codes[:6]] + [ExitCode.OUTPUT]
    assert list(EXIT_TABLE) == [value for _, value in codes]


def test_every_error_carries_a_documented_exit_code() -> None:
    def subclasses(kind: type[StallprobeError]) -> list[type[StallprobeError]]:
        return [kind, *(sub for child in kind.__subclasses__() for sub in subclasses(child))]

    errors = subclasses(StallprobeError)[1:]
    assert {error.__name__ for error in errors} >= {
        "UsageError",
        "InjectError",
        "ScrapeError",
        "MetricsError",
        "StateFileError",
    }
    for error in errors:
        assert error.exit_code in EXIT_TABLE, error  # documented for some command (OutputError: inject's)
        assert error.exit_code not in (ExitCode.OK, ExitCode.STALLED), error


def test_installed_script_behaves_like_the_module(served: StubEngine, state_file: str) -> None:
    script = Path(sys.executable).parent / "stallprobe"
    assert script.exists(), "the package must install a `stallprobe` script"
    served.set(0, 0, 0)
    result = subprocess.run(
        [str(script), "--url", served.url, "--state-file", state_file],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == ExitCode.OK
    assert one_line(result).startswith("baseline: 0 running")
    result = subprocess.run([str(script), "--window", "x"], capture_output=True, text=True, check=False)
    assert result.returncode == ExitCode.USAGE


def endless(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    block = b"# " + b"x" * 65533 + b"\n"
    while not stop.is_set():
        conn.sendall(block)


def test_runaway_page_is_cut_off_at_the_cap(raw_server: StartRaw, state_file: str) -> None:
    server = raw_server(endless)
    result = run_probe("--url", server.url, "--state-file", state_file, "--timeout", "20")
    assert result.returncode == ExitCode.SCRAPE
    assert one_line(result).endswith(f"page larger than {32 * 1024 * 1024} bytes")


# --- engines: dialects, several engines behind one page, overrides


def dp_page(engines: dict[str, tuple[float, float, float]]) -> bytes:
    """vLLM V1 with data parallelism: (running, prompt, generation) per engine index."""
    return vllm_engines_page(
        {e: (running, 0, prompt, generation) for e, (running, prompt, generation) in engines.items()}
    )


def test_one_wedged_engine_among_moving_ones_is_named(served: StubEngine, state_file: str) -> None:
    then = ago(200)
    save_states(
        state_file,
        {"0": State(Sample(3, 100, 50, then)), "1": State(Sample(4, 700, 90, then))},
        read_boot_id(),
    )
    served.route("/metrics", dp_page({"0": (3, 50, 900), "1": (4, 90, 700)}))
    result = run_probe("--url", served.url, "--state-file", state_file)
    assert result.returncode == ExitCode.STALLED
    assert re.fullmatch(
        r"stalled: engine 1 of 2: 4 running, 0 waiting; no token progress for 20\d s \(window 120 s\)", one_line(result)
    )
    saved, _ = load_states(state_file, read_boot_id())
    assert saved is not None
    assert sorted(saved) == ["0", "1"]


def test_engines_in_json(served: StubEngine, state_file: str) -> None:
    served.route("/metrics", dp_page({"0": (3, 50, 900), "1": (0, 90, 700)}))
    fields = json.loads(one_line(run_probe("--url", served.url, "--state-file", state_file, "--json")))
    assert (fields["dialect"], fields["engine"], fields["running"], fields["generation_tokens"]) == (
        "vllm",
        "0",
        3,
        1600,
    )
    assert [(e["engine"], e["verdict"], e["running"]) for e in fields["engines"]] == [
        ("0", "baseline", 3),
        ("1", "baseline", 0),
    ]


@pytest.mark.parametrize(
    ("before", "after", "flags", "code", "start"),
    [
        (
            sglang_page(162, 1000, 500, 2826),
            sglang_page(162, 1000, 500, 2826),
            [],
            1,
            "stalled: 162 running, 2826 waiting",
        ),
        (sglang_page(162, 1000, 500, 2826), sglang_page(162, 1050, 500, 2826), [], 0, "saturated: 162 running"),
        (sglang_page(1, 1000, 500), sglang_page(1, 1000, 500, used_tokens=640), [], 0, "progressing: 1 running"),
        (
            llamacpp_page(1, 142, 41, 500),
            llamacpp_page(1, 142, 41, 900),
            [],
            0,
            "progressing: 1 running, 0 waiting; +0 prompt",
        ),
        (llamacpp_page(1, 142, 41, 500), llamacpp_page(1, 142, 41, 500), [], 1, "stalled: 1 running"),
        (
            llamacpp_page(1, 142, 41, 500),
            llamacpp_page(1, 142, 41, 500),
            ["--engine", "llamacpp"],
            1,
            "stalled: 1 running",
        ),
        (vllm_page(2, 10, 10), vllm_page(2, 10, 10), ["--engine", "vllm"], 1, "stalled: 2 running"),
    ],
)
def test_each_engine_through_the_real_command(
    served: StubEngine, state_file: str, before: bytes, after: bytes, flags: list[str], code: int, start: str
) -> None:
    from conftest import rewind

    served.route("/metrics", before)
    args = ["--url", served.url, "--state-file", state_file, *flags]
    assert run_probe(*args).returncode == 0
    served.route("/metrics", after)
    rewind(state_file, 0.3)
    result = run_probe(*args, "--window", "0.2")
    assert (result.returncode, one_line(result)[: len(start)]) == (code, start)


def test_llamacpp_stall_line_says_when_rounding_can_hide_progress(served: StubEngine, state_file: str) -> None:
    from conftest import rewind

    served.route("/metrics", llamacpp_page(1, 3.5e6, 2.1e6, 4.20001e6))
    args = ["--url", served.url, "--state-file", state_file]
    run_probe(*args)
    rewind(state_file, 0.3)
    line = one_line(run_probe(*args, "--window", "0.2"))
    assert line.startswith("stalled: 1 running")
    assert line.endswith("; llamacpp prints 6 significant digits, so an advance under 10 is invisible")


def test_engine_flag_on_the_wrong_page_is_exit_4(served: StubEngine, state_file: str) -> None:
    served.route("/metrics", llamacpp_page(1, 1, 1, 1))
    result = run_probe("--url", served.url, "--state-file", state_file, "--engine", "vllm", "--strict")
    assert result.returncode == ExitCode.METRICS
    assert one_line(result).startswith("error: not a vllm metrics page: none of vllm:num_requests_running")


def test_ambiguous_page_is_exit_4(served: StubEngine, state_file: str) -> None:
    served.route("/metrics", vllm_page(1, 2, 3) + llamacpp_page(1, 1, 1, 1))
    result = run_probe("--url", served.url, "--state-file", state_file, "--strict")
    assert result.returncode == ExitCode.METRICS
    assert one_line(result) == "error: the page fits vllm and llamacpp: pass --engine to choose"


def test_renamed_families_through_flags(served: StubEngine, state_file: str) -> None:
    from conftest import rewind

    page = (
        vllm_page(2, 10, 10)
        .replace(b"vllm:num_requests_running", b"fork:busy")
        .replace(b"vllm:prompt_tokens", b"fork:prefill")
    )
    served.route("/metrics", page)
    args = ["--url", served.url, "--state-file", state_file, "--running-metric", "fork:busy"]
    env = {"STALLPROBE_PROMPT_METRIC": "fork:prefill_total"}
    assert one_line(run_probe(*args, env=env)).startswith("baseline: 2 running")
    rewind(state_file, 0.3)
    assert run_probe(*args, "--window", "0.2", env=env).returncode == ExitCode.STALLED


def test_engine_label_none_judges_the_page_as_one(served: StubEngine, state_file: str) -> None:
    served.route("/metrics", dp_page({"0": (3, 50, 900), "1": (4, 90, 700)}))
    line = one_line(run_probe("--url", served.url, "--state-file", state_file, "--engine-label", "none"))
    assert line.startswith("baseline: 7 running, 0 waiting; first run")


def test_include_waiting_stalls_a_queue_behind_nothing(served: StubEngine, state_file: str) -> None:
    served.set(0, 10, 10, waiting=5)
    remember(state_file, Sample(0, 10, 10, ago(300), 5))
    args = ["--url", served.url, "--state-file", state_file]
    assert one_line(run_probe(*args)) == "idle: 0 running, 5 waiting"
    remember(state_file, Sample(0, 10, 10, ago(300), 5))
    result = run_probe(*args, "--include-waiting")
    assert result.returncode == ExitCode.STALLED
    assert one_line(result).startswith("stalled: 0 running, 5 waiting; no token progress for 30")
    remember(state_file, Sample(0, 10, 10, ago(300), 5))
    assert run_probe(*args, env={"STALLPROBE_INCLUDE_WAITING": "1"}).returncode == ExitCode.STALLED


def test_progress_metric_counts_as_life(served: StubEngine, state_file: str) -> None:
    from conftest import rewind

    args = ["--url", served.url, "--state-file", state_file, "--window", "0.2"]
    served.route("/metrics", vllm_page(2, 10, 10) + b"custom_steps 1\nother_beat 5\n")
    run_probe(*args, "--progress-metric", "custom_steps", "--progress-metric", "other_beat")
    served.route("/metrics", vllm_page(2, 10, 10) + b"custom_steps 2\nother_beat 5\n")
    rewind(state_file, 0.3)
    result = run_probe(*args, "--progress-metric", "custom_steps", "--progress-metric", "other_beat")
    assert (result.returncode, one_line(result)[:24]) == (0, "progressing: 2 running, ")
    rewind(state_file, 0.3)
    assert (
        run_probe(*args, env={"STALLPROBE_PROGRESS_METRIC": "custom_steps, other_beat"}).returncode == ExitCode.STALLED
    )


ENGINE_USAGE: list[tuple[list[str], dict[str, str], str]] = [
    (["--engine", "tgi"], {}, "--engine must be one of auto, vllm, sglang, llamacpp, lmdeploy, trtllm (got 'tgi')"),
    (
        [],
        {"STALLPROBE_ENGINE": "x"},
        "STALLPROBE_ENGINE must be one of auto, vllm, sglang, llamacpp, lmdeploy, trtllm (got 'x')",
    ),
    (["--running-metric", "1bad"], {}, "--running-metric must be a Prometheus metric name (got '1bad')"),
    (["--progress-metric", "a b"], {}, "--progress-metric must be a Prometheus metric name (got 'a b')"),
    ([], {"STALLPROBE_PROGRESS_METRIC": "ok,bad-name"}, "STALLPROBE_PROGRESS_METRIC must be a Prometheus metric name"),
    (["--include-waiting=often"], {}, "--include-waiting must be auto, always or never (got 'often')"),
    ([], {"STALLPROBE_INCLUDE_WAITING": "sometimes"}, "STALLPROBE_INCLUDE_WAITING must be auto, always or never"),
    (["--window", "1", "--window", "2"], {}, "--window given 2 times"),
]


@pytest.mark.parametrize(
    ("argv", "env", "message"), ENGINE_USAGE, ids=[" ".join(u[0]) or str(u[1]) for u in ENGINE_USAGE]
)
def test_engine_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str], message: str
) -> None:
    assert main(argv, env) == ExitCode.USAGE
    assert capsys.readouterr().out.startswith("error: " + message)
