"""What an engine said at one look, for every command: the probe, its readiness, and each endpoint of watch.

One look is: the page (or no answer within the deadline), read with the dialect; for an engine that looks
idle, the questions that can find requests the gauges miss (its server's load, the canary); for an engine
that would be suspect or stalled, whether its operator paused it; and, when readiness is wanted, its
health route. The result is an Observation (judge.py): the samples the detector judges, and the facts
beside them. Judging them (judge.judge) is the caller's next step, so that the probe can judge inside its
state file's lock and watch in memory.

Every question beyond the page is asked only when the page alone cannot tell, so a healthy engine's look
is one GET (two with readiness); api.py, and json with it, is loaded only then.

A look is decided apart from its I/O: look() is a generator that yields each exchange it needs next
(asking.Ask), given how the ones before it went (asking.Outcome), and returns the Observation. The probe
and doctor perform its exchanges one after another (observe(): asking.drive); watch performs those of
every endpoint of its pool at once, on one thread (watch/loop.py). What is asked and how it is judged is
the same.
"""

from __future__ import annotations

from .asking import Ask, drive
from .detector import looks_idle
from .engines import about as engine_about
from .engines import choose, read_engines
from .errors import ScrapeError, ScrapeTimeout
from .judge import Observation, Rules, canary_due, silent, would_be_stalled, would_be_stuck
from .scrape import page_of
from .urls import origin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from .asking import Outcome
    from .judge import Memory
    from .settings import LookSettings

__all__ = [
    "Observation",
    "budget",
    "health",
    "kubelet_timeout",
    "look",
    "observe",
    "silent",
    "worst_case",
]


def observe(
    url: str,
    settings: LookSettings,
    memory: Memory,
    clock: Callable[[], float],
    *,
    readiness: bool = False,
    page: bytes | None = None,
) -> Observation:
    """Look at the engine whose page is `url` once, against what is remembered of it (`memory`: its
    history, when its last canary went out). `clock` gives the sample's time (CLOCK_MONOTONIC: one clock
    for every process since boot). With `readiness`, the health route is asked too. `page`: the page, when
    the caller has just read it itself (doctor's first contact, which reads its status too), so that the
    look asks for it no second time. Raises ScrapeError (not ScrapeTimeout: that is an Observation) and
    MetricsError. Each exchange is performed here, one after another (look() decides which)."""
    at = clock() if page is not None else 0.0
    return drive(look(url, settings, memory, readiness=readiness, page=page, at=at), clock)


def look(
    url: str,
    settings: LookSettings,
    memory: Memory,
    *,
    readiness: bool = False,
    page: bytes | None = None,
    at: float = 0.0,
) -> Generator[Ask, Outcome, Observation]:
    """observe()'s decisions without its I/O: yields each exchange to perform, is sent how it went, and
    returns the Observation (or raises ScrapeError and MetricsError, as observe() does). A sample's time
    is when its page's exchange ended, by the driver's clock (`at`, when the caller gives the `page`)."""
    previous = memory.states
    if page is None:
        outcome = yield Ask(url, settings.timeout, key=settings.key)
        try:
            page = page_of(url, outcome.result())
        except ScrapeTimeout as exc:
            return silent(previous, outcome.ended, str(exc))
        at = outcome.ended
        del outcome  # its answer holds the page
    now = at
    dialect = choose(page, settings.engine, settings.names)
    samples = read_engines(page, now, dialect, settings.progress_metric)
    if dialect.confirm_route:
        from .api import carried

        samples = carried(samples, previous)
    rules = Rules.of(settings).of_engine(dialect)
    stuck = would_be_stuck(rules, previous, samples)
    about = engine_about(page, dialect) if stuck else ""  # for the evidence of a run that may fail
    del page  # a page can be megabytes: not held while the questions below wait on their answers
    base = origin(url)
    note = ""
    sent = None
    if (settings.canary or settings.server_load) and looks_idle(samples, previous):
        from .api import ask_idle

        samples, note, sent = yield from ask_idle(
            samples, settings, base=base, dialect=dialect, now=now, canary_due=canary_due(rules, memory, now)
        )
    if dialect.live_route and stuck:
        # The scheduler's own counts, where the page's may be a stale batch (SGLang); no answer: the page.
        from .api import ask_live

        samples = (yield from ask_live(samples, base, dialect.live_route, settings.key)) or samples
        stuck = would_be_stuck(rules, previous, samples)
    if dialect.pause_route and stuck:
        # Asked only now, so a healthy look costs nothing more; no answer is never "paused".
        from .api import ask_paused

        paused = yield from ask_paused(samples, base, dialect.pause_route, settings.key, name=dialect.pause_key)
        samples = paused or samples
    if dialect.confirm_route and would_be_stalled(rules, previous, samples, ready=readiness):
        # A page that cannot show a long request's progress: a request through the whole engine can.
        from .api import CONFIRM_TIMEOUT, confirmed

        samples, answered = yield from confirmed(samples, base, dialect.confirm_route, settings.key, CONFIRM_TIMEOUT)
        note = "; ".join(part for part in (note, answered) if part)
    why: str | None = None
    quiet = ""
    if readiness:
        why, quiet, body = yield from _health(base + dialect.health_route, settings)
        if body and dialect.health_paused[0]:
            from .api import health_paused

            samples = health_paused(samples, body, dialect.health_route, *dialect.health_paused)
    return Observation(dialect, samples, note=note, health=why, health_silent=quiet, canary_at=sent, about=about)


def health(
    url: str, settings: LookSettings, *, missing_ok: bool = True, timeout: float | None = None
) -> tuple[str, str]:
    """What the engine's health route says, asked here and now (within `timeout`, else --timeout): why
    it says the engine does not serve ("" when it answers 2xx, or 404 with `missing_ok`: beside a page
    that was judged, a server without that route has nothing to say about serving; the engines' own
    servers all have one), and why it gave no answer ("" when it did). Without `missing_ok` (the route
    alone decides, as an httpGet probe of it would), a 404 is a failure too."""
    import time

    return drive(_health(url, settings, missing_ok=missing_ok, timeout=timeout), time.monotonic)[:2]


def _health(
    url: str, settings: LookSettings, *, missing_ok: bool = True, timeout: float | None = None
) -> Generator[Ask, Outcome, tuple[str, str, bytes]]:
    """health()'s exchange, and the body of a 2xx answer (b"" for any other)."""
    from .scrape import status_error

    outcome = yield Ask(url, settings.timeout if timeout is None else timeout, key=settings.key, what="health")
    try:
        answer = outcome.result()
    except ScrapeTimeout as exc:
        return "", str(exc), b""  # no answer in time: ambiguous, as a page that gives none (judge.py)
    except ScrapeError as exc:
        return str(exc), "", b""
    if 200 <= answer.code < 300:
        return "", "", answer.body
    if answer.code == 404 and missing_ok:
        return "", "", b""
    return status_error(f"health {url}", answer), "", b""


def worst_case(timeout: float, asks: int = 0, engine: str | None = None) -> float:
    """The longest one look can take, with --timeout `timeout` and `asks` exchanges beyond the page (the
    idle engine's load, the canary, the health route): each has its own deadline, and so has the one
    question an engine that looks stuck is asked (vLLM's /is_paused, SGLang's /v1/loads, LMDeploy's
    /is_sleeping; TensorRT-LLM's /health_generate, a generation, has a longer one: any engine but a named
    other one may be it)."""
    from .api import CONFIRM_TIMEOUT, STUCK_QUESTION_TIMEOUT
    from .engines import dialect_named

    dialect = dialect_named(engine)
    stuck = STUCK_QUESTION_TIMEOUT if dialect is not None and not dialect.confirm_route else CONFIRM_TIMEOUT
    return timeout * (1 + asks) + stuck


def budget(settings: LookSettings, *, readiness: bool = False) -> float:
    """The longest one look of `settings` can take (worst_case): the canary's two exchanges share one
    deadline. Only a look whose page answered asks more."""
    return worst_case(settings.timeout, settings.server_load + settings.canary + readiness, settings.engine)


def kubelet_timeout(timeout: float, asks: int = 0, engine: str | None = None) -> int:
    """The timeoutSeconds to give the kubelet for one run of the probe with --timeout `timeout` and `asks`
    exchanges beyond the page (--canary, --server-load, and --ready's health route), for `engine` (None:
    any): above the run's own worst case, with room for the interpreter's start on a starved CPU. A run
    the kubelet kills at its timeout counts as a failure, so the probe must end first."""
    import math

    return math.ceil(worst_case(timeout, asks, engine)) + 2
