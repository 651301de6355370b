"""The detector as a table of scenarios: samples in, verdicts out. One row per rule or case."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import pytest

from stallprobe import (
    DEFAULT_SATURATION,
    DEFAULT_WINDOW,
    EnginesAssessment,
    Sample,
    State,
    Verdict,
    assess,
    assess_engines,
    replay,
    step,
)
from stallprobe.detector import THRASHED, Assessment, looks_idle, readiness

B, IDL, PA, P, SAT, THR, SUS, ST = (
    Verdict.BASELINE,
    Verdict.IDLE,
    Verdict.PAUSED,
    Verdict.PROGRESSING,
    Verdict.SATURATED,
    Verdict.THRASHING,
    Verdict.SUSPECT,
    Verdict.STALLED,
)


def step_engines(
    states: Mapping[str, State] | None, samples: Mapping[str, Sample], *args: Any, **kwargs: Any
) -> tuple[Verdict, dict[str, State]]:
    """One step for several engines: the page's verdict and the states for the next step."""
    result = assess_engines(states, samples, *args, **kwargs)
    return result.verdict, result.states


def S(running: float, gen: float, prompt: float, t: float, waiting: float = 0.0, **signals: float) -> Sample:
    return Sample(running, gen, prompt, t, waiting, signals=signals)


def Z(running: float, gen: float, prompt: float, t: float, why: str = "a weight update in flight") -> Sample:
    """A sample of an engine its operator has paused."""
    return Sample(running, gen, prompt, t, paused=why)


def C(gen: float, prompt: float, t: float, pending: float = 1) -> Sample:
    """An engine that looks idle, with requests known to be in flight outside its gauges (a canary)."""
    return Sample(0, gen, prompt, t, pending=pending)


def Q(t: float) -> Sample:
    """The page gave no answer in time."""
    return Sample(0, 0, 0, t, answered=False)


def W(running: float, gen: float, prompt: float, t: float, waiting: float, owed: float) -> Sample:
    """Requests waiting, `owed` of them owed work (waiting for capacity; the others deferred)."""
    return Sample(running, gen, prompt, t, waiting, owed=owed)


# (name, window, samples, expected verdicts)
SCENARIOS: list[tuple[str, float, list[Sample], list[Verdict]]] = [
    # --- the four cases every stall detector must get right: idle, moving, frozen, a long prefill
    (
        "idle_never_fails",
        120,
        [S(0, 500, 900, t) for t in range(0, 3601, 600)],
        [B, IDL, IDL, IDL, IDL, IDL, IDL],
    ),
    (
        "steady_progress_never_fails",
        120,
        [S(4, 100 * k, 50 * k, 10.0 * k) for k in range(40)],
        [B] + [P] * 39,
    ),
    (
        "frozen_fails_only_after_the_window",
        120,
        [S(21, 900, 400, t) for t in (0, 10, 60, 119, 120, 134)],
        [B, SUS, SUS, SUS, ST, ST],
    ),
    (
        "long_prefill_is_not_a_stall",
        120,
        [S(1, 0, 8192 * k, 60.0 * k) for k in range(10)],
        [B] + [P] * 9,
    ),
    (
        "generation_only_progress_is_not_a_stall",
        120,
        [S(3, 10 * k, 512, 60.0 * k) for k in range(10)],
        [B] + [P] * 9,
    ),
    # --- baseline: no history, the clock went back, a counter went down; the stall clock restarts
    (
        "clock_going_back_restarts_the_baseline",
        120,
        [S(5, 100, 10, 1000), S(5, 100, 10, 1100), S(5, 100, 10, 50), S(5, 100, 10, 150), S(5, 100, 10, 170)],
        [B, SUS, B, SUS, ST],
    ),
    (
        "generation_counter_reset_is_a_restart_not_a_stall",
        120,
        [S(5, 9000, 100, 0), S(5, 9000, 100, 100), S(5, 3, 100, 200), S(5, 3, 100, 250)],
        [B, SUS, B, SUS],
    ),
    (
        "prompt_counter_reset_is_a_restart_not_a_stall",
        120,
        [S(5, 90, 9000, 0), S(5, 90, 9000, 100), S(5, 90, 7, 200), S(5, 90, 7, 250)],
        [B, SUS, B, SUS],
    ),
    # --- the stall clock's start
    (
        "idle_then_wedged_is_judged_from_first_seen_busy",
        120,
        [S(0, 50, 50, 0), S(0, 50, 50, 3600), S(2, 50, 50, 3610), S(2, 50, 50, 3700), S(2, 50, 50, 3730)],
        [B, IDL, SUS, SUS, ST],
    ),
    (
        "first_busy_sample_after_a_long_idle_gap_starts_the_clock",
        120,
        [S(0, 50, 50, 0), S(2, 50, 50, 200), S(2, 50, 50, 250), S(2, 50, 50, 319), S(2, 50, 50, 320)],
        [B, SUS, SUS, SUS, ST],
    ),
    (
        "stall_clock_starts_at_the_last_busy_sample",
        120,
        [S(2, 0, 0, 0), S(2, 10, 0, 10), S(2, 10, 0, 100), S(2, 10, 0, 130)],
        [B, P, SUS, ST],
    ),
    (
        "busy_from_the_baseline_counts_from_the_baseline",
        120,
        [S(2, 10, 10, 0), S(2, 10, 10, 119.5), S(2, 10, 10, 120)],
        [B, SUS, ST],
    ),
    # --- queue depth: saturated when moving, never an excuse when frozen
    (
        "saturated_is_alive",
        120,
        [S(12, 10 * k, 100 * k, 30.0 * k, 99) for k in range(8)],
        [B] + [SAT] * 7,
    ),
    (
        "deep_queue_while_frozen_is_stalled",
        120,
        [S(12, 700, 9000, t, 99) for t in (0, 60, 121)],
        [B, SUS, ST],
    ),
    (
        "waiting_below_threshold_is_progressing",
        120,
        [S(3, 0, 0, 0, 0.5), S(3, 1, 0, 1, 0.5)],
        [B, P],
    ),
    (
        "waiting_at_threshold_is_saturated",
        120,
        [S(3, 0, 0, 0, 1), S(3, 1, 0, 1, 1)],
        [B, SAT],
    ),
    # --- a stall clears
    (
        "stall_clears_on_progress",
        120,
        [S(4, 5, 5, 0), S(4, 5, 5, 130), S(4, 6, 5, 140), S(4, 6, 5, 150), S(4, 6, 5, 259), S(4, 6, 5, 260)],
        [B, ST, P, SUS, SUS, ST],
    ),
    (
        "stall_clears_on_idle",
        120,
        [S(4, 5, 5, 0), S(4, 5, 5, 130), S(0, 5, 5, 140), S(1, 5, 5, 150), S(1, 5, 5, 200)],
        [B, ST, IDL, SUS, SUS],
    ),
    (
        "idle_with_moving_counters_is_idle",
        120,
        [S(0, 0, 0, 0), S(0, 10, 20, 10)],
        [B, IDL],
    ),
    (
        "suspect_clock_survives_running_changes",
        120,
        [S(4, 5, 5, 0), S(9, 5, 5, 60), S(2, 5, 5, 125)],
        [B, SUS, ST],
    ),
    (
        "same_instant_is_not_a_clock_going_back",
        120,
        [S(4, 5, 5, 100), S(4, 5, 5, 100)],
        [B, SUS],
    ),
    # --- extra signals (a decode-step counter, the KV-cache usage): any change is life
    (
        "chunked_prefill_moves_only_the_kv_cache",
        120,
        [S(1, 0, 0, 60.0 * k, kv=0.05 * k) for k in range(6)],
        [B] + [P] * 5,
    ),
    (
        "a_signal_going_down_is_life_too",
        120,
        [S(1, 5, 5, 0, kv=0.5), S(1, 5, 5, 100, kv=0.4), S(1, 5, 5, 200, kv=0.3)],
        [B, P, P],
    ),
    (
        "frozen_signals_do_not_excuse_a_frozen_engine",
        120,
        [S(1, 5, 5, 0, kv=0.5), S(1, 5, 5, 100, kv=0.5), S(1, 5, 5, 120, kv=0.5)],
        [B, SUS, ST],
    ),
    (
        "a_signal_appearing_or_vanishing_is_a_change",
        120,
        [S(1, 5, 5, 0), S(1, 5, 5, 130, kv=0.5), S(1, 5, 5, 260)],
        [B, P, P],
    ),
    (
        "moving_signal_with_a_queue_is_saturated",
        120,
        [S(4, 5, 5, 0, 30, decode=100), S(4, 5, 5, 10, 30, decode=101)],
        [B, SAT],
    ),
    (
        "short_window",
        2,
        [S(1, 0, 0, 0), S(1, 0, 0, 1), S(1, 0, 0, 2)],
        [B, SUS, ST],
    ),
    # --- paused by its operator (a weight update, sleep mode): never stalled; the clock starts afresh
    (
        "a_pause_held_past_the_window_is_never_stalled",
        4,
        [S(4, 10, 10, 0), S(4, 20, 10, 1), Z(4, 20, 10, 2), Z(4, 20, 10, 10), Z(4, 20, 10, 100), S(4, 30, 10, 101)],
        [B, P, PA, PA, PA, P],
    ),
    (
        "frozen_after_a_resume_is_judged_from_the_resume",
        4,
        [S(4, 10, 10, 0), Z(4, 10, 10, 1), Z(4, 10, 10, 50), S(4, 10, 10, 51), S(4, 10, 10, 54), S(4, 10, 10, 55)],
        [B, PA, PA, SUS, SUS, ST],
    ),
    (
        "a_pause_stops_a_running_stall_clock",
        4,
        [S(4, 1, 1, 0), S(4, 1, 1, 3), Z(4, 1, 1, 4), Z(4, 1, 1, 30), S(4, 1, 1, 31), S(4, 1, 1, 34)],
        [B, SUS, PA, PA, SUS, SUS],
    ),
    (
        "paused_from_the_first_sample",
        4,
        [Z(4, 1, 1, 0), Z(4, 1, 1, 100), S(4, 1, 1, 101), S(4, 1, 1, 105)],
        [PA, PA, SUS, ST],
    ),
    (
        "a_paused_idle_engine_is_paused",
        4,
        [S(0, 1, 1, 0), Z(0, 1, 1, 5, "asleep"), Z(0, 1, 1, 500, "asleep"), S(0, 1, 1, 501)],
        [B, PA, PA, IDL],
    ),
    (
        "a_restart_during_a_pause_is_a_baseline",
        4,
        [S(4, 9, 9, 0), Z(4, 9, 9, 1), Z(4, 0, 0, 2), Z(4, 0, 0, 3)],
        [B, PA, B, PA],
    ),
    # --- requests owed outside the gauges (a canary that got no answer): work, like running ones
    (
        "an_unanswered_canary_is_owed_work",
        10,
        [S(0, 5, 5, 0), S(0, 5, 5, 10), C(5, 5, 20), C(5, 5, 25), C(5, 5, 30)],
        [B, IDL, SUS, SUS, ST],
    ),
    (
        "an_answered_canary_ends_the_clock",
        10,
        [S(0, 5, 5, 0), C(5, 5, 10), C(5, 5, 15), S(0, 6, 6, 20), S(0, 6, 6, 40)],
        [B, SUS, SUS, IDL, IDL],
    ),
    (
        "owed_work_with_moving_counters_is_progress",
        10,
        [S(0, 5, 5, 0), C(5, 5, 10), C(6, 5, 30), C(6, 5, 35)],
        [B, SUS, P, SUS],
    ),
    # --- requests waiting for capacity while nothing runs: owed work; deferred ones are not
    (
        "waiting_for_capacity_with_nothing_running_stalls",
        120,
        [W(0, 5, 5, 0, 3, 3), W(0, 5, 5, 60, 3, 3), W(0, 5, 5, 119, 3, 3), W(0, 5, 5, 120, 3, 3)],
        [B, SUS, SUS, ST],
    ),
    (
        "waiting_for_capacity_then_admitted_progresses",
        120,
        [W(0, 5, 5, 0, 3, 3), W(0, 5, 5, 1, 3, 3), W(2, 9, 5, 2, 1, 1), W(0, 12, 9, 3, 0, 0)],
        [B, SUS, SAT, IDL],
    ),
    ("deferred_waiting_is_idle", 120, [W(0, 5, 5, t, 2, 0) for t in (0, 100, 300)], [B, IDL, IDL]),
    (
        "owed_waiting_starts_the_clock_when_first_seen",
        120,
        [S(0, 5, 5, 0), W(0, 5, 5, 200, 3, 3), W(0, 5, 5, 319, 3, 3), W(0, 5, 5, 320, 3, 3)],
        [B, SUS, SUS, ST],
    ),
    (
        "owed_waiting_that_turns_deferred_is_idle",
        120,
        [W(0, 5, 5, 0, 3, 3), W(0, 5, 5, 100, 3, 3), W(0, 5, 5, 200, 3, 0)],
        [B, SUS, IDL],
    ),
    # --- no answer in time: a slow answer is not a wedge; a page silent for the whole window is
    (
        "silence_runs_the_clock_from_the_last_answer",
        10,
        [S(4, 1, 1, 0), S(4, 2, 1, 5), Q(8), Q(12), Q(15)],
        [B, P, SUS, SUS, ST],
    ),
    (
        "an_answer_after_silence_is_judged_against_the_last_answer",
        10,
        [S(4, 1, 1, 0), Q(5), Q(9), S(4, 2, 1, 12), S(4, 2, 1, 14)],
        [B, SUS, SUS, P, SUS],
    ),
    (
        "frozen_after_silence_keeps_the_clock",
        10,
        [S(4, 1, 1, 0), Q(5), S(4, 1, 1, 9), S(4, 1, 1, 10)],
        [B, SUS, SUS, ST],
    ),
    (
        "an_idle_engine_silent_for_the_window_is_stalled",
        10,
        [S(0, 1, 1, 0), Q(4), Q(9.5), Q(10)],
        [B, SUS, SUS, ST],
    ),
    (
        "silence_with_no_history_then_answers",
        10,
        [Q(0), Q(5), Q(10), S(4, 1, 1, 11), S(4, 1, 1, 12)],
        [SUS, SUS, ST, B, SUS],
    ),
]


@pytest.mark.parametrize(("window", "samples", "expected"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_scenario(window: float, samples: list[Sample], expected: list[Verdict]) -> None:
    assert len(samples) == len(expected)
    assert replay(samples, window) == expected


@pytest.mark.parametrize(("window", "samples"), [s[1:3] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_assessment_fields_agree_with_the_verdict(window: float, samples: list[Sample]) -> None:
    """Only a baseline or a pause gives a reason; only a running stall clock has a start and a duration;
    a page that gave no answer leaves the last answer in the state."""
    state = None
    for sample in samples:
        result = assess(state, sample, window)
        assert result.state.last == (sample if sample.answered or state is None else state.last)
        assert (result.state.paused_since is not None) == (result.verdict is PA)
        if result.verdict is B:
            assert result.reason in BASELINE_REASONS
        elif result.verdict is PA:
            assert result.reason == sample.paused != ""
        else:
            assert result.reason == ""
        if result.verdict in (SUS, ST):
            assert result.state.stall_since is not None
            assert result.stalled_for == sample.t - result.state.stall_since
        else:
            assert (result.stalled_for, result.state.stall_since) == (0, None)
            assert isinstance(result.stalled_for, float)
        state = result.state


BASELINE_REASONS = {
    "no history",
    "no earlier answer",
    "the clock went backwards",
    "a token counter went down (engine restarted)",
}


def test_scenarios_are_unique_and_present() -> None:
    assert SCENARIOS
    names = [s[0] for s in SCENARIOS]
    assert len(names) == len(set(names))


def test_stalled_for_counts_from_the_clock_start() -> None:
    first = assess(None, S(3, 1, 1, 10))
    assert first.stalled_for == 0
    second = assess(first.state, S(3, 1, 1, 40))
    assert second.verdict is SUS
    assert second.stalled_for == 30
    assert second.state.stall_since == 10
    third = assess(second.state, S(3, 1, 1, 200))
    assert (third.verdict, third.stalled_for) == (ST, 190)
    moving = assess(third.state, S(3, 2, 1, 210))
    assert (moving.stalled_for, moving.state.stall_since) == (0, None)


def test_baseline_says_why() -> None:
    assert assess(None, S(1, 1, 1, 0)).reason == "no history"
    state = State(S(1, 5, 5, 10), stall_since=0)
    assert assess(state, S(1, 5, 5, 9)).reason == "the clock went backwards"
    assert assess(state, S(1, 4, 5, 11)).reason == "a token counter went down (engine restarted)"
    assert assess(state, S(1, 5, 4, 11)).reason == "a token counter went down (engine restarted)"
    assert assess(state, S(1, 6, 5, 11)).reason == ""


def test_baseline_restarts_the_stall_clock() -> None:
    state = State(S(1, 5, 5, 100), stall_since=0)
    for sample in (S(1, 5, 5, 50), S(1, 4, 5, 200), S(1, 5, 4, 200)):
        verdict, after = step(state, sample)
        assert verdict is B
        assert after == State(sample)


def test_saturation_threshold_is_a_parameter() -> None:
    state = State(S(2, 0, 0, 0))
    assert step(state, S(2, 1, 0, 1, waiting=5), saturation=6)[0] is P
    assert step(state, S(2, 1, 0, 1, waiting=6), saturation=6)[0] is SAT
    assert replay([S(2, 0, 0, 0, 1), S(2, 1, 0, 1, 1)], saturation=2) == [B, P]


def test_windows_and_thresholds_below_one_are_valid() -> None:
    assert replay([S(1, 0, 0, 0), S(1, 0, 0, 0.25), S(1, 0, 0, 0.5)], window=0.5) == [B, SUS, ST]
    assert replay([S(1, 0, 0, 0), S(1, 1, 0, 1, waiting=0.5)], saturation=0.5) == [B, SAT]


def test_defaults_are_the_documented_ones() -> None:
    assert DEFAULT_WINDOW == 120
    assert DEFAULT_SATURATION == 1
    assert replay([S(1, 0, 0, 0), S(1, 0, 0, 119.9), S(1, 0, 0, 120)]) == [B, SUS, ST]
    assert replay([S(1, 0, 0, 0), S(1, 1, 0, 1, waiting=1)]) == [B, SAT]


def test_step_never_mutates_its_inputs() -> None:
    state = State(S(2, 3, 4, 5, 6), stall_since=1)
    sample = S(2, 3, 4, 50, 6)
    before_state, before_sample = repr(state), repr(sample)
    step(state, sample)
    assert (repr(state), repr(sample)) == (before_state, before_sample)


def test_verdict_values_are_the_documented_strings() -> None:
    assert [v.value for v in Verdict] == [
        "baseline",
        "idle",
        "paused",
        "progressing",
        "saturated",
        "thrashing",
        "suspect",
        "stalled",
    ]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", range(5))
def test_non_finite_sample_is_refused(bad: float, field: int) -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    values[field] = bad
    with pytest.raises(ValueError, match="finite"):
        Sample(*values)


@pytest.mark.parametrize(("window", "saturation"), [(0, 1), (-1, 1), (math.nan, 1), (120, 0), (120, math.nan)])
def test_invalid_parameters_are_refused(window: float, saturation: float) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        step(None, S(1, 1, 1, 1), window, saturation)


def test_sample_positional_order_and_default_waiting() -> None:
    sample = Sample(1, 2, 3, 4)
    assert (sample.running, sample.generation, sample.prompt, sample.t, sample.waiting) == (1, 2, 3, 4, 0)
    assert sample == Sample(1.0, 2.0, 3.0, 4.0, 0.0)
    assert sample != Sample(1, 2, 3, 4, 1)
    assert sample != (1, 2, 3, 4, 0)
    assert repr(sample) == "Sample(running=1.0, generation=2.0, prompt=3.0, t=4.0, waiting=0.0)"


STATES = [
    State(S(1, 2, 3, 4, 5)),
    State(S(1, 2, 3, 4, 5), stall_since=4),
    State(S(21, 9.5e6, 3.675428e06, 1234.5678, 99), stall_since=1000.25),
    State(S(0, 0, 0, 0)),
    State(Z(4, 2, 3, 50, "asleep (sleep mode)"), paused_since=20),
    State(C(2, 3, 60, pending=2), stall_since=55),
    State(Q(70), stall_since=70),
    State(W(0, 2, 3, 80, 3, 2), stall_since=75),
]


@pytest.mark.parametrize("state", STATES, ids=repr)
def test_state_round_trips_through_a_json_able_dict(state: State) -> None:
    import json

    data = json.loads(json.dumps(state.to_dict()))
    assert State.from_dict(data) == state
    fields = {"running", "generation", "prompt", "t", "waiting", "stall_since", "paused_since"}
    last = state.last
    assert set(data) == fields | {
        key
        for key, given in (
            ("pending", last.pending),
            ("owed", last.owed),
            ("paused", last.paused),
            ("answered", not last.answered),
        )
        if given
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "sample field 'running' must be a number \\(got None\\)"),
        (
            {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "stall_since": "x"},
            "stall_since must be a number or None \\(got 'x'\\)",
        ),
        (
            {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "stall_since": 5},
            "stall_since \\(5\\) is later than the last sample \\(4.0\\)",
        ),
        (
            {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "paused_since": 3},
            "paused_since must be given exactly when the last sample is paused",
        ),
    ],
)
def test_state_from_a_bad_dict_says_what_is_wrong(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        State.from_dict(data)


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4},
        {"running": "1", "generation": 2, "prompt": 3, "t": 4, "waiting": 0},
        {"running": True, "generation": 2, "prompt": 3, "t": 4, "waiting": 0},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "stall_since": "x"},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "stall_since": False},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "stall_since": math.nan},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "stall_since": 5},
        {"running": math.inf, "generation": 2, "prompt": 3, "t": 4, "waiting": 0},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "paused_since": 5},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "paused_since": 3},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "paused": "asleep"},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "paused_since": "x"},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "pending": "1"},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "pending": True},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "pending": math.inf},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "paused": 1},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "answered": 0},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "owed": "1"},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "owed": True},
        {"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "owed": math.nan},
    ],
)
def test_state_from_a_bad_dict_is_a_value_error(data: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - several messages, one contract: ValueError
        State.from_dict(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"pending": "1"}, "sample pending must be a number (got '1')"),
        ({"paused": 1}, "sample paused must be a string (got 1)"),
        ({"answered": 0}, "sample answered must be true or false (got 0)"),
        ({"pending": math.inf}, "Sample.pending must be a finite number (got inf)"),
    ],
)
def test_sample_from_a_bad_dict_says_what_is_wrong(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Sample.from_dict({"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, **data})


def test_a_pause_remembers_when_it_began_and_says_why() -> None:
    first = assess(State(S(4, 1, 1, 0)), Z(4, 1, 1, 10, "asleep"))
    assert (first.verdict, first.reason, first.state.paused_since) == (PA, "asleep", 10)
    later = assess(first.state, Z(4, 1, 1, 70, "asleep"))
    assert (later.verdict, later.state.paused_since, later.state.stall_since) == (PA, 10, None)
    resumed = assess(later.state, S(4, 1, 1, 80))
    assert (resumed.verdict, resumed.state.paused_since, resumed.state.stall_since) == (SUS, None, 80)


def test_silence_keeps_a_running_clock_and_the_last_answer() -> None:
    frozen = assess(State(S(4, 1, 1, 0)), S(4, 1, 1, 5), window=7)
    assert (frozen.verdict, frozen.state.stall_since) == (SUS, 0)
    silent = assess(frozen.state, Q(8), window=7)
    assert (silent.verdict, silent.stalled_for, silent.state) == (ST, 8, State(S(4, 1, 1, 5), stall_since=0))
    after = assess(State(Q(3), stall_since=3), S(4, 1, 1, 9))
    assert (after.verdict, after.reason) == (B, "no earlier answer")


def test_sample_and_state_reprs_show_what_is_set() -> None:
    assert repr(C(2, 3, 4, pending=2)) == (
        "Sample(running=0.0, generation=2.0, prompt=3.0, t=4.0, waiting=0.0, pending=2.0)"
    )
    assert repr(Z(1, 2, 3, 4, "asleep")) == (
        "Sample(running=1.0, generation=2.0, prompt=3.0, t=4.0, waiting=0.0, paused='asleep')"
    )
    assert repr(Q(4)) == "Sample(running=0.0, generation=0.0, prompt=0.0, t=4.0, waiting=0.0, answered=False)"
    assert repr(W(0, 2, 3, 4, 5, 3)) == "Sample(running=0.0, generation=2.0, prompt=3.0, t=4.0, waiting=5.0, owed=3.0)"
    assert W(0, 2, 3, 4, 5, 3) != W(0, 2, 3, 4, 5, 0)
    assert (
        repr(State(Z(1, 2, 3, 4), paused_since=2)) == f"State(last={Z(1, 2, 3, 4)!r}, stall_since=None, paused_since=2)"
    )
    assert Q(4) != S(0, 0, 0, 4)
    assert C(1, 1, 1) != S(0, 1, 1, 1)
    assert Z(1, 1, 1, 1) != S(1, 1, 1, 1)
    assert len({Q(4), S(0, 0, 0, 4), C(0, 0, 4), Z(0, 0, 0, 4)}) == 4


def test_state_equality_and_repr() -> None:
    a = State(S(1, 2, 3, 4), stall_since=2)
    assert a == State(S(1, 2, 3, 4), stall_since=2)
    assert a != State(S(1, 2, 3, 4))
    assert a != State(S(1, 2, 3, 5), stall_since=2)
    assert a != "state"
    assert repr(a) == f"State(last={S(1, 2, 3, 4)!r}, stall_since=2)"
    assert "stalled_for=0.0" in repr(assess(None, S(1, 2, 3, 4)))


def test_samples_and_states_are_hashable_values() -> None:
    assert len({S(1, 2, 3, 4), S(1.0, 2.0, 3.0, 4.0)}) == 1
    assert len({hash(S(1, 2, 3, t)) for t in range(10)}) == 10
    assert len({State(S(1, 2, 3, 4), 2), State(S(1, 2, 3, 4), 2.0)}) == 1
    assert len({hash(State(S(1, 2, 3, 4), since)) for since in (None, 0, 1, 2, 3)}) == 5


# --- include_waiting: a queue that never moves behind nothing running


def test_queue_behind_nothing_running_is_idle_by_default() -> None:
    samples = [S(0, 5, 5, t, waiting=7) for t in (0, 100, 200, 300)]
    assert replay(samples) == [B, IDL, IDL, IDL]


def test_queue_behind_nothing_running_stalls_with_include_waiting() -> None:
    samples = [S(0, 5, 5, t, waiting=7) for t in (0, 100, 119, 120)]
    assert replay(samples, include_waiting=True) == [B, SUS, SUS, ST]
    assert replay(samples, 120, DEFAULT_SATURATION, include_waiting=True) == [B, SUS, SUS, ST]


def test_include_waiting_starts_the_clock_at_the_first_queued_sample() -> None:
    samples = [S(0, 5, 5, 0), S(0, 5, 5, 200, waiting=3), S(0, 5, 5, 310, waiting=3), S(0, 5, 5, 320, waiting=3)]
    assert replay(samples, include_waiting=True) == [B, SUS, SUS, ST]
    assert step(State(S(0, 5, 5, 0)), S(0, 5, 5, 200, waiting=3), include_waiting=True)[1].stall_since == 200


def test_include_waiting_says_which_waiting_requests_are_owed() -> None:
    samples = [W(0, 5, 5, t, 3, 1) for t in (0, 100, 200)]
    assert replay(samples) == [B, SUS, ST]  # auto: the one the sample says is owed
    assert replay(samples, include_waiting=None) == [B, SUS, ST]
    assert replay(samples, include_waiting=False) == [B, IDL, IDL]  # never: none of them
    deferred = [W(0, 5, 5, t, 3, 0) for t in (0, 100, 200)]
    assert replay(deferred) == [B, IDL, IDL]
    assert replay(deferred, include_waiting=True) == [B, SUS, ST]  # always: every one


def test_include_waiting_still_needs_work_to_be_owed() -> None:
    assert replay([S(0, 5, 5, 0), S(0, 5, 5, 500)], include_waiting=True) == [B, IDL]


# --- several engines behind one page


def E(**engines: Sample) -> dict[str, Sample]:
    return {name.lstrip("e"): sample for name, sample in engines.items()}


# (name, window, [samples of each engine at each step], expected page verdict, expected worst engine)
ENGINE_SCENARIOS: list[tuple[str, float, list[dict[str, Sample]], list[tuple[Verdict, str]]]] = [
    (
        "one_wedged_among_moving_is_stalled",
        120,
        [
            E(e0=S(3, 10, 10, 0), e1=S(3, 10, 10, 0)),
            E(e0=S(3, 90, 10, 60), e1=S(3, 10, 10, 60)),
            E(e0=S(3, 190, 10, 121), e1=S(3, 10, 10, 121)),
        ],
        [(B, "0"), (SUS, "1"), (ST, "1")],
    ),
    (
        "engines_moving_is_progressing",
        120,
        [E(e0=S(3, 10, 10, 0), e1=S(3, 10, 10, 0)), E(e0=S(3, 90, 10, 60), e1=S(3, 11, 10, 60, 5))],
        [(B, "0"), (SAT, "1")],
    ),
    (
        "an_engine_appearing_starts_at_baseline",
        120,
        [
            E(e0=S(3, 10, 10, 0)),
            E(e0=S(3, 20, 10, 200), e1=S(3, 10, 10, 200)),
            E(e0=S(3, 30, 10, 300), e1=S(3, 10, 10, 300)),
        ],
        [(B, "0"), (P, "0"), (SUS, "1")],
    ),
    (
        "an_engine_vanishing_is_forgotten",
        120,
        [
            E(e0=S(3, 10, 10, 0), e1=S(3, 10, 10, 0)),
            E(e0=S(3, 20, 10, 100), e1=S(3, 10, 10, 100)),
            E(e0=S(3, 30, 10, 200)),
            E(e0=S(3, 40, 10, 300), e1=S(3, 10, 10, 300)),
        ],
        [(B, "0"), (SUS, "1"), (P, "0"), (P, "0")],
    ),
    (
        "the_longest_stall_speaks_for_the_page",
        120,
        [
            E(e0=S(3, 10, 10, 0), e1=S(3, 10, 10, 0)),
            E(e0=S(3, 20, 10, 100), e1=S(3, 10, 10, 100)),
            E(e0=S(3, 20, 10, 250), e1=S(3, 10, 10, 250)),
            E(e0=S(3, 20, 10, 400), e1=S(0, 10, 10, 400)),
        ],
        [(B, "0"), (SUS, "1"), (ST, "1"), (ST, "0")],
    ),
    (
        "idle_engines_beside_a_baseline",
        120,
        [E(e0=S(0, 10, 10, 0)), E(e0=S(0, 10, 10, 10), e1=S(0, 0, 0, 10))],
        [(B, "0"), (B, "1")],
    ),
]


@pytest.mark.parametrize(
    ("window", "steps", "expected"), [s[1:] for s in ENGINE_SCENARIOS], ids=[s[0] for s in ENGINE_SCENARIOS]
)
def test_engine_scenario(window: float, steps: list[dict[str, Sample]], expected: list[tuple[Verdict, str]]) -> None:
    assert ENGINE_SCENARIOS
    states = None
    seen = []
    for samples in steps:
        result = assess_engines(states, samples, window)
        seen.append((result.verdict, result.worst))
        assert sorted(result.engines) == sorted(samples)
        assert result.states == {name: one.state for name, one in result.engines.items()}
        verdict, states = step_engines(states, samples, window)
        assert verdict is result.verdict
    assert seen == expected


def test_one_engine_through_the_mapping_is_judged_like_step() -> None:
    samples = [S(2, 0, 0, 0), S(2, 0, 0, 60), S(2, 5, 0, 70), S(2, 5, 0, 200), S(0, 5, 0, 210)]
    states = None
    verdicts = []
    for sample in samples:
        verdict, states = step_engines(states, {"": sample}, include_waiting=False)
        verdicts.append(verdict)
    assert verdicts == replay(samples) == [B, SUS, P, ST, IDL]


def test_engines_are_judged_with_the_given_parameters() -> None:
    history = {"0": State(S(0, 5, 5, 0, waiting=2))}
    queued = {"0": S(0, 5, 5, 10, waiting=2)}
    assert step_engines(history, queued, 5, include_waiting=True)[0] is ST
    assert step_engines(history, queued, 5)[0] is IDL
    moving = {"0": S(1, 6, 5, 10, waiting=2)}
    assert step_engines(history, moving, 5, 3)[0] is P
    assert step_engines(history, moving, 5, 2)[0] is SAT


def test_no_engines_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^samples must name at least one engine$"):
        assess_engines(None, {})


def test_engines_assessment_repr_names_the_worst() -> None:
    result = assess_engines(None, {"a": S(1, 1, 1, 0)})
    assert repr(result).startswith("EnginesAssessment(Verdict.BASELINE, worst='a', engines={'a': Assessment(")


def test_signals_round_trip_and_are_validated() -> None:
    sample = S(1, 2, 3, 4, kv=0.5, decode=7)
    assert sample.signals == {"decode": 7.0, "kv": 0.5}
    assert Sample.from_dict(sample.to_dict()) == sample
    assert sample != S(1, 2, 3, 4, kv=0.5)
    assert repr(sample).endswith("signals={'decode': 7.0, 'kv': 0.5})")
    with pytest.raises(ValueError, match="signal 'kv' must be a finite number"):
        S(1, 2, 3, 4, kv=math.nan)
    with pytest.raises(ValueError, match="signals must be a mapping"):
        Sample.from_dict({**S(1, 2, 3, 4).to_dict(), "signals": [1]})
    with pytest.raises(ValueError, match="signal 'kv' must be a number"):
        Sample.from_dict({**S(1, 2, 3, 4).to_dict(), "signals": {"kv": "x"}})


def test_include_waiting_is_off_unless_asked_for_everywhere() -> None:
    history = State(S(0, 5, 5, 0, waiting=1))
    queued = S(0, 5, 5, 500, waiting=1)
    assert assess(history, queued).verdict is IDL
    assert step(history, queued)[0] is IDL
    assert assess_engines({"": history}, {"": queued}).verdict is IDL
    assert step_engines({"": history}, {"": queued})[0] is IDL
    assert replay([history.last, queued]) == [B, IDL]
    assert replay([history.last, queued], include_waiting=True) == [B, ST]


def test_bad_signal_entries_in_a_dict_are_refused() -> None:
    base = S(1, 2, 3, 4).to_dict()
    for signals in ({1: 2.0}, {"kv": True}, {"kv": None}):
        with pytest.raises(ValueError, match="must be a number"):
            Sample.from_dict({**base, "signals": signals})


def test_replace_changes_only_what_it_is_given() -> None:
    def sample(
        running: float = 1, waiting: float = 5, pending: float = 2, owed: float = 4, paused: str = "x"
    ) -> Sample:
        return Sample(running, 2, 3, 4, waiting, signals={"kv": 0.5}, pending=pending, owed=owed, paused=paused)

    assert sample().replace() == sample()
    assert sample().replace(pending=0) == sample(pending=0)
    assert sample().replace(paused="") == sample(paused="")
    assert sample().replace(owed=0) == sample(owed=0)
    assert sample().replace(running=0, waiting=7, owed=6) == sample(running=0, waiting=7, owed=6)
    assert Q(4).replace(pending=1).answered is False


def test_a_sample_refuses_an_owed_count_that_is_not_finite() -> None:
    with pytest.raises(ValueError, match=r"^Sample.owed must be a finite number \(got nan\)$"):
        Sample(0, 1, 1, 1, 3, owed=math.nan)
    with pytest.raises(ValueError, match=r"^sample owed must be a number \(got '2'\)$"):
        Sample.from_dict({"running": 1, "generation": 2, "prompt": 3, "t": 4, "waiting": 0, "owed": "2"})


# --- readiness: one rule for the probe's --ready and watch's /ready


def judged(window: float, steps: list[dict[str, Sample]]) -> EnginesAssessment:
    """The last step's assessment after folding every step from no history."""
    states = None
    for samples in steps:
        result = assess_engines(states, samples, window)
        states = result.states
    return result


# (name, window, drain_after, steps, healthy, (ready, verdict for routing, the engine that speaks))
READINESS: list[tuple[str, float, float, list[dict[str, Sample]], bool, tuple[bool, Verdict, str]]] = [
    ("baseline_is_ready", 120, 30, [E(e0=S(4, 0, 0, 0))], True, (True, B, "0")),
    ("idle_is_ready", 120, 30, [E(e0=S(0, 5, 5, 0)), E(e0=S(0, 5, 5, 500))], True, (True, IDL, "0")),
    ("moving_is_ready", 120, 30, [E(e0=S(4, 0, 0, 0)), E(e0=S(4, 9, 0, 10))], True, (True, P, "0")),
    ("saturated_stays_ready", 120, 30, [E(e0=S(9, 0, 0, 0)), E(e0=S(9, 1, 0, 60, 99))], True, (True, SAT, "0")),
    ("frozen_under_drain_is_ready", 120, 30, [E(e0=S(4, 5, 5, 0)), E(e0=S(4, 5, 5, 29.9))], True, (True, SUS, "0")),
    ("frozen_for_drain_is_not_ready", 120, 30, [E(e0=S(4, 5, 5, 0)), E(e0=S(4, 5, 5, 30))], True, (False, ST, "0")),
    ("silent_under_drain_is_ready", 120, 30, [E(e0=S(4, 5, 5, 0)), E(e0=Q(29))], True, (True, SUS, "0")),
    ("silent_for_drain_is_not_ready", 120, 30, [E(e0=S(4, 5, 5, 0)), E(e0=Q(30))], True, (False, ST, "0")),
    ("stalled_for_liveness_too", 120, 30, [E(e0=S(4, 5, 5, 0)), E(e0=S(4, 5, 5, 200))], True, (False, ST, "0")),
    # A drain window longer than the liveness window: an engine stalled (about to be restarted) is not ready.
    ("drain_longer_than_window_stalled", 10, 30, [E(e0=S(4, 5, 5, 0)), E(e0=S(4, 5, 5, 20))], True, (False, ST, "0")),
    ("drain_longer_than_window_at_it", 10, 30, [E(e0=S(4, 5, 5, 0)), E(e0=S(4, 5, 5, 10))], True, (False, ST, "0")),
    ("drain_longer_than_window_under", 10, 30, [E(e0=S(4, 5, 5, 0)), E(e0=S(4, 5, 5, 9.9))], True, (True, SUS, "0")),
    ("silent_past_window_under_drain", 10, 30, [E(e0=S(4, 5, 5, 0)), E(e0=Q(15))], True, (False, ST, "0")),
    ("drain_equal_to_window", 20, 20, [E(e0=S(4, 5, 5, 0)), E(e0=S(4, 5, 5, 20))], True, (False, ST, "0")),
    ("drain_equal_to_window_under", 20, 20, [E(e0=S(4, 5, 5, 0)), E(e0=S(4, 5, 5, 19))], True, (True, SUS, "0")),
    ("paused_is_not_ready", 120, 30, [E(e0=Z(4, 5, 5, 0)), E(e0=Z(4, 5, 5, 1))], True, (False, PA, "0")),
    ("unhealthy_is_not_ready", 120, 30, [E(e0=S(4, 0, 0, 0)), E(e0=S(4, 9, 0, 10))], False, (False, P, "0")),
    (
        "a_paused_engine_among_moving_ones_speaks",
        120,
        30,
        [E(e0=S(3, 0, 0, 0), e1=Z(0, 0, 0, 0)), E(e0=S(3, 9, 0, 10), e1=Z(0, 0, 0, 10))],
        True,
        (False, PA, "1"),
    ),
    (
        "a_drained_engine_speaks_before_a_paused_one",
        120,
        30,
        [E(e0=Z(0, 0, 0, 0), e1=S(3, 0, 0, 0)), E(e0=Z(0, 0, 0, 40), e1=S(3, 0, 0, 40))],
        True,
        (False, ST, "1"),
    ),
    (
        "one_frozen_engine_under_drain_beside_a_moving_one",
        120,
        30,
        [E(e0=S(3, 0, 0, 0), e1=S(3, 0, 0, 0)), E(e0=S(3, 9, 0, 10), e1=S(3, 0, 0, 10))],
        True,
        (True, SUS, "1"),
    ),
]


@pytest.mark.parametrize(
    ("window", "drain_after", "steps", "healthy", "expected"),
    [r[1:] for r in READINESS],
    ids=[r[0] for r in READINESS],
)
def test_readiness(
    window: float,
    drain_after: float,
    steps: list[dict[str, Sample]],
    healthy: bool,
    expected: tuple[bool, Verdict, str],
) -> None:
    assert READINESS
    result = judged(window, steps)
    ready, routing = readiness(result, drain_after, healthy=healthy)
    assert (ready, routing.verdict, routing.worst) == expected
    # The same history and stall clocks; only verdicts of busy, frozen engines change with the window.
    assert routing.states == result.states
    for name, one in routing.engines.items():
        assert one.stalled_for == result.engines[name].stalled_for
        assert one.reason == result.engines[name].reason
        assert one.verdict is result.engines[name].verdict or {one.verdict, result.engines[name].verdict} == {SUS, ST}


def test_readiness_is_healthy_unless_told() -> None:
    result = judged(120, [E(e0=S(4, 0, 0, 0)), E(e0=S(4, 9, 0, 10))])
    assert readiness(result, 30)[0] is True


@pytest.mark.parametrize("drain_after", [0.0, -1.0, math.nan])
def test_readiness_refuses_a_drain_window_that_is_not_positive(drain_after: float) -> None:
    result = judged(120, [E(e0=S(4, 0, 0, 0))])
    with pytest.raises(ValueError, match="drain_after must be > 0"):
        readiness(result, drain_after)
    assert readiness(result, 0.5)[0] is True  # a drain window under a second is a window


# --- when an engine looks idle enough to be asked about requests its gauges miss

# (name, the previous sample of each engine or None, this look's samples, whether it looks idle)
LOOKS_IDLE: list[tuple[str, dict[str, Sample] | None, dict[str, Sample], bool]] = [
    ("nothing_moved_since_the_last_look", E(e0=S(0, 5, 5, 0)), E(e0=S(0, 5, 5, 10)), True),
    ("no_history", None, E(e0=S(0, 5, 5, 10)), False),
    ("requests_running", E(e0=S(0, 5, 5, 0)), E(e0=S(1, 5, 5, 10)), False),
    ("requests_waiting", E(e0=S(0, 5, 5, 0)), E(e0=S(0, 5, 5, 10, 1)), False),
    ("an_engine_not_seen_before", E(e0=S(0, 5, 5, 0)), E(e0=S(0, 5, 5, 10), e1=S(0, 5, 5, 10)), False),
    ("the_last_look_got_no_answer", E(e0=Q(0)), E(e0=S(0, 5, 5, 10)), False),
    ("generation_moved", E(e0=S(0, 5, 5, 0)), E(e0=S(0, 6, 5, 10)), False),
    ("prompt_moved", E(e0=S(0, 5, 5, 0)), E(e0=S(0, 5, 6, 10)), False),
    ("a_signal_moved", E(e0=S(0, 5, 5, 0, kv=0.1)), E(e0=S(0, 5, 5, 10, kv=0.2)), False),
    ("moved_while_a_canary_was_owed", E(e0=C(5, 5, 0)), E(e0=S(0, 6, 5, 10)), True),
    ("one_of_two_engines_moved", E(e0=S(0, 5, 5, 0), e1=S(0, 5, 5, 0)), E(e0=S(0, 5, 5, 9), e1=S(0, 6, 5, 9)), False),
]


@pytest.mark.parametrize(("previous", "samples", "idle"), [r[1:] for r in LOOKS_IDLE], ids=[r[0] for r in LOOKS_IDLE])
def test_looks_idle(previous: dict[str, Sample] | None, samples: dict[str, Sample], idle: bool) -> None:
    assert LOOKS_IDLE
    history = None if previous is None else {name: State(sample) for name, sample in previous.items()}
    assert looks_idle(samples, history) is idle


# --- thrashing: tokens move, nothing finishes


def F(
    running: float,
    gen: float,
    prompt: float,
    t: float,
    finished: float | None,
    waiting: float = 0.0,
    preemptions: float | None = 0.0,
) -> Sample:
    """A sample of an engine whose page counts its finished and preempted requests."""
    return Sample(running, gen, prompt, t, waiting, finished=finished, preemptions=preemptions)


MINUTES = range(0, 13)  # a sample a minute for twelve minutes: past the 600 s thrash window

# (name, thrash_fails_after, samples, expected verdicts), all with the window 120 s and the thrash window 600 s
THRASH: list[tuple[str, float | None, list[Sample], list[Verdict]]] = [
    (
        # vLLM #53130: 1,946 prompt and 0.48 generation tokens a second, nothing finished, no preemption.
        "prefill_far_ahead_of_decoding_with_nothing_finished_is_thrashing",
        None,
        [F(4, 29 * m, 116760 * m, 60.0 * m, 100, waiting=487) for m in MINUTES],
        [B] + [SAT] * 9 + [THR] * 3,
    ),
    (
        "one_long_generation_never_thrashes",
        None,
        [F(1, 300 * m, 4000, 60.0 * m, 7) for m in range(40)],
        [B] + [P] * 39,
    ),
    (
        "an_engine_that_generates_nothing_never_thrashes",  # embeddings: prompt tokens only
        None,
        [F(8, 0, 50000 * m, 60.0 * m, 3) for m in MINUTES],
        [B] + [P] * 12,
    ),
    (
        "a_burst_of_long_prefills_finishes_within_the_window",
        None,
        [F(50, 10 * m, 500000 * m, 60.0 * m, 0 if m < 9 else 50) for m in MINUTES],
        [B] + [P] * 12,
    ),
    (
        "a_saturated_engine_finishing_slowly_never_thrashes",
        None,
        [F(12, 300 * m, 20000 * m, 60.0 * m, m // 5, waiting=99) for m in range(30)],
        [B] + [SAT] * 29,
    ),
    (
        "preemptions_climbing_with_nothing_finished_is_thrashing",  # recompute: decoding may lead
        None,
        [F(4, 100 * m, 10, 60.0 * m, 5, preemptions=5 * m) for m in MINUTES],
        [B] + [P] * 9 + [THR] * 3,
    ),
    (
        "preemptions_that_do_not_climb_are_no_sign",
        None,
        [F(4, 100 * m, 10, 60.0 * m, 5, preemptions=5) for m in MINUTES],
        [B] + [P] * 12,
    ),
    (
        "a_page_without_a_finished_counter_is_never_thrashing",
        None,
        [F(4, 29 * m, 116760 * m, 60.0 * m, None, waiting=487, preemptions=None) for m in MINUTES],
        [B] + [SAT] * 12,
    ),
    (
        "thrashing_fails_only_when_the_operator_asks_and_past_that_window",
        900,
        [F(4, 29 * m, 116760 * m, 60.0 * m, 100, waiting=487) for m in range(17)],
        [B] + [SAT] * 9 + [THR] * 5 + [ST] * 2,
    ),
    (
        "a_finish_starts_a_new_period",
        None,
        [F(4, 29 * m, 116760 * m, 60.0 * m, 100 if m < 8 else 101) for m in range(20)],
        [B] + [P] * 17 + [THR] * 2,
    ),
    (
        "an_idle_moment_starts_a_new_period",
        None,
        [F(0 if m == 6 else 4, 29 * m, 116760 * m, 60.0 * m, 100) for m in range(18)],
        [B] + [P] * 5 + [IDL] + [P] * 10 + [THR],
    ),
    (
        "a_pause_starts_a_new_period",
        None,
        [
            Sample(4, 29 * m, 116760 * m, 60.0 * m, finished=100, preemptions=0, paused="asleep" if m == 6 else "")
            for m in range(18)
        ],
        [B] + [P] * 5 + [PA] + [P] * 10 + [THR],
    ),
    (
        "a_frozen_moment_keeps_the_period",
        None,
        [F(4, 29 * m, 116760 * m, 60.0 * m, 100) for m in range(9)]
        + [F(4, 29 * 8, 116760 * 8, 540.0, 100)]  # nothing moves for a minute
        + [F(4, 29 * m, 116760 * m, 60.0 * m, 100) for m in range(10, 13)],
        [B] + [P] * 8 + [SUS] + [THR] * 3,
    ),
    (
        "a_finished_counter_that_appears_starts_its_period",
        None,
        [F(4, 29 * m, 116760 * m, 60.0 * m, None if m < 3 else 100) for m in range(15)],
        [B] + [P] * 12 + [THR] * 2,
    ),
    (
        "a_finished_count_that_goes_starts_nothing",
        None,
        [F(4, 29 * m, 116760 * m, 60.0 * m, 100 if m < 3 else None) for m in range(15)],
        [B] + [P] * 14,
    ),
    (
        "exactly_the_ratio_is_thrashing",
        None,
        [F(4, 10 * m, 100 * m, 60.0 * m, 1) for m in MINUTES],
        [B] + [P] * 9 + [THR] * 3,
    ),
    (
        "just_under_the_ratio_is_not",
        None,
        [F(4, 10 * m, 99 * m, 60.0 * m, 1) for m in MINUTES],
        [B] + [P] * 12,
    ),
    (
        "a_busy_engine_first_seen_idle_starts_its_period_when_busy",
        None,
        [F(0, 0, 0, 0, 1)] + [F(4, 29 * m, 116760 * m, 60.0 * m, 1) for m in range(1, 12)],
        [B] + [P] * 10 + [THR],  # from the first busy sample (60 s), not the idle one (0 s)
    ),
]


@pytest.mark.parametrize(
    ("fails_after", "samples", "expected"), [row[1:] for row in THRASH], ids=[row[0] for row in THRASH]
)
def test_thrash_scenario(fails_after: float | None, samples: list[Sample], expected: list[Verdict]) -> None:
    assert THRASH
    assert len(samples) == len(expected)
    assert replay(samples, 120, thrash_window=600, thrash_fails_after=fails_after) == expected
    # The same rows with the default thrash window (600 s) and no opt-in: never stalled by thrashing.
    assert replay(samples, 120) == [
        THR if verdict is ST and fails_after is not None else verdict for verdict in expected
    ]


def test_thrashing_says_how_long_nothing_finished_and_why_it_stalled() -> None:
    state: State | None = None
    for m in MINUTES:
        result = assess(state, F(4, 29 * m, 116760 * m, 60.0 * m, 100, waiting=487), thrash_fails_after=700)
        state = result.state
    assert (result.verdict, result.reason, result.unfinished_for) == (ST, THRASHED, 720.0)
    assert result.state.mark == F(0, 0, 0, 0.0, 100)  # what a mark keeps: when, and the counters
    assert result.stalled_for == 0.0


def test_readiness_drains_thrashing_only_when_liveness_acts_on_it() -> None:
    samples = [F(4, 29 * m, 116760 * m, 60.0 * m, 100, waiting=487) for m in MINUTES]
    for fails_after, ready in ((None, True), (600.0, False)):
        states = None
        for sample in samples:
            result = assess_engines(states, {"0": sample}, thrash_fails_after=fails_after)
            states = result.states
        assert readiness(result, 30.0)[0] is ready


def test_the_counts_of_finished_and_preempted_requests_round_trip() -> None:
    sample = F(4, 1, 2, 3.0, 7, preemptions=9)
    assert Sample.from_dict(sample.to_dict()) == sample
    assert sample.to_dict()["finished"] == 7.0
    assert "finished" not in S(1, 2, 3, 4).to_dict()
    assert repr(sample).endswith(", finished=7.0, preemptions=9.0)")
    assert sample.replace(running=2).finished == 7.0
    assert sample != F(4, 1, 2, 3.0, 8, preemptions=9)
    assert sample != F(4, 1, 2, 3.0, 7, preemptions=8)
    state = State(sample, mark=F(4, 0, 0, 1.0, 7))
    assert State.from_dict(state.to_dict()) == state
    assert "mark=" in repr(state)
    assert state != State(sample)
    with pytest.raises(ValueError, match="mark"):
        State.from_dict({**state.to_dict(), "mark": F(4, 0, 0, 5.0, 7).to_dict()})
    with pytest.raises(ValueError, match="mark must be"):
        State.from_dict({**state.to_dict(), "mark": 3})
    for name in ("finished", "preemptions"):
        with pytest.raises(ValueError, match=f"sample {name} must be a number"):
            Sample.from_dict({**sample.to_dict(), name: "many"})
        with pytest.raises(ValueError, match=f"Sample.{name} must be a finite number"):
            Sample(1, 1, 1, 1, finished=math.nan) if name == "finished" else Sample(1, 1, 1, 1, preemptions=math.nan)


# --- the thrash rule's edges, each a rule a mutant would break


def test_a_request_finishing_while_the_counters_hold_is_progress() -> None:
    before = assess(None, F(4, 10, 10, 0.0, 5))
    after = assess(before.state, F(4, 10, 10, 10.0, 6))
    assert after.verdict is P
    assert after.state.mark == F(0, 10, 10, 10.0, 6)  # a new period starts at the finish
    assert after.unfinished_for == 0.0


def test_a_silent_page_keeps_the_period_of_nothing_finished() -> None:
    moving = assess(None, F(4, 10, 10, 0.0, 5))
    moving = assess(moving.state, F(4, 20, 20, 10.0, 5))
    assert moving.state.mark is not None
    quiet = assess(moving.state, Q(20.0))
    assert quiet.state.mark == moving.state.mark


def test_the_period_starts_at_a_sample_busy_only_by_its_owed_queue() -> None:
    """include_waiting reaches the thrash rule: the last sample, with nothing running but 5 waiting, is
    busy when every waiting request counts, and the period runs from it."""
    first = assess(None, Sample(0, 10, 10, 0.0, 5, finished=1, preemptions=0), include_waiting=True)
    second = assess(first.state, F(4, 20, 20, 10.0, 1), include_waiting=True)
    assert second.state.mark == F(0, 10, 10, 0.0, 1)
    alone = assess(first.state, F(4, 20, 20, 10.0, 1))  # the default: nothing waiting is owed there
    assert alone.state.mark == F(0, 20, 20, 10.0, 1)


def test_a_page_without_a_finished_counter_counts_no_period() -> None:
    first = assess(None, S(4, 10, 10, 0.0))
    second = assess(first.state, S(4, 20, 20, 10.0))
    assert (second.verdict, second.unfinished_for, second.state.mark) == (P, 0.0, None)


@pytest.mark.parametrize(
    ("mark", "now", "thrashing"),
    [
        (F(0, 1000, 100, 0.0, 1), F(4, 1000, 100100, 700.0, 1), False),  # no decoding since: no sign
        (F(0, 1000, 100, 0.0, 1), F(4, 1001, 110, 700.0, 1), True),  # one token decoded, ten prefilled
        (F(0, 1000, 1000000, 0.0, 1), F(4, 1001, 1000005, 700.0, 1), False),  # five prefilled for one decoded
    ],
)
def test_the_signs_compare_what_moved_since_the_period_began(mark: Sample, now: Sample, thrashing: bool) -> None:
    state = State(F(4, mark.generation, mark.prompt, 600.0, 1), mark=mark)
    assert (assess(state, now).verdict is THR) is thrashing


def test_every_fold_takes_the_thrash_window() -> None:
    samples = [F(4, 29 * m, 116760 * m, 60.0 * m, 100, waiting=487) for m in range(7)]
    assert replay(samples, thrash_window=300)[-2:] == [THR, THR]
    assert replay(samples)[-2:] == [SAT, SAT]
    state = None
    for sample in samples:
        verdict, state = step(state, sample, thrash_window=300)
    assert verdict is THR
    states = None
    for sample in samples:
        result = assess_engines(states, {"0": sample}, thrash_window=300)
        states = result.states
    assert result.verdict is THR


def test_a_mark_at_the_last_sample_s_time_reads_back_and_one_later_does_not() -> None:
    state = State(F(4, 1, 2, 30.0, 7), mark=F(0, 1, 2, 30.0, 7))
    assert State.from_dict(state.to_dict()) == state
    assert Assessment(P, state, "", 0.0).unfinished_for == 0.0


def test_a_copy_keeps_the_counts_and_takes_new_signals() -> None:
    sample = F(4, 1, 2, 3.0, 7, preemptions=9)
    copy = sample.replace(signals={"a": 1.0})
    assert (copy.signals, copy.finished, copy.preemptions) == ({"a": 1.0}, 7.0, 9.0)
    assert sample.replace().signals == sample.signals
