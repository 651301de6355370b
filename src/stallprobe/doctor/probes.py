"""The probes the doctor prints for the engine it looked at: built by stanza.py, the code `inject` writes
manifests with, from the plan inject would make of the `stallprobe inject` command printed beside them
(the same flags), so the two can never disagree; and that command.

Printed as YAML by a printer of a few lines: a probe is mappings of scalars and lists of strings, and
ruamel.yaml (inject's) costs more to import than the doctor needs. Every string is written as JSON, which
is YAML's double-quoted style.
"""

from __future__ import annotations

from ..options import PASSED_ON
from ..report import num
from ..serving import default_address
from ..settings import given_flags
from ..stanza import Plan, liveness_probe, probe_command, readiness_probe, startup_probe
from ..urls import parse_url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..engines import Dialect
    from ..settings import LookSettings

__all__ = ["inject_command", "plan", "probes", "yaml_lines"]


def probe_args(settings: LookSettings, *, key_needed: bool, server_load: bool) -> list[str]:
    """The probe's flags beyond its --url, --window, --timeout and --engine, as inject passes them on:
    those given, the key file only where a route wants the key, and --server-load where it would help."""
    args = given_flags(settings, PASSED_ON, leave_out=("--window", "--engine", "--api-key-file", "--server-load"))
    if server_load:
        args.append("--server-load")
    if settings.api_key_file and (key_needed or settings.canary):
        args += ["--api-key-file", settings.api_key_file]
    return args


def window(settings: LookSettings, dialect: Dialect | None) -> float:
    """The liveness window the looks were judged with: --window when given, else the engine's own
    (TensorRT-LLM's, whose page cannot show a long request's progress), else the probe's default."""
    from ..judge import Rules

    return Rules.of(settings).of_engine(dialect).window


def plan(settings: LookSettings, args: list[str], dialect: Dialect | None = None) -> Plan:
    """inject's plan for these settings: its window (the one the looks were judged with) and timeout, the
    kubelet's period and failure threshold (inject's defaults), and the readiness probe's drain window
    (inject writes the readiness probe unless told not to)."""
    return Plan(
        window=window(settings, dialect), timeout=settings.timeout, probe_args=args, drain_after=settings.drain_after
    )


def probes(url: str, dialect: Dialect, stanza_plan: Plan) -> dict[str, Any]:
    """The container's probes, as inject writes them into a container of this engine serving on the
    URL's port with no startup guard of its own: liveness, startup and readiness."""
    _, port, _ = parse_url(url)
    reached = default_address(dialect.name)  # where it binds when its manifest says nothing (serving.py)
    command = probe_command(port, dialect.name, stanza_plan, address=reached)
    fields: dict[str, Any] = {"livenessProbe": liveness_probe(command, stanza_plan)}
    fields["startupProbe"] = startup_probe(port, dialect.name, reached, stanza_plan)
    if stanza_plan.drain_after is not None:
        fields["readinessProbe"] = readiness_probe(command, stanza_plan)
    return fields


def inject_command(settings: LookSettings, args: list[str], *, engine_needed: bool, engine: str) -> list[str]:
    """The `stallprobe inject` command that writes these probes: the same flags (inject reads the engine
    from the container, so --engine only where the page alone does not tell). An engine's own window is
    inject's to write too (inject.decide.own_window), so only a window given here is said."""
    command = ["stallprobe", "inject", "-f", "your-deployment.yaml"]
    if engine_needed:
        command += ["--engine", engine]
    command += args
    for flag, key in (("--window", "window"), ("--timeout", "timeout"), ("--drain-after", "drain_after")):
        if key in settings.given:
            command += [flag, num(getattr(settings, key))]
    return command


def _scalar(value: object) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return num(value)
    return json.dumps(value)


def yaml_lines(mapping: dict[str, Any], indent: int = 0) -> list[str]:
    """A mapping as block YAML, two spaces a level; a list in flow style, one line (a command)."""
    import json

    lines = []
    pad = " " * indent
    for key, value in mapping.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines += yaml_lines(value, indent + 2)
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: {json.dumps(value)}")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return lines
