"""The doctor's looks: one about a second for --seconds, each through observe.observe with every look
option (--include-waiting, --saturation, --canary, --server-load, the API key ...) and the health route,
judged in memory by the one judge (judge.judge, as the probe's --ready judges a look). The first look is
the first contact's.

What it keeps is each look's judgment: the observation, the assessment, the history it was judged
against and its readiness. Beside them, the engine's own routes that the words need asked once (its
pause, SGLang's scheduler counts, TensorRT-LLM's one-token generation) and its server's load at each look
(whether --server-load would help), all through api.ask. The clock and the pause between looks are
parameters, as the detector takes time as a field: tests move a clock of their own.
"""

from __future__ import annotations

from ..api import CONFIRM_TIMEOUT, STUCK_QUESTION_TIMEOUT, ask, server_load
from ..detector import Verdict
from ..errors import MetricsError, ScrapeError
from ..judge import Memory, Rules, judge
from ..observe import observe
from ..urls import origin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ..api import Reply
    from ..detector import EnginesAssessment, State
    from ..judge import Judgment, Observation
    from ..settings import LookSettings
    from .first import First

__all__ = ["BUSY", "MOVING", "Look", "Looks", "intervals", "look"]

# The verdicts of an engine that owes work: moving (thrashing moves too: it finishes nothing), or frozen.
MOVING = (Verdict.PROGRESSING, Verdict.SATURATED, Verdict.THRASHING)
BUSY = (*MOVING, Verdict.SUSPECT, Verdict.STALLED)


class Look:
    """One look: the judge's judgment of it (what observe saw, the detector's assessment, the history it was
    judged against, whether the page may take requests and the step judged for routing), and what the
    server-load route said (None: not asked)."""

    __slots__ = ("judgment", "load")

    def __init__(self, judgment: Judgment) -> None:
        self.judgment = judgment
        self.load: Reply | None = None

    @property
    def seen(self) -> Observation:
        return self.judgment.seen

    @property
    def result(self) -> EnginesAssessment:
        return self.judgment.result

    @property
    def before(self) -> Mapping[str, State] | None:
        return self.judgment.previous

    @property
    def ready(self) -> bool:
        return self.judgment.ready

    @property
    def routing(self) -> EnginesAssessment:
        return self.judgment.routing


class Looks:
    """Every look, how they ended (an error, Ctrl-C), and the routes asked once."""

    def __init__(self) -> None:
        self.all: list[Look] = []
        self.error: ScrapeError | MetricsError | None = None
        self.interrupted = False
        self.pause: Reply | None = None  # the pause route's answer (vLLM's /is_paused)
        self.live: Reply | None = None  # the scheduler's counts (SGLang's /v1/loads)
        # How the request through the whole engine that the probe asks of one whose page would be
        # stalled (TensorRT-LLM's /health_generate) was answered.
        self.confirm: Reply | None = None

    @property
    def answered(self) -> list[Look]:
        return [one for one in self.all if one.seen.dialect is not None]

    @property
    def verdicts(self) -> list[Verdict]:
        return [one.result.verdict for one in self.all]

    def moved(self) -> dict[str, float | None]:
        """What moved between two looks the detector compared, family by family: how much a token counter
        rose, or None for a heartbeat that changed (or appeared, or went: any change is progress)."""
        moved: dict[str, float | None] = {}
        for one in self.all:
            dialect = one.seen.dialect
            if dialect is None or not one.before:
                continue
            for name, sample in one.seen.samples.items():
                last = one.before.get(name)
                if last is None or not last.last.answered:
                    continue
                prev = last.last
                if sample.generation < prev.generation or sample.prompt < prev.prompt:
                    continue  # a restarted engine: a baseline, nothing compared
                for family, rise in (
                    (dialect.prompt, sample.prompt - prev.prompt),
                    (dialect.generation, sample.generation - prev.generation),
                ):
                    if rise > 0:
                        moved[family] = (moved.get(family) or 0.0) + rise
                for family in {*sample.signals, *prev.signals}:
                    if sample.signals.get(family) != prev.signals.get(family):
                        moved.setdefault(family, None)
        return moved


def intervals(seconds: float) -> int:
    """How many intervals of about a second --seconds makes (at least one: a look, then one more)."""
    import math

    return max(1, math.ceil(seconds))


def _judge(looks: Looks, seen: Observation, memory: Memory, settings: LookSettings) -> Look:
    one = Look(judge(Rules.of(settings), memory, seen, ready=True))
    looks.all.append(one)
    return one


def look(
    url: str,
    settings: LookSettings,
    seconds: float,
    first: First,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> Looks:
    """The looks after the first contact's, one per interval until --seconds have passed since it; stop
    early at a failure, or at Ctrl-C (what was seen is kept)."""
    assert first.seen is not None
    count = intervals(seconds)
    step = seconds / count
    looks = Looks()
    base = origin(url)
    try:
        one = _judge(looks, first.seen, Memory(), settings)
        _ask_load(one, base, settings)
        for i in range(1, count + 1):
            wait = first.started + i * step - clock()
            if wait > 0:
                sleep(wait)
            memory = one.judgment.memory
            try:
                seen = observe(url, settings, memory, clock, readiness=True)
            except (ScrapeError, MetricsError) as exc:
                looks.error = exc
                break
            one = _judge(looks, seen, memory, settings)
            _ask_load(one, base, settings)
        dialect = first.seen.dialect
        if dialect is not None and dialect.pause_route:
            looks.pause = ask(base + dialect.pause_route, settings.key, STUCK_QUESTION_TIMEOUT)
        if dialect is not None and dialect.live_route:
            looks.live = ask(base + dialect.live_route, settings.key, STUCK_QUESTION_TIMEOUT)
        if dialect is not None and dialect.confirm_route:
            # After the looks: its answer is a request that finishes, which moves the page's counters.
            looks.confirm = ask(base + dialect.confirm_route, settings.key, CONFIRM_TIMEOUT)
    except KeyboardInterrupt:
        looks.interrupted = True
    return looks


def _ask_load(one: Look, base: str, settings: LookSettings) -> None:
    """The server's requests in flight at this look, whatever the engine's gauges say: whether the
    probe's --server-load would find them (observe asks only an engine that looks idle)."""
    dialect = one.seen.dialect
    if dialect is not None and dialect.load_route:
        one.load = ask(base + dialect.load_route, settings.key, settings.timeout)


def loads(looks: Looks) -> list[tuple[float, bool]]:
    """What the server-load route counted at each look that it answered, and whether requests ran then."""
    counted = []
    for one in looks.all:
        value = server_load(one.load.data) if one.load is not None else None
        if value is not None:
            counted.append((value, any(sample.running for sample in one.seen.samples.values())))
    return counted
