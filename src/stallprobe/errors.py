"""The exit codes, and the errors stallprobe raises: one base, one class per boundary, each with its code.

Internals raise; `cli.main()` is the only place that turns an error into its one line and exit code.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar

__all__ = [
    "COMMANDS",
    "EXIT_TABLE",
    "BadAnswer",
    "BugError",
    "ExitCode",
    "InjectError",
    "MetricsError",
    "OutputError",
    "ScrapeError",
    "ScrapeTimeout",
    "StallprobeError",
    "StateFileError",
    "UsageError",
    "exit_lines",
    "shown_path",
]


def shown_path(path: str) -> str:
    """A path or a word from outside as an error's one line shows it: as it is, or quoted when it holds
    what would break the line (a newline, a control character)."""
    return path if path.isprintable() else repr(path)


class ExitCode:
    """The process's exit codes, one table for every command. Plain ints, not an IntEnum: `enum` costs
    ~1-2 ms of every probe run."""

    OK = 0  # alive (probe), ready (--ready), written (inject), stopped or all alive (watch)
    STALLED = 1  # busy and no progress (or no answer) for the window: restart me. Never anything else.
    USAGE = 2  # a flag, an environment variable or an input file cannot be used (argparse's traditional code)
    SCRAPE = 3  # /metrics (or another route of the engine) failed unambiguously: refused, reset, an HTTP error
    METRICS = 4  # not a metrics page, or a required metric missing
    STATE = 5  # the state file cannot be read or written
    CHANGES = 6  # inject --check: a run would change the manifests (a CI gate)
    OUTPUT = 7  # stdout was closed (or failed) before the output was whole: `inject ... | head`
    INTERRUPTED = 130  # stopped by SIGINT (the shell's code) before watch --once or doctor saw enough


# The one table of what each code means, per command (one column each). Each
# command's --help prints its own column, the README prints them all; a test compares both with this.
COMMANDS = ("probe", "watch", "inject", "doctor")
EXIT_TABLE: dict[int, dict[str, str]] = {
    ExitCode.OK: {
        "probe": "alive: baseline, idle, paused, progressing, saturated or suspect (a slow answer is suspect);"
        " or unjudged: the server answers but the page cannot be judged (3, 4 and 5 below) and the health"
        " route answers 2xx; with --ready: ready; with --report-only (liveness runs): stalled, a usage error or a"
        " bug too, unless the health route refuses or answers an error",
        "watch": "stopped (Ctrl-C, SIGTERM, or its reader went away); with --once: every endpoint alive",
        "inject": "written (with --check: nothing would change)",
        "doctor": "the engine looks fit for the probe",
    },
    ExitCode.STALLED: {
        "probe": "stalled: busy and no token progress, or no answer at all, for the window;"
        " with --ready: not ready (stuck under --drain-after, paused, or its health route fails)",
        "watch": "--once: an engine is stalled",
        "doctor": "the engine is stalled now",
    },
    ExitCode.USAGE: {
        "probe": "usage error: a flag or environment variable is invalid, or the archive beside the launcher"
        " cannot be run (missing, unreadable, not the probe); or a bug of stallprobe",
        "watch": "usage error: a flag or URL is invalid, or --listen or --agent cannot bind; or a bug of stallprobe",
        "inject": "usage error: a flag is invalid, or the input or a file it names cannot be used; or a bug of"
        " stallprobe",
        "doctor": "usage error: a flag is invalid; or a bug of stallprobe",
    },
    ExitCode.SCRAPE: {
        "probe": "scrape or canary failed: refused, reset, empty; or non-2xx (401: give the API key) or too"
        " large, and the health route fails too (or --strict)",
        "watch": "--once: an endpoint could not be scraped (and none stalled)",
        "doctor": "the engine could not be scraped: refused, reset, empty, non-2xx, too large",
    },
    ExitCode.METRICS: {
        "probe": "not a metrics page, no known engine or several, or a required metric missing or unusable,"
        " and the health route fails too (or --strict)",
        "watch": "--once: an endpoint is not a metrics page (and none stalled)",
        "doctor": "not a metrics page, no known engine, or a required metric missing",
    },
    ExitCode.STATE: {
        "probe": "the state file cannot be read or written (read-only or full filesystem), and the health"
        " route fails too (or --strict)",
    },
    ExitCode.CHANGES: {
        "inject": "--check: a run would change the manifests",
    },
    ExitCode.OUTPUT: {
        "probe": "--help or --version: stdout was closed before the text was whole (a verdict keeps its code)",
        "watch": "--help or --version: stdout was closed before the text was whole",
        "inject": "stdout was closed before the manifests were whole (nothing is half-written on purpose)",
        "doctor": "stdout was closed before the report was whole",
    },
    ExitCode.INTERRUPTED: {
        "watch": "--once interrupted before its second poll",
        "doctor": "interrupted before its first look",
    },
}


def exit_lines(command: str) -> list[str]:
    """The exit-code lines of `command`'s --help, from the one table: the code, two spaces, its meaning."""
    rows = [(str(code), meanings[command]) for code, meanings in EXIT_TABLE.items() if command in meanings]
    width = max(len(code) for code, _ in rows) + 2
    return [f"  {code:<{width}}{meaning}" for code, meaning in rows]


class StallprobeError(Exception):
    """Base of every error stallprobe raises on purpose; str() is a one-line message for a person.

    `settings`: the command's configuration the error was raised under (None where the command had none
    yet; a flag that does not parse gives the switches it could read: settings.parse), from which the CLI
    tells how to say it (--json) and whether the probe's --report-only excuses it."""

    exit_code: ClassVar[int]
    settings: object = None


class UsageError(StallprobeError):
    """A flag or environment variable has a value the probe cannot use."""

    exit_code = ExitCode.USAGE


class BugError(StallprobeError):
    """An exception nothing expected: a bug of stallprobe. Said in one line and exit 2, the code of a deploy
    error, never a traceback and never exit 1 (which means stalled, and nothing else)."""

    exit_code = ExitCode.USAGE

    def __init__(self, exc: BaseException) -> None:
        detail = " ".join(str(exc).split())[:300]
        super().__init__(f"a bug of stallprobe (please report it): {type(exc).__name__}: {detail}".rstrip(": "))


class InjectError(UsageError):
    """`stallprobe inject` cannot use its input (not YAML or JSON manifests) or a file it was pointed at."""


class ScrapeError(StallprobeError):
    """The /metrics page could not be fetched: refused, reset, non-2xx, too large, or past the deadline."""

    exit_code = ExitCode.SCRAPE


class BadAnswer(ScrapeError):
    """The server answered, but not with a page the probe can read: an HTTP error status (401 without the
    key, 404 or 501 with the metrics off), a page too large, an encoding it cannot decode. The engine's
    server is up, so the probe can still ask the engine's own health route (probe.py's fallback)."""


class ScrapeTimeout(ScrapeError):
    """No complete answer within the deadline: ambiguous (a saturated engine's server can be that slow),
    so the probe judges it as a page that gave no answer, not as an immediate failure."""


class MetricsError(StallprobeError):
    """The page is not a Prometheus text page, or a required metric is missing or unusable."""

    exit_code = ExitCode.METRICS


class OutputError(StallprobeError):
    """stdout was closed (or a write to it failed) before the output was whole: `inject ... | head -1`."""

    exit_code = ExitCode.OUTPUT


class StateFileError(StallprobeError):
    """The state file cannot be read or written (a read-only or full filesystem, a directory in the way)."""

    exit_code = ExitCode.STATE
