"""The probe: look, judge, remember, print one line, leave a trace, and return the exit code.

This is the kubelet's hot path: it runs every few seconds in every pod, so it imports only what a run
needs (tests/test_cost.py keeps the rest off it). The clock and the environment are read here, not in the
judge; errors are raised, and cli.main() turns them into their line and exit code.
"""

from __future__ import annotations

import time

from .console import emit, show, tell
from .errors import BadAnswer, BugError, ExitCode, MetricsError, StallprobeError, StateFileError, UsageError
from .evidence import evidence
from .judge import LIVENESS, READINESS, Memory, Rules, judge, report_only_code, said
from .options import PROBE
from .report import json_fields, report_only_note
from .settings import LookSettings, parse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .judge import Judgment, Observation

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
    """What one probe run needs to know, validated: the option table's PROBE selection, then what depends
    on the environment: the API key, the URL's host when it names a variable, the state file's path, and
    whether this run is report-only (a liveness run, by flag, variable or the kill switch's file)."""

    OPTIONS = PROBE

    url: str
    state_file: str
    ready: bool
    json: bool
    strict: bool
    report_only: bool
    report_only_file: str | None
    api_key_env: str | None
    transition_log: str
    termination_log: str | None
    argv: tuple[str, ...] = ()  # the command line, as the evidence of a failing run quotes it
    started: float = 0.0  # when the run started (time.monotonic): what is left of its budget


def configure(argv: Sequence[str], environ: Mapping[str, str]) -> Config | str:
    """Every flag and environment variable, validated: a Config, or "help"/"version". UsageError carries
    what was read (its `settings`), so that the CLI tells it as the run was asked (--json, --report-only)."""
    config = parse(argv, Config, environ=environ)
    if isinstance(config, str):
        return config
    config.argv = tuple(argv)
    try:
        from .credentials import api_key
        from .readers import expand_url

        config.key = api_key(config.api_key_file, environ, config.api_key_env)
        given = config.url
        config.url = expand_url("--url", given, environ)
        if config.state_file is None:
            from .statefile import default_path

            config.state_file = default_path(given, environ)
    except UsageError as exc:
        exc.settings = config
        raise
    # Report-only holds a restart back; a readiness run only moves traffic, and keeps draining a dead or
    # stuck engine whatever the switch says (the kill switch is for restarts, not for routing).
    if config.ready:
        config.report_only = False
    elif not config.report_only and config.report_only_file is not None:
        from .killswitch import switched_on

        config.report_only = switched_on(config.report_only_file)
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
    stays stalled. --strict fails at once instead (but not under --report-only, which asks the route).
    """
    try:
        try:
            return _judge(config)
        except (BadAnswer, MetricsError, StateFileError) as exc:
            if config.strict and not config.report_only:
                raise
            return _unjudged(config, exc)
    except StallprobeError as exc:
        line = f"error: {' '.join(str(exc).splitlines())}"
        _trace(config, "not ready" if config.ready else "error", line, exc.exit_code)
        raise


def _unjudged(config: Config, blind: BadAnswer | MetricsError | StateFileError) -> int:
    """The fallback: the engine's health route, asked once; exit 0 when it answers 2xx, else `blind`
    raised again with the health route's answer. A route that gives no answer is excused where a page
    that gives none would be: under --report-only, and for readiness until --drain-after."""
    from .engines import health_route
    from .observe import health
    from .report import unjudged_line
    from .urls import origin

    route = health_route(config.engine)
    why, quiet = health(origin(config.url) + route, config, missing_ok=False)
    note = ""
    if quiet and config.ready:
        why, note = _quiet_health(config, quiet)
    elif quiet and not config.report_only:
        why = quiet
    if why:
        raise type(blind)(f"{blind}; and {why}") from None
    line = unjudged_line(str(blind), route) + (f"; {note or quiet}" if quiet else "")
    if config.ready:
        line = f"ready: {line}"
    _trace(config, "ready" if config.ready else "unjudged", line, ExitCode.OK)
    if config.json:
        import json

        fields = {"verdict": "unjudged", "error": str(blind), "message": line, "exit_code": int(ExitCode.OK)}
        if config.ready:
            fields["ready"] = True
        line = json.dumps(fields, sort_keys=True)
    _print(line)
    return ExitCode.OK


def _quiet_health(config: Config, quiet: str) -> tuple[str, str]:
    """A readiness run whose health route gave no answer: excused until it has lasted --drain-after
    (judge.serving, its clock in the state file). Why the engine is not ready ("" when excused), and the
    note of an excused silence."""
    from .judge import serving
    from .statefile import Locked, load, read_boot_id, save

    boot_id = read_boot_id()
    with Locked(config.state_file):
        memory, _ = load(config.state_file, boot_id)
        facts = dict(memory.facts)
        serves, why, note = serving("", quiet, time.monotonic(), facts, config.drain_after)
        if facts != memory.facts:
            save(config.state_file, _with(memory, facts=facts), boot_id)
    return ("" if serves else why), note


def _with(memory: Memory, *, facts: dict[str, float] | None = None, said: dict[str, str] | None = None) -> Memory:
    return Memory(
        memory.states,
        dialect=memory.dialect,
        facts=memory.facts if facts is None else facts,
        said=memory.said if said is None else said,
    )


def _trace(config: Config, klass: str, line: str, code: int) -> None:
    """What a run that judged nothing (unjudged, or ended in an error) leaves behind: its line on the
    container's log when this kind of run's class changed to `klass`, and (a failing liveness run) the
    evidence in the termination message file; remembered in the state file, when it can be used."""
    from .statefile import Locked, load, read_boot_id, save

    kind = READINESS if config.ready else LIVENESS
    try:
        boot_id = read_boot_id()
        with Locked(config.state_file):
            memory, _ = load(config.state_file, boot_id)
            change, after = said(memory, kind, klass, line)
            after = _evidence(config, after, code, line, None)
            if change:
                _tell(config, change)
            if after != memory:
                save(config.state_file, after, boot_id)
    except StateFileError:
        pass  # the state folder cannot be used: nothing is remembered, and nothing said twice is worse


def _tell(config: Config, change: str) -> None:
    if config.transition_log != "none":
        from .trace import tell_log

        tell_log(config.transition_log, change)


# The fact that remembers the termination message file holds the probe's evidence, so that a passing run
# reads the file (and clears it) only then.
EVIDENCE = "evidence_written"


def _evidence(config: Config, memory: Memory, code: int, line: str, judgment: Judgment | None) -> Memory:
    """A failing liveness run writes its evidence for the kubelet; a passing one clears what an earlier
    one wrote, so that an engine that later exits on its own is not blamed on a stale stall. The memory,
    with whether the file now holds the evidence."""
    if config.ready or config.termination_log is None:
        return memory
    from .trace import clear_evidence, write_evidence

    written = EVIDENCE in memory.facts
    if code != ExitCode.OK:
        if write_evidence(config.termination_log, evidence(line, code, memory, judgment, config.argv)):
            written = True
    elif written and clear_evidence(config.termination_log):
        written = False
    if written == (EVIDENCE in memory.facts):
        return memory
    facts = {key: value for key, value in memory.facts.items() if key != EVIDENCE}
    return _with(memory, facts={**facts, EVIDENCE: 1.0} if written else facts)


def _judge(config: Config) -> int:
    """Look, judge against the state file, save, and report: the exit code."""
    from .observe import observe
    from .statefile import load, read_boot_id

    boot_id = read_boot_id()
    before, why = load(config.state_file, boot_id)
    # CLOCK_MONOTONIC is one clock for every process since boot: a wall-clock step cannot fake a
    # stall, and the boot id in the state file catches the one case where it restarts.
    seen = observe(config.url, config, before, time.monotonic, readiness=config.ready)
    judgment = _save(config, boot_id, before, seen, why)
    code, line = judgment.code, judgment.line
    if config.report_only and code != ExitCode.OK:
        code, line = _excused(config, code, line)
    if judgment.change:
        _tell(config, judgment.change)
    if config.termination_log is not None and not config.ready:
        after = _evidence(config, judgment.memory, code, line, judgment)
        if after != judgment.memory:
            _remember(config, boot_id, after)
    _print(_shown(config, judgment, line))
    return code


def _save(config: Config, boot_id: str, before: Memory, seen: Observation, why: str) -> Judgment:
    """Judge what the look saw and save what is to be remembered, under the state file's lock: liveness
    and readiness share the file and may run at once (judge.merge says how their memories merge)."""
    from .judge import merge
    from .statefile import Locked, load, save

    with Locked(config.state_file):
        theirs, _ = load(config.state_file, boot_id)
        memory, keep = merge(before, theirs, seen.samples)
        judgment = judge(Rules.of(config), memory, seen, ready=config.ready, first=why)
        kept = judgment.memory
        if not keep:  # theirs is newer: keep their samples, and remember only what this run said
            kind = READINESS if config.ready else LIVENESS
            kept = _with(theirs, said={**theirs.said, kind: kept.said[kind]})
        if kept != theirs:
            save(config.state_file, kept, boot_id)
    return judgment


def _remember(config: Config, boot_id: str, memory: Memory) -> None:
    """Save whether the termination message file holds the evidence (after the run judged and saved)."""
    from .statefile import Locked, load, save

    try:
        with Locked(config.state_file):
            now, _ = load(config.state_file, boot_id)
            save(
                config.state_file,
                _with(
                    now,
                    facts={**now.facts, **memory.facts}
                    if EVIDENCE in memory.facts
                    else {k: v for k, v in now.facts.items() if k != EVIDENCE},
                ),
                boot_id,
            )
    except StateFileError:
        pass


def _shown(config: Config, judgment: Judgment, line: str) -> str:
    """The run's line, or its JSON object (--json)."""
    if not config.json:
        return line
    import json  # only on this path: json pulls in re, which the plain line does not need

    seen = judgment.seen
    dialect = seen.dialect.name if seen.dialect else None
    window = config.drain_after if config.ready else config.window
    result = judgment.routing if config.ready else judgment.result
    fields = json_fields(result, seen.samples if not seen.unanswered else {}, dialect, window, line)
    if config.ready:
        fields["ready"] = judgment.ready
    return json.dumps(fields, sort_keys=True)


def _excused(config: Config, code: int, line: str) -> tuple[int, str]:
    """A liveness run under --report-only that would fail: its own verdict is excused, never what an
    httpGet of the health route would fail on (asked now, within what is left of the run's budget)."""
    from .engines import health_route
    from .observe import budget, health
    from .urls import origin

    left = max(0.5, budget(config) - (time.monotonic() - config.started))
    route = origin(config.url) + health_route(config.engine)
    why, quiet = health(route, config, missing_ok=False, timeout=min(left, config.timeout))
    final = report_only_code(code, why)
    if final != ExitCode.OK:
        return final, f"{line}; report-only, but {why}"
    return final, f"{line}; {report_only_note(code)}" + (f" ({quiet})" if quiet else "")


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """`stallprobe [options]`: run the probe once (or print help or the version); the exit code. Every
    error carries the run's configuration (`settings`); anything unexpected is a BugError."""
    started = time.monotonic()
    config = configure(argv, environ)
    if isinstance(config, str):
        if config == "help":
            return show(help_text())
        from .buildinfo import version_line

        return show(version_line())
    assert isinstance(config, Config)
    config.started = started
    try:
        return run(config)
    except StallprobeError as exc:
        exc.settings = config
        raise
    except Exception as exc:  # a bug of ours: one line and exit 2, never a traceback, never exit 1
        bug = BugError(exc)
        bug.settings = config
        raise bug from exc
