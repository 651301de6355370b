"""`stallprobe inject`: the command. Manifests on stdin (or -f) to stdout, one line per decision on stderr.

The same command serves three callers:
- a person or a pipeline: `stallprobe inject -f deploy.yaml | kubectl apply -f -`; `--check` writes
  nothing and exits 6 when a run would change something (a CI gate);
- Helm's post-renderer: every rendered manifest on stdin, the result on stdout, non-zero on failure;
- Kustomize's KRM function (exec): a ResourceList on stdin, whose functionConfig carries the options
  (the flags' names without `--`, under `spec` or `data`), the ResourceList back on stdout.
`--print-probe` writes only what an operator embeds in the pods it renders: the container fields and the
ConfigMap.
"""

from __future__ import annotations

import sys

from .. import __version__
from ..errors import ExitCode, InjectError, exit_lines
from ..options import INJECT, PASSED_ON, EngineSettings, help_lines, parse, waiting_word
from ..report import num
from .core import Options, configmap, container_fields, inject
from .decide import Decision
from .manifests import Manifests, read_documents, write_documents

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


__all__ = ["main"]

KRM_API = "config.kubernetes.io/v1"

DESCRIPTION = """\
usage: stallprobe inject [-f FILE] [options]
       stallprobe inject --print-probe --engine ENGINE --port PORT [--output yaml|json]

Put the stallprobe exec liveness probe (and a startup guard) into Kubernetes manifests (YAML or JSON):
the manifests go to stdout, one line per container to stderr. Works as a Helm post-renderer
(--post-renderer stallprobe --post-renderer-args inject) and as a Kustomize KRM function (a
ResourceList on stdin). The engine flags are the probe's, written into the probe it adds."""


def help_text() -> str:
    return "\n".join(
        [
            DESCRIPTION,
            "",
            "options:",
            *help_lines(INJECT, environment=False),
            "",
            "exit codes:",
            *exit_lines("inject"),
        ]
    )


class InjectConfig(EngineSettings):
    """Every flag of `stallprobe inject` (the option table's INJECT selection)."""

    OPTIONS = INJECT

    filename: str
    container: str | None
    timeout: float
    api_key_file: str | None
    canary: bool
    canary_interval: float
    server_load: bool
    period: int
    failure_threshold: int
    force: bool
    state_volume: bool
    configmap: str
    pyz: str | None
    python: str | None
    drain_after: float
    startup_budget: float
    check: bool
    print_probe: bool
    port: float | None
    output: str


def _probe_args(config: InjectConfig) -> list[str]:
    """The probe's engine flags that were given, as the probe's command line takes them (--window and
    --engine are always written, and so are left out here). Read through the option table, which names
    each one's attribute."""
    args: list[str] = []
    for option in PASSED_ON:
        if option.key not in config.given or option.flag in ("--window", "--engine"):
            continue
        value = getattr(config, option.key)
        if option.is_switch:
            args += [option.flag] if value else []
        elif option.bare:  # --include-waiting: its word, in the one form that cannot be misread
            args.append(f"{option.flag}={waiting_word(value)}")
        elif option.repeats:
            for word in value:
                args += [option.flag, word]
        else:
            args += [option.flag, num(value) if isinstance(value, float) else (str(value) or "none")]
    return args


def _read(path: str, flag: str, binary: bool) -> str | bytes:
    try:
        if binary:
            with open(path, "rb") as f:
                return f.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InjectError(f"{flag} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _pyz(config: InjectConfig) -> bytes:
    path = config.pyz
    if path is not None:
        pyz = _read(path, "--pyz", binary=True)
        assert isinstance(pyz, bytes)
        return pyz
    from ..pyz import build

    return build(config.python)


def options_of(config: InjectConfig, pyz: bytes) -> Options:
    return Options(
        configmap=config.configmap or "stallprobe",
        container=config.container,
        engine=None if config.engine == "auto" else config.engine,
        window=config.window,
        timeout=config.timeout,
        period=config.period,
        failure=config.failure_threshold,
        force=config.force,
        state_volume=config.state_volume,
        pyz=pyz,
        probe_args=_probe_args(config),
        startup_budget=config.startup_budget,
        drain_after=config.drain_after if "drain_after" in config.given else None,
    )


def _krm_args(config: Any) -> list[str]:
    """The functionConfig's options as flags: `spec` (or a ConfigMap's `data`) maps each flag's name,
    without `--`, to its value; true for a switch, a list for a flag that repeats."""
    if config is None:
        return []
    if not isinstance(config, dict):
        raise InjectError("the ResourceList's functionConfig must be a mapping")
    fields = config.get("spec", config.get("data")) or {}
    if not isinstance(fields, dict):
        raise InjectError("the functionConfig's spec (or data) must map option names to values")
    argv: list[str] = []
    for key, value in fields.items():
        flag = f"--{key}"
        if value is True or str(value).lower() == "true":
            argv.append(flag)
        elif value is False or str(value).lower() == "false":
            continue
        elif isinstance(value, list):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def _print_probe(config: InjectConfig) -> int:
    engine = config.engine
    port = config.port
    if engine == "auto" or port is None:
        raise InjectError("--print-probe needs --engine (vllm, sglang or llamacpp) and --port")
    if config.output not in ("yaml", "json"):
        raise InjectError(f"--output must be yaml or json (got {config.output!r})")
    options = options_of(config, _pyz(config))
    loopback = engine != "vllm"  # SGLang and llama.cpp bind loopback unless told otherwise
    decision = Decision(
        "probe", engine=engine, port=int(port), startup=True, loopback=loopback, readiness="added", liveness="added"
    )
    fields = container_fields(decision, options, None, options.state_volume)
    volumes: list[dict[str, Any]] = [
        {"name": "stallprobe", "configMap": {"name": options.configmap, "defaultMode": 0o444}}
    ]
    if options.state_volume:
        volumes.append({"name": "stallprobe-state", "emptyDir": {"sizeLimit": "1Mi"}})
    whole = {"container": fields, "volumes": volumes, "configMap": configmap(options.configmap, None, options.pyz)}
    if config.output == "json":
        import json

        print(json.dumps(whole, indent=2))
    else:
        import io

        from .manifests import _yaml

        buffer = io.StringIO()
        _yaml().dump(whole, buffer)
        sys.stdout.write(buffer.getvalue())
    return 0


def main(argv: Sequence[str]) -> int:
    """`stallprobe inject ...`: the manifests to stdout, the log to stderr; the exit code."""
    config = parse(argv, InjectConfig)
    if isinstance(config, str):
        print(help_text() if config == "help" else f"stallprobe {__version__}")
        return 0
    if config.print_probe:
        return _print_probe(config)
    filename = config.filename or "-"
    text = sys.stdin.read() if filename == "-" else _read(filename, "-f", binary=False)
    assert isinstance(text, str)
    manifests = read_documents(text)
    krm = (
        len(manifests.docs) == 1
        and isinstance(manifests.docs[0], dict)
        and manifests.docs[0].get("kind") == "ResourceList"
    )
    if krm:
        resource_list = manifests.docs[0]
        config = parse([*_krm_args(resource_list.get("functionConfig")), *argv], InjectConfig)
        assert not isinstance(config, str)
        items = list(resource_list.get("items") or [])
        items, log, changed = inject(items, options_of(config, _pyz(config)))
        resource_list["items"] = items
        out = Manifests(manifests.form, [resource_list], manifests.texts, manifests.indents)
        changed = {0} if changed else set()
    else:
        docs, log, changed = inject(manifests.docs, options_of(config, _pyz(config)))
        out = Manifests(manifests.form, docs, manifests.texts, manifests.indents)
    for line in log:
        print(f"stallprobe inject: {line}", file=sys.stderr)
    if config.check:
        return ExitCode.CHANGES if changed else ExitCode.OK
    write_documents(out, changed, sys.stdout)
    return 0
