"""The stall detector: a pure function from (previous state, sample) to (verdict, next state).

Everything that decides a verdict lives in this module, and nothing else does. It does no I/O, reads no
clock and no environment: the time is a field of the sample, the history is the state the caller passes
in, and nothing is mutated. The CLI keeps the state in a file between runs; tests fold samples in memory.

The rules, first match wins (each exists to avoid a false restart or a missed stall):

1. baseline    - no history, the clock went backwards, or a counter went down (the engine restarted).
                 Nothing can be compared, so the stall clock restarts.
2. idle        - running == 0. Nothing is owed, so an idle engine is never stalled, however long.
3. progressing - the prompt or the generation counter advanced. Prefill counts: a long prompt produces
                 no output tokens for a long time and is still work.
   saturated   - the same, with waiting >= the threshold: busy, not stuck. Page, never restart.
4. suspect     - busy and neither counter advanced, for less than the window.
5. stalled     - busy and neither counter advanced for at least the window. Queue depth never excuses
                 it: a deep queue behind a frozen engine is the seed's most common real fault.

The stall clock starts at the previous sample's time when that sample was busy (the last moment the
engine was seen moving or seen busy), otherwise at this sample's time, so an engine idle for an hour that
takes a request and wedges is judged from when it was first seen busy, never from hour-old counters.
"""

from __future__ import annotations

import math
from enum import Enum

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "DEFAULT_SATURATION",
    "DEFAULT_WINDOW",
    "Assessment",
    "Sample",
    "State",
    "Verdict",
    "assess",
    "replay",
    "step",
]

# 120 s, the feature request's default: a long prefill completes in seconds on current GPUs, so a busy
# engine that moved no counter for two minutes is wedged. In vLLM V1 the prompt counter moves only when a
# whole prefill completes, so the window must exceed the longest prefill a deployment allows.
DEFAULT_WINDOW = 120.0
# One queued request behind a moving engine already means demand exceeds what is running: saturated.
DEFAULT_SATURATION = 1.0

_FIELDS = ("running", "generation", "prompt", "t", "waiting")


class Verdict(Enum):
    """What one sample says about the engine. Only STALLED means "restart me"."""

    BASELINE = "baseline"
    IDLE = "idle"
    PROGRESSING = "progressing"
    SATURATED = "saturated"
    SUSPECT = "suspect"
    STALLED = "stalled"


class Sample:
    """One reading of the engine: gauges, monotonic counters and the time (seconds) it was taken."""

    __slots__ = _FIELDS

    running: float
    generation: float
    prompt: float
    t: float
    waiting: float

    def __init__(self, running: float, generation: float, prompt: float, t: float, waiting: float = 0.0) -> None:
        values = (running, generation, prompt, t, waiting)
        for name, value in zip(_FIELDS, values):
            # A NaN compares false both ways, so a NaN counter would read as "frozen" and fake a stall.
            if not math.isfinite(value):
                raise ValueError(f"Sample.{name} must be a finite number (got {value!r})")
        self.running, self.generation, self.prompt, self.t, self.waiting = (float(v) for v in values)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"Sample({inner})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sample):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _FIELDS)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, name) for name in _FIELDS))

    def to_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Sample:
        """Rebuild a sample; ValueError on a missing field or a value that is not a finite number."""
        values = []
        for name in _FIELDS:
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"sample field {name!r} must be a number (got {value!r})")
            values.append(float(value))
        return cls(*values)


class State:
    """What the detector remembers between samples: the last sample and when the stall clock started."""

    __slots__ = ("last", "stall_since")

    def __init__(self, last: Sample, stall_since: float | None = None) -> None:
        self.last = last
        # None while the stall clock is not running; otherwise the time it started.
        self.stall_since = stall_since

    def __repr__(self) -> str:
        return f"State(last={self.last!r}, stall_since={self.stall_since!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, State):
            return NotImplemented
        return self.last == other.last and self.stall_since == other.stall_since

    def __hash__(self) -> int:
        return hash((self.last, self.stall_since))

    def to_dict(self) -> dict[str, float | None]:
        """A flat JSON-able dict: the last sample's fields and `stall_since` (None when not running)."""
        data: dict[str, float | None] = dict(self.last.to_dict())
        data["stall_since"] = self.stall_since
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> State:
        """Inverse of to_dict; ValueError when the dict is not of that shape."""
        last = Sample.from_dict(data)
        since = data.get("stall_since")
        if since is None:
            return cls(last)
        if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since):
            raise ValueError(f"stall_since must be a number or None (got {since!r})")
        if since > last.t:
            raise ValueError(f"stall_since ({since!r}) is later than the last sample ({last.t!r})")
        return cls(last, float(since))


class Assessment:
    """The full outcome of one step: the verdict, the next state, and what a person needs to read it."""

    __slots__ = ("reason", "stalled_for", "state", "verdict")

    def __init__(self, verdict: Verdict, state: State, reason: str, stalled_for: float) -> None:
        self.verdict = verdict
        self.state = state
        # Why a baseline was taken (empty for every other verdict).
        self.reason = reason
        # Seconds the stall clock has run (0 when it is not running).
        self.stalled_for = stalled_for

    def __repr__(self) -> str:
        return f"Assessment({self.verdict}, {self.state!r}, reason={self.reason!r}, stalled_for={self.stalled_for!r})"


def assess(
    state: State | None,
    sample: Sample,
    window: float = DEFAULT_WINDOW,
    saturation: float = DEFAULT_SATURATION,
) -> Assessment:
    """Judge `sample` against the history in `state` (None: no history). Pure: mutates nothing."""
    if not window > 0:
        raise ValueError(f"window must be > 0 (got {window!r})")
    if not saturation > 0:
        raise ValueError(f"saturation threshold must be > 0 (got {saturation!r})")
    if state is None:
        return Assessment(Verdict.BASELINE, State(sample), "no history", 0.0)
    prev = state.last
    if sample.t < prev.t:
        return Assessment(Verdict.BASELINE, State(sample), "the clock went backwards", 0.0)
    if sample.generation < prev.generation or sample.prompt < prev.prompt:
        return Assessment(Verdict.BASELINE, State(sample), "a token counter went down (engine restarted)", 0.0)
    if sample.running <= 0:
        return Assessment(Verdict.IDLE, State(sample), "", 0.0)
    if sample.generation > prev.generation or sample.prompt > prev.prompt:
        verdict = Verdict.SATURATED if sample.waiting >= saturation else Verdict.PROGRESSING
        return Assessment(verdict, State(sample), "", 0.0)
    # Busy and frozen. Keep a running clock; else start it when the engine was last seen busy.
    since = state.stall_since
    if since is None:
        since = prev.t if prev.running > 0 else sample.t
    stalled_for = sample.t - since
    verdict = Verdict.STALLED if stalled_for >= window else Verdict.SUSPECT
    return Assessment(verdict, State(sample, since), "", stalled_for)


def step(
    state: State | None,
    sample: Sample,
    window: float = DEFAULT_WINDOW,
    saturation: float = DEFAULT_SATURATION,
) -> tuple[Verdict, State]:
    """One detector step: the verdict for `sample` and the state to pass to the next step."""
    result = assess(state, sample, window, saturation)
    return result.verdict, result.state


def replay(
    samples: Iterable[Sample],
    window: float = DEFAULT_WINDOW,
    saturation: float = DEFAULT_SATURATION,
) -> list[Verdict]:
    """Fold `step` over `samples` from no history; the verdict of each sample, in order."""
    state: State | None = None
    verdicts = []
    for sample in samples:
        verdict, state = step(state, sample, window, saturation)
        verdicts.append(verdict)
    return verdicts
