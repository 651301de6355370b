"""stallprobe: tell a wedged LLM inference engine from a busy one by token progress.

The pure detector is importable from here; the probe itself is `python3 -m stallprobe` (see cli.py, which
dispatches to probe.py, doctor/, watch/ and inject/). Importing this package loads only the detector
and the errors, so library users pay for nothing else.
"""

from __future__ import annotations

from .detector import (
    DEFAULT_SATURATION,
    DEFAULT_WINDOW,
    Assessment,
    EnginesAssessment,
    Sample,
    State,
    Verdict,
    assess,
    assess_engines,
    readiness,
    replay,
    step,
)
from .errors import ExitCode, MetricsError, ScrapeError, StallprobeError, StateFileError, UsageError

__version__ = "0.2.0"

__all__ = [
    "DEFAULT_SATURATION",
    "DEFAULT_WINDOW",
    "Assessment",
    "EnginesAssessment",
    "ExitCode",
    "MetricsError",
    "Sample",
    "ScrapeError",
    "StallprobeError",
    "State",
    "StateFileError",
    "UsageError",
    "Verdict",
    "__version__",
    "assess",
    "assess_engines",
    "readiness",
    "replay",
    "step",
]
