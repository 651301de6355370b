"""The exit codes, and the errors stallprobe raises: one base, one class per boundary, each with its code.

Internals raise; `cli.main()` is the only place that turns an error into its one line and exit code.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar

__all__ = [
    "EXIT_MEANINGS",
    "ExitCode",
    "InjectError",
    "MetricsError",
    "ScrapeError",
    "ScrapeTimeout",
    "StallprobeError",
    "StateFileError",
    "UsageError",
]


class ExitCode:
    """The process's exit codes. Plain ints, not an IntEnum: `enum` costs ~1-2 ms of every probe run."""

    OK = 0  # alive: baseline, idle, paused, progressing, saturated or suspect
    STALLED = 1  # busy and no token progress (or no answer) for the window: restart me
    USAGE = 2  # a flag or environment variable is invalid (argparse's traditional code)
    SCRAPE = 3  # /metrics (or the canary) failed unambiguously: refused, reset, an HTTP error
    METRICS = 4  # not a metrics page, or a required metric missing
    STATE = 5  # the state file cannot be read or written
    INTERRUPTED = 130  # `watch --once` interrupted (the shell's code for SIGINT): never read as "alive"


# The one table of what each code means to the probe: --help and the README print it (a test compares).
EXIT_MEANINGS = {
    ExitCode.OK: "alive: baseline, idle, paused, progressing, saturated or suspect (a slow answer is suspect)",
    ExitCode.STALLED: "stalled: busy and no token progress, or no answer at all, for the window",
    ExitCode.USAGE: "usage error: a flag or environment variable is invalid",
    ExitCode.SCRAPE: "scrape or canary failed: refused, reset, empty, non-2xx (401: give the API key), too large",
    ExitCode.METRICS: "not a metrics page, no known engine or several, or a required metric missing or unusable",
    ExitCode.STATE: "the state file cannot be read or written (read-only or full filesystem)",
}


class StallprobeError(Exception):
    """Base of every error stallprobe raises on purpose; str() is a one-line message for a person."""

    exit_code: ClassVar[int]


class UsageError(StallprobeError):
    """A flag or environment variable has a value the probe cannot use."""

    exit_code = ExitCode.USAGE


class InjectError(UsageError):
    """`stallprobe inject` cannot use its input (not YAML or JSON manifests) or a file it was pointed at."""


class ScrapeError(StallprobeError):
    """The /metrics page could not be fetched: refused, reset, non-2xx, too large, or past the deadline."""

    exit_code = ExitCode.SCRAPE


class ScrapeTimeout(ScrapeError):
    """No complete answer within the deadline: ambiguous (a saturated engine's server can be that slow),
    so the probe judges it as a page that gave no answer, not as an immediate failure."""


class MetricsError(StallprobeError):
    """The page is not a Prometheus text page, or a required metric is missing or unusable."""

    exit_code = ExitCode.METRICS


class StateFileError(StallprobeError):
    """The state file cannot be read or written (a read-only or full filesystem, a directory in the way)."""

    exit_code = ExitCode.STATE
