"""The errors stallprobe raises: one base, one class per boundary. Only the CLI maps them to exit codes."""

from __future__ import annotations

__all__ = ["MetricsError", "ScrapeError", "StallprobeError", "StateFileError", "UsageError"]


class StallprobeError(Exception):
    """Base of every error stallprobe raises on purpose; str() is a one-line message for a person."""


class UsageError(StallprobeError):
    """A flag or environment variable has a value the probe cannot use."""


class ScrapeError(StallprobeError):
    """The /metrics page could not be fetched: refused, reset, non-2xx, too large, or past the deadline."""


class MetricsError(StallprobeError):
    """The page is not a Prometheus text page, or a required metric is missing or unusable."""


class StateFileError(StallprobeError):
    """The state file cannot be read or written (a read-only or full filesystem, a directory in the way)."""
