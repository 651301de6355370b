"""`stallprobe inject`: the command. Manifests on stdin (or -f) to stdout, one line per decision on stderr.

The same command serves three callers:
- a person or a pipeline: `stallprobe inject -f deploy.yaml | kubectl apply -f -`; `--check` writes
  nothing and exits 3 when a run would change something (a CI gate);
- Helm's post-renderer: every rendered manifest on stdin, the result on stdout, non-zero on failure;
- Kustomize's KRM function (exec): a ResourceList on stdin, whose functionConfig carries the options
  (the flags' names without `--`, under `spec` or `data`), the ResourceList back on stdout.
`--print-probe` writes only what an operator embeds in the pods it renders: the container fields and the
ConfigMap.
"""

from __future__ import annotations

import sys

from .. import __version__
from ..errors import InjectError
from ..options import INJECT, PASSED_ON, help_lines, parse
from ..report import num
from .core import Options, configmap, container_fields, inject
from .decide import Decision
from .manifests import Manifests, read_documents, write_documents

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..options import Values

__all__ = ["main"]

# --check: a run would change the manifests. Not 1 (that is "stalled" to anyone who reads stallprobe's
# codes) and not 2 (a usage error).
CHANGES_PENDING = 3
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
            f"exit codes: 0 written; 2 usage error; {CHANGES_PENDING} with --check: a run would change something",
        ]
    )


def _probe_args(values: Values) -> list[str]:
    """The probe's engine flags that were given, as the probe's command line takes them (--window and
    --engine are always written, and so are left out here)."""
    args: list[str] = []
    for option in PASSED_ON:
        if option.key not in values.given or option.flag in ("--window", "--engine"):
            continue
        if option.is_switch:
            args += [option.flag] if values.flag(option.key) else []
        elif option.repeats:
            for word in values.words(option.key):
                args += [option.flag, word]
        else:
            value = values.value(option.key)
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


def _pyz(values: Values) -> bytes:
    path = values.text("pyz")
    if path is not None:
        pyz = _read(path, "--pyz", binary=True)
        assert isinstance(pyz, bytes)
        return pyz
    from ..pyz import build

    return build(values.text("python"))


def options_of(values: Values, pyz: bytes) -> Options:
    engine = values.text("engine")
    return Options(
        configmap=values.text("configmap") or "stallprobe",
        container=values.text("container"),
        engine=None if engine == "auto" else engine,
        window=values.number("window"),
        timeout=values.number("timeout"),
        period=values.integer("period"),
        failure=values.integer("failure_threshold"),
        force=values.flag("force"),
        state_volume=values.flag("state_volume"),
        pyz=pyz,
        probe_args=_probe_args(values),
        startup_budget=values.number("startup_budget"),
        drain_after=values.number("drain_after") if "drain_after" in values.given else None,
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


def _print_probe(values: Values) -> int:
    engine = values.text("engine")
    port = values.value("port")
    if engine in (None, "auto") or not isinstance(port, float):
        raise InjectError("--print-probe needs --engine (vllm, sglang or llamacpp) and --port")
    if values.text("output") not in ("yaml", "json"):
        raise InjectError(f"--output must be yaml or json (got {values.text('output')!r})")
    options = options_of(values, _pyz(values))
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
    if values.text("output") == "json":
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
    values = parse(argv, INJECT)
    if isinstance(values, str):
        print(help_text() if values == "help" else f"stallprobe {__version__}")
        return 0
    if values.flag("print_probe"):
        return _print_probe(values)
    filename = values.text("filename") or "-"
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
        values = parse([*_krm_args(resource_list.get("functionConfig")), *argv], INJECT)
        assert not isinstance(values, str)
        items = list(resource_list.get("items") or [])
        items, log, changed = inject(items, options_of(values, _pyz(values)))
        resource_list["items"] = items
        out = Manifests(manifests.form, [resource_list], manifests.texts, manifests.indents)
        changed = {0} if changed else set()
    else:
        docs, log, changed = inject(manifests.docs, options_of(values, _pyz(values)))
        out = Manifests(manifests.form, docs, manifests.texts, manifests.indents)
    for line in log:
        print(f"stallprobe inject: {line}", file=sys.stderr)
    if values.flag("check"):
        return CHANGES_PENDING if changed else 0
    write_documents(out, changed, sys.stdout)
    return 0
