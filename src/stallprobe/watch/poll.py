"""The polling: every endpoint scraped at once, each engine judged against its history in memory.

Nothing here judges or words a verdict: the scrape is the probe's (scrape.fetch), the page is read by
engines.py with the same flags as the probe's, the verdicts are the detector's (assess_engines) and the
lines and notes are report.py's. This module keeps what a watch remembers between polls (each endpoint's
history, how long each verdict has held, the hooks' memory) and builds one Row per engine per poll;
WatchConfig is what it was asked to poll, and how.

- Each endpoint is scraped in a thread of its own, under the probe's single deadline (--timeout), so a
  slow or dead endpoint neither delays nor hides the others; an endpoint whose scrape is still stuck past
  the deadline (a DNS lookup has none) gets no second thread until the first returns.
- Two verdicts belong to the endpoint, not to an engine: `unreachable` (the scrape failed, exit 3) and
  `error` (the page is not one an engine writes, exit 4). They leave the detector's history as it was,
  as a failed probe run leaves its state file: a blip in the middle of a stall neither ends nor restarts it.
"""

from __future__ import annotations

import threading
import time

from ..detector import DEFAULT_SATURATION, DEFAULT_WINDOW, EnginesAssessment, Sample, Verdict, assess_engines
from ..engines import choose, precision_note, read_engines
from ..errors import ExitCode, MetricsError, ScrapeError, ScrapeTimeout, StallprobeError
from ..options import DEFAULT_CANARY_INTERVAL, DEFAULT_COOLDOWN, DEFAULT_HOOK_TIMEOUT, DEFAULT_INTERVAL, DEFAULT_TIMEOUT
from ..report import ERROR, UNREACHABLE, describe, note, num, secs
from ..scrape import fetch
from .hooks import Memory, consider
from .runner import Runner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ..detector import Assessment, State
    from ..engines import Dialect

__all__ = ["Row", "Watch", "WatchConfig"]

# The scrape's own deadline covers connect to last byte; this covers reading the page and a thread start.
_GRACE = 1.0


class WatchConfig:
    """Every flag of `stallprobe watch`, validated; the defaults are the option table's."""

    __slots__ = (
        "canary",
        "canary_interval",
        "cooldown",
        "engine",
        "hook_timeout",
        "hooks",
        "include_waiting",
        "interval",
        "json",
        "key",
        "listen",
        "names",
        "once",
        "progress",
        "saturation",
        "server_load",
        "timeout",
        "urls",
        "window",
    )

    def __init__(
        self,
        urls: Sequence[str],
        *,
        interval: float = DEFAULT_INTERVAL,
        window: float = DEFAULT_WINDOW,
        timeout: float = DEFAULT_TIMEOUT,
        engine: str = "auto",
        include_waiting: bool = False,
        saturation: float = DEFAULT_SATURATION,
        progress: Sequence[str] = (),
        names: Mapping[str, str] | None = None,
        once: bool = False,
        json: bool = False,
        hooks: Mapping[str, Sequence[str]] | None = None,
        cooldown: float = DEFAULT_COOLDOWN,
        hook_timeout: float = DEFAULT_HOOK_TIMEOUT,
        key: str = "",
        listen: tuple[str, int] | None = None,
        canary: bool = False,
        canary_interval: float = DEFAULT_CANARY_INTERVAL,
        server_load: bool = False,
    ) -> None:
        self.urls = tuple(urls)
        self.interval = interval
        self.window = window
        self.timeout = timeout
        self.engine = engine
        self.include_waiting = include_waiting
        self.saturation = saturation
        # Extra progress signals (--progress-metric), and the family names that override the engine's own
        # (options.dialect_names: running, waiting, prompt, generation, engine_label).
        self.progress = tuple(progress)
        self.names = dict(names or {})
        self.once = once
        self.json = json
        # The hooks given (--on-stalled, --on-saturated): the verdict each runs for -> its argv.
        self.hooks = {kind: tuple(argv) for kind, argv in (hooks or {}).items() if argv}
        self.cooldown = cooldown
        self.hook_timeout = hook_timeout
        self.key = key  # the API key to send (--api-key-file), "" for none
        self.listen = listen  # where to serve /metrics and /ready (--listen), None: nowhere
        # As the probe's: ask an idle-looking engine its in-flight requests, or send it the canary.
        self.canary = canary
        self.canary_interval = canary_interval
        self.server_load = server_load


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
        "prompt_rate",
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
        prompt_rate: float | None = None,
        generation_rate: float | None = None,
        stalled_for: float = 0.0,
        error: str | None = None,
        note: str = "",
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
        self.prompt_rate = prompt_rate  # tokens per second since the last poll; None without one
        self.generation_rate = generation_rate
        self.stalled_for = stalled_for
        self.error = error
        self.note = note  # the short why, for the table
        self.held_for = 0.0  # seconds this verdict has held, as seen by this watch
        self.time = 0.0  # the poll's wall-clock time (for the JSON lines only: every clock here is monotonic)
        self.hook = ""  # what the hooks did for this engine


class _Scrape:
    """One scrape and read of a page, in a thread of its own; `done` is set when it has an outcome."""

    def __init__(
        self, url: str, config: WatchConfig, previous: dict[str, State] | None, facts: dict[str, float]
    ) -> None:
        self.started = time.monotonic()
        self.done = threading.Event()
        self.outcome: tuple[Dialect, dict[str, Sample]] | StallprobeError | None = None
        self.facts = dict(facts)  # the endpoint's own (when its last canary went out), for this thread
        self.note = ""  # what the canary or the server's load said
        thread = threading.Thread(target=self._run, args=(url, config, previous), name=f"scrape {url}", daemon=True)
        thread.start()

    def _run(self, url: str, config: WatchConfig, previous: dict[str, State] | None) -> None:
        # Anything a hostile page or host makes the library raise stays on this endpoint's row: one
        # endpoint must never take the view of the others down.
        try:
            try:
                page = fetch(url, config.timeout, key=config.key)
            except StallprobeError:
                raise
            except Exception as exc:  # e.g. UnicodeError from a host the IDNA codec refuses
                raise ScrapeError(f"scrape {url}: {exc}") from None
            now = time.monotonic()
            try:
                # Read as the probe reads it (probe.run): the same engine, names and extra signals.
                dialect = choose(page, config.engine, config.names)
                samples = read_engines(page, now, dialect, config.progress)
            except StallprobeError:
                raise
            except Exception as exc:
                raise MetricsError(f"unreadable page: {exc}") from None
            if config.canary or config.server_load:
                from ..api import ask_idle, origin

                samples, self.note = ask_idle(
                    samples, previous, config, base=origin(url), dialect=dialect, facts=self.facts, now=now
                )
            if dialect.pause_route and previous:
                # As the probe does: an engine that would be suspect or stalled is asked whether its
                # operator paused it (here, off the poll's thread: a wedged core never answers).
                would = assess_engines(
                    previous, samples, config.window, config.saturation, include_waiting=config.include_waiting
                )
                if would.verdict in (Verdict.SUSPECT, Verdict.STALLED):
                    from ..api import ask_paused, origin

                    samples = ask_paused(samples, origin(url), dialect.pause_route, config.key) or samples
            self.outcome = (dialect, samples)
        except StallprobeError as exc:
            self.outcome = exc
        finally:
            self.done.set()


class _Endpoint:
    __slots__ = ("dialect", "facts", "pending", "states", "url")

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect: Dialect | None = None
        self.states: dict[str, State] | None = None  # the detector's history, in memory
        self.pending: _Scrape | None = None
        self.facts: dict[str, float] = {}  # when its last canary went out


class Watch:
    """The pool: each endpoint's history, how long each verdict has held, and the hooks."""

    def __init__(self, config: WatchConfig, environ: Mapping[str, str]) -> None:
        self.config = config
        self.endpoints = [_Endpoint(url) for url in config.urls]
        self.held: dict[tuple[str, str], tuple[str, float]] = {}
        self.memory = Memory()
        self.runner = Runner(config.hooks, config.hook_timeout, environ)

    def poll(self) -> list[Row]:
        """Scrape every endpoint at once, judge each engine, run the hooks; the rows, in URL order."""
        for endpoint in self.endpoints:
            if endpoint.pending is None:
                endpoint.pending = _Scrape(endpoint.url, self.config, endpoint.states, endpoint.facts)
        deadline = time.monotonic() + self.config.timeout + _GRACE
        for endpoint in self.endpoints:
            if endpoint.pending is not None:
                endpoint.pending.done.wait(max(0.0, deadline - time.monotonic()))
        now, wall = time.monotonic(), time.time()
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
        if scrape is None or not scrape.done.is_set():
            started = scrape.started if scrape else now
            silence = (
                f"scrape {endpoint.url}: no answer within {num(self.config.timeout)} s; "
                f"still waiting after {secs(now - started)} s (is its host name resolving?)"
            )
            return self._silent(endpoint, now, silence)
        endpoint.pending = None
        outcome = scrape.outcome
        if isinstance(outcome, ScrapeTimeout):
            return self._silent(endpoint, now, str(outcome))
        if outcome is None or isinstance(outcome, StallprobeError):
            return [_failure(endpoint.url, outcome or ScrapeError(f"scrape {endpoint.url}: no outcome"))]
        dialect, samples = outcome
        endpoint.facts = scrape.facts
        fresh = ""
        if endpoint.dialect is None or dialect.name != endpoint.dialect.name:
            # The first poll, or another engine answers on this URL now: no history to compare with.
            fresh = "first poll" if endpoint.dialect is None else f"now a {dialect.name} page"
            endpoint.states = None
            endpoint.dialect = dialect
        previous = endpoint.states
        config = self.config
        result = assess_engines(
            previous, samples, config.window, config.saturation, include_waiting=config.include_waiting
        )
        endpoint.states = result.states
        several = len(result.engines) > 1
        return [
            _engine_row(
                endpoint.url,
                dialect,
                name,
                one,
                previous=previous,
                fresh=fresh,
                several=several,
                window=config.window,
                learnt=scrape.note,
            )
            for name, one in result.engines.items()
        ]

    def _silent(self, endpoint: _Endpoint, now: float, silence: str) -> list[Row]:
        """An endpoint that gave no answer in time, judged as the probe judges it: no sample, and the
        stall clock runs from the last answer (a slow answer is not a wedge; silence for a window is)."""
        previous = endpoint.states
        names = list(previous) if previous else [""]
        silent = {name: Sample(0, 0, 0, now, answered=False) for name in names}
        result = assess_engines(previous, silent, self.config.window, self.config.saturation)
        endpoint.states = result.states
        prefix = f"scrape {endpoint.url}: "
        why = silence[len(prefix) :] if silence.startswith(prefix) else silence
        rows = []
        for name, one in result.engines.items():
            message = describe(EnginesAssessment({name: one}), previous, "", self.config.window, silence=silence)
            code = ExitCode.STALLED if one.verdict is Verdict.STALLED else ExitCode.OK
            rows.append(
                Row(
                    endpoint.url,
                    name,
                    one.verdict.value,
                    int(code),
                    message,
                    engine=name if len(names) > 1 else None,
                    dialect=endpoint.dialect.name if endpoint.dialect else None,
                    stalled_for=one.stalled_for,
                    note=f"{why}; nothing answered for {secs(one.stalled_for)} s",
                )
            )
        return rows


def _failure(url: str, exc: StallprobeError) -> Row:
    """The row of an endpoint that could not be read: unreachable (the scrape failed), else error."""
    verdict = UNREACHABLE if isinstance(exc, ScrapeError) else ERROR
    text = str(exc)
    prefix = f"scrape {url}: "
    why = text[len(prefix) :] if text.startswith(prefix) else text
    return Row(url, "", verdict, int(exc.exit_code), f"{verdict}: {text}", error=text, note=why)


def _engine_row(
    url: str,
    dialect: Dialect,
    name: str,
    one: Assessment,
    *,
    previous: Mapping[str, State] | None,
    fresh: str,
    several: bool,
    window: float,
    learnt: str = "",
) -> Row:
    sample = one.state.last
    before = previous.get(name) if previous else None
    prompt_rate = generation_rate = None
    if before is not None and one.verdict is not Verdict.BASELINE and sample.t > before.last.t:
        elapsed = sample.t - before.last.t
        prompt_rate = (sample.prompt - before.last.prompt) / elapsed
        generation_rate = (sample.generation - before.last.generation) / elapsed
    precision = precision_note(dialect, sample) if one.verdict in (Verdict.SUSPECT, Verdict.STALLED) else ""
    # describe() says why a baseline was taken; `fresh` (why there is no history at all) comes first.
    message = describe(EnginesAssessment({name: one}), previous, fresh, window, precision, note=learnt)
    return Row(
        url,
        name,
        one.verdict.value,
        int(ExitCode.STALLED if one.verdict is Verdict.STALLED else ExitCode.OK),
        message,
        engine=name if several else None,
        dialect=dialect.name,
        running=sample.running,
        waiting=sample.waiting,
        prompt_rate=prompt_rate,
        generation_rate=generation_rate,
        stalled_for=one.stalled_for,
        note="; ".join(part for part in (note(one, before, previous, fresh, precision), learnt) if part),
    )
