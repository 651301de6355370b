"""`stallprobe watch`: the operator's view of a pool of engines, and a watchdog for engines outside Kubernetes.

The probe judges one page per process and keeps its history in a file; watch keeps the history of every
engine of a pool in memory and polls them all every --interval seconds. Nothing here judges: the scrape is
the probe's (scrape.fetch), the page is read by engines.py, the verdicts are the detector's
(assess_engines) and the lines are the probe's (cli.describe). This module adds the polling, the view and
the hooks.

- Each endpoint is scraped in a thread of its own, under the probe's single deadline (--timeout), so a slow
  or dead endpoint neither delays nor hides the others; an endpoint whose scrape is still stuck past the
  deadline (a DNS lookup has none) gets no second thread until the first returns.
- Two verdicts belong to the endpoint, not to an engine: `unreachable` (the scrape failed, exit 3) and
  `error` (the page is not one an engine writes, exit 4). They leave the detector's history as it was,
  as a failed probe run leaves its state file: a blip in the middle of a stall neither ends nor restarts it.
- Hooks run once per episode (an engine seen with the verdict, until it is seen with another one the
  detector gave), at most once per --cooldown per endpoint, in their own session, killed after
  --hook-timeout. A stall that outlives the command it triggered does not trigger it again: a restart
  that did not take needs a person, not a restart loop.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

from .cli import DEFAULT_TIMEOUT, ENGINES, MAX_PAGE_BYTES, ExitCode, _num, _positive, _secs, describe
from .detector import DEFAULT_SATURATION, DEFAULT_WINDOW, EnginesAssessment, Verdict, assess_engines
from .engines import choose, precision_note, read_engines
from .errors import MetricsError, ScrapeError, StallprobeError, UsageError
from .scrape import fetch, parse_url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import FrameType
    from typing import NoReturn, TextIO

    from .detector import Assessment, Sample, State
    from .engines import Dialect

__all__ = ["Row", "Watch", "WatchConfig", "configure", "endpoint_name", "help_text", "main", "once_code", "table"]

# A person reading the table wants it fresh; the detector needs only a few samples per window. One GET per
# engine every 5 s is nothing next to what the engine serves.
DEFAULT_INTERVAL = 5.0
# Longer than a model takes to load (the README's startupProbe allows 10 minutes): a restarted engine is
# not restarted again before it could have served a request. (The incident's watchdog held off 165 minutes.)
DEFAULT_COOLDOWN = 600.0
# A restart command (docker restart, systemctl restart) returns within a minute; five minutes is a hang.
DEFAULT_HOOK_TIMEOUT = 300.0
# The scrape's own deadline covers connect to last byte; this covers reading the page and a thread start.
_GRACE = 1.0
# After SIGTERM, how long a hook's process group has before SIGKILL.
_KILL_GRACE = 5.0
# How long a poll waits for a hook's process to exist (fork and exec take milliseconds).
_SPAWN_WAIT = 5.0
# --once interrupted: the shell's code for SIGINT, so a script never reads an unfinished check as "alive".
_INTERRUPTED = 130

_STALLED = Verdict.STALLED.value
_SATURATED = Verdict.SATURATED.value
_UNREACHABLE = "unreachable"
_ERROR = "error"
# For the totals row: the pool is as bad as its worst row. An endpoint that cannot be read is worse than
# one that is only suspect, and better than one known to be stalled.
_ORDER = ("idle", "baseline", "progressing", "saturated", "suspect", _UNREACHABLE, _ERROR, _STALLED)
_DETECTOR_VERDICTS = frozenset(v.value for v in Verdict)
_HOOKS = ((_STALLED, "--on-stalled"), (_SATURATED, "--on-saturated"))

_DRAIN = (
    "Drain the load balancer before restarting one member of a pool: otherwise the gateway retries the "
    "restarted member's queue on the survivors, and the survivor absorbs the whole retried backlog."
)

_DESCRIPTION = f"""\
Poll every engine of a pool and show, per engine, whether it is idle, moving, saturated or stuck:
running and waiting requests, prompt and generation tokens per second since the last poll, the
detector's verdict, and how long that verdict has held. On a terminal one table is redrawn in place
(the last row sums the pool); piped, or with --json, one line per engine per poll.

Verdicts: baseline, idle, progressing, saturated, suspect, stalled (the probe's), unreachable (the
scrape failed) and error (not a metrics page).

Watchdog: --on-stalled runs a command (split like a shell would, but run without one: write
`sh -c '...'` for a shell) once per stall episode of an engine, never for a saturated or suspect one, at
most once per --cooldown per endpoint, with STALLPROBE_URL, STALLPROBE_ENGINE (empty when the page has
one engine), STALLPROBE_VERDICT and STALLPROBE_MESSAGE in its environment. It runs in the background,
its output discarded but for the last line of a failure, and is killed after --hook-timeout.
{_DRAIN}"""

_EPILOG = f"""\
exit codes:
  0    interrupted with Ctrl-C (or SIGTERM); with --once, every endpoint alive
  1    --once: an engine is stalled (the stall clock can only run one interval, so only when
       --window <= --interval; the probe with its state file is the tool for cron)
  2    usage error: a flag or URL is invalid
  3    --once: an endpoint could not be scraped (and none stalled)
  4    --once: an endpoint is not a metrics page (and none stalled)
  {_INTERRUPTED}  --once interrupted before its second poll"""


class WatchConfig:
    """Every flag of `stallprobe watch`, validated."""

    __slots__ = (
        "cooldown",
        "engine",
        "hook_timeout",
        "include_waiting",
        "interval",
        "json",
        "on_saturated",
        "on_stalled",
        "once",
        "saturation",
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
        once: bool = False,
        json: bool = False,
        on_stalled: Sequence[str] = (),
        on_saturated: Sequence[str] = (),
        cooldown: float = DEFAULT_COOLDOWN,
        hook_timeout: float = DEFAULT_HOOK_TIMEOUT,
    ) -> None:
        self.urls = tuple(urls)
        self.interval = interval
        self.window = window
        self.timeout = timeout
        self.engine = engine
        self.include_waiting = include_waiting
        self.saturation = saturation
        self.once = once
        self.json = json
        # A hook's argv; empty when not given.
        self.on_stalled = tuple(on_stalled)
        self.on_saturated = tuple(on_saturated)
        self.cooldown = cooldown
        self.hook_timeout = hook_timeout


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse would print its usage to stderr and exit; here every usage error is one line, exit 2.
        raise UsageError(message)


def _parser() -> _Parser:
    parser = _Parser(
        prog="stallprobe watch",
        usage="stallprobe watch URL [URL ...] [--interval S] [--window S] [--once] [--json] [options]",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        allow_abbrev=False,
    )
    parser.add_argument("urls", nargs="*", metavar="URL", help="an engine's Prometheus page (plain http://)")
    # Valued flags append, so that one given twice is an error, as in the probe.
    valued = (
        ("--interval", "SECONDS", f"poll every this long (default {_num(DEFAULT_INTERVAL)})"),
        ("--window", "SECONDS", f"busy with no progress this long is stalled (default {_num(DEFAULT_WINDOW)})"),
        ("--timeout", "SECONDS", f"one deadline per scrape, connect to last byte (default {_num(DEFAULT_TIMEOUT)})"),
        ("--engine", "NAME", "auto, vllm, sglang or llamacpp (default auto)"),
        ("--saturation", "N", f"waiting >= N while progressing is saturated (default {_num(DEFAULT_SATURATION)})"),
        (
            "--on-stalled",
            "CMD",
            "run CMD once per stall episode of an engine (restart it). Drain the load balancer first, "
            "or the survivors absorb the restarted member's whole retried backlog",
        ),
        ("--on-saturated", "CMD", "run CMD once per saturation episode (page someone; never restart)"),
        (
            "--cooldown",
            "SECONDS",
            f"after a hook ran for an endpoint, wait this long before it may run again there "
            f"(default {_num(DEFAULT_COOLDOWN)})",
        ),
        (
            "--hook-timeout",
            "SECONDS",
            f"kill a hook still running after this long (default {_num(DEFAULT_HOOK_TIMEOUT)})",
        ),
    )
    for flag, metavar, meaning in valued:
        parser.add_argument(flag, metavar=metavar, action="append", help=meaning)
    parser.add_argument("--include-waiting", action="store_true", help="queued requests count as work")
    parser.add_argument("--once", action="store_true", help="poll twice, one interval apart, print and exit")
    parser.add_argument("--json", action="store_true", help="one JSON object per engine per poll")
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    return parser


def help_text() -> str:
    return _parser().format_help().rstrip("\n")


def _one(flag: str, values: list[str] | None) -> str | None:
    if values is None:
        return None
    if len(values) > 1:
        raise UsageError(f"{flag} given {len(values)} times")
    return values[0]


def _command(flag: str, text: str, environ: Mapping[str, str]) -> list[str]:
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{flag} cannot be split into words: {exc} (got {text!r})") from None
    if not argv:
        raise UsageError(f"{flag} must name a command (got {text!r})")
    # Checked now, with the PATH the hook will get: a typo found during an incident is found too late.
    if shutil.which(argv[0], path=environ.get("PATH", os.defpath)) is None:
        raise UsageError(f"{flag}: no executable {argv[0]!r} on PATH (got {text!r})")
    return argv


def configure(argv: Sequence[str], environ: Mapping[str, str]) -> WatchConfig | str:
    """Validate every flag and URL in one place: a WatchConfig, or "help"."""
    args = _parser().parse_intermixed_args(list(argv))
    if args.help:
        return "help"
    urls: list[str] = args.urls
    if not urls:
        raise UsageError("at least one URL is required")
    for url in urls:
        try:
            parse_url(url)
        except ValueError as exc:
            raise UsageError(f"URL {exc} (got {url!r})") from None
        if urls.count(url) > 1:
            raise UsageError(f"URL {url!r} given {urls.count(url)} times")

    def number(flag: str, default: float, zero_ok: bool = False) -> float:
        text = _one(flag, getattr(args, flag[2:].replace("-", "_")))
        if text is None:
            return default
        if not zero_ok:
            return _positive(flag, text)
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 <= value < float("inf"):
            raise UsageError(f"{flag} must be a number >= 0 (got {text!r})")
        return value

    engine = _one("--engine", args.engine) or "auto"
    if engine.lower() not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)} (got {engine!r})")
    hooks: dict[str, list[str]] = {}
    for flag in ("--on-stalled", "--on-saturated"):
        text = _one(flag, getattr(args, flag[2:].replace("-", "_")))
        if text is not None:
            hooks[flag] = _command(flag, text, environ)
    return WatchConfig(
        urls,
        interval=number("--interval", DEFAULT_INTERVAL),
        window=number("--window", DEFAULT_WINDOW),
        timeout=number("--timeout", DEFAULT_TIMEOUT),
        engine=engine.lower(),
        include_waiting=args.include_waiting,
        saturation=number("--saturation", DEFAULT_SATURATION),
        once=args.once,
        json=args.json,
        on_stalled=hooks.get("--on-stalled", ()),
        on_saturated=hooks.get("--on-saturated", ()),
        cooldown=number("--cooldown", DEFAULT_COOLDOWN, zero_ok=True),
        hook_timeout=number("--hook-timeout", DEFAULT_HOOK_TIMEOUT),
    )


# --- polling


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

    def to_json(self) -> dict[str, object]:
        return {
            "time": round(self.time, 3),
            "url": self.url,
            "engine": self.engine,
            "dialect": self.dialect,
            "verdict": self.verdict,
            "running": self.running,
            "waiting": self.waiting,
            "prompt_tokens_per_s": _round(self.prompt_rate),
            "generation_tokens_per_s": _round(self.generation_rate),
            "held_for": round(self.held_for, 3),
            "stalled_for": round(self.stalled_for, 3),
            "exit_code": self.code,
            "message": self.message,
            "error": self.error,
            "hook": self.hook or None,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class _Scrape:
    """One scrape and read of a page, in a thread of its own; `done` is set when it has an outcome."""

    def __init__(self, url: str, timeout: float, engine: str) -> None:
        self.started = time.monotonic()
        self.done = threading.Event()
        self.outcome: tuple[Dialect, dict[str, Sample]] | StallprobeError | None = None
        thread = threading.Thread(target=self._run, args=(url, timeout, engine), name=f"scrape {url}", daemon=True)
        thread.start()

    def _run(self, url: str, timeout: float, engine: str) -> None:
        # Anything a hostile page or host makes the library raise stays on this endpoint's row: one
        # endpoint must never take the view of the others down.
        try:
            try:
                page = fetch(url, timeout, MAX_PAGE_BYTES)
            except StallprobeError:
                raise
            except Exception as exc:  # e.g. UnicodeError from a host the IDNA codec refuses
                raise ScrapeError(f"scrape {url}: {exc}") from None
            now = time.monotonic()
            try:
                dialect = choose(page, engine)
                self.outcome = (dialect, read_engines(page, now, dialect))
            except StallprobeError:
                raise
            except Exception as exc:
                raise MetricsError(f"unreadable page: {exc}") from None
        except StallprobeError as exc:
            self.outcome = exc
        finally:
            self.done.set()


class _Endpoint:
    __slots__ = ("dialect", "pending", "states", "url")

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect: Dialect | None = None
        self.states: dict[str, State] | None = None  # the detector's history, in memory
        self.pending: _Scrape | None = None


class Watch:
    """The pool: each endpoint's history, how long each verdict has held, and the hooks."""

    def __init__(self, config: WatchConfig, environ: Mapping[str, str]) -> None:
        self.config = config
        self.endpoints = [_Endpoint(url) for url in config.urls]
        self.held: dict[tuple[str, str], tuple[str, float]] = {}
        commands = {_STALLED: config.on_stalled, _SATURATED: config.on_saturated}
        self.hooks = _Hooks(
            {kind: argv for kind, argv in commands.items() if argv}, config.cooldown, config.hook_timeout, environ
        )

    def poll(self) -> list[Row]:
        """Scrape every endpoint at once, judge each engine, run the hooks; the rows, in URL order."""
        for endpoint in self.endpoints:
            if endpoint.pending is None:
                endpoint.pending = _Scrape(endpoint.url, self.config.timeout, self.config.engine)
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
        self.hooks.observe(rows, now)
        return rows

    def _judge(self, endpoint: _Endpoint, now: float) -> list[Row]:
        scrape = endpoint.pending
        if scrape is None or not scrape.done.is_set():
            started = scrape.started if scrape else now
            return [
                _failure(
                    endpoint.url,
                    ScrapeError(
                        f"scrape {endpoint.url}: no answer within {_num(self.config.timeout)} s (--timeout); "
                        f"still waiting after {_secs(now - started)} s (is its host name resolving?)"
                    ),
                )
            ]
        endpoint.pending = None
        outcome = scrape.outcome
        if outcome is None or isinstance(outcome, StallprobeError):
            return [_failure(endpoint.url, outcome or ScrapeError(f"scrape {endpoint.url}: no outcome"))]
        dialect, samples = outcome
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
                endpoint.url, dialect, name, one, previous=previous, fresh=fresh, several=several, window=config.window
            )
            for name, one in result.engines.items()
        ]


def _failure(url: str, exc: StallprobeError) -> Row:
    unreachable = isinstance(exc, ScrapeError)
    verdict = _UNREACHABLE if unreachable else _ERROR
    text = str(exc)
    prefix = f"scrape {url}: "
    note = text[len(prefix) :] if text.startswith(prefix) else text
    code = ExitCode.SCRAPE if unreachable else ExitCode.METRICS
    return Row(url, "", verdict, int(code), f"{verdict}: {text}", error=text, note=note)


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
    message = describe(EnginesAssessment({name: one}), previous, fresh, window, precision)
    if one.verdict is Verdict.BASELINE:
        note = fresh or ("engine first seen" if one.reason == "no history" else one.reason)
    elif one.verdict is Verdict.SATURATED:
        note = "busy, not stuck: do not restart"
    elif one.verdict in (Verdict.SUSPECT, Verdict.STALLED):
        note = f"no token progress for {_secs(one.stalled_for)} s" + (f"; {precision}" if precision else "")
    else:
        note = ""
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
        note=note,
    )


# --- hooks


class _Run:
    """One run of a hook: started at a poll's time, its status None while it runs."""

    __slots__ = ("flag", "name", "pid", "spawned", "started", "status", "thread")

    def __init__(self, flag: str, name: str, started: float) -> None:
        self.flag = flag
        self.name = name  # the engine it ran for
        self.started = started
        self.pid: int | None = None
        self.status: str | None = None
        self.thread: threading.Thread | None = None
        self.spawned = threading.Event()  # set once it has a pid, or could not start

    def describe(self, now: float) -> str:
        who = f"{self.flag} (pid {self.pid})" if self.pid is not None else self.flag
        if self.status is None:
            return f"{who} running for {_duration(now - self.started)}"
        return f"{who} ran {_duration(now - self.started)} ago: {self.status}"


class _Hooks:
    """Which hook runs when: once per episode per engine, at most once per cooldown per endpoint."""

    def __init__(
        self, commands: Mapping[str, Sequence[str]], cooldown: float, timeout: float, environ: Mapping[str, str]
    ) -> None:
        self.commands = dict(commands)  # verdict -> argv
        self.cooldown = cooldown
        self.timeout = timeout
        self.environ = dict(environ)
        # (verdict, url, engine) -> whether this episode's run has started.
        self.episodes: dict[tuple[str, str, str], bool] = {}
        # (verdict, url) -> the latest run for that endpoint.
        self.runs: dict[tuple[str, str], _Run] = {}

    def observe(self, rows: Sequence[Row], now: float) -> None:
        seen = {(row.url, row.name) for row in rows if row.verdict in _DETECTOR_VERDICTS}
        read = {row.url for row in rows if row.verdict in _DETECTOR_VERDICTS}
        # An engine gone from a page that was read is forgotten, as the detector forgets it.
        for key in [k for k in self.episodes if k[1] in read and (k[1], k[2]) not in seen]:
            del self.episodes[key]
        for row in rows:
            notes = [note for kind in self.commands if (note := self._consider(kind, row, now))]
            row.hook = "; ".join(notes)

    def _consider(self, kind: str, row: Row, now: float) -> str:
        flag = dict(_HOOKS)[kind]
        episode = (kind, row.url, row.name)
        run = self.runs.get((kind, row.url))
        if row.verdict == kind and not self.episodes.setdefault(episode, False):
            if run is not None and run.status is None:
                return f"{flag} waits for its previous run (pid {run.pid}) to end"
            if run is not None and now - run.started < self.cooldown:
                return f"{flag} held by --cooldown, {_duration(self.cooldown - (now - run.started))} left"
            run = self.runs[(kind, row.url)] = self._start(kind, flag, row, now)
            self.episodes[episode] = True
        elif row.verdict != kind and row.verdict in _DETECTOR_VERDICTS:
            # Seen with another verdict by the detector: the episode is over. An endpoint that could not be
            # read says nothing about its engines, so it neither ends an episode nor starts one.
            self.episodes.pop(episode, None)
        if run is None or run.name != row.name:
            return ""
        return run.describe(now)

    def _start(self, kind: str, flag: str, row: Row, now: float) -> _Run:
        run = _Run(flag, row.name, now)
        env = dict(self.environ)
        env.update(
            STALLPROBE_URL=row.url,
            STALLPROBE_ENGINE=row.engine or "",
            STALLPROBE_VERDICT=kind,
            STALLPROBE_MESSAGE=row.message,
        )
        run.thread = threading.Thread(target=self._hook, args=(run, self.commands[kind], env), daemon=True)
        run.thread.start()
        # Starting a process takes milliseconds; waiting for it lets this poll's row name the pid.
        run.spawned.wait(_SPAWN_WAIT)
        return run

    def _hook(self, run: _Run, argv: Sequence[str], env: Mapping[str, str]) -> None:
        """One hook, start to end, in the background: started, waited for (bounded), reaped."""
        try:
            self._hook_run(run, argv, env)
        except Exception as exc:  # (no room for its output file, say): never leave a run "running" forever
            run.status = run.status or f"could not run: {exc}"
        finally:
            run.spawned.set()

    def _hook_run(self, run: _Run, argv: Sequence[str], env: Mapping[str, str]) -> None:
        import tempfile  # only when a hook runs

        with tempfile.TemporaryFile() as output:
            try:
                # Its own session: Ctrl-C on the watch does not reach it, and on a timeout its whole
                # process group (a shell and what it started) is killed together.
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                run.status = f"could not start: {exc.strerror or exc}"
                return
            run.pid = proc.pid
            run.spawned.set()
            try:
                code = proc.wait(self.timeout)
                status = (
                    "exited 0" if code == 0 else f"failed with exit {code}" if code > 0 else f"killed by signal {-code}"
                )
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                code = -1
                status = f"killed after {_num(self.timeout)} s (--hook-timeout)"
            if code != 0:
                # The last line of its output says why, as far as anything does.
                output.seek(max(0, output.seek(0, os.SEEK_END) - 4096))
                lines = output.read().decode("utf-8", "replace").strip().splitlines()
                if lines:
                    status += f": {lines[-1].strip()[:200]}"
            run.status = status

    def join(self, timeout: float) -> None:
        """Wait, at most `timeout` seconds in all, for the hooks still running."""
        deadline = time.monotonic() + timeout
        for run in self.runs.values():
            if run.thread is not None:
                run.thread.join(max(0.0, deadline - time.monotonic()))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the hook's process group, a grace, then SIGKILL to whatever of the group is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already
        try:
            proc.wait(_KILL_GRACE)
        except subprocess.TimeoutExpired:
            pass  # (after SIGKILL: a process stuck in the kernel; the reaper gives up on it)


# --- the view


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{_secs(max(0.0, seconds))} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


def _count(value: float | None) -> str:
    return "-" if value is None else _num(value)


# The verdict comes right after the endpoint, so that a narrow terminal cuts the numbers, never the verdict.
_HEADINGS = ("ENDPOINT", "ENGINE", "VERDICT", "HELD", "RUNNING", "WAITING", "PROMPT/S", "GEN/S", "NOTE")
_RIGHT = frozenset((3, 4, 5, 6, 7))


def _sum(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def endpoint_name(url: str) -> str:
    """The URL as the table shows it: without `http://`, and without the path when it is `/metrics`."""
    rest = url[len("http://") :] if url.lower().startswith("http://") else url
    return rest[: -len("/metrics")] if rest.endswith("/metrics") and rest.count("/") == 1 else rest


def table(rows: Sequence[Row], config: WatchConfig, width: int = 0, height: int = 0) -> list[str]:
    """The terminal view: a title, one row per engine and the pool's totals, cut to width x height if given
    (the size of the terminal it is redrawn on)."""
    cells = [
        [
            endpoint_name(row.url),
            row.engine if row.engine is not None else "-",
            row.verdict,
            _duration(row.held_for),
            _count(row.running),
            _count(row.waiting),
            _rate(row.prompt_rate),
            _rate(row.generation_rate),
            "; ".join(part for part in (row.note, row.hook) if part),
        ]
        for row in rows
    ]
    counts = {verdict: sum(row.verdict == verdict for row in rows) for verdict in _ORDER}
    cells.append(
        [
            "total",
            "",
            max((row.verdict for row in rows), key=_ORDER.index),
            "",
            _count(_sum([row.running for row in rows])),
            _count(_sum([row.waiting for row in rows])),
            _rate(_sum([row.prompt_rate for row in rows])),
            _rate(_sum([row.generation_rate for row in rows])),
            ", ".join(f"{counts[v]} {v}" for v in reversed(_ORDER) if counts[v]),
        ]
    )
    widths = [max(len(line[i]) for line in [list(_HEADINGS), *cells]) for i in range(len(_HEADINGS))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if i in _RIGHT else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(parts).rstrip()

    title = (
        f"stallprobe watch  {len(config.urls)} endpoints  every {_num(config.interval)} s  "
        f"window {_num(config.window)} s  {time.strftime('%H:%M:%S')}"
    ) + ("  Ctrl-C quits" if width else "")
    body = [line(values) for values in cells]
    room = height - 3  # the title, the headings, and the line the cursor rests on
    if height and len(body) > room:
        kept = max(0, room - 2)
        body = [*body[:kept], f"... {len(body) - 1 - kept} more rows: enlarge the terminal", body[-1]]
    lines = [title, line(_HEADINGS), *body]
    # One column short of the width: a full line leaves some terminals in a pending wrap.
    return [text[: max(1, width - 1)] for text in lines] if width else lines


def _line(row: Row) -> str:
    who = row.url if row.engine is None else f"{row.url} engine {row.engine}"
    text = f"{who}: {row.message}; held {_duration(row.held_for)}"
    return f"{text}; {row.hook}" if row.hook else text


class _Output:
    """Where the rows go: a table redrawn in place on a terminal, else one line (or object) per row."""

    def __init__(self, config: WatchConfig, stream: TextIO) -> None:
        self.config = config
        self.stream = stream
        self.terminal = not config.json and stream.isatty()
        self.live = self.terminal and not config.once  # redraw in place
        self.drawn = False

    def show(self, rows: Sequence[Row]) -> None:
        if self.terminal:
            size = shutil.get_terminal_size()
            # Cut to the terminal only when redrawing: a line that wraps would break the redraw.
            lines = table(rows, self.config, size.columns, size.lines) if self.live else table(rows, self.config)
            if self.live:
                # Home, each line then erase its rest, erase below: no flicker, no curses.
                start = "\x1b[?25l\x1b[H\x1b[2J" if not self.drawn else "\x1b[H"
                self.stream.write(start + "".join(f"{text}\x1b[K\n" for text in lines) + "\x1b[J")
            else:
                self.stream.write("".join(f"{text}\n" for text in lines))
        elif self.config.json:
            self.stream.write("".join(json.dumps(row.to_json()) + "\n" for row in rows))
        else:
            self.stream.write("".join(_line(row) + "\n" for row in rows))
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.live and self.drawn:
            self.stream.write("\x1b[?25h")  # the cursor back
            self.stream.flush()


def once_code(rows: Sequence[Row]) -> int:
    """1 when an engine is stalled, else the highest of the rows' codes (3 unreachable, 4 not a page)."""
    codes = {row.code for row in rows}
    return int(ExitCode.STALLED) if ExitCode.STALLED in codes else max(codes, default=0)


def _run(watch: Watch, output: _Output) -> int:
    interval = watch.config.interval
    if watch.config.once:
        started = time.monotonic()
        watch.poll()
        time.sleep(max(0.0, started + interval - time.monotonic()))
        rows = watch.poll()
        output.show(rows)
        watch.hooks.join(watch.config.hook_timeout + 2 * _KILL_GRACE + 1)
        return once_code(rows)
    next_at = time.monotonic()
    while True:
        output.show(watch.poll())
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.monotonic()  # a round overran: poll now, and do not try to catch up


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """`stallprobe watch ...`: the exit code. Runs until Ctrl-C or SIGTERM (exit 0) unless --once."""
    try:
        config = configure(argv, environ)
    except UsageError as exc:
        if "--json" in argv:
            print(json.dumps({"verdict": "error", "error": str(exc), "exit_code": int(ExitCode.USAGE)}))
        else:
            print(f"error: {exc}")
        return ExitCode.USAGE
    if isinstance(config, str):
        print(help_text())
        return ExitCode.OK
    watch = Watch(config, environ)
    output = _Output(config, sys.stdout)
    # SIGTERM (systemd stopping the watchdog) ends it as cleanly as Ctrl-C does.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
    try:
        return _run(watch, output)
    except KeyboardInterrupt:
        return _INTERRUPTED if config.once else ExitCode.OK
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and nothing to flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    finally:
        try:
            output.close()
        except OSError:
            pass
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
