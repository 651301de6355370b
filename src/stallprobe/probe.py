"""The probe: scrape, judge, remember, print one line, and return the exit code.

This is the kubelet's hot path: it runs every few seconds in every pod, so it imports only what a run
needs (tests/test_cost.py keeps the rest off it). The clock and the environment are read here, not in the
detector; errors are raised, and cli.main() turns them into their line and exit code.
"""

from __future__ import annotations

import time

from . import __version__
from .console import emit, show, tell
from .detector import assess_engines, readiness
from .errors import BadAnswer, ExitCode, MetricsError, StateFileError
from .options import PROBE
from .report import json_fields, look_line, ready_line, report_only_note, verdict_code
from .scrape import api_key
from .settings import LookSettings, parse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .detector import EnginesAssessment, Sample, State
    from .observe import Observation

__all__ = ["Config", "configure", "help_text", "main", "run"]

USAGE = """\
usage: stallprobe [--url URL] [--window S] [--timeout S] [--engine NAME] [--ready] [options]
       stallprobe doctor [--url URL] [--seconds S]  look at an engine and say how to probe it (see doctor --help)
       stallprobe watch URL [URL ...] [options]      watch a pool of engines (see watch --help)
       stallprobe inject [-f FILE] [options]        put the probe into Kubernetes manifests (see inject --help)"""


def help_text() -> str:
    description = (
        "Exec liveness probe for LLM inference engines (vLLM, SGLang, llama.cpp): fails only when an\n"
        "engine is busy (requests running, or waiting for capacity while nothing runs) and none of its\n"
        "progress signals moved for the window. With --ready, a readiness probe: not ready once busy with\n"
        "no progress for --drain-after, or paused, or its health route fails."
    )
    title = "each flag also reads its environment variable; the flag wins"
    from .helppage import help_page  # only for --help

    return help_page("probe", f"{USAGE}\n\n{description}", PROBE, environment=True, title=title)


class Config(LookSettings):
    """What one probe run needs to know, validated: the option table's PROBE selection, then the API key
    and the state file's path, which depend on the environment."""

    OPTIONS = PROBE

    url: str
    state_file: str
    ready: bool
    json: bool
    strict: bool
    report_only: bool


def configure(argv: Sequence[str], environ: Mapping[str, str]) -> Config | str:
    """Every flag and environment variable, validated: a Config, or "help"/"version"."""
    config = parse(argv, Config, environ=environ)
    if isinstance(config, str):
        return config
    config.key = api_key(config.api_key_file, environ)
    if config.state_file is None:
        from .statefile import default_path

        config.state_file = default_path(config.url, environ)
    return config


def _print(line: str) -> None:
    if not emit(line):
        # The verdict stands: the kubelet reads the exit code, and a closed stdout says nothing of the engine.
        tell(f"stallprobe: stdout is closed; the line was: {line}")


def run(config: Config) -> int:
    """One probe run: the exit code (OK or STALLED; with --ready, OK or not ready). Every failure is a
    StallprobeError.

    Never worse than the health check it replaces: when the engine's server answers but the probe cannot
    judge it (not a metrics page, a required metric missing, an HTTP error from /metrics, a key it lacks,
    a state file it cannot write), the engine's own health route decides, as an httpGet probe of it would:
    2xx is exit 0 with a line that says the probe could not judge and why; anything else is the error's
    own failure. A server that does not answer at all stays a failure, and a page silent for the window
    stays stalled. --strict fails at once instead.
    """
    try:
        return _judge(config)
    except (BadAnswer, MetricsError, StateFileError) as exc:
        if config.strict:
            raise
        return _unjudged(config, exc)


def _unjudged(config: Config, blind: BadAnswer | MetricsError | StateFileError) -> int:
    """The fallback: the engine's health route, asked once; exit 0 when it answers 2xx, else `blind`
    raised again with the health route's answer."""
    from .engines import health_route
    from .observe import health, origin
    from .report import unjudged_line

    route = health_route(config.engine)
    url = origin(config.url) + route
    why = health(url, config, missing_ok=False)
    if why:
        raise type(blind)(f"{blind}; and {why}") from None
    line = unjudged_line(str(blind), route)
    if config.ready:
        line = f"ready: {line}"
    if config.json:
        import json

        fields = {"verdict": "unjudged", "error": str(blind), "message": line, "exit_code": int(ExitCode.OK)}
        if config.ready:
            fields["ready"] = True
        line = json.dumps(fields, sort_keys=True)
    _print(line)
    return ExitCode.OK


def _judge(config: Config) -> int:
    """Look, judge against the state file, save, and report: the exit code."""
    from .observe import observe
    from .statefile import load, read_boot_id

    boot_id = read_boot_id()
    facts: dict[str, float] = {}
    previous, why = load(config.state_file, boot_id, facts)
    # CLOCK_MONOTONIC is one clock for every process since boot: a wall-clock step cannot fake a
    # stall, and the boot id in the state file catches the one case where it restarts.
    seen = observe(config.url, config, previous, facts, time.monotonic, readiness=config.ready)
    result, previous = _save(config, boot_id, previous, seen.samples, facts=facts)
    return _report(config, result, previous=previous, why=why, seen=seen)


def _save(
    config: Config,
    boot_id: str,
    previous: dict[str, State] | None,
    samples: dict[str, Sample],
    *,
    facts: dict[str, float],
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
                return _assess(config, previous, samples), previous  # theirs is newer: keep it
            if all(name not in current or sample.t >= current[name].last.t for name, sample in samples.items()):
                previous = current  # judged against the fresher history (never a clock going back)
            for key, value in theirs.items():
                facts[key] = max(value, facts.get(key, value))
        result = _assess(config, previous, samples)
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


def _assess(config: Config, previous: dict[str, State] | None, samples: dict[str, Sample]) -> EnginesAssessment:
    return assess_engines(previous, samples, config.window, config.saturation, include_waiting=config.include_waiting)


def _report(
    config: Config,
    result: EnginesAssessment,
    *,
    previous: dict[str, State] | None,
    why: str,
    seen: Observation,
) -> int:
    """Print the run's one line (or JSON object); its exit code.

    With --ready, the readiness rule (detector.readiness): ready when the health route answers 2xx and
    no engine is paused, or busy with no progress (or silent) for --drain-after; the line tells the step
    as judged for routing, under the drain window.
    """
    window = config.window
    if config.ready:
        ready, result = readiness(result, config.drain_after, healthy=not seen.health)
        window = config.drain_after
        code = ExitCode.OK if ready else ExitCode.STALLED
        line = ready_line(
            result, previous, why, window, seen.dialect,
            ready=ready, health=seen.health, unanswered=seen.unanswered, note=seen.note,
        )  # fmt: skip
    else:
        code = verdict_code(result.verdict)
        line = look_line(result, previous, why, window, seen.dialect, unanswered=seen.unanswered, note=seen.note)
    if config.report_only and code != ExitCode.OK:
        line = f"{line}; {report_only_note(code)}"
    if config.json:
        import json  # only on this path: json pulls in re, which the plain line does not need

        dialect = seen.dialect.name if seen.dialect else None
        fields = json_fields(result, seen.samples if not seen.unanswered else {}, dialect, window, line)
        if config.ready:
            fields["ready"] = code == ExitCode.OK
        line = json.dumps(fields, sort_keys=True)
    _print(line)
    return ExitCode.OK if config.report_only else code


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """`stallprobe [options]`: run the probe once (or print help or the version); the exit code."""
    config = configure(argv, environ)
    if isinstance(config, str):
        return show(help_text() if config == "help" else f"stallprobe {__version__}")
    assert isinstance(config, Config)
    return run(config)
