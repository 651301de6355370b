"""A hostile /metrics server, through the real command: every abuse ends with its documented exit code
inside the deadline, one line of output, bounded memory, and the state file left as it was (or, when the
page was good, validly rewritten).

Each run goes through a small spawner (`python -S`) that reports the probe's exit code and peak RSS
from wait4: a child's ru_maxrss starts from its parent's high-water mark, so the spawner must be small.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import RawServer, clean_env, load_states, save_states, vllm_page
from stallprobe import Sample, State
from stallprobe.errors import ExitCode
from stallprobe.scrape import MAX_PAGE_BYTES
from stallprobe.statefile import read_boot_id

Behave = Callable[[socket.socket, threading.Event], None]
TIMEOUT = 1.0
# The deadline covers the scrape. The allowance is wide so that a loaded machine cannot fail the test,
# yet a probe without the deadline could not meet it: the silent servers below hold a connection open
# for 60 s, and the trickling ones for as long as the test lasts.
ALLOWANCE = TIMEOUT + 20.0
HOLD = 60.0
# 32 MiB of page at most, read into one buffer, plus the interpreter: 100 MiB bounds any abuse.
MAX_RSS_KIB = 100 * 1024

SPAWN = """
import json, os, sys, time
out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
started = time.monotonic()
actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)]
pid = os.posix_spawn(sys.argv[2], sys.argv[2:], os.environ, file_actions=actions)
_, status, usage = os.wait4(pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss, time.monotonic() - started]))
"""


def measured(tmp_path: Path, *args: str) -> tuple[int, str, int, float]:
    """Run the probe; its exit code, its whole output, its peak RSS (KiB) and how long it took."""
    out = tmp_path / "probe.out"
    env = clean_env()
    report = subprocess.run(
        [sys.executable, "-S", "-c", SPAWN, str(out), sys.executable, "-m", "stallprobe", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    code, rss, elapsed = json.loads(report.stdout)
    return code, out.read_text(errors="replace"), rss, elapsed


def respond(head: bytes, body: bytes = b"") -> Behave:
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head + b"\r\n\r\n" + body)

    return behave


def ok(body: bytes, *headers: bytes) -> Behave:
    head = b"\r\n".join([b"HTTP/1.1 200 OK", b"Content-Type: text/plain; version=0.0.4", *headers])
    return respond(head, body)


PAGE = vllm_page(3, 100, 50)


def chunked(body: bytes, size: int = 1000) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def reset_mid_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE) + PAGE[:300])
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def headers_then_silence(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n")
    stop.wait(HOLD)


def byte_every_200ms(conn: socket.socket, stop: threading.Event) -> None:
    for byte in b"HTTP/1.1 200 OK\r\n\r\n" + PAGE:
        if stop.wait(0.2):
            return
        conn.sendall(bytes([byte]))


def never_ends(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE)
    block = b"# " + b"x" * 65533 + b"\n"
    while not stop.is_set():
        conn.sendall(block)


def slow_headers(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not stop.wait(0.2):
        conn.sendall(b"X-Padding: y\r\n")


def endless_headers(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n" + b"X-Padding: " + b"y" * 100_000)
    stop.wait(HOLD)


HUGE_LABEL = b'vllm:num_requests_running{model_name="' + b"\\\\" * (5 * 1024 * 1024) + b'"} 1\n'
NULS = b"\x00\x00garbage\x00\n" + PAGE + b"\x00" * 1000 + b"\n"
WRONG_TYPE = PAGE.replace(b"# TYPE vllm:num_requests_running gauge", b"# TYPE vllm:num_requests_running histogram")
WRONG_TYPE_EMPTY = b"\n".join(
    line for line in WRONG_TYPE.splitlines() if not line.startswith(b"vllm:num_requests_running{")
)
DUPLICATED = PAGE + b"".join(line + b"\n" for line in PAGE.splitlines() if line.startswith(b"vllm:"))
BOMB = zlib.compress(b"0" * (MAX_PAGE_BYTES + 1024 * 1024), 9)  # ~33 KiB that inflates past the cap

# (name, server behaviour, expected exit code, text the line must contain)
CASES: list[tuple[str, Behave | None, int, str]] = [
    ("refused", None, ExitCode.SCRAPE, "connection refused"),
    ("reset_mid_body", reset_mid_body, ExitCode.SCRAPE, "scrape"),
    # No complete answer in time: no sample (suspect, exit 0), judged from the last answer 5 s before.
    ("headers_then_silence", headers_then_silence, ExitCode.OK, "suspect: scrape"),
    ("a_byte_every_200ms", byte_every_200ms, ExitCode.OK, "no complete answer within 1 s; nothing answered for "),
    ("slow_headers", slow_headers, ExitCode.OK, "no complete answer within 1 s"),
    ("endless_headers", endless_headers, ExitCode.SCRAPE, "no end of HTTP headers in 65536 bytes"),
    ("page_that_never_ends", never_ends, ExitCode.SCRAPE, f"page larger than {MAX_PAGE_BYTES} bytes"),
    ("gzip", ok(gzip.compress(PAGE), b"Content-Encoding: gzip"), ExitCode.OK, "progressing: 3 running"),
    ("deflate", ok(zlib.compress(PAGE), b"Content-Encoding: deflate"), ExitCode.OK, "progressing: 3 running"),
    (
        "gzip_bomb",
        ok(BOMB, b"Content-Encoding: deflate"),
        ExitCode.SCRAPE,
        "larger than 33554432 bytes once decompressed",
    ),
    ("gzip_garbage", ok(b"not gzip at all", b"Content-Encoding: gzip"), ExitCode.SCRAPE, "does not decode"),
    ("brotli", ok(PAGE, b"Content-Encoding: br"), ExitCode.SCRAPE, "unsupported Content-Encoding 'br'"),
    ("chunked", ok(chunked(PAGE), b"Transfer-Encoding: chunked"), ExitCode.OK, "progressing: 3 running"),
    ("chunked_cut_short", ok(chunked(PAGE)[:-20], b"Transfer-Encoding: chunked"), ExitCode.SCRAPE, "chunked"),
    ("chunked_garbage", ok(b"zz\r\nxx\r\n", b"Transfer-Encoding: chunked"), ExitCode.SCRAPE, "malformed chunked"),
    (
        "redirect",
        respond(b"HTTP/1.1 301 Moved\r\nLocation: http://127.0.0.1:1/metrics"),
        ExitCode.SCRAPE,
        "not followed",
    ),
    ("server_error", respond(b"HTTP/1.1 503 Service Unavailable"), ExitCode.SCRAPE, "HTTP 503 Service Unavailable"),
    ("html", ok(b"<html><body><h1>It works!</h1></body></html>"), ExitCode.METRICS, "the server sent HTML"),
    ("not_http", respond(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), ExitCode.SCRAPE, "not an HTTP answer"),
    ("bad_content_length", ok(PAGE, b"Content-Length: lots"), ExitCode.SCRAPE, "invalid Content-Length"),
    ("superscript_content_length", ok(PAGE, b"Content-Length: \xb2"), ExitCode.SCRAPE, "invalid Content-Length"),
    ("nul_bytes_elsewhere", ok(NULS), ExitCode.OK, "progressing: 3 running"),
    ("nul_in_a_value", ok(PAGE.replace(b"} 3.0", b"} 3\x00.0")), ExitCode.METRICS, "value is not a number"),
    ("10mb_label_value", ok(PAGE + HUGE_LABEL), ExitCode.METRICS, "longer than 65536"),
    ("10mb_label_elsewhere", ok(PAGE + HUGE_LABEL.replace(b"vllm:", b"other:")), ExitCode.OK, "progressing: 3 running"),
    ("duplicate_series", ok(DUPLICATED), ExitCode.OK, "progressing: 6 running"),
    ("family_of_the_wrong_type", ok(WRONG_TYPE_EMPTY), ExitCode.METRICS, "declared as a histogram"),
    ("nan_counter", ok(PAGE.replace(b"} 100.0", b"} NaN")), ExitCode.METRICS, "not a finite number"),
]


@pytest.mark.parametrize(("behave", "code", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_server(
    raw_server: Callable[[Behave], RawServer], tmp_path: Path, behave: Behave | None, code: int, words: str
) -> None:
    if behave is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
    else:
        url = raw_server(behave).url
    state = tmp_path / "probe.state"
    before = {"0": State(Sample(3, 90, 40, time.monotonic() - 5))}
    save_states(str(state), before, read_boot_id())

    # --strict: each reader's own verdict on the page (the health route's fallback has tests of its own).
    got, output, rss_kib, elapsed = measured(
        tmp_path, "--url", url, "--state-file", str(state), "--timeout", str(TIMEOUT), "--strict"
    )

    assert (got, words in output) == (code, True), output
    assert output.count("\n") == 1, output  # one line, no traceback
    assert elapsed < ALLOWANCE
    assert rss_kib < MAX_RSS_KIB
    if code == ExitCode.OK:
        states, why = load_states(str(state), read_boot_id())
        assert states is not None, why
        # No answer (suspect): the last answer is kept, the clock runs from it; an answer replaces it.
        kept = states == {"0": State(before["0"].last, stall_since=before["0"].last.t)}
        assert kept is output.startswith("suspect: "), states
    else:
        # A failed run leaves the last good sample alone (and remembers only what it said on the log).
        assert load_states(str(state), read_boot_id()) == (before, "")


def test_hostile_cases_are_listed() -> None:
    assert len(CASES) >= 20


# --- the state file, abused


@pytest.fixture
def good_page(raw_server: Callable[[Behave], RawServer]) -> str:
    return raw_server(ok(PAGE)).url


def run(*args: str, limit_file_size: bool = False) -> subprocess.CompletedProcess[str]:
    def no_file_growth() -> None:  # every write to a file fails with EFBIG, as on a full disk
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    env = clean_env()
    return subprocess.run(
        [sys.executable, "-m", "stallprobe", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
        preexec_fn=no_file_growth if limit_file_size else None,
    )


def test_symlink_planted_at_the_state_path_is_not_followed(good_page: str, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state = tmp_path / "probe.state"
    state.symlink_to(victim)
    result = run("--url", good_page, "--state-file", str(state))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("baseline: 3 running, 0 waiting; state file is a symlink (not followed)")
    assert victim.read_text() == "precious\n"
    assert not state.is_symlink()
    assert load_states(str(state), read_boot_id())[0] is not None


def test_directory_at_the_state_path_is_exit_5(good_page: str, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    state.mkdir()
    result = run("--url", good_page, "--state-file", str(state), "--strict")
    assert result.returncode == ExitCode.STATE
    assert result.stdout.startswith(f"error: state file {state} cannot be read: Is a directory")
    assert state.is_dir()


def test_full_disk_is_exit_5_and_keeps_the_last_state(good_page: str, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    save_states(str(state), {"0": State(Sample(3, 90, 40, time.monotonic() - 5))}, read_boot_id())
    saved = state.read_bytes()
    result = run("--url", good_page, "--state-file", str(state), "--strict", limit_file_size=True)
    assert (result.returncode, result.stderr) == (ExitCode.STATE, "")
    assert result.stdout == (
        f"error: state file {state} cannot be written: File too large; "
        "mount an emptyDir at /tmp or point --state-file elsewhere\n"
    )
    assert state.read_bytes() == saved
    # No temporary left behind (the lock file is the state's own, and stays).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probe.state", "probe.state.lock"]


def test_state_from_another_boot_restarts_the_baseline(good_page: str, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    save_states(str(state), {"0": State(Sample(3, 100, 50, 1.0))}, "the-boot-before")
    result = run("--url", good_page, "--state-file", str(state))
    assert result.returncode == 0
    assert result.stdout.startswith("baseline: 3 running, 0 waiting; state file is from another boot")


def test_state_written_by_a_newer_version_restarts_the_baseline(good_page: str, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    state.write_text("stallprobe-state 5\nboot_id x\nengines {}\n")
    result = run("--url", good_page, "--state-file", str(state))
    assert result.returncode == 0
    assert result.stdout.startswith("baseline: 3 running, 0 waiting; state file has unknown version '5'")
    assert state.read_text().startswith("stallprobe-state 4\n")


def test_fifo_planted_at_the_state_path_cannot_block_the_probe(good_page: str, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    os.mkfifo(state)
    result = run("--url", good_page, "--state-file", str(state))
    assert result.returncode == 0
    assert result.stdout.startswith("baseline: 3 running, 0 waiting; state file is not a regular file")
    assert state.is_file()


def test_a_huge_reason_phrase_is_cut_short(raw_server: Callable[[Behave], RawServer], tmp_path: Path) -> None:
    server = raw_server(respond(b"HTTP/1.1 500 " + b"x" * 50_000))
    result = run("--url", server.url, "--state-file", str(tmp_path / "probe.state"))
    assert result.returncode == ExitCode.SCRAPE
    assert len(result.stdout) < 400
