"""The probe: scrape, judge, remember, print one line, and return the exit code.

This is the kubelet's hot path: it runs every few seconds in every pod, so it imports only what a run
needs (tests/test_cost.py keeps the rest off it). The clock and the environment are read here, not in the
detector; errors are raised, and cli.main() turns them into their line and exit code.
"""

from __future__ import annotations

import sys
import time

from . import __version__
from .detector import Sample, Verdict, assess_engines
from .errors import EXIT_MEANINGS, ExitCode, ScrapeTimeout
from .options import PROBE, api_key, dialect_names, help_lines, parse
from .report import describe, json_fields

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .detector import EnginesAssessment, State
    from .engines import Dialect
    from .options import Values

__all__ = ["Config", "configure", "help_text", "main", "run"]

USAGE = """\
usage: stallprobe [--url URL] [--window S] [--timeout S] [--engine NAME] [options]
       stallprobe watch URL [URL ...] [options]  watch a pool of engines (see watch --help)
       stallprobe inject [-f FILE] [options]    put the probe into Kubernetes manifests (see inject --help)"""


def help_text() -> str:
    lines = [
        USAGE,
        "",
        "Exec liveness probe for LLM inference engines (vLLM, SGLang, llama.cpp): fails only when an",
        "engine is busy (requests running) and none of its progress signals moved for the window.",
        "",
        "options (each flag also reads its environment variable; the flag wins):",
        *help_lines(PROBE),
        f"  {'--version':27} {'':29} print the version and exit",
        "",
        "exit codes:",
        *(f"  {code}  {meaning}" for code, meaning in EXIT_MEANINGS.items()),
    ]
    return "\n".join(lines)


class Config:
    """What one probe run needs to know, validated."""

    __slots__ = (
        "canary",
        "canary_interval",
        "drain_after",
        "engine",
        "include_waiting",
        "json",
        "key",
        "names",
        "progress",
        "ready",
        "saturation",
        "server_load",
        "state_file",
        "timeout",
        "url",
        "window",
    )

    def __init__(self, values: Values, environ: Mapping[str, str]) -> None:
        self.url = values.text("url") or ""
        self.window = values.number("window")
        self.timeout = values.number("timeout")
        self.saturation = values.number("saturation")
        self.engine = values.text("engine") or "auto"
        self.include_waiting = values.flag("include_waiting")
        self.progress = values.words("progress_metric")
        self.names = dialect_names(values)
        self.json = values.flag("json")
        self.canary = values.flag("canary")
        self.canary_interval = values.number("canary_interval")
        self.server_load = values.flag("server_load")
        self.ready = values.flag("ready")
        self.drain_after = values.number("drain_after")
        self.key = api_key(values, environ)
        state_file = values.text("state_file")
        if state_file is None:
            from .statefile import default_path

            state_file = default_path(self.url, environ)
        self.state_file = state_file


def configure(argv: Sequence[str], environ: Mapping[str, str]) -> Config | str:
    """Every flag and environment variable, validated: a Config, or "help"/"version"."""
    values = parse(argv, PROBE, environ=environ)
    return values if isinstance(values, str) else Config(values, environ)


def _print(line: str) -> None:
    print(line)
    sys.stdout.flush()


def run(config: Config) -> int:
    """One probe run: the exit code (OK or STALLED; with --ready, OK or not ready). Every failure is a
    StallprobeError."""
    from .engines import choose, read_engines
    from .scrape import fetch
    from .statefile import load, read_boot_id

    # Readiness judges the same history as liveness (one state file), under its shorter window: the
    # detector's state does not depend on the window, only its verdict does.
    window = config.drain_after if config.ready else config.window
    boot_id = read_boot_id()
    facts: dict[str, float] = {}
    previous, why = load(config.state_file, boot_id, facts)
    try:
        page = fetch(config.url, config.timeout, key=config.key)
    except ScrapeTimeout as exc:
        # A slow answer is not a wedge: no sample, and the stall clock runs from the last answer.
        now = time.monotonic()
        silent = {name: Sample(0, 0, 0, now, answered=False) for name in (list(previous) if previous else [""])}
        result, previous = _save(config, boot_id, previous, silent, facts=facts, window=window)
        return _report(config, result, previous=previous, why=why, samples={}, dialect=None, silence=str(exc))
    # CLOCK_MONOTONIC is one clock for every process since boot: a wall-clock step cannot fake a
    # stall, and the boot id in the state file catches the one case where it restarts.
    now = time.monotonic()
    dialect = choose(page, config.engine, config.names)
    samples = read_engines(page, now, dialect, config.progress)
    note = ""
    if config.canary or config.server_load:
        from .api import ask_idle, origin

        samples, note = ask_idle(
            samples, previous, config, base=origin(config.url), dialect=dialect, facts=facts, now=now
        )
    result = assess_engines(previous, samples, window, config.saturation, include_waiting=config.include_waiting)
    if result.verdict in (Verdict.SUSPECT, Verdict.STALLED) and dialect.pause_route:
        # Asked only now, so a healthy run costs nothing more; no answer is never "paused".
        from .api import ask_paused, origin

        samples = ask_paused(samples, origin(config.url), dialect.pause_route, config.key) or samples
    result, previous = _save(config, boot_id, previous, samples, facts=facts, window=window)
    return _report(config, result, previous=previous, why=why, samples=samples, dialect=dialect, note=note)


def _save(
    config: Config,
    boot_id: str,
    previous: dict[str, State] | None,
    samples: dict[str, Sample],
    *,
    facts: dict[str, float],
    window: float,
) -> tuple[EnginesAssessment, dict[str, State] | None]:
    """Judge `samples` and save the next state, under the state file's lock; the assessment and the
    history it was judged against.

    Liveness and readiness share the file and may run at once. If the other one saved since this run
    read the file, this run's samples are judged against what it saved, so neither resets the other's
    stall clock; and if the other's sample is the newer, this run saves nothing, so no newer sample is
    ever replaced by an older one (the counters only go up: the newer one tells all the older did).
    """
    from .statefile import Locked, load, save

    with Locked(config.state_file):
        theirs: dict[str, float] = {}
        current, _ = load(config.state_file, boot_id, theirs)
        if current is not None and current != previous:
            if not _supersedes(samples, current):
                return _assess(config, previous, samples, window), previous  # theirs is newer: keep it
            if all(name not in current or sample.t >= current[name].last.t for name, sample in samples.items()):
                previous = current  # judged against the fresher history (never a clock going back)
            for key, value in theirs.items():
                facts[key] = max(value, facts.get(key, value))
        result = _assess(config, previous, samples, window)
        save(config.state_file, result.states, boot_id, facts)
    return result, previous


def _supersedes(samples: dict[str, Sample], current: dict[str, State]) -> bool:
    """Whether this run's samples are newer than what another run just saved: no counter lower, and
    either a counter higher or a time no earlier. (Two runs at once can finish their scrapes in either
    order; the counters, which only go up, tell which page was served last.)"""
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


def _assess(
    config: Config, previous: dict[str, State] | None, samples: dict[str, Sample], window: float
) -> EnginesAssessment:
    return assess_engines(previous, samples, window, config.saturation, include_waiting=config.include_waiting)


def _report(
    config: Config,
    result: EnginesAssessment,
    *,
    previous: dict[str, State] | None,
    why: str,
    samples: dict[str, Sample],
    dialect: Dialect | None,
    silence: str = "",
    note: str = "",
) -> int:
    """Print the run's one line (or JSON object); its exit code.

    With --ready: ready when serving (the engine's own health route answers 2xx) and not stuck (neither
    stalled nor paused under --drain-after). A saturated engine stays ready: it is working, and taking it
    out would push its load onto the others.
    """
    from .engines import precision_note

    window = config.drain_after if config.ready else config.window
    precision = ""
    if dialect is not None and result.verdict in (Verdict.SUSPECT, Verdict.STALLED):
        precision = precision_note(dialect, result.engines[result.worst].state.last)
    line = describe(result, previous, why, window, precision, silence=silence, note=note)
    code = ExitCode.STALLED if result.verdict is Verdict.STALLED else ExitCode.OK
    if config.ready:
        problem = ""
        if result.verdict in (Verdict.STALLED, Verdict.PAUSED):
            problem = line
        elif dialect is not None:
            problem = _unhealthy(config, dialect)
        line, code = (f"not ready: {problem}", ExitCode.STALLED) if problem else (f"ready: {line}", ExitCode.OK)
    if config.json:
        import json  # only on this path: json pulls in re, which the plain line does not need

        fields = json_fields(result, samples, dialect.name if dialect else None, window, line)
        if config.ready:
            fields["ready"] = code == ExitCode.OK
        line = json.dumps(fields, sort_keys=True)
    _print(line)
    return code


def _unhealthy(config: Config, dialect: Dialect) -> str:
    """Why the engine's own health route says it does not serve ("" when it answers 2xx)."""
    from .api import origin
    from .errors import ScrapeError
    from .scrape import exchange, status_error

    url = origin(config.url) + dialect.health_route
    try:
        answer = exchange(url, config.timeout, key=config.key, what="health")
    except ScrapeError as exc:
        return str(exc)
    return "" if 200 <= answer.code < 300 else status_error(f"health {url}", answer)


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """`stallprobe [options]`: run the probe once (or print help or the version); the exit code."""
    config = configure(argv, environ)
    if config == "help":
        _print(help_text())
        return ExitCode.OK
    if config == "version":
        _print(f"stallprobe {__version__}")
        return ExitCode.OK
    assert isinstance(config, Config)
    return run(config)
