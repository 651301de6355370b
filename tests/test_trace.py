"""What a probe run leaves where operators look: a line on the container's log (PID 1's stdout, here a
FIFO the test reads, as the container runtime's log pipe is) when its verdict or readiness changed, and the
evidence of a failing liveness run in the termination message file, cleared when a run passes again. Each
test runs the exact command a pod runs against the suite's stub engine."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import refused_url, rewind, run_probe
from stallprobe import __version__
from stallprobe.errors import ExitCode
from stallprobe.evidence import EVIDENCE_BEGIN, EVIDENCE_END
from stubengine import StubEngine


class Log:
    """A stand-in for PID 1's stdout: a FIFO whose read end the test holds (as the runtime's log reader
    does), read without waiting."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = str(path)
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def lines(self) -> list[str]:
        data = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        return data.decode().splitlines()

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    pipe = Log(tmp_path / "pid1-stdout")
    yield pipe
    pipe.close()


@pytest.fixture
def engine() -> Iterator[StubEngine]:
    with StubEngine(running=3, generation=10, prompt=10) as stub:
        yield stub


def liveness(engine: StubEngine, state: Path, log: Log, *args: str) -> tuple[int, str]:
    result = run_probe("--url", engine.url, "--state-file", str(state), "--transition-log", log.path, *args)
    assert result.stderr == ""
    return result.returncode, result.stdout.strip()


def test_a_line_when_the_verdict_changes_and_none_on_a_steady_state(
    engine: StubEngine, tmp_path: Path, log: Log
) -> None:
    state = tmp_path / "probe.state"
    _, first = liveness(engine, state, log)
    assert log.lines() == [f"stallprobe: liveness: {first}"]  # the first run says what it found
    engine.set(generation_step=5)  # moving: still alive, nothing to say
    liveness(engine, state, log)
    liveness(engine, state, log)
    assert log.lines() == []
    engine.set(generation_step=0)  # frozen from here on: suspect, said once
    _, suspect = liveness(engine, state, log)
    assert suspect.startswith("suspect: 3 running")
    rewind(state, 10)
    assert liveness(engine, state, log)[1].startswith("suspect: ")
    assert log.lines() == [f"stallprobe: liveness: {suspect}"]
    rewind(state, 200)
    code, stalled = liveness(engine, state, log)
    assert code == ExitCode.STALLED
    rewind(state, 10)
    liveness(engine, state, log)  # stalled again: said once
    assert log.lines() == [f"stallprobe: liveness: {stalled}"]
    engine.set(generation_step=5)
    _, moving = liveness(engine, state, log)
    assert moving.startswith("progressing: ")
    assert log.lines() == [f"stallprobe: liveness: {moving}"]


def test_readiness_says_its_own_changes_beside_liveness(engine: StubEngine, tmp_path: Path, log: Log) -> None:
    state = tmp_path / "probe.state"
    liveness(engine, state, log)
    _, ready = liveness(engine, state, log, "--ready")
    assert ready.startswith("ready: ")
    rewind(state, 40)
    code, drained = liveness(engine, state, log, "--ready")
    assert (code, drained.startswith("not ready: stalled: ")) == (ExitCode.STALLED, True)
    liveness(engine, state, log, "--ready")
    lines = log.lines()
    assert lines[1:] == [f"stallprobe: readiness: {ready}", f"stallprobe: readiness: {drained}"]


def test_unjudged_and_errors_are_said_once_each_and_back(engine: StubEngine, tmp_path: Path, log: Log) -> None:
    state = tmp_path / "probe.state"
    _, first = liveness(engine, state, log)
    page = engine.routes["/metrics"]
    engine.route("/metrics", b"<html>login</html>")
    _, unjudged = liveness(engine, state, log)
    liveness(engine, state, log)
    assert unjudged.startswith("unjudged: not a metrics page")
    engine.routes["/metrics"] = page
    _, back = liveness(engine, state, log)
    assert log.lines() == [f"stallprobe: liveness: {line}" for line in (first, unjudged, back)]
    refused = refused_url()
    for _ in range(2):
        result = run_probe("--url", refused, "--state-file", str(state), "--transition-log", log.path)
        assert result.returncode == ExitCode.SCRAPE
    (line,) = log.lines()
    assert line == f"stallprobe: liveness: {result.stdout.strip()}"
    assert line.startswith("stallprobe: liveness: error: scrape ")


def test_report_only_says_its_stall_on_the_log_too(engine: StubEngine, tmp_path: Path, log: Log) -> None:
    state = tmp_path / "probe.state"
    liveness(engine, state, log, "--report-only")
    rewind(state, 200)
    code, line = liveness(engine, state, log, "--report-only")
    assert (code, line.endswith("report-only: exit 0, not 1")) == (ExitCode.OK, True)
    assert log.lines()[-1] == "stallprobe: liveness: " + line.removesuffix("; report-only: exit 0, not 1")


def test_a_full_or_unread_log_loses_the_line_never_the_run(engine: StubEngine, tmp_path: Path, log: Log) -> None:
    state = tmp_path / "probe.state"
    writer = os.open(log.path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        while True:  # fill the pipe, as a log reader that stopped reading leaves it
            os.write(writer, b"x" * 4096)
    except BlockingIOError:
        pass
    started = time.monotonic()
    code, line = liveness(engine, state, log)
    assert (code, line.startswith("baseline: ")) == (ExitCode.OK, True)
    assert time.monotonic() - started < 10  # nothing waited on the pipe
    os.close(writer)
    assert not [text for text in log.lines() if "stallprobe:" in text]
    # A FIFO nobody reads: the open fails at once (ENXIO), the run goes on.
    orphan = tmp_path / "orphan"
    os.mkfifo(orphan)
    with pytest.raises(OSError, match="No such device or address") as caught:
        os.open(orphan, os.O_WRONLY | os.O_NONBLOCK)
    assert caught.value.errno == errno.ENXIO
    result = run_probe("--url", engine.url, "--state-file", str(tmp_path / "other"), "--transition-log", str(orphan))
    assert (result.returncode, result.stderr) == (ExitCode.OK, "")
    # And none at all: --transition-log none.
    result = run_probe("--url", engine.url, "--state-file", str(tmp_path / "third"), "--transition-log", "none")
    assert (result.returncode, result.stderr) == (ExitCode.OK, "")


# --- the termination message file


def test_a_failing_liveness_run_leaves_its_evidence_and_a_passing_one_clears_only_it(
    engine: StubEngine, tmp_path: Path
) -> None:
    state, message = tmp_path / "probe.state", tmp_path / "termination-log"
    message.write_text("engine: my own last words\n")  # the engine's, which the probe never removes
    args = (
        "--url",
        engine.url,
        "--state-file",
        str(state),
        "--termination-log",
        str(message),
        "--transition-log",
        "none",
    )
    assert run_probe(*args).returncode == ExitCode.OK
    assert message.read_text() == "engine: my own last words\n"
    rewind(state, 200)
    result = run_probe(*args)
    assert result.returncode == ExitCode.STALLED
    text = message.read_text()
    assert text.startswith("engine: my own last words\n")
    ours = text.removeprefix("engine: my own last words\n")
    lines = ours.splitlines()
    assert lines[0] == f"{EVIDENCE_BEGIN} (exit 1): {result.stdout.strip()}"
    assert lines[1].startswith("no progress seen for 20")  # the rewound 200 s, and the run between
    assert lines[2] == "the last two samples (seconds after boot: what the page said):"
    assert lines[3].endswith(": 3 running, 0 waiting, 10 prompt and 10 generation tokens")
    assert lines[4].endswith(": 3 running, 0 waiting, 10 prompt and 10 generation tokens")
    assert "in flight, lost to a restart: 3 running, 0 waiting" in lines
    assert "engine: vllm, model tiny-llama" in lines
    assert f"flags: {' '.join(args)}" in lines
    assert lines[-2:] == [f"stallprobe {__version__}", EVIDENCE_END]
    assert len(ours.encode()) <= 2048
    # A run that passes again clears the evidence, and only it.
    engine.set(generation_step=5)
    assert run_probe(*args).returncode == ExitCode.OK
    assert message.read_text() == "engine: my own last words\n"


def test_evidence_only_for_a_run_that_fails_liveness(engine: StubEngine, tmp_path: Path) -> None:
    state, message = tmp_path / "probe.state", tmp_path / "termination-log"
    args = ("--url", engine.url, "--state-file", str(state), "--termination-log", str(message))
    run_probe(*args)
    rewind(state, 200)
    assert run_probe(*args, "--report-only").returncode == ExitCode.OK  # report-only: nothing failed
    assert run_probe(*args, "--ready").returncode == ExitCode.STALLED  # readiness restarts nothing
    assert not message.exists()
    # A run that ends in an error fails liveness too: its line, and the last sample remembered.
    result = run_probe("--url", refused_url(), "--state-file", str(state), "--termination-log", str(message))
    assert result.returncode == ExitCode.SCRAPE
    lines = message.read_text().splitlines()
    assert lines[0] == f"{EVIDENCE_BEGIN} (exit 3): {result.stdout.strip()}"
    assert lines[1] == "the last sample remembered (seconds after boot: what the page said):"
    assert lines[2].endswith(": 3 running, 0 waiting, 10 prompt and 10 generation tokens")


def test_evidence_that_cannot_be_written_costs_nothing(engine: StubEngine, tmp_path: Path) -> None:
    state = tmp_path / "probe.state"
    args = ("--url", engine.url, "--state-file", str(state), "--termination-log", str(tmp_path / "no" / "such" / "dir"))
    run_probe(*args)
    rewind(state, 200)
    result = run_probe(*args)
    assert (result.returncode, result.stderr) == (ExitCode.STALLED, "")
