"""The words of a look (report.py), in process: each verdict's line, the readiness line, a verdict's exit
code, the precision note, and the notes of the fallback and report-only modes. One table of steps and
the line each must give."""

from __future__ import annotations

import pytest

from stallprobe.detector import EnginesAssessment, Sample, State, assess_engines, readiness
from stallprobe.engines import VLLM, Dialect
from stallprobe.errors import ExitCode
from stallprobe.report import (
    describe,
    drain_warning,
    duration,
    num,
    precision,
    ready_line,
    report_only_note,
    secs,
    unjudged_line,
    verdict_code,
)


def judged(*steps: dict[str, Sample], window: float = 120) -> tuple[EnginesAssessment, dict[str, State] | None]:
    """The last step's assessment, and the history it was judged against."""
    states: dict[str, State] | None = None
    result = None
    for samples in steps:
        before = states
        result = assess_engines(states, samples, window)
        states = result.states
    assert result is not None
    return result, before


S = Sample
# (name, steps, the line)
LINES: list[tuple[str, list[dict[str, Sample]], str]] = [
    (
        "baseline",
        [{"0": S(4, 0, 0, 0)}],
        "baseline: 4 running, 0 waiting; first run, progress is judged from the next run",
    ),
    ("idle", [{"0": S(0, 5, 5, 0)}, {"0": S(0, 5, 5, 10)}], "idle: 0 running, 0 waiting"),
    (
        "progressing",
        [{"0": S(4, 0, 0, 0)}, {"0": S(4, 37, 120, 10)}],
        "progressing: 4 running, 0 waiting; +120 prompt and +37 generation tokens in 10 s",
    ),
    (
        "saturated",
        [{"0": S(9, 0, 0, 0)}, {"0": S(9, 6, 0, 0.5, 99)}],
        "saturated: 9 running, 99 waiting; +0 prompt and +6 generation tokens in 0.5 s; "
        "busy, not stuck: do not restart",
    ),
    (
        "suspect",
        [{"0": S(4, 5, 5, 0)}, {"0": S(4, 5, 5, 30)}],
        "suspect: 4 running, 0 waiting; no token progress for 30 s (window 120 s)",
    ),
    (
        "stalled_owed",
        [{"0": S(0, 5, 5, 0, 3, owed=3)}, {"0": S(0, 5, 5, 130, 3, owed=3)}],
        "stalled: 0 running, 3 waiting; no token progress for 130 s (window 120 s); "
        "3 waiting for capacity, nothing running",
    ),
    (
        "paused",
        [{"0": S(4, 5, 5, 0, paused="asleep")}, {"0": S(4, 5, 5, 75, paused="asleep")}],
        "paused: 4 running, 0 waiting; asleep, paused for 1m15s: not judged until it resumes",
    ),
    (
        "one_of_two",
        [{"0": S(3, 0, 0, 0), "1": S(3, 0, 0, 0)}, {"0": S(3, 9, 0, 200), "1": S(3, 0, 0, 200)}],
        "stalled: engine 1 of 2: 3 running, 0 waiting; no token progress for 200 s (window 120 s)",
    ),
]


@pytest.mark.parametrize(("steps", "line"), [r[1:] for r in LINES], ids=[r[0] for r in LINES])
def test_each_verdict_has_its_line(steps: list[dict[str, Sample]], line: str) -> None:
    assert LINES
    result, before = judged(*steps)
    assert describe(result, before, "", 120) == line
    assert verdict_code(result.verdict) == (ExitCode.STALLED if line.startswith("stalled:") else ExitCode.OK)


def test_a_silent_page_says_why_and_for_how_long() -> None:
    result, before = judged({"0": S(4, 5, 5, 0)}, {"0": S(0, 0, 0, 50, answered=False)})
    line = describe(result, before, "", 120, unanswered="scrape x: no complete answer within 3 s")
    assert line == "suspect: scrape x: no complete answer within 3 s; nothing answered for 50 s (window 120 s)"


@pytest.mark.parametrize(
    ("steps", "healthy", "line"),
    [
        ([{"0": S(4, 0, 0, 0)}, {"0": S(4, 9, 0, 10)}], True, "ready: progressing: 4 running, 0 waiting; "),
        ([{"0": S(4, 5, 5, 0)}, {"0": S(4, 5, 5, 40)}], True, "not ready: stalled: 4 running, 0 waiting; no token"),
        ([{"0": S(4, 0, 0, 0)}, {"0": S(4, 9, 0, 10)}], False, "not ready: health http://e/health: HTTP 503"),
    ],
    ids=["ready", "drained", "unhealthy"],
)
def test_the_readiness_line(steps: list[dict[str, Sample]], healthy: bool, line: str) -> None:
    result, before = judged(*steps)
    ready, routing = readiness(result, 30, healthy=healthy)
    health = "" if healthy else "health http://e/health: HTTP 503 Service Unavailable"
    assert ready_line(routing, before, "", 30, VLLM, ready=ready, health=health).startswith(line)


def test_the_precision_note_only_for_a_frozen_engine() -> None:
    printer = Dialect("x", running="r", waiting="w", prompt="p", generation="g", port=1, hints=(), digits=3)
    frozen, _ = judged({"0": S(4, 5e9, 5e9, 0)}, {"0": S(4, 5e9, 5e9, 30)})
    moving, _ = judged({"0": S(4, 5e9, 5e9, 0)}, {"0": S(4, 6e9, 5e9, 30)})
    assert precision(printer, frozen.engines["0"]) != ""
    assert precision(printer, moving.engines["0"]) == ""
    assert precision(None, frozen.engines["0"]) == ""
    assert precision(VLLM, frozen.engines["0"]) == ""  # vLLM prints every digit


@pytest.mark.parametrize(("drain", "window", "said"), [(30, 120, False), (20, 20, True), (30, 20, True)])
def test_the_drain_warning(drain: float, window: float, said: bool) -> None:
    text = drain_warning(drain, window)
    assert bool(text) is said
    assert (f"--drain-after {num(drain)} s is not shorter than --window {num(window)} s" in text) is said


def test_the_fallback_and_report_only_notes() -> None:
    assert unjudged_line("why", "/health").startswith("unjudged: why; /health answers 2xx")
    assert report_only_note(1) == "report-only: exit 0, not 1"


@pytest.mark.parametrize(("value", "text"), [(120.0, "120"), (0.5, "0.5"), (1e20, "1e+20")])
def test_num(value: float, text: str) -> None:
    assert num(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(4.04, "4.0 s"), (12.3, "12 s"), (725, "12m05s"), (12000, "3h20m"), (-1, "0.0 s")]
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text
    assert secs(12.3) == "12"
