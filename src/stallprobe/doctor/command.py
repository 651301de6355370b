"""`stallprobe doctor`, the command: its configuration, the report's lines as they come, and main().

run() makes the first contact (first.py), looks (looks.py), says the topics and the summary (words.py)
and the probes inject would write (probes.py). The clock and the pause between looks are parameters,
time.monotonic and time.sleep by default, so tests move a clock of their own instead of waiting.
"""

from __future__ import annotations

import time

from ..buildinfo import version_line
from ..console import emit, tell
from ..credentials import api_key, key_source
from ..errors import ExitCode, OutputError
from ..helppage import help_page
from ..options import DOCTOR
from ..report import drain_warning, secs, verdict_code
from ..settings import LookSettings, parse
from ..stanza import PYZ_DIR
from .first import first_contact
from .looks import intervals, look
from .probes import inject_command, plan, probe_args, probes, window, yaml_lines
from .words import rollout, summary, topics, unreadable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ..engines import Dialect
    from .first import First
    from .looks import Looks

__all__ = ["DoctorConfig", "configure", "help_text", "main", "run"]

USAGE = "usage: stallprobe doctor [--url URL] [--seconds S] [--timeout S] [--api-key-file PATH] [options]"

DESCRIPTION = """\
Before adopting the probe: read the engine for a while (one look a second) and say, one topic a line,
what was found and what to do: the engine and how many share its page, its progress signals and which
moved, which waiting requests count as owed work, whether an API key is needed, which of its routes
answer (pause, load, health), the verdicts the probe would have given and its readiness, the probes
`stallprobe inject` would write for this engine, and what the probe would do now. It keeps no state
file: the looks are judged in memory, with every look option the probe takes."""

# Each topic's label, then its text wrapped to the width (but a probe's line, which is never broken).
LABEL_WIDTH = 12
WIDTH = 104


def help_text() -> str:
    title = "each flag also reads the probe's environment variable; the flag wins"
    return help_page("doctor", f"{USAGE}\n\n{DESCRIPTION}", DOCTOR, environment=True, title=title)


class DoctorConfig(LookSettings):
    """What the doctor needs: the option table's DOCTOR selection (every look option of the probe, and
    its readiness rule's drain window), then the API key and where it came from."""

    OPTIONS = DOCTOR

    url: str
    seconds: float
    # Where the key came from: "--api-key-file", VLLM_API_KEY or LLAMA_API_KEY; "" for no key.
    key_from = ""


def configure(argv: Sequence[str], environ: Mapping[str, str]) -> DoctorConfig | str:
    """Every flag and environment variable, validated: a DoctorConfig, or "help"/"version"."""
    config = parse(argv, DoctorConfig, environ=environ)
    if isinstance(config, str):
        return config
    config.key = api_key(config.api_key_file, environ)
    config.key_from = key_source(config.api_key_file, environ)
    return config


class _Out:
    """The report's lines, written as they come. OutputError when stdout takes one no more (`| head -1`):
    the report cannot be whole, and nothing more is asked of the engine."""

    def say(self, label: str, text: str) -> None:
        """One topic: its label, then its text wrapped to the width, each line after the first indented."""
        import textwrap  # off the probe's path: textwrap loads re

        width = WIDTH - LABEL_WIDTH
        lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
        head = f"{label}:" if label else ""
        self.line(f"{head:<{LABEL_WIDTH}}{lines[0]}")
        for line in lines[1:]:
            self.line(f"{'':<{LABEL_WIDTH}}{line}")

    def line(self, text: str) -> None:
        if not emit(text.rstrip()):
            raise OutputError("stdout was closed before the report was whole")


def run(
    config: DoctorConfig,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Look, then report; the exit code. What the engine gets wrong is reported here, not raised; a
    stdout that takes no more raises OutputError."""
    out = _Out()
    count = intervals(config.seconds)
    out.line(f"stallprobe doctor: reading {config.url} for {secs(config.seconds)} s, {count + 1} looks")
    warning = drain_warning(config.drain_after, config.window)  # its readiness is judged with both
    if warning:
        tell(f"stallprobe doctor: {warning}")
    first = first_contact(config.url, config, config.key_from, clock)
    if first.code != ExitCode.OK or first.seen is None or first.seen.dialect is None:
        for label, text in first.lines:
            out.say(label, text)
        if first.code in (ExitCode.SCRAPE, ExitCode.METRICS):
            out.say(
                "in short",
                unreadable(first.code, config.window, config.timeout, silent=first.silent, answered=first.answered),
            )
        return first.code
    looks = look(config.url, config, config.seconds, first, clock=clock, sleep=sleep)
    if not looks.all:  # Ctrl-C before the first look was judged
        raise KeyboardInterrupt
    return _report(config, first, first.seen.dialect, looks, out)


def _report(config: DoctorConfig, first: First, dialect: Dialect, looks: Looks, out: _Out) -> int:
    lines, server_load = topics(config, first, dialect, looks, window(config, dialect))
    code: int = ExitCode.OK
    if looks.interrupted:
        lines.append(("stopped", f"interrupted after {len(looks.all)} looks"))
    if looks.error is not None:
        lines.append(("stopped", f"at look {len(looks.all) + 1}: {looks.error}"))
        code = looks.error.exit_code
    else:  # the first look answered (first contact): the last look's verdict, told or silent
        code = verdict_code(looks.all[-1].result.verdict)
    for label, text in lines:
        out.say(label, text)
    args = probe_args(config, key_needed=first.key_needed, server_load=server_load)
    stanza_plan = plan(config, args, dialect)
    out.say(
        "probes",
        f"as `stallprobe inject` writes them into the engine's container (the probe itself in the ConfigMap "
        f"it adds, mounted at {PYZ_DIR}; a startupProbe only where nothing guards the model's loading):",
    )
    for line in yaml_lines(probes(config.url, dialect, stanza_plan), LABEL_WIDTH + 2):
        out.line(line)
    if first.key_needed and config.api_key_file:
        out.say("", "Mount the key file at that path in the container.")
    elif first.key_needed:
        out.say("", f"The probe reads {config.key_from} in the engine's container, as the engine does.")
    import shlex

    command = inject_command(config, args, engine_needed=first.engine_needed, engine=dialect.name)
    out.line(f"{'inject:':<{LABEL_WIDTH}}{shlex.join(command)} | kubectl apply -f -")
    if code in (ExitCode.OK, ExitCode.STALLED):
        out.say("in short", summary(config, looks.all[-1], stanza_plan))
    else:
        out.say("in short", unreadable(code, stanza_plan.window, config.timeout))
    for index, line in enumerate(rollout()):
        out.line(f"{'rollout:' if index == 0 else '':<{LABEL_WIDTH}}{line}")
    return code


def main(
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """`stallprobe doctor [options]`: look, then report (or print help or the version); the exit code."""
    config = configure(argv, environ)
    if isinstance(config, str):
        _Out().line(help_text() if config == "help" else version_line())
        return ExitCode.OK
    try:
        return run(config, clock, sleep)
    except KeyboardInterrupt:  # at the first contact or among the last questions (the looks keep what they saw)
        tell("stallprobe doctor: interrupted")
        return ExitCode.INTERRUPTED
