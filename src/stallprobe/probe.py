"""The probe: scrape, judge, remember, print one line, and return the exit code.

This is the kubelet's hot path: it runs every few seconds in every pod, so it imports only what a run
needs (tests/test_cost.py keeps the rest off it). The clock and the environment are read here, not in the
detector; errors are raised, and cli.main() turns them into their line and exit code.
"""

from __future__ import annotations

import sys
import time

from . import __version__
from .detector import Verdict, assess_engines
from .errors import EXIT_MEANINGS, ExitCode
from .options import PROBE, dialect_names, help_lines, parse
from .report import describe, json_fields

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

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
        "engine",
        "include_waiting",
        "json",
        "names",
        "progress",
        "saturation",
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
    """One probe run: the exit code, OK or STALLED. Every failure is a StallprobeError."""
    from .engines import choose, precision_note, read_engines
    from .scrape import fetch
    from .statefile import load, read_boot_id, save

    boot_id = read_boot_id()
    previous, why = load(config.state_file, boot_id)
    page = fetch(config.url, config.timeout)
    # CLOCK_MONOTONIC is one clock for every process since boot: a wall-clock step cannot fake a
    # stall, and the boot id in the state file catches the one case where it restarts.
    now = time.monotonic()
    dialect = choose(page, config.engine, config.names)
    samples = read_engines(page, now, dialect, config.progress)
    result = assess_engines(previous, samples, config.window, config.saturation, include_waiting=config.include_waiting)
    save(config.state_file, result.states, boot_id)
    precision = ""
    if result.verdict in (Verdict.SUSPECT, Verdict.STALLED):
        precision = precision_note(dialect, result.engines[result.worst].state.last)
    line = describe(result, previous, why, config.window, precision)
    if config.json:
        import json  # only on this path: json pulls in re, which the plain line does not need

        line = json.dumps(json_fields(result, samples, dialect.name, config.window, line), sort_keys=True)
    _print(line)
    return ExitCode.STALLED if result.verdict is Verdict.STALLED else ExitCode.OK


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
