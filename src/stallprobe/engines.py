"""Which metrics each engine publishes, in one place, and turning a /metrics page into a Sample."""

from __future__ import annotations

import math

from .detector import Sample
from .errors import MetricsError
from .exposition import sum_families

__all__ = ["VLLM", "Dialect", "read_sample"]


class Dialect:
    """The names under which one engine publishes the four numbers the detector reads."""

    __slots__ = ("generation", "name", "prompt", "running", "waiting")

    def __init__(self, name: str, running: str, waiting: str, prompt: str, generation: str) -> None:
        self.name = name
        self.running = running
        self.waiting = waiting
        self.prompt = prompt
        self.generation = generation


# vLLM V1 (vllm/v1/metrics/loggers.py) and V0 (vllm/engine/metrics.py) publish the same four names.
# - running: requests the engine holds in its batch; "busy" means running > 0.
# - waiting: queued requests; never excuses a frozen engine, only tells saturated from progressing.
# - prompt: prefill tokens. In V1 it moves when a request's whole prefill completes, so it is why a long
#   prompt (no output for a long time) still reads as progress once its prefill lands.
# - generation: decoded tokens, the steady heartbeat of a working engine.
VLLM = Dialect(
    "vllm",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    prompt="vllm:prompt_tokens_total",
    generation="vllm:generation_tokens_total",
)


def read_sample(page: bytes, t: float, dialect: Dialect = VLLM) -> Sample:
    """The sample a page shows at time `t`. MetricsError names what is missing or unusable."""
    wanted = (dialect.running, dialect.generation, dialect.prompt, dialect.waiting)
    sums = sum_families(page, wanted)
    missing = [name for name in wanted[:3] if sums[name] is None]
    if missing:
        if page.lstrip()[:1] == b"<":
            raise MetricsError("not a metrics page: the server sent HTML")
        if len(missing) == 3:
            raise MetricsError(f"not a {dialect.name} metrics page: none of {', '.join(missing)} is on it")
        raise MetricsError(f"required metric missing from the page: {', '.join(missing)}")
    values = [sums[name] or 0.0 for name in wanted]
    for name, value in zip(wanted, values):
        if not math.isfinite(value):
            raise MetricsError(f"{name} is {value!r}, not a finite number")
    running, generation, prompt, waiting = values
    return Sample(running, generation, prompt, t, waiting)
