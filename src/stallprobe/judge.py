"""The one judge: what one look at an engine means, for every command (the probe, its --ready, doctor's
looks and every endpoint of watch). Pure: no I/O, no clock, no environment; what is remembered of the
endpoint comes in as a value (Memory) and the next one goes out in the Judgment.

A look (observe.look) gathers what the engine said; judge() then decides, in this order:

1. the history to judge against: none when another engine now answers on the endpoint (the dialect
   changed: its counters mean other things), else what is remembered;
2. each engine's verdict (detector.assess_engines: the detector's rules, the window, the saturation);
3. whether the engine serves (its health route, when the look asked it): a refusal or an error status is
   "not serving" at once; no answer within the deadline is excused like a page that gives none, until it
   has lasted --drain-after (a saturated engine's API server can be that slow: draining it then is the
   false drain the probe exists to avoid);
4. readiness (detector.readiness: the drain window, paused, serving);
5. the exit code and the words (report.py), for liveness or readiness;
6. what is said on the container's log: a line only when the run's class changed since the last run of
   the same kind (liveness: alive, paused, suspect, stalled, unjudged, error; readiness: ready, not ready).

Beside it, the decisions a look needs before it is judged, so that they live here and nowhere else:
whether the engine would be suspect or stalled (only then is its pause asked about), whether a canary is
due, and how the memory of two runs that overlapped merge (liveness and readiness share one state file).
"""

from __future__ import annotations

from .detector import (
    DEFAULT_DRAIN_AFTER,
    DEFAULT_SATURATION,
    DEFAULT_THRASH_WINDOW,
    DEFAULT_WINDOW,
    Sample,
    Verdict,
    assess_engines,
    readiness,
)
from .engines import dialect_named
from .errors import ExitCode
from .report import look_line, num, ready_line, secs, verdict_code

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from .detector import EnginesAssessment, State
    from .engines import Dialect

__all__ = [
    "ALIVE",
    "DEFAULT_CANARY_INTERVAL",
    "LIVENESS",
    "PREFIX",
    "READINESS",
    "Judgment",
    "Memory",
    "Observation",
    "Rules",
    "canary_due",
    "class_of",
    "judge",
    "live_class",
    "merge",
    "report_only_code",
    "said",
    "serving",
    "silent",
    "would_be_stalled",
    "would_be_stuck",
]

# Ten minutes between two canaries to an idle engine: six an hour, nothing next to real traffic. A canary
# that gets no answer is sent again on every run until one is answered, so once one fails the restart
# comes about window + period x (failureThreshold - 1) later, as for any stall.
DEFAULT_CANARY_INTERVAL = 600.0
# What starts every line the probe writes on the container's log: one log query finds every pod's.
PREFIX = "stallprobe: "
LIVENESS, READINESS = "liveness", "readiness"
# The fact that remembers since when the health route has given no answer (readiness runs only).
HEALTH_SILENT_SINCE = "health_silent_since"
CANARY_AT = "canary_at"


class Rules:
    """How a look is judged, one value for every command: the liveness window, the saturation threshold,
    which waiting requests are owed (include_waiting), the thrash window and whether (past how long)
    thrashing is acted on, the readiness rule's drain window, and the least time between two canaries to
    an idle engine."""

    __slots__ = (
        "canary_interval",
        "drain_after",
        "fail_thrashing_after",
        "include_waiting",
        "saturation",
        "thrash_window",
        "window",
        "window_given",
    )

    def __init__(
        self,
        *,
        window: float = DEFAULT_WINDOW,
        saturation: float = DEFAULT_SATURATION,
        include_waiting: bool | None = None,
        thrash_window: float = DEFAULT_THRASH_WINDOW,
        fail_thrashing_after: float | None = None,
        drain_after: float = DEFAULT_DRAIN_AFTER,
        canary_interval: float = DEFAULT_CANARY_INTERVAL,
        window_given: bool = True,
    ) -> None:
        self.window = window
        # Whether the window is the operator's (given), or the probe's default, which an engine whose page
        # cannot show a long request's progress replaces with its own (Dialect.window).
        self.window_given = window_given
        self.saturation = saturation
        self.include_waiting = include_waiting
        self.thrash_window = thrash_window
        self.fail_thrashing_after = fail_thrashing_after
        self.drain_after = drain_after
        self.canary_interval = canary_interval

    @classmethod
    def of(cls, settings: object) -> Rules:
        """The rules a command's configuration gives (the defaults for those it has not)."""
        rules = cls()
        for name in cls.__slots__:
            if hasattr(settings, name):
                setattr(rules, name, getattr(settings, name))
        rules.window_given = "window" in getattr(settings, "given", ())
        return rules

    def of_engine(self, dialect: Dialect | None) -> Rules:
        """These rules for an engine read with `dialect`: its own window where the operator gave none."""
        if self.window_given or dialect is None or dialect.window is None:
            return self
        rules = Rules()
        for name in self.__slots__:
            setattr(rules, name, getattr(self, name))
        rules.window = dialect.window
        return rules

    def assess(self, states: Mapping[str, State] | None, samples: Mapping[str, Sample]) -> EnginesAssessment:
        """The detector's assessment of `samples` against `states`, under these rules: the one place the
        rules are handed to it."""
        return assess_engines(
            states, samples, self.window, self.saturation, include_waiting=self.include_waiting,
            thrash_window=self.thrash_window, thrash_fails_after=self.fail_thrashing_after,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"Rules({', '.join(f'{name}={getattr(self, name)!r}' for name in self.__slots__)})"


class Observation:
    """What one look found: the dialect (None when the page gave no answer), one sample per engine, why
    there was no answer ("" when there was), what the questions to an idle-looking engine learnt, why the
    health route says the engine does not serve (None: not asked; "": it serves, or gave no answer), why
    it gave no answer ("" when it did, or was not asked), when a canary went out (None: none did), and
    what the page says of the engine when it looked stuck (`about`)."""

    __slots__ = ("about", "canary_at", "dialect", "health", "health_silent", "note", "samples", "unanswered")

    def __init__(
        self,
        dialect: Dialect | None,
        samples: dict[str, Sample],
        *,
        unanswered: str = "",
        note: str = "",
        health: str | None = None,
        health_silent: str = "",
        canary_at: float | None = None,
        about: str = "",
    ) -> None:
        self.dialect = dialect
        self.samples = samples
        self.unanswered = unanswered
        self.note = note
        self.health = health
        self.health_silent = health_silent
        self.canary_at = canary_at
        # What the page says of the engine (its model, its version), read only when it looked stuck: the
        # evidence of a failing run names it.
        self.about = about

    @property
    def t(self) -> float:
        """When the look was taken (its samples' time)."""
        return next(iter(self.samples.values())).t

    def __repr__(self) -> str:
        name = self.dialect.name if self.dialect else None
        return f"Observation({name!r}, {self.samples!r}, unanswered={self.unanswered!r}, note={self.note!r})"


def silent(previous: Mapping[str, State] | None, now: float, why: str) -> Observation:
    """No answer in time: a sample without numbers for every engine seen before (a slow answer is not a
    wedge; the detector runs the stall clock from the last answer)."""
    return Observation(None, _no_answer(list(previous) if previous else [""], now), unanswered=why)


def _no_answer(names: Iterable[str], now: float) -> dict[str, Sample]:
    """A sample without numbers, at `now`, for each engine named."""
    return {name: Sample(0, 0, 0, now, answered=False) for name in names}


class Memory:
    """What is remembered of an endpoint between two looks: each engine's detector state (None: no
    history), the dialect that read its page ("" before any), facts of the page as a whole (when the last
    canary went out, since when the health route has given no answer), and the class each kind of run
    last said (liveness, readiness)."""

    __slots__ = ("dialect", "facts", "said", "states")

    def __init__(
        self,
        states: Mapping[str, State] | None = None,
        *,
        dialect: str = "",
        facts: Mapping[str, float] | None = None,
        said: Mapping[str, str] | None = None,
    ) -> None:
        self.states = dict(states) if states is not None else None
        self.dialect = dialect
        self.facts = dict(facts or {})
        self.said = dict(said or {})

    def _key(self) -> tuple[object, ...]:
        states = None if self.states is None else sorted(self.states.items())
        return (states, self.dialect, sorted(self.facts.items()), sorted(self.said.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Memory):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable: compared, never hashed

    def __repr__(self) -> str:
        return f"Memory({self.states!r}, dialect={self.dialect!r}, facts={self.facts!r}, said={self.said!r})"


class Judgment:
    """What a look means: the detector's assessment (liveness), the step judged for routing and whether
    the engine may take new requests (readiness), the run's exit code and its line (for the kind of run
    judged), the line to write on the container's log ("" when nothing changed), and the memory to keep."""

    __slots__ = ("change", "code", "first", "line", "memory", "previous", "ready", "result", "routing", "seen")

    def __init__(
        self,
        *,
        result: EnginesAssessment,
        routing: EnginesAssessment,
        ready: bool,
        code: int,
        line: str,
        change: str,
        memory: Memory,
        previous: Mapping[str, State] | None,
        seen: Observation,
        first: str,
    ) -> None:
        self.result = result
        self.routing = routing
        self.ready = ready
        self.code = code
        self.line = line
        self.change = change
        self.memory = memory
        self.previous = previous  # the history the look was judged against
        self.seen = seen
        self.first = first  # why there was no history at all ("" when there was, or nothing to say)


# The verdicts of an engine that works or has nothing to do: they come and go with the traffic, and a line
# for each change among them would bury the ones that matter.
ALIVE = frozenset(verdict.value for verdict in (Verdict.BASELINE, Verdict.IDLE, Verdict.PROGRESSING, Verdict.SATURATED))


def class_of(word: str) -> str:
    """The class a verdict's word is told in on a log when it changes: "alive" for ALIVE, else the word
    itself (paused, thrashing, suspect, stalled; watch's unreachable and error too)."""
    return "alive" if word in ALIVE else word


def live_class(verdict: Verdict) -> str:
    """The class of a liveness verdict (class_of)."""
    return class_of(verdict.value)


def said(memory: Memory, kind: str, klass: str, line: str) -> tuple[str, Memory]:
    """What a run of `kind` (liveness, readiness) whose class is `klass` writes on the container's log:
    its line, prefixed, when the class differs from what the last run of that kind said (the first run
    included), else ""; and the memory that remembers it."""
    if memory.said.get(kind) == klass:
        return "", memory
    after = Memory(memory.states, dialect=memory.dialect, facts=memory.facts, said={**memory.said, kind: klass})
    return f"{PREFIX}{kind}: {line}", after


def serving(
    health: str | None, quiet: str, now: float, facts: dict[str, float], drain_after: float
) -> tuple[bool, str, str]:
    """Whether the health route says the engine serves: `health` is why it says it does not (None: not
    asked; "": it serves, or gave no answer), `quiet` why it gave no answer ("" when it did). Returns
    whether it serves, why not ("" when it does), and a note for a route whose silence is excused; the
    silence clock is kept in `facts` (HEALTH_SILENT_SINCE), started at `now`."""
    if health is None and not quiet:
        return True, "", ""  # not asked: the page alone decides (and the silence clock stays as it is)
    if not quiet:
        facts.pop(HEALTH_SILENT_SINCE, None)
        return not health, health or "", ""
    since = facts.setdefault(HEALTH_SILENT_SINCE, now)
    silent_for = now - since
    if silent_for >= drain_after:
        return False, f"{quiet}; no answer for {secs(silent_for)} s (drain after {num(drain_after)} s)", ""
    return True, "", f"{quiet} (for {secs(silent_for)} s; drained at {num(drain_after)} s)"


def judge(rules: Rules, memory: Memory, seen: Observation, *, ready: bool = False, first: str = "") -> Judgment:
    """Judge what a look saw against what is remembered of the endpoint. `ready`: a readiness run (its
    code and line are readiness's, and it is what the container's log is told about); `first`: why there
    is no history at all (the state file could not be used), "" when there is none to say."""
    states = memory.states
    if seen.dialect is not None and memory.dialect and seen.dialect.name != memory.dialect:
        states, first = None, f"now a {seen.dialect.name} page"  # another engine answers: nothing to compare
    rules = rules.of_engine(seen.dialect or dialect_named(memory.dialect))
    samples = seen.samples
    if states and seen.unanswered:
        # A look that got no answer names no engine of its own: it is every remembered engine that did not
        # answer (the look may have started before another run saved them: liveness and readiness share
        # the memory), so none of them loses its stall clock.
        samples = _no_answer(states, seen.t)
    result = rules.assess(states, samples)
    facts = dict(memory.facts)
    if seen.canary_at is not None:
        facts[CANARY_AT] = seen.canary_at
    serves, health, excused = serving(seen.health, seen.health_silent, seen.t, facts, rules.drain_after)
    is_ready, routing = readiness(result, rules.drain_after, healthy=serves)
    note = "; ".join(part for part in (seen.note, excused) if part)
    if ready:
        code = ExitCode.OK if is_ready else ExitCode.STALLED
        line = ready_line(
            routing, states, first, rules.drain_after, seen.dialect,
            ready=is_ready, health=health, unanswered=seen.unanswered, note=note,
        )  # fmt: skip
        klass = "ready" if is_ready else "not ready"
    else:
        code = verdict_code(result.verdict)
        line = look_line(result, states, first, rules.window, seen.dialect, unanswered=seen.unanswered, note=note)
        klass = live_class(result.verdict)
    dialect = seen.dialect.name if seen.dialect is not None else memory.dialect
    kept = Memory(result.states, dialect=dialect, facts=facts, said=memory.said)
    change, kept = said(kept, READINESS if ready else LIVENESS, klass, line)
    return Judgment(
        result=result, routing=routing, ready=is_ready, code=code, line=line, change=change, memory=kept,
        previous=states, seen=seen, first=first,
    )  # fmt: skip


def would_be_stuck(rules: Rules, previous: Mapping[str, State] | None, samples: Mapping[str, Sample]) -> bool:
    """Whether the engine would be judged suspect or stalled (busy and frozen, whatever the window): only
    then is it asked whether its operator paused it, or for its scheduler's own counts."""
    verdict = rules.assess(previous, samples).verdict
    return verdict is Verdict.SUSPECT or verdict is Verdict.STALLED


def would_be_stalled(
    rules: Rules, previous: Mapping[str, State] | None, samples: Mapping[str, Sample], *, ready: bool
) -> bool:
    """Whether the engine would be judged stalled (with `ready`, drained too: frozen for --drain-after):
    only then is an engine whose page cannot show a long request's progress asked to answer a request
    through the whole engine (Dialect.confirm_route). Readiness asks at its own window, else a healthy
    engine would leave routing --drain-after into every long request."""
    result = rules.assess(previous, samples)
    if ready:
        result = readiness(result, rules.drain_after)[1]
    return any(one.verdict is Verdict.STALLED for one in result.engines.values())


def canary_due(rules: Rules, memory: Memory, now: float) -> bool:
    """Whether an idle-looking engine gets the canary at this look: while the last one is owed an answer
    (its requests are pending on the engine), at the first look, and once its interval has passed since
    the last (a clock that went back counts as passed)."""
    failing = any(state.last.pending for state in (memory.states or {}).values())
    last = memory.facts.get(CANARY_AT)
    return failing or last is None or not 0 <= now - last < rules.canary_interval


def _supersedes(samples: Mapping[str, Sample], current: Mapping[str, State]) -> bool:
    """Whether these samples are newer than what another run just saved: no counter lower, and either a
    counter higher or a time no earlier. (Two runs at once can finish their scrapes in either order; the
    counters, which only go up, tell which page was served last.)"""
    for name, sample in samples.items():
        state = current.get(name)
        if state is None:
            continue
        last = state.last
        if sample.answered and last.answered:
            if sample.generation < last.generation or sample.prompt < last.prompt:
                return False
            if sample.generation > last.generation or sample.prompt > last.prompt:
                continue
        if sample.t < last.t:
            return False
    return True


def merge(mine: Memory, theirs: Memory | None, samples: Mapping[str, Sample]) -> tuple[Memory, bool]:
    """Two runs that share one memory (liveness and readiness, one state file) and overlapped: `mine` is
    what this run read before its look, `theirs` what is there now that it is about to save. The memory to
    judge this run's samples against, and whether to save what it judges.

    If the other saved since this run read it, this run's samples are judged against what it saved, so
    neither resets the other's stall clock; and if the other's sample is the newer, this run saves none
    of its samples, so no newer sample is ever replaced by an older one (the counters only go up: the
    newer one tells all the older did). The page's facts keep the later of each; what each kind of run
    last said is the other's own, so theirs is kept but for this run's kind."""
    if theirs is None or theirs == mine:
        return mine, True
    states = theirs.states or {}
    if not _supersedes(samples, states):
        return Memory(mine.states, dialect=mine.dialect, facts=mine.facts, said=theirs.said), False
    base = mine
    if all(name not in states or sample.t >= states[name].last.t for name, sample in samples.items()):
        base = theirs  # judged against the fresher history (never a clock going back)
    facts = dict(mine.facts)
    for key, value in theirs.facts.items():
        facts[key] = max(value, facts.get(key, value))
    return Memory(base.states, dialect=base.dialect or mine.dialect, facts=facts, said=theirs.said), True


def report_only_code(code: int, health: str | None) -> int:
    """The exit code of a run under --report-only (liveness): the probe's own verdicts and readings are
    excused (0), never what an httpGet of the health route would fail on. `health`: why the health route
    says the engine does not serve, asked because the run would fail (None: it gave no answer, which is
    ambiguous and excused too; "": it serves). A refusal, a reset or an error status fails the run with
    the scrape's code."""
    if code == ExitCode.OK or not health:
        return ExitCode.OK
    return ExitCode.SCRAPE
