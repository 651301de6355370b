"""Properties of the detector over generated sample sequences (hypothesis).

The central one compares the detector with an independent oracle: a backward scan over the samples that
finds how long the engine has been seen busy with frozen counters. Times are whole seconds, so shifting
them or comparing a duration with the window is exact in floating point.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stallprobe import Sample, State, Verdict, assess_engines, replay, step

SETTINGS = settings(derandomize=True, deadline=None, max_examples=200)
WINDOWS = st.sampled_from([1.0, 10.0, 30.0, 120.0])


def step_engines(
    states: Mapping[str, State] | None, samples: Mapping[str, Sample], *args: Any, **kwargs: Any
) -> tuple[Verdict, dict[str, State]]:
    """One step for several engines: the page's verdict and the states for the next step."""
    result = assess_engines(states, samples, *args, **kwargs)
    return result.verdict, result.states


@st.composite
def sequences(draw: st.DrawFn, min_size: int = 1, max_size: int = 40) -> list[Sample]:
    """Samples of one engine: mostly forward time, counters that often freeze, sometimes resets and
    clock steps back; a KV-cache-like signal that sometimes moves."""
    size = draw(st.integers(min_size, max_size))
    t = float(draw(st.integers(0, 10_000)))
    gen, prompt, kv = 0.0, 0.0, 0.0
    samples = []
    for _ in range(size):
        t += draw(st.sampled_from([0, 1, 5, 10, 30, 60, 119, 120, 121, 200, -50]))
        move = draw(st.sampled_from(["none", "none", "none", "gen", "prompt", "kv", "reset"]))
        if move == "gen":
            gen += draw(st.integers(1, 50))
        elif move == "prompt":
            prompt += draw(st.integers(1, 5000))
        elif move == "kv":
            kv = draw(st.sampled_from([0.0, 0.25, 0.5]))
        elif move == "reset":
            gen, prompt = draw(st.sampled_from([(0.0, 0.0), (gen, 0.0), (0.0, prompt)]))
        running = float(draw(st.sampled_from([0, 1, 1, 3, 21])))
        waiting = float(draw(st.sampled_from([0, 0, 1, 99])))
        owed = float(draw(st.sampled_from([0, 0, waiting])))  # waiting for capacity, or deferred
        samples.append(Sample(running, gen, prompt, t, waiting, signals={"kv": kv}, owed=owed))
    return samples


def frozen_since(samples: list[Sample], i: int, include_waiting: bool | None = None) -> float | None:
    """The oracle: when the engine was last seen moving or idle, scanning back from sample i; None when
    sample i is not busy-and-frozen compared with the sample before it. Busy: requests running, or
    waiting and owed (include_waiting None: those the sample says; True: all; False: none)."""

    def busy(s: Sample) -> bool:
        if s.running > 0:
            return True
        return s.owed > 0 if include_waiting is None else include_waiting and s.waiting > 0

    def frozen(k: int) -> bool:  # sample k shows nothing new compared with k - 1, on a clock going forward
        a, b = samples[k - 1], samples[k]
        same = (a.generation, a.prompt, a.signals) == (b.generation, b.prompt, b.signals)
        return busy(b) and same and b.t >= a.t

    if i == 0 or not frozen(i):
        return None
    k = i
    while k > 0 and frozen(k):
        k -= 1
    # Samples k+1..i are busy and frozen; k is where the chain began: its time if it was busy too.
    return samples[k].t if busy(samples[k]) else samples[k + 1].t


@SETTINGS
@given(sequences(), WINDOWS)
def test_stalled_exactly_when_seen_busy_and_frozen_for_the_window(samples: list[Sample], window: float) -> None:
    verdicts = replay(samples, window)
    for i, verdict in enumerate(verdicts):
        since = frozen_since(samples, i)
        expected_stalled = since is not None and samples[i].t - since >= window
        assert (verdict is Verdict.STALLED) == expected_stalled, (i, verdict, since)
        assert (verdict in (Verdict.SUSPECT, Verdict.STALLED)) == (since is not None)


@SETTINGS
@given(sequences(), WINDOWS, st.sampled_from([True, False]))
def test_with_include_waiting_the_oracle_counts_the_queue_or_not(
    samples: list[Sample], window: float, include_waiting: bool
) -> None:
    verdicts = replay(samples, window, include_waiting=include_waiting)
    for i, verdict in enumerate(verdicts):
        since = frozen_since(samples, i, include_waiting=include_waiting)
        assert (verdict is Verdict.STALLED) == (since is not None and samples[i].t - since >= window)


@st.composite
def idle_or_advancing(draw: st.DrawFn) -> list[Sample]:
    """Samples of one engine (from `sequences`) whose every step is idle (nothing running, nothing owed)
    or shows progress over the step before (a generation token more)."""
    samples = draw(sequences(min_size=2))
    made = [samples[0]]
    for s in samples[1:]:
        if draw(st.booleans()):
            made.append(Sample(0, s.generation, s.prompt, s.t, s.waiting, signals=s.signals, owed=0))
        else:
            generation = made[-1].generation + 1
            made.append(Sample(s.running, generation, s.prompt, s.t, s.waiting, signals=s.signals, owed=s.owed))
    return made


@SETTINGS
@given(idle_or_advancing(), WINDOWS)
def test_idle_or_advancing_samples_are_never_stalled(samples: list[Sample], window: float) -> None:
    assert Verdict.STALLED not in replay(samples, window)


@SETTINGS
@given(
    st.lists(st.integers(1, 119), min_size=1, max_size=30),
    st.lists(st.sampled_from([0, 1, 3]), min_size=30, max_size=30),
)
def test_progress_at_least_once_a_window_is_never_stalled(gaps: list[int], running: list[int]) -> None:
    """Samples every few seconds; the counters advance at least every 119 s: never stalled at 120 s."""
    samples = []
    t, gen = 0.0, 0.0
    for n, gap in enumerate(gaps):
        for k in range(3):  # frozen samples in between, then the advance at the end of the gap
            samples.append(Sample(max(running[n], 1), gen, 0, t + gap * k / 3))
        t += gap
        gen += 1
        samples.append(Sample(max(running[n], 1), gen, 0, t))
    assert Verdict.STALLED not in replay(samples, 120.0)


@SETTINGS
@given(sequences(), WINDOWS)
def test_replay_equals_stepping_through_the_json_state_file(samples: list[Sample], window: float) -> None:
    """Between two runs the CLI keeps only what State.to_dict() holds: a JSON round trip must not matter."""
    state: State | None = None
    verdicts = []
    for sample in samples:
        restored = None if state is None else State.from_dict(json.loads(json.dumps(state.to_dict())))
        assert restored == state
        verdict, state = step(restored, sample, window)
        verdicts.append(verdict)
    assert verdicts == replay(samples, window)


@SETTINGS
@given(sequences(), WINDOWS, st.integers(-(10**9), 10**9))
def test_shifting_the_clock_changes_no_verdict(samples: list[Sample], window: float, shift: int) -> None:
    moved = [
        Sample(s.running, s.generation, s.prompt, s.t + shift, s.waiting, signals=s.signals, owed=s.owed)
        for s in samples
    ]
    assert replay(moved, window) == replay(samples, window)


@SETTINGS
@given(
    st.lists(st.integers(0, 400), min_size=2, max_size=12, unique=True),
    st.lists(st.integers(0, 400), max_size=12),
    WINDOWS,
)
def test_sampling_more_often_never_hides_a_frozen_engine(times: list[int], extra: list[int], window: float) -> None:
    """A busy engine whose counters never move: more samples in between cannot turn a stall into none."""
    # The last sparse sample a whole window after the first: the sparse samples see the stall at least once.
    ordered = sorted({*times, min(times) + int(window)})
    sparse = [Sample(4, 10, 10, float(t)) for t in ordered]
    dense_times = sorted(set(ordered) | {t for t in extra if ordered[0] <= t <= ordered[-1]})
    dense = [Sample(4, 10, 10, float(t)) for t in dense_times]
    by_time = dict(zip(dense_times, replay(dense, window)))
    sparse_verdicts = replay(sparse, window)
    assert sparse_verdicts[-1] is Verdict.STALLED
    stalled = [int(sample.t) for sample, verdict in zip(sparse, sparse_verdicts) if verdict is Verdict.STALLED]
    assert [by_time[t] for t in stalled] == [Verdict.STALLED] * len(stalled)


@SETTINGS
@given(st.lists(sequences(min_size=5, max_size=5), min_size=1, max_size=4), WINDOWS)
def test_the_page_is_stalled_exactly_when_one_of_its_engines_is(engines: list[list[Sample]], window: float) -> None:
    """Engines judged together give each engine the verdict it gets alone; the page takes the worst."""
    # Give every engine the same clock, so the steps line up as one page's samples.
    aligned = [
        [Sample(s.running, s.generation, s.prompt, float(i * 50), s.waiting) for i, s in enumerate(e)] for e in engines
    ]
    alone = [replay(samples, window) for samples in aligned]
    states = None
    for i in range(5):
        verdict, states = step_engines(states, {str(n): e[i] for n, e in enumerate(aligned)}, window)
        assert (verdict is Verdict.STALLED) == any(a[i] is Verdict.STALLED for a in alone)
