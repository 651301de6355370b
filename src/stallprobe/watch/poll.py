"""The polling: every endpoint scraped at once, each engine judged against its history in memory.

Nothing here judges or words a verdict: each look is observe.look's, as the probe's, the page read by
engines.py with the same flags, and what it means is judge.judge's (the probe's one judge), its lines and
notes report.py's. This module keeps what a watch remembers between polls (each endpoint's memory, how
long each verdict has held, the hooks' memory) and builds one Row per engine per poll; WatchConfig is what
it was asked to poll, and how.

- Every endpoint is looked at at once, on one thread (loop.Flights performs the exchanges that observe.look
  asks for), each exchange under the probe's own deadline (--timeout), so a slow or dead endpoint
  neither delays nor hides the others; an endpoint whose look is still stuck past the poll's deadline
  (a DNS lookup has none) gets no second look until the first returns.
- Two verdicts belong to the endpoint, not to an engine: `unreachable` (the scrape failed, exit 3) and
  `error` (the page is not one an engine writes, exit 4). They leave the detector's history as it was,
  as a failed probe run leaves its state file: a blip in the middle of a stall neither ends nor restarts it.
"""

from __future__ import annotations

import time

from .. import judge as judging
from ..detector import EnginesAssessment, Verdict
from ..errors import ScrapeError, StallprobeError
from ..judge import Rules, judge, silent
from ..observe import budget, look
from ..options import WATCH
from ..report import ERROR, UNREACHABLE, describe, num, precision, secs, short_why, verdict_code
from ..settings import LookSettings
from .hooks import Memory, consider
from .loop import Flights
from .runner import Runner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ..detector import Assessment, State
    from ..engines import Dialect
    from ..judge import Observation
    from .loop import Flight

__all__ = ["Row", "Watch", "WatchConfig"]

# Each exchange's own deadline covers connect to last byte; this covers reading the pages (one thread
# reads them all).
_GRACE = 1.0


class WatchConfig(LookSettings):
    """Every flag of `stallprobe watch` (the option table's WATCH selection), and the URLs it polls.

    `WatchConfig(urls, window=2)` gives the option table's defaults for the rest (tests and benchmarks
    build one so); `command.configure` fills one from a command line.
    """

    OPTIONS = WATCH

    interval: float
    once: bool
    json: bool
    every: bool
    on_stalled: tuple[str, ...]
    on_saturated: tuple[str, ...]
    cooldown: float
    hook_timeout: float
    listen: tuple[str, int] | None
    agent: tuple[str, int] | None
    urls: tuple[str, ...] = ()

    def __init__(self, urls: Sequence[str] = (), **values: object) -> None:
        super().__init__(**values)
        self.urls = tuple(urls)

    @property
    def routing(self) -> bool:
        """Whether a load balancer asks this watch (--listen's /ready, --agent): only then is each
        engine's health route asked too, for the readiness rule."""
        return self.listen is not None or self.agent is not None

    @property
    def hooks(self) -> dict[str, tuple[str, ...]]:
        """The hooks given (--on-stalled, --on-saturated): the verdict each runs for -> its argv."""
        given = {Verdict.STALLED.value: self.on_stalled, Verdict.SATURATED.value: self.on_saturated}
        return {kind: argv for kind, argv in given.items() if argv}


class Row:
    """One row of the view: an engine of an endpoint, or the endpoint itself when it could not be read."""

    __slots__ = (
        "code",
        "dialect",
        "engine",
        "error",
        "generation_rate",
        "held_for",
        "hook",
        "message",
        "name",
        "note",
        "owed",
        "prompt_rate",
        "ready",
        "ready_message",
        "running",
        "stalled_for",
        "time",
        "url",
        "verdict",
        "waiting",
    )

    def __init__(
        self,
        url: str,
        name: str,
        verdict: str,
        code: int,
        message: str,
        *,
        engine: str | None = None,
        dialect: str | None = None,
        running: float | None = None,
        waiting: float | None = None,
        owed: float | None = None,
        prompt_rate: float | None = None,
        generation_rate: float | None = None,
        stalled_for: float = 0.0,
        error: str | None = None,
        note: str = "",
        ready: bool = False,
        ready_message: str = "",
    ) -> None:
        self.url = url
        self.name = name  # the engine's name on the page ("" for one unlabelled engine, or the endpoint)
        self.engine = engine  # the name shown: None when the page has one engine
        self.verdict = verdict
        self.code = code  # this row's exit code in --once
        self.message = message  # the probe's line for this engine
        self.dialect = dialect
        self.running = running
        self.waiting = waiting
        self.owed = owed  # of the waiting, those the engine owes work (waiting for capacity)
        self.prompt_rate = prompt_rate  # tokens per second since the last poll; None without one
        self.generation_rate = generation_rate
        self.stalled_for = stalled_for
        self.error = error
        self.note = note  # the short why, for the table
        # The readiness rule (detector.readiness, the probe's --ready): whether the endpoint may take new
        # requests, and the line that says why (what /ready answers).
        self.ready = ready
        self.ready_message = ready_message or message
        self.held_for = 0.0  # seconds this verdict has held, as seen by this watch
        self.time = 0.0  # the poll's wall-clock time (for the JSON lines only: every clock here is monotonic)
        self.hook = ""  # what the hooks did for this engine


class _Endpoint:
    __slots__ = ("dialect", "memory", "pending", "url")

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect: Dialect | None = None  # the dialect its last page was read with
        self.memory = judging.Memory()  # what the judge remembers of it, as the probe's state file does
        self.pending: Flight | None = None


class Watch:
    """The pool: each endpoint's history, how long each verdict has held, and the hooks."""

    def __init__(self, config: WatchConfig, environ: Mapping[str, str], *, flights: Flights | None = None) -> None:
        self.config = config
        # Every look's exchanges, on this thread; its clock is the watch's (tests give both a fake one).
        self.flights = flights or Flights()
        self.clock: Callable[[], float] = self.flights.clock
        self.endpoints = [_Endpoint(url) for url in config.urls]
        self.held: dict[tuple[str, str], tuple[str, float]] = {}
        self.memory = Memory()
        self.runner = Runner(config.hooks, config.hook_timeout, environ)
        self.rules = Rules.of(config)

    def poll(self) -> list[Row]:
        """Scrape every endpoint at once, judge each engine, run the hooks; the rows, in URL order."""
        config, looks = self.config, self.flights
        health = config.routing  # the health route: asked only when a load balancer asks (/ready, the agent)
        for endpoint in self.endpoints:
            if endpoint.pending is None:
                steps = look(endpoint.url, config, endpoint.memory, readiness=health)
                endpoint.pending = looks.start(endpoint.url, steps)
        looks.run(self.clock() + budget(config, readiness=health) + _GRACE)
        now, wall = self.clock(), time.time()
        rows = [row for endpoint in self.endpoints for row in self._judge(endpoint, now)]
        held = {}
        for row in rows:
            row.time = wall
            key = (row.url, row.name)
            verdict, since = self.held.get(key, (row.verdict, now))
            if verdict != row.verdict:
                since = now
            held[key] = (row.verdict, since)
            row.held_for = now - since
        self.held = held
        if self.config.hooks:
            self._hooks(rows, now)
        return rows

    def _hooks(self, rows: Sequence[Row], now: float) -> None:
        """The hook rules (hooks.consider) on this poll's rows; the runner starts what they ask for."""
        seen = [(row.url, row.name, row.verdict) for row in rows]
        running = self.runner.running()
        self.memory, starts, notes = consider(
            self.memory, seen, running, now, cooldown=self.config.cooldown, kinds=self.config.hooks
        )
        by_engine = {(row.url, row.name): row for row in rows}
        for kind, url, name in starts:
            row = by_engine[(url, name)]
            self.runner.start(kind, url, row.engine or "", row.message)
        for row, told in zip(rows, notes):
            row.hook = "; ".join(self.runner.tell(one, now) for one in told)

    def _judge(self, endpoint: _Endpoint, now: float) -> list[Row]:
        scrape = endpoint.pending
        if scrape is None or not scrape.done:
            started = scrape.started if scrape else now
            # Only a name lookup outlives its exchange's deadline; else the watch itself was starved.
            hint = " (is its host name resolving?)" if scrape is None or scrape.resolving else ""
            why = (
                f"scrape {endpoint.url}: no answer within {num(self.config.timeout)} s; "
                f"still waiting after {secs(now - started)} s{hint}"
            )
            return self._rows(endpoint, silent(endpoint.memory.states, now, why))
        endpoint.pending = None
        seen = scrape.outcome
        if seen is None or isinstance(seen, StallprobeError):
            return [_failure(endpoint.url, seen or ScrapeError(f"scrape {endpoint.url}: no outcome"))]
        return self._rows(endpoint, seen)

    def _rows(self, endpoint: _Endpoint, seen: Observation) -> list[Row]:
        """Judge what the look saw against the endpoint's memory, as the probe judges its page (and its
        readiness, as the probe's --ready does): one row per engine."""
        memory = endpoint.memory
        first = "first poll" if not memory.dialect else ""
        judgment = judge(self.rules, memory, seen, ready=True, first=first)
        endpoint.memory = judgment.memory
        if seen.dialect is not None:
            endpoint.dialect = seen.dialect
        fresh = judgment.first if judgment.previous is None else ""
        result = judgment.result
        several = len(result.engines) > 1
        rows = []
        for name, one in result.engines.items():
            row = _engine_row(endpoint.url, endpoint.dialect, name, one, previous=judgment.previous, fresh=fresh,
                              several=several, window=self.config.window, seen=seen)  # fmt: skip
            row.ready = judgment.ready
            row.ready_message = judgment.line
            rows.append(row)
        return rows


def _failure(url: str, exc: StallprobeError) -> Row:
    """The row of an endpoint that could not be read: unreachable (the scrape failed), else error."""
    verdict = UNREACHABLE if isinstance(exc, ScrapeError) else ERROR
    text = str(exc)
    prefix = f"scrape {url}: "
    why = text[len(prefix) :] if text.startswith(prefix) else text
    line = f"{verdict}: {text}"
    return Row(url, "", verdict, int(exc.exit_code), line, error=text, note=why, ready_message=f"not ready: {line}")


def _engine_row(
    url: str,
    dialect: Dialect | None,
    name: str,
    one: Assessment,
    *,
    previous: Mapping[str, State] | None,
    fresh: str,
    several: bool,
    window: float,
    seen: Observation,
) -> Row:
    sample = one.state.last
    before = previous.get(name) if previous else None
    code = verdict_code(one.verdict)
    dialect_name = dialect.name if dialect else None
    engine = name if several else None
    if seen.unanswered:
        prefix = f"scrape {url}: "
        why = seen.unanswered[len(prefix) :] if seen.unanswered.startswith(prefix) else seen.unanswered
        message = describe(EnginesAssessment({name: one}), previous, "", window, unanswered=seen.unanswered)
        note_text = f"{why}; nothing answered for {secs(one.stalled_for)} s"
        return Row(url, name, one.verdict.value, code, message, engine=engine, dialect=dialect_name,
                   stalled_for=one.stalled_for, note=note_text)  # fmt: skip
    prompt_rate = generation_rate = None
    if before is not None and one.verdict is not Verdict.BASELINE and sample.t > before.last.t:
        elapsed = sample.t - before.last.t
        prompt_rate = (sample.prompt - before.last.prompt) / elapsed
        generation_rate = (sample.generation - before.last.generation) / elapsed
    why_frozen = precision(dialect, one)
    # describe() says why a baseline was taken; `fresh` (why there is no history at all) comes first.
    message = describe(EnginesAssessment({name: one}), previous, fresh, window, why_frozen, note=seen.note)
    return Row(
        url,
        name,
        one.verdict.value,
        code,
        message,
        engine=engine,
        dialect=dialect_name,
        running=sample.running,
        waiting=sample.waiting,
        owed=sample.owed,
        prompt_rate=prompt_rate,
        generation_rate=generation_rate,
        stalled_for=one.stalled_for,
        note="; ".join(part for part in (short_why(one, before, previous, fresh, why_frozen), seen.note) if part),
    )
