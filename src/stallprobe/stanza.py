"""The probe's stanza: the command a pod runs, the liveness, startup and readiness probes around it, and
their timeoutSeconds, from one set of look options. Pure: `inject` writes what this builds into manifests,
and `doctor` prints the same for the engine it looked at, so the two can never disagree.
"""

from __future__ import annotations

import math

from .detector import DEFAULT_WINDOW
from .engines import DIALECTS, health_route
from .observe import kubelet_timeout
from .options import DEFAULT_FAILURE_THRESHOLD, DEFAULT_PERIOD, DEFAULT_STARTUP_BUDGET, DEFAULT_TIMEOUT
from .report import num
from .serving import LAUNCHER_KEY, LOOPBACK, MOUNT, PYZ_KEY, REPORT_ONLY_KEY, TERMINATION_LOG

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .serving import Address

__all__ = [
    "LAUNCHER_PATH",
    "PYZ_DIR",
    "PYZ_PATH",
    "READY_PERIOD",
    "REPORT_ONLY_PATH",
    "STARTUP_PERIOD",
    "STATE_DIR",
    "Plan",
    "health_check",
    "health_readiness_probe",
    "liveness_args",
    "liveness_probe",
    "probe_command",
    "readiness_probe",
    "restart_after",
    "startup_probe",
    "timeout_seconds",
]

# Where the pod mounts the ConfigMap of the single-file build and its launcher (serving.py names them).
PYZ_DIR = MOUNT
PYZ_PATH = f"{PYZ_DIR}/{PYZ_KEY}"
# The pod runs the launcher (launcher.launcher(): a script file, which goes through no runpy), not the
# archive as `python3 stallprobe.pyz`: running a zip goes through runpy, which costs a run several ms of
# CPU for nothing (docs/cost.md has both rows).
LAUNCHER_PATH = f"{PYZ_DIR}/{LAUNCHER_KEY}"
# The kill switch's file: there once an operator adds the key to the ConfigMap (kubectl patch), and read
# by every liveness run (the probe's --report-only-file).
REPORT_ONLY_PATH = f"{PYZ_DIR}/{REPORT_ONLY_KEY}"
STATE_DIR = "/run/stallprobe"
STARTUP_PERIOD = 10
# Readiness is asked often and fails at once: it only moves new requests elsewhere, it restarts nothing.
READY_PERIOD = 5


class Plan:
    """What the probes are built from: the look's window and timeout, the kubelet's period and failure
    threshold, the startup budget, the drain window (None: no readiness probe), the probe's other
    engine flags as given (--saturation 4, --progress-metric X, ...), and whether the liveness probe only
    reports (the probe's --report-only: it judges and says, and restarts nothing)."""

    __slots__ = ("drain_after", "failure", "period", "probe_args", "report_only", "startup_budget", "timeout", "window")

    def __init__(
        self,
        *,
        window: float = DEFAULT_WINDOW,
        timeout: float = DEFAULT_TIMEOUT,
        period: int = DEFAULT_PERIOD,
        failure: int = DEFAULT_FAILURE_THRESHOLD,
        probe_args: Sequence[str] = (),
        startup_budget: float = DEFAULT_STARTUP_BUDGET,
        drain_after: float | None = None,
        report_only: bool = False,
    ) -> None:
        self.window = window
        self.timeout = timeout
        self.period = period
        self.failure = failure
        self.probe_args = tuple(probe_args)
        self.startup_budget = startup_budget
        self.drain_after = drain_after
        self.report_only = report_only


def restart_after(plan: Plan) -> float:
    """About how long after its last progress a wedged engine is restarted: the window, then the
    kubelet's further failed runs (period x (failureThreshold - 1))."""
    return plan.window + plan.period * (plan.failure - 1)


def probe_command(
    port: int,
    engine: str | None,
    plan: Plan,
    *,
    state_volume: bool = False,
    address: Address = LOOPBACK,
    python: str = "python3",
    key: Sequence[str] = (),
) -> list[str]:
    """The liveness probe's command, run in the engine's container with `python` (the image's
    interpreter), dialling the engine where `address` says, with the flags that give the probe the
    engine's API key (`key`: --api-key-env VAR or --api-key-file PATH)."""
    # The kubelet expands $(VAR) in a probe's command from the container's plain `env` values, and a
    # variable set by valueFrom (the pod's address) to nothing: `$$(VAR)` reaches the probe as `$(VAR)`,
    # which it reads from its environment at run time.
    host = f"${address.host}" if address.host.startswith("$(") else address.host
    path = next((d.metrics_path for d in DIALECTS if d.name == engine), "/metrics")
    command = [python, "-I", "-S", LAUNCHER_PATH, "--url", f"http://{host}:{port}{path}"]
    command += ["--window", num(plan.window), "--timeout", num(plan.timeout)]
    if engine is not None:
        command += ["--engine", engine]
    command += key
    if state_volume:
        command += ["--state-file", f"{STATE_DIR}/probe.state"]
    command += plan.probe_args
    return command


def timeout_seconds(plan: Plan, *, ready: bool = False, engine: str | None = None) -> int:
    """The probe's timeoutSeconds for `engine` (None: any): a readiness run also asks the engine's health
    route."""
    extra = sum(flag in plan.probe_args for flag in ("--canary", "--server-load"))
    return kubelet_timeout(plan.timeout, extra + ready, engine)


def _engine(command: list[str]) -> str | None:
    """The engine a probe's command names (--engine NAME), None for one it leaves to the page."""
    return command[command.index("--engine") + 1] if "--engine" in command[:-1] else None


def liveness_args(plan: Plan, termination: str = TERMINATION_LOG) -> list[str]:
    """The flags only the liveness probe carries (a readiness run restarts nothing, so it neither leaves
    evidence for the kubelet nor reads the kill switch): where a failing run writes its evidence (the
    container's termination message file, `termination`), the kill switch's file, and --report-only when
    the plan says so. The kubelet expands `$(VAR)` in a probe's command, and nothing in a
    terminationMessagePath: every `$` of the path is written `$$`, which it turns back into `$`."""
    args = ["--termination-log", termination.replace("$", "$$"), "--report-only-file", REPORT_ONLY_PATH]
    return [*args, "--report-only"] if plan.report_only else args


def liveness_probe(
    command: list[str], plan: Plan, old: Any = None, *, termination: str = TERMINATION_LOG
) -> dict[str, Any]:
    """The livenessProbe: the command and the flags only it carries (liveness_args; the readiness probe
    is built from the same command without them); an operator's initialDelaySeconds on the probe it
    replaces (`old`) is kept."""
    probe: dict[str, Any] = {"exec": {"command": [*command, *liveness_args(plan, termination)]}}
    delay = old.get("initialDelaySeconds") if isinstance(old, dict) else None
    if isinstance(delay, int):  # model loading: keep the operator's delay (a startupProbe is better)
        probe["initialDelaySeconds"] = delay
    probe["periodSeconds"] = plan.period
    probe["timeoutSeconds"] = timeout_seconds(plan, engine=_engine(command))
    probe["successThreshold"] = 1
    probe["failureThreshold"] = plan.failure
    return probe


def health_check(port: int, engine: str | None, address: Address, python: str = "python3") -> dict[str, Any]:
    """GET the engine's health route where the kubelet reaches it: its httpGet dials the pod's IP, or the
    address the engine binds (`host`). An engine on loopback (SGLang's and llama.cpp's default) it cannot
    reach: there the same GET runs inside the container, with `python`, at that loopback address."""
    route = health_route(engine)
    if address.kubelet is not None:
        where = {"host": address.kubelet} if address.kubelet else {}
        return {"httpGet": {**where, "path": route, "port": port}}
    program = (
        "import sys, urllib.request as u\n"
        f"try: u.urlopen('http://{address.host}:{port}{route}', timeout=3)\n"
        "except Exception as e: sys.exit(str(e))"
    )
    return {"exec": {"command": [python, "-I", "-S", "-c", program]}}


def startup_probe(
    port: int, engine: str | None, address: Address, plan: Plan, python: str = "python3"
) -> dict[str, Any]:
    """The health check until it passes, for up to the budget."""
    probe = health_check(port, engine, address, python)
    probe["periodSeconds"] = STARTUP_PERIOD
    probe["timeoutSeconds"] = 5
    probe["failureThreshold"] = math.ceil(plan.startup_budget / STARTUP_PERIOD)
    return probe


def health_readiness_probe(port: int, engine: str | None, address: Address, python: str = "python3") -> dict[str, Any]:
    """A readinessProbe that only asks the health route: ready once loaded, never drained for a stall."""
    probe = health_check(port, engine, address, python)
    probe.update({"periodSeconds": READY_PERIOD, "timeoutSeconds": 5, "successThreshold": 1, "failureThreshold": 3})
    return probe


def readiness_probe(command: list[str], plan: Plan) -> dict[str, Any]:
    """The readinessProbe: the same command with --ready and the drain window (plan.drain_after)."""
    assert plan.drain_after is not None
    return {
        "exec": {"command": [*command, "--ready", "--drain-after", num(plan.drain_after)]},
        "periodSeconds": READY_PERIOD,
        "timeoutSeconds": timeout_seconds(plan, ready=True, engine=_engine(command)),
        "successThreshold": 1,
        "failureThreshold": 1,
    }
