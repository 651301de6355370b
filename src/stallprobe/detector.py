"""The stall detector: a pure function from (previous state, sample) to (verdict, next state).

Every rule that turns samples into a verdict lives in this module, and in no other. What a sample holds
is the reader's business (engines.py says, per engine, which waiting requests are owed and which signals
are heartbeats); how a verdict is judged from it is decided here alone. It does no I/O, reads no
clock and no environment: the time is a field of the sample, the history is the state the caller passes
in, and nothing is mutated. The CLI keeps the state in a file between runs; tests fold samples in memory.

The rules, first match wins (each exists to avoid a false restart or a missed stall):

0. unanswered  - the page gave no answer in time (the sample says so, and carries no numbers). A slow
                 answer is not a wedge: a saturated engine's server can be slow. The stall clock runs
                 from the last answer (or keeps running); suspect until it reaches the window, then
                 stalled: a page that stays unanswered for the whole window is as dead as a frozen one.
1. baseline    - no history, the clock went backwards, a counter went down (the engine restarted), or
                 the only history is pages that never answered. Nothing can be compared, so the stall
                 clock restarts.
2. paused      - the engine's operator stopped it on purpose (a pause for a weight update, sleep mode):
                 it owes nothing, so it is never stalled, however long; the stall clock stops, and
                 starts afresh at the first sample after it resumes.
3. idle        - not busy: nothing running, nothing pending (a request known to be in flight outside
                 the engine's gauges: a canary that got no answer, HTTP requests the server counts), and
                 nothing waiting that the engine owes work. A request waiting for capacity while nothing
                 runs is owed: a healthy scheduler admits it at its next step, so one that waits on is a
                 wedge (the reader says which are owed: vLLM's `capacity`, not its `deferred`, which
                 wait on something of the engine's own). include_waiting=True counts every waiting
                 request, False none. Nothing is owed, so it is never stalled.
4. progressing - the prompt or the generation counter advanced, or one of the sample's extra signals
                 changed. Prefill counts: a long prompt produces no output tokens for a long time and
                 is still work. A wedged engine publishes nothing new, so any change is life.
   saturated   - the same, with waiting >= the threshold: busy, not stuck. Page, never restart.
   thrashing   - the same, but no request has finished for the thrash window (the page counts finished
                 requests), while its preemptions climbed or its prefill ran far ahead of its decoding
                 (prompt tokens >= THRASH_RATIO x generation tokens, and some generated): the engine
                 works and completes nothing (vLLM #53130: 1,946 prompt and 0.5 generation tokens a
                 second, nothing finished for 1.5 hours). Never for one long generation (its decoding
                 leads), an engine that generates nothing (embeddings), or a saturated engine (it
                 finishes requests, slowly). Said, never acted on, unless the operator asks
                 (thrash_fails_after: then stalled, past that window: a whole pool overloaded at once
                 thrashes together, and draining every member would empty it).
5. suspect     - busy and neither counter advanced, for less than the window.
6. stalled     - busy and neither counter advanced for at least the window. Queue depth never excuses
                 it: worker processes deadlocked in a collective, the commonest real wedge, strike under
                 load and leave a deep queue in front of a frozen engine.

The stall clock starts at the previous sample's time when that sample was busy and not paused (the last
moment the engine was seen moving or seen busy), otherwise at this sample's time, so an engine idle for an
hour that takes a request and wedges is judged from when it was first seen busy, never from hour-old
counters.

Several engines behind one page (data parallelism) are judged one by one, each with its own state, by
assess_engines(); the page is as bad as its worst engine, so one wedged engine among moving ones is
stalled. An engine that appears starts at baseline; one that vanishes is forgotten: neither can stall.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping
    from typing import ClassVar

__all__ = [
    "DEFAULT_DRAIN_AFTER",
    "DEFAULT_SATURATION",
    "DEFAULT_THRASH_WINDOW",
    "DEFAULT_WINDOW",
    "THRASHED",
    "THRASH_RATIO",
    "Assessment",
    "EnginesAssessment",
    "Sample",
    "State",
    "Verdict",
    "assess",
    "assess_engines",
    "looks_idle",
    "readiness",
    "replay",
    "step",
]

# 120 s: a long prefill completes in seconds on current GPUs, so a busy
# engine that moved no counter for two minutes is wedged. In vLLM V1 the prompt counter moves only when a
# whole prefill completes, so the window must exceed the longest prefill a deployment allows.
DEFAULT_WINDOW = 120.0
# One queued request behind a moving engine already means demand exceeds what is running: saturated.
DEFAULT_SATURATION = 1.0
# Ten minutes with nothing finished, tokens moving: far past one request's prefill and decoding on any
# deployment that serves interactively, so a healthy engine has finished something by then.
DEFAULT_THRASH_WINDOW = 600.0
# Prefill far ahead of decoding: ten prompt tokens for each generated one over the whole period. A long
# generation has the ratio near 0; #53130 had ~4,000.
THRASH_RATIO = 10.0
# Readiness takes an engine out of routing when it has been busy with no progress for this long: a quarter
# of the liveness window. A false "not ready" only moves new requests to the other members for a while
# (in-flight work goes on), so it can be quick where a restart cannot; yet 30 s is far above a decode
# step, a prefill chunk, or the gap between SGLang's metric updates.
DEFAULT_DRAIN_AFTER = 30.0

_FIELDS = ("running", "generation", "prompt", "t", "waiting")
_INF = float("inf")


def _finite(value: float) -> bool:
    # NaN fails both comparisons. (Not math.isfinite: nothing else on the probe's path loads math.)
    return -_INF < value < _INF


class _Members(type):
    """Iteration over the verdicts, as over an Enum class."""

    def __iter__(cls) -> Iterator[Verdict]:
        return iter(_VERDICTS.values())

    def __len__(cls) -> int:
        return len(_VERDICTS)


class Verdict(metaclass=_Members):
    """What one sample says about the engine. Only STALLED means "restart me".

    Used like an Enum (`Verdict.STALLED.value == "stalled"`, `Verdict("stalled") is Verdict.STALLED`,
    iteration), but not one: building Enum classes is the largest cost of a probe run's imports after
    the interpreter's own. `severity` ranks them, 0 (idle) to 7 (stalled): the page speaks with its
    worst engine's verdict.
    """

    __slots__ = ("name", "severity", "value")

    IDLE: ClassVar[Verdict]
    PAUSED: ClassVar[Verdict]
    BASELINE: ClassVar[Verdict]
    PROGRESSING: ClassVar[Verdict]
    SATURATED: ClassVar[Verdict]
    THRASHING: ClassVar[Verdict]
    SUSPECT: ClassVar[Verdict]
    STALLED: ClassVar[Verdict]

    name: str
    value: str
    severity: int

    def __new__(cls, value: str) -> Verdict:
        """The member whose value is `value`; ValueError for any other, as an Enum does."""
        try:
            return _VERDICTS[value]
        except KeyError:
            raise ValueError(f"{value!r} is not a valid Verdict") from None

    def __repr__(self) -> str:
        return f"<Verdict.{self.name}: {self.value!r}>"

    def __str__(self) -> str:
        return f"Verdict.{self.name}"

    def __reduce__(self) -> tuple[type[Verdict], tuple[str]]:
        return Verdict, (self.value,)


_VERDICTS: dict[str, Verdict] = {}
# In the order they are documented (and iterate); the number is the severity, from the least to the most
# severe: which engine speaks for the page is the one with the worst verdict.
for _name, _severity in (
    ("BASELINE", 2),
    ("IDLE", 0),
    ("PAUSED", 1),
    ("PROGRESSING", 3),
    ("SATURATED", 4),
    ("THRASHING", 5),
    ("SUSPECT", 6),
    ("STALLED", 7),
):
    # (Here, not in a method: mutmut cannot test code that runs only while the module is imported.)
    _member = object.__new__(Verdict)
    _member.name, _member.value, _member.severity = _name, _name.lower(), _severity
    _VERDICTS[_member.value] = _member
    setattr(Verdict, _name, _member)
del _name, _severity, _member


class Sample:
    """One reading of the engine: gauges, monotonic counters and the time (seconds) it was taken.

    `signals` holds extra values whose change counts as progress (a decode-step counter, the KV-cache
    usage): a wedged engine publishes nothing new, so a change in any of them means its loop is alive.
    `finished` and `preemptions` are the engine's counters of requests it completed and preempted (None
    where its page has none): what tells an engine that works and completes nothing (thrashing).
    """

    __slots__ = (*_FIELDS, "answered", "finished", "owed", "paused", "pending", "preemptions", "signals")

    running: float
    generation: float
    prompt: float
    t: float
    waiting: float
    signals: dict[str, float]
    pending: float
    owed: float
    paused: str
    answered: bool
    finished: float | None
    preemptions: float | None

    def __init__(
        self,
        running: float,
        generation: float,
        prompt: float,
        t: float,
        waiting: float = 0.0,
        *,
        signals: Mapping[str, float] | None = None,
        pending: float = 0.0,
        owed: float = 0.0,
        paused: str = "",
        answered: bool = True,
        finished: float | None = None,
        preemptions: float | None = None,
    ) -> None:
        values = (running, generation, prompt, t, waiting)
        for name, value in zip(_FIELDS, values):
            # A NaN compares false both ways, so a NaN counter would read as "frozen" and fake a stall.
            if not _finite(value):
                raise ValueError(f"Sample.{name} must be a finite number (got {value!r})")
        self.running, self.generation, self.prompt, self.t, self.waiting = (float(v) for v in values)
        self.signals = {}
        for key, value in sorted((signals or {}).items()):
            if not _finite(value):
                raise ValueError(f"Sample signal {key!r} must be a finite number (got {value!r})")
            self.signals[key] = float(value)
        if not _finite(pending):
            raise ValueError(f"Sample.pending must be a finite number (got {pending!r})")
        if not _finite(owed):
            raise ValueError(f"Sample.owed must be a finite number (got {owed!r})")
        # Requests known to be in flight that the engine's gauges do not show (a canary that got no
        # answer, HTTP requests the server counts): work owed, like running ones.
        self.pending = float(pending)
        # Of the waiting requests, those the engine owes work: waiting for capacity, not deferred by the
        # engine for a reason of its own (the reader of the page says which; 0 when it cannot tell).
        self.owed = float(owed)
        # Why the engine's operator has stopped it ("" when not paused): never judged while paused.
        self.paused = paused
        # False: the page gave no answer in time; the numbers mean nothing.
        self.answered = answered
        for name, count in (("finished", finished), ("preemptions", preemptions)):
            if count is not None and not _finite(count):
                raise ValueError(f"Sample.{name} must be a finite number or None (got {count!r})")
        self.finished = None if finished is None else float(finished)
        self.preemptions = None if preemptions is None else float(preemptions)

    def replace(
        self,
        *,
        running: float | None = None,
        waiting: float | None = None,
        owed: float | None = None,
        pending: float | None = None,
        paused: str | None = None,
        signals: Mapping[str, float] | None = None,
    ) -> Sample:
        """A copy with the gauges, the requests pending outside them, paused, or the signals, as given."""
        return Sample(
            self.running if running is None else running,
            self.generation,
            self.prompt,
            self.t,
            self.waiting if waiting is None else waiting,
            signals=self.signals if signals is None else signals,
            pending=self.pending if pending is None else pending,
            owed=self.owed if owed is None else owed,
            paused=self.paused if paused is None else paused,
            answered=self.answered,
            finished=self.finished,
            preemptions=self.preemptions,
        )

    def _key(self) -> tuple[object, ...]:
        numbers = tuple(getattr(self, name) for name in _FIELDS)
        counts = (self.finished, self.preemptions)
        return (*numbers, tuple(self.signals.items()), self.pending, self.owed, self.paused, self.answered, *counts)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        extra = f", signals={self.signals!r}" if self.signals else ""
        extra += f", pending={self.pending!r}" if self.pending else ""
        extra += f", owed={self.owed!r}" if self.owed else ""
        extra += f", paused={self.paused!r}" if self.paused else ""
        extra += "" if self.answered else ", answered=False"
        extra += "" if self.finished is None else f", finished={self.finished!r}"
        extra += "" if self.preemptions is None else f", preemptions={self.preemptions!r}"
        return f"Sample({inner}{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sample):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def to_dict(self) -> dict[str, object]:
        """A JSON-able dict: the five numbers, and `signals` (name to value), `pending`, `owed`, `paused`,
        `answered`, `finished` and `preemptions` when they are not their defaults."""
        data: dict[str, object] = {name: getattr(self, name) for name in _FIELDS}
        if self.signals:
            data["signals"] = dict(self.signals)
        if self.pending:
            data["pending"] = self.pending
        if self.owed:
            data["owed"] = self.owed
        if self.paused:
            data["paused"] = self.paused
        if not self.answered:
            data["answered"] = False
        for name in ("finished", "preemptions"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Sample:
        """Rebuild a sample; ValueError on a missing field or a value that is not a finite number."""
        values = []
        for name in _FIELDS:
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"sample field {name!r} must be a number (got {value!r})")
            values.append(float(value))
        raw = data.get("signals", {})
        if not isinstance(raw, dict):
            raise ValueError(f"sample signals must be a mapping (got {raw!r})")
        signals: dict[str, float] = {}
        for key, value in raw.items():
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"sample signal {key!r} must be a number (got {value!r})")
            signals[key] = float(value)
        pending = data.get("pending", 0.0)
        if isinstance(pending, bool) or not isinstance(pending, (int, float)):
            raise ValueError(f"sample pending must be a number (got {pending!r})")
        owed = data.get("owed", 0.0)
        if isinstance(owed, bool) or not isinstance(owed, (int, float)):
            raise ValueError(f"sample owed must be a number (got {owed!r})")
        paused = data.get("paused", "")
        if not isinstance(paused, str):
            raise ValueError(f"sample paused must be a string (got {paused!r})")
        answered = data.get("answered", True)
        if not isinstance(answered, bool):
            raise ValueError(f"sample answered must be true or false (got {answered!r})")
        counts: list[float | None] = []
        for name in ("finished", "preemptions"):
            count = data.get(name)
            if count is not None and (isinstance(count, bool) or not isinstance(count, (int, float))):
                raise ValueError(f"sample {name} must be a number or None (got {count!r})")
            counts.append(None if count is None else float(count))
        return cls(
            *values,
            signals=signals,
            pending=float(pending),
            owed=float(owed),
            paused=paused,
            answered=answered,
            finished=counts[0],
            preemptions=counts[1],
        )


class State:
    """What the detector remembers between samples: the last sample, when the stall clock started, since
    when the engine has been paused, and the sample since which, busy, it has finished nothing (`mark`:
    None where the page counts no finished requests, or the engine was not busy)."""

    __slots__ = ("last", "mark", "paused_since", "stall_since")

    def __init__(
        self,
        last: Sample,
        stall_since: float | None = None,
        paused_since: float | None = None,
        mark: Sample | None = None,
    ) -> None:
        self.last = last
        # None while the stall clock is not running; otherwise the time it started.
        self.stall_since = stall_since
        # None unless the last sample was paused; then the time the pause was first seen.
        self.paused_since = paused_since
        # The counters when the finished-request counter last moved (or the engine was first seen busy).
        self.mark = mark

    def __repr__(self) -> str:
        paused = "" if self.paused_since is None else f", paused_since={self.paused_since!r}"
        mark = "" if self.mark is None else f", mark={self.mark!r}"
        return f"State(last={self.last!r}, stall_since={self.stall_since!r}{paused}{mark})"

    def _key(self) -> tuple[object, ...]:
        return (self.last, self.stall_since, self.paused_since, self.mark)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, State):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def to_dict(self) -> dict[str, object]:
        """A JSON-able dict: the last sample's fields, `stall_since` and `paused_since` (None when unset),
        and `mark` (the mark sample's dict, when set)."""
        data = self.last.to_dict()
        data["stall_since"] = self.stall_since
        data["paused_since"] = self.paused_since
        if self.mark is not None:
            data["mark"] = self.mark.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> State:
        """Inverse of to_dict; ValueError when the dict is not of that shape."""
        last = Sample.from_dict(data)
        times = []
        for key in ("stall_since", "paused_since"):
            value = data.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
                    raise ValueError(f"{key} must be a number or None (got {value!r})")
                if value > last.t:
                    raise ValueError(f"{key} ({value!r}) is later than the last sample ({last.t!r})")
                value = float(value)
            times.append(value)
        if (times[1] is not None) != bool(last.paused):
            raise ValueError("paused_since must be given exactly when the last sample is paused")
        raw = data.get("mark")
        if raw is not None and not isinstance(raw, dict):
            raise ValueError(f"mark must be a sample or None (got {raw!r})")
        mark = None if raw is None else Sample.from_dict(raw)
        if mark is not None and mark.t > last.t:
            raise ValueError(f"mark ({mark.t!r}) is later than the last sample ({last.t!r})")
        return cls(last, times[0], times[1], mark)


class Assessment:
    """The full outcome of one step: the verdict, the next state, and what a person needs to read it."""

    __slots__ = ("reason", "stalled_for", "state", "unfinished_for", "verdict")

    def __init__(
        self, verdict: Verdict, state: State, reason: str, stalled_for: float, unfinished_for: float = 0.0
    ) -> None:
        self.verdict = verdict
        self.state = state
        # Why a baseline was taken, why the engine is paused, or THRASHED for an engine stalled by thrashing
        # (empty for every other verdict).
        self.reason = reason
        # Seconds the stall clock has run (0 when it is not running).
        self.stalled_for = stalled_for
        # Seconds the engine, busy and moving, has finished no request (0 when not counted).
        self.unfinished_for = unfinished_for

    def __repr__(self) -> str:
        return f"Assessment({self.verdict}, {self.state!r}, reason={self.reason!r}, stalled_for={self.stalled_for!r})"


def _busy(sample: Sample, include_waiting: bool | None) -> bool:
    """Whether the engine owes work: requests running, pending outside its gauges, or waiting and owed
    (include_waiting None: those the reader says are owed; True: every waiting one; False: none)."""
    waiting = sample.owed if include_waiting is None else sample.waiting if include_waiting else 0.0
    return sample.running > 0 or sample.pending > 0 or waiting > 0


def assess(
    state: State | None,
    sample: Sample,
    window: float = DEFAULT_WINDOW,
    saturation: float = DEFAULT_SATURATION,
    *,
    include_waiting: bool | None = None,
    thrash_window: float = DEFAULT_THRASH_WINDOW,
    thrash_fails_after: float | None = None,
) -> Assessment:
    """Judge `sample` against the history in `state` (None: no history). Pure: mutates nothing.

    `include_waiting` says which waiting requests are work owed, so that an engine with nothing running
    and a queue that does not move is judged like a busy one: None (the default) those the sample says
    are owed (`Sample.owed`: waiting for capacity), True every waiting request, False none.
    `thrash_window`: how long a moving engine that finishes nothing is watched before it is thrashing;
    `thrash_fails_after`: None (the default) never acts on it, else thrashing that long is stalled.
    """
    if not window > 0:
        raise ValueError(f"window must be > 0 (got {window!r})")
    if not saturation > 0:
        raise ValueError(f"saturation threshold must be > 0 (got {saturation!r})")
    if not sample.answered:
        # No numbers to compare: the clock runs from the last answer, and the last answer is kept.
        last = sample if state is None else state.last
        began = sample.t if state is None else state.stall_since if state.stall_since is not None else last.t
        silent_for = sample.t - began
        verdict = Verdict.STALLED if silent_for >= window else Verdict.SUSPECT
        return Assessment(verdict, State(last, began, mark=None if state is None else state.mark), "", silent_for)
    if state is None or not state.last.answered:
        why = "no history" if state is None else "no earlier answer"
        return _paused(sample, None) if sample.paused else Assessment(Verdict.BASELINE, State(sample), why, 0.0)
    prev = state.last
    if sample.t < prev.t:
        return Assessment(Verdict.BASELINE, State(sample), "the clock went backwards", 0.0)
    if sample.generation < prev.generation or sample.prompt < prev.prompt:
        return Assessment(Verdict.BASELINE, State(sample), "a token counter went down (engine restarted)", 0.0)
    if sample.paused:
        return _paused(sample, state.paused_since)  # set only while the last sample was paused
    if not _busy(sample, include_waiting):
        return Assessment(Verdict.IDLE, State(sample), "", 0.0)
    finished = sample.finished != prev.finished  # a request completed (or the count appeared, or went)
    if sample.generation > prev.generation or sample.prompt > prev.prompt or sample.signals != prev.signals or finished:
        return _moving(
            state, sample, saturation, include_waiting=include_waiting,
            thrash_window=thrash_window, thrash_fails_after=thrash_fails_after,
        )  # fmt: skip
    # Busy and frozen. Keep a running clock; else start it when the engine was last seen busy (and not
    # paused: a pause owes nothing, so the clock starts afresh at the first sample after it).
    since = state.stall_since
    if since is None:
        since = prev.t if _busy(prev, include_waiting) and not prev.paused else sample.t
    stalled_for = sample.t - since
    verdict = Verdict.STALLED if stalled_for >= window else Verdict.SUSPECT
    return Assessment(verdict, State(sample, since, mark=state.mark), "", stalled_for)


# The reason of an engine stalled by thrashing (thrash_fails_after): tokens moved, nothing finished.
THRASHED = "thrashing"


def _moving(
    state: State,
    sample: Sample,
    saturation: float,
    *,
    include_waiting: bool | None,
    thrash_window: float,
    thrash_fails_after: float | None,
) -> Assessment:
    """A busy engine whose counters moved: progressing or saturated, unless it has finished nothing for
    the thrash window with the signs of thrashing (and then stalled, past thrash_fails_after)."""
    prev = state.last
    mark = None
    if sample.finished is not None and sample.finished == prev.finished:
        # Nothing finished since the last sample: the period runs on from its mark, or from the last
        # sample when it was busy (and not paused), else from this one.
        mark = state.mark
        if mark is None:
            mark = _mark(prev if _busy(prev, include_waiting) and not prev.paused else sample)
    elif sample.finished is not None:
        mark = _mark(sample)  # a request finished (or the count just appeared): a new period starts here
    unfinished = 0.0 if mark is None else sample.t - mark.t
    verdict = Verdict.SATURATED if sample.waiting >= saturation else Verdict.PROGRESSING
    reason = ""
    if mark is not None and unfinished >= thrash_window and _thrashing(mark, sample):
        verdict = Verdict.THRASHING
        if thrash_fails_after is not None and unfinished >= thrash_fails_after:
            verdict, reason = Verdict.STALLED, THRASHED
    return Assessment(verdict, State(sample, mark=mark), reason, 0.0, unfinished)


def _mark(sample: Sample) -> Sample:
    """What a mark keeps of a sample: when, and the counters the signs of thrashing compare."""
    return Sample(
        0, sample.generation, sample.prompt, sample.t, finished=sample.finished, preemptions=sample.preemptions
    )


def _thrashing(mark: Sample, sample: Sample) -> bool:
    """The signs of an engine that works and completes nothing, since `mark`: its preemptions climbed, or
    it generated some tokens and prefilled THRASH_RATIO times as many."""
    if sample.preemptions is not None and mark.preemptions is not None and sample.preemptions > mark.preemptions:
        return True
    generated = sample.generation - mark.generation
    return generated > 0 and sample.prompt - mark.prompt >= THRASH_RATIO * generated


def _paused(sample: Sample, since: float | None) -> Assessment:
    """Paused on purpose: the reason is why, and the state remembers since when."""
    return Assessment(Verdict.PAUSED, State(sample, None, sample.t if since is None else since), sample.paused, 0.0)


def step(
    state: State | None,
    sample: Sample,
    window: float = DEFAULT_WINDOW,
    saturation: float = DEFAULT_SATURATION,
    *,
    include_waiting: bool | None = None,
    thrash_window: float = DEFAULT_THRASH_WINDOW,
    thrash_fails_after: float | None = None,
) -> tuple[Verdict, State]:
    """One detector step: the verdict for `sample` and the state to pass to the next step."""
    result = assess(
        state, sample, window, saturation, include_waiting=include_waiting,
        thrash_window=thrash_window, thrash_fails_after=thrash_fails_after,
    )  # fmt: skip
    return result.verdict, result.state


def replay(
    samples: Iterable[Sample],
    window: float = DEFAULT_WINDOW,
    saturation: float = DEFAULT_SATURATION,
    *,
    include_waiting: bool | None = None,
    thrash_window: float = DEFAULT_THRASH_WINDOW,
    thrash_fails_after: float | None = None,
) -> list[Verdict]:
    """Fold `step` over `samples` from no history; the verdict of each sample, in order."""
    state: State | None = None
    verdicts = []
    for sample in samples:
        verdict, state = step(
            state, sample, window, saturation, include_waiting=include_waiting,
            thrash_window=thrash_window, thrash_fails_after=thrash_fails_after,
        )  # fmt: skip
        verdicts.append(verdict)
    return verdicts


class EnginesAssessment:
    """The outcome of judging several engines at once: each engine's assessment and the worst."""

    __slots__ = ("engines", "verdict", "worst")

    def __init__(self, engines: dict[str, Assessment], worst: str | None = None) -> None:
        # Each engine's own assessment, by engine name, in name order.
        self.engines = engines
        # The engine that speaks for the page: the worst verdict, then the longest stall, then by name
        # (or the one named: readiness speaks with the engine that takes the page out of routing).
        if worst is None:
            worst = max(engines, key=lambda name: (engines[name].verdict.severity, engines[name].stalled_for))
        self.worst = worst
        self.verdict = engines[worst].verdict

    @property
    def states(self) -> dict[str, State]:
        """The state to pass to the next call."""
        return {name: result.state for name, result in self.engines.items()}

    def __repr__(self) -> str:
        return f"EnginesAssessment({self.verdict}, worst={self.worst!r}, engines={self.engines!r})"


def assess_engines(
    states: Mapping[str, State] | None,
    samples: Mapping[str, Sample],
    window: float = DEFAULT_WINDOW,
    saturation: float = DEFAULT_SATURATION,
    *,
    include_waiting: bool | None = None,
    thrash_window: float = DEFAULT_THRASH_WINDOW,
    thrash_fails_after: float | None = None,
) -> EnginesAssessment:
    """Judge each engine of `samples` against its own history in `states`; the page is its worst engine.

    An engine with no history is a baseline; history of an engine no longer in `samples` is dropped.
    """
    if not samples:
        raise ValueError("samples must name at least one engine")
    history = states or {}
    judged = {}
    for name in sorted(samples):
        judged[name] = assess(
            history.get(name), samples[name], window, saturation, include_waiting=include_waiting,
            thrash_window=thrash_window, thrash_fails_after=thrash_fails_after,
        )  # fmt: skip
    return EnginesAssessment(judged)


def readiness(result: EnginesAssessment, drain_after: float, *, healthy: bool = True) -> tuple[bool, EnginesAssessment]:
    """The readiness rule, one for the probe's --ready and watch's /ready: whether the page may take new
    requests, and the step judged for routing (each engine's verdict with `drain_after` for the window,
    speaking with the engine that takes the page out of routing, if one does).

    Ready when the engine serves (`healthy`: its health route answered 2xx), no engine is paused (asleep,
    or stopped for a weight update: it owes nothing, and takes nothing), and none has been busy with no
    progress, or silent, for the earlier of `drain_after` and the liveness window (an engine already
    stalled, about to be restarted, never takes new requests, whichever window is the shorter). A
    saturated engine stays ready: it is working, and taking it out would push its load onto the others. A
    false "not ready" only sends new requests elsewhere for a while (nothing is killed), so the drain
    window can be far shorter than the liveness window: the load balancer drains a wedged engine long
    before anyone restarts it.
    """
    if not drain_after > 0:
        raise ValueError(f"drain_after must be > 0 (got {drain_after!r})")
    engines = {}
    for name, one in result.engines.items():
        engines[name] = one
        if one.verdict is Verdict.SUSPECT:
            # The same stall clock, another window: the step's state does not depend on the window. A
            # stalled verdict stays stalled: its window was reached first.
            verdict = Verdict.STALLED if one.stalled_for >= drain_after else Verdict.SUSPECT
            engines[name] = Assessment(verdict, one.state, one.reason, one.stalled_for)
    out = [name for name in engines if engines[name].verdict is Verdict.STALLED]
    out += [name for name in engines if engines[name].verdict is Verdict.PAUSED]
    judged = EnginesAssessment(engines, out[0] if out else None)
    return healthy and not out, judged


def looks_idle(samples: Mapping[str, Sample], previous: Mapping[str, State] | None) -> bool:
    """Every engine idle to its gauges, and nothing moved since the last look (or a canary is owed an
    answer): only then can requests be hanging where the gauges do not see them, and only then is an
    engine asked about them (its server's load, the canary). Never for a busy one."""
    if not previous or any(sample.running or sample.waiting for sample in samples.values()):
        return False
    for name, sample in samples.items():
        before = previous.get(name)
        if before is None or not before.last.answered:
            return False
        last = before.last
        moved = (sample.generation, sample.prompt, sample.signals) != (last.generation, last.prompt, last.signals)
        if moved and not last.pending:
            return False
    return True
