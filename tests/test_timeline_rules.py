"""The fault timeline's judge (tests/timeline.py `judge`) can fail: runs as the kubelet would have seen them, for
one phase, against what the probes must say. A judge that let a false stall, a missed one, a stall clock carried
over, or a readiness that never comes back pass would make the real-vLLM timeline assert nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from realengine import ProbeRun
from timeline import PHASES, SHORT, Outcome, Phase, judge

SECONDS = {"liveness": 6, "readiness": 9}  # the timeoutSeconds of --timeout 3 (observe.kubelet_timeout)
BY_NAME = {phase.name: phase for phase in PHASES}
Said = Callable[[float], tuple[int, str]]

MOVING = (0, "saturated: 4 running, 2 waiting; +0 prompt and +90 generation tokens in 1.0 s")
SUSPECT = (0, "suspect: 4 running, 0 waiting; no token progress for 3.0 s (window 24 s)")
STALLED = (1, "stalled: 4 running, 0 waiting; no token progress for 25 s (window 24 s)")
READY = (0, "ready: saturated: 4 running, 2 waiting; +0 prompt and +90 generation tokens in 1.0 s")
DRAINED = (1, "not ready: stalled: 4 running, 0 waiting; no token progress for 13 s (window 12 s)")
PAUSED = (0, "paused: 4 running, 2 waiting; paused by its operator (/is_paused), paused for 5.0 s")
SILENT = (0, "suspect: scrape http://127.0.0.1:1/metrics: no complete answer within 3 s; nothing answered for 4 s")
HEALTH_SILENT = (1, "not ready: health http://127.0.0.1:1/health: no complete answer within 3 s")
OUT = (1, "not ready: paused: 4 running, 2 waiting; paused by its operator (/is_paused), paused for 5.0 s")


def wedge(stalled_at: float, left: float) -> Said:
    """Liveness through a wedge that began at 0: suspect, stalled from `stalled_at`, moving once left."""
    return lambda t: MOVING if t >= left else STALLED if t >= stalled_at else SUSPECT


def drain(not_ready_at: float, back_at: float, out: tuple[int, str] = DRAINED) -> Said:
    return lambda t: out if not_ready_at <= t < back_at else READY


@dataclass(frozen=True)
class Scenario:
    phase: str
    liveness: Said
    readiness: Said
    left: float = 30.0  # the wedge began at 0; undone at `left`, the engine moving half a second later
    end: float = 40.0
    took: float = 0.1
    false_stalls: int = 0
    missed_stalls: int = 0
    problems: tuple[str, ...] = ()  # each found in some problem; none at all when empty
    notes: int = 0


SCENARIOS = {
    "wedged, as promised": Scenario("wedged", wedge(24, 30), drain(12, 30)),
    "wedged, a stall clock carried over from before": Scenario(
        "wedged", wedge(4, 30), drain(12, 30), false_stalls=1, problems=("false stall: stalled 4.1 s",)
    ),
    "wedged, never stalled": Scenario(
        "wedged", wedge(99, 30), drain(12, 30), missed_stalls=1, problems=("never said stalled",)
    ),
    "wedged, stalled far too late": Scenario(
        "wedged", wedge(70, 80), drain(12, 80), left=80, end=90, missed_stalls=1, problems=("stalled only",)
    ),
    "wedged, liveness back while still wedged": Scenario(
        "wedged",
        lambda t: MOVING if t >= 27 else wedge(24, 30)(t),
        drain(12, 30),
        problems=("came back while the wedge lasted",),
    ),
    "wedged, drained before --drain-after": Scenario(
        "wedged", wedge(24, 30), drain(3, 30), problems=("before --drain-after",)
    ),
    "wedged, never drained": Scenario("wedged", wedge(24, 30), drain(99, 99), problems=("never said not ready",)),
    "wedged, readiness never back": Scenario(
        "wedged", wedge(24, 30), drain(12, 99), problems=("did not come back after the recovery",)
    ),
    "wedged, stalled after the engine moved again": Scenario(
        "wedged",
        lambda t: STALLED if t >= 24 else SUSPECT,
        drain(12, 30),
        false_stalls=4,  # at 32, 34, 36 and 38 s; the run at 30 s started before the engine was seen moving
        problems=("false stall after the recovery",),
    ),
    "admission wedge, the stalled line says nothing of the queue": Scenario(
        "admission wedge", wedge(24, 30), drain(12, 30), problems=("does not say 'waiting for capacity",)
    ),
    "saturated, as promised": Scenario("saturated", lambda t: MOVING, lambda t: READY, left=math.nan),
    "saturated, one stalled run": Scenario(
        "saturated",
        lambda t: STALLED if t == 10 else MOVING,
        lambda t: READY,
        left=math.nan,
        false_stalls=1,
        problems=("false stall: t=",),
    ),
    "saturated, a scrape error": Scenario(
        "saturated",
        lambda t: (3, "error: scrape: connection refused") if t == 10 else MOVING,
        lambda t: READY,
        left=math.nan,
        false_stalls=1,
        problems=("liveness run failed",),
    ),
    "saturated, drained once": Scenario(
        "saturated", lambda t: MOVING, drain(10, 11), left=math.nan, problems=("not ready while saturated",)
    ),
    "saturated, runs over timeoutSeconds": Scenario(
        "saturated",
        lambda t: MOVING,
        lambda t: READY,
        left=math.nan,
        took=9.5,
        problems=("liveness run over timeoutSeconds 6", "readiness run over timeoutSeconds 9"),
    ),
    "saturated, never saturated": Scenario(
        "saturated",
        lambda t: (0, "progressing: 1 running, 0 waiting"),
        lambda t: (0, "ready: progressing: 1 running, 0 waiting"),
        left=math.nan,
        problems=("no run said 'saturated: '",),
    ),
    "slow API server, a health route that got no answer drained the engine: a fault": Scenario(
        "slow API server",
        lambda t: SILENT if t == 4 else MOVING,
        lambda t: HEALTH_SILENT if t == 9 else READY,
        problems=("not ready while slow API server",),
    ),
    "saturated, the same run is a fault": Scenario(
        "saturated",
        lambda t: MOVING,
        lambda t: HEALTH_SILENT if t == 9 else READY,
        left=math.nan,
        problems=("not ready while saturated",),
    ),
    "paused, as promised": Scenario("paused", lambda t: PAUSED if t < 30 else MOVING, drain(1, 30, OUT)),
    "paused, still routed": Scenario(
        "paused", lambda t: PAUSED if t < 30 else MOVING, lambda t: READY, problems=("never said not ready",)
    ),
    "paused, back in routing before the resume": Scenario(
        "paused", lambda t: PAUSED if t < 30 else MOVING, drain(1, 20, OUT), problems=("ready again while paused",)
    ),
    "paused, restarted": Scenario(
        "paused",
        lambda t: STALLED if 10 <= t < 30 else PAUSED,
        drain(1, 30, OUT),
        false_stalls=10,
        problems=("false stall",),
    ),
}


def runs(said: Scenario, kind: str, period: float) -> list[ProbeRun]:
    """A run every `period` seconds from 0 to the phase's end, saying what the scenario says at its start."""
    tell = said.liveness if kind == "liveness" else said.readiness
    made = []
    for n in range(int(said.end / period)):
        code, line = tell(n * period)
        made.append(ProbeRun(n * period, said.took, code, {}, line + "\n", ""))
    return made


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_judge_of_a_phase(name: str) -> None:
    assert SCENARIOS
    scenario = SCENARIOS[name]
    phase: Phase = BY_NAME[scenario.phase]
    outcome = Outcome(phase, 1, 0.0, began=0.0, left=scenario.left, end=scenario.end)
    if not math.isnan(scenario.left):
        outcome.moved = scenario.left + 0.5
    every = {"liveness": runs(scenario, "liveness", 2.0), "readiness": runs(scenario, "readiness", 1.0)}
    judge(outcome, SHORT, SECONDS, every)
    assert (outcome.false_stalls, outcome.missed_stalls) == (scenario.false_stalls, scenario.missed_stalls), (
        outcome.problems
    )
    assert len(outcome.notes) == scenario.notes, outcome.notes
    assert bool(outcome.problems) is bool(scenario.problems), outcome.problems
    for expected in scenario.problems:
        assert any(expected in problem for problem in outcome.problems), (expected, outcome.problems)
