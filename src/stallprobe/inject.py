"""`stallprobe inject`: put the exec liveness probe into the Kubernetes manifests people already have.

    stallprobe inject -f deploy.yaml | kubectl apply -f -

For every pod template (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, and the
leader and worker templates of a LeaderWorkerSet) it finds the inference containers (vLLM, SGLang,
llama.cpp's server, by image or command, or the one named by --container) and:

- replaces a liveness probe that is absent, or a plain HTTP check of /health, with the exec probe; any
  other liveness probe is the operator's and stays unless --force; startup and readiness never change;
- mounts a ConfigMap that holds the single-file build, and an emptyDir for the state file when the
  container's root filesystem is read-only (or --state-volume asks);
- emits that ConfigMap last, one per namespace; injecting its own output changes nothing.

Output goes to stdout in the input's format (YAML in, YAML out; JSON in, JSON out); what changed, and
how long a wedged engine lives before the kubelet restarts it, go to stderr. YAML needs PyYAML (the
`stallprobe[kube]` extra); the probe itself never imports it.
"""

from __future__ import annotations

import base64
import json
import math
import sys

from . import __version__
from .api import PAUSE_QUERY_TIMEOUT
from .detector import DEFAULT_WINDOW
from .engines import DIALECTS
from .errors import InjectError
from .options import (
    DEFAULT_FAILURE_THRESHOLD,
    DEFAULT_PERIOD,
    DEFAULT_TIMEOUT,
    INJECT,
    PASSED_ON,
    help_lines,
    parse,
)
from .pyz import launcher
from .report import num

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any, TextIO

    from .options import Values

__all__ = ["InjectError", "Options", "inject", "main"]

PYZ_DIR = "/opt/stallprobe"
PYZ_KEY = "stallprobe.pyz"
PYZ_PATH = f"{PYZ_DIR}/{PYZ_KEY}"
# The pod runs the archive through `-c`, not as `python3 stallprobe.pyz`: running a zip goes through
# runpy, ~8 ms of CPU a run (a third of the probe's cost) for nothing.
LAUNCHER = launcher(PYZ_PATH)
STATE_DIR = "/run/stallprobe"
VOLUME = "stallprobe"
STATE_VOLUME = "stallprobe-state"
# Where each workload kind keeps its pod templates' specs.
TEMPLATE_PATHS: dict[str, list[tuple[str, ...]]] = {
    "Pod": [("spec",)],
    "Deployment": [("spec", "template", "spec")],
    "StatefulSet": [("spec", "template", "spec")],
    "DaemonSet": [("spec", "template", "spec")],
    "ReplicaSet": [("spec", "template", "spec")],
    "Job": [("spec", "template", "spec")],
    "CronJob": [("spec", "jobTemplate", "spec", "template", "spec")],
    "LeaderWorkerSet": [
        ("spec", "leaderWorkerTemplate", "leaderTemplate", "spec"),
        ("spec", "leaderWorkerTemplate", "workerTemplate", "spec"),
    ],
}


class Options:
    __slots__ = (
        "configmap",
        "container",
        "engine",
        "failure",
        "force",
        "period",
        "probe_args",
        "pyz",
        "state_volume",
        "timeout",
        "window",
    )

    def __init__(
        self,
        *,
        configmap: str = "stallprobe",
        container: str | None = None,
        engine: str | None = None,
        window: float = DEFAULT_WINDOW,
        timeout: float = DEFAULT_TIMEOUT,
        period: int = DEFAULT_PERIOD,
        failure: int = DEFAULT_FAILURE_THRESHOLD,
        force: bool = False,
        state_volume: bool = False,
        pyz: bytes = b"",
        probe_args: Sequence[str] = (),
    ) -> None:
        self.configmap = configmap
        self.container = container
        self.engine = engine
        self.window = window
        self.timeout = timeout
        self.period = period
        self.failure = failure
        self.force = force
        self.state_volume = state_volume
        self.pyz = pyz
        # The probe's other engine flags, as given to inject (--saturation 4, --progress-metric X, ...).
        self.probe_args = tuple(probe_args)


def _dig(doc: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def pod_specs(doc: Any) -> Iterator[dict[str, Any]]:
    """The pod specs a manifest holds, whatever its kind (none for kinds without pods)."""
    if not isinstance(doc, dict):
        return
    for path in TEMPLATE_PATHS.get(str(doc.get("kind")), []):
        spec = _dig(doc, path)
        if isinstance(spec, dict):
            yield spec


def _command_line(container: dict[str, Any]) -> list[str]:
    words = [*(container.get("command") or []), *(container.get("args") or [])]
    return [str(word) for word in words]


def engine_of(container: dict[str, Any]) -> str | None:
    """The engine a container runs, from its image and command line; None when it runs none we know."""
    haystack = " ".join([str(container.get("image", "")), *_command_line(container)]).lower()
    for dialect in DIALECTS:
        if any(hint in haystack for hint in dialect.hints):
            return dialect.name
    return None


def port_of(container: dict[str, Any], engine: str | None) -> int:
    """The port the engine serves /metrics on: from `--port` in its command line, else its declared
    container ports (one named http, else the first), else the engine's own default."""
    words = _command_line(container)
    for i, word in enumerate(words):
        value = words[i + 1] if word == "--port" and i + 1 < len(words) else word.partition("=")[2]
        if (word == "--port" or word.startswith("--port=")) and value.isascii() and value.isdigit():
            return int(value)
    ports = [p for p in container.get("ports") or [] if isinstance(p, dict) and isinstance(p.get("containerPort"), int)]
    for port in ports:
        if port.get("name") == "http":
            return int(port["containerPort"])
    if ports:
        return int(ports[0]["containerPort"])
    return next((dialect.port for dialect in DIALECTS if dialect.name == engine), DIALECTS[0].port)


def is_ours(probe: Any) -> bool:
    command = _dig(probe, ("exec", "command"))
    return isinstance(command, list) and any(PYZ_KEY in str(word) for word in command)


def is_plain_health_check(probe: Any) -> bool:
    """An HTTP GET of /health: it only says the process is alive, which is what the probe replaces."""
    path = _dig(probe, ("httpGet", "path"))
    return isinstance(path, str) and path.rstrip("/") in ("/health", "/healthz")


def _read_only_root(container: dict[str, Any]) -> bool:
    return bool(_dig(container, ("securityContext", "readOnlyRootFilesystem")))


def liveness_probe(port: int, engine: str | None, options: Options, old: Any, state_volume: bool) -> dict[str, Any]:
    command = ["python3", "-I", "-S", "-c", LAUNCHER, "--url", f"http://127.0.0.1:{port}/metrics"]
    command += ["--window", num(options.window), "--timeout", num(options.timeout)]
    if engine is not None:
        command += ["--engine", engine]
    if state_volume:
        command += ["--state-file", f"{STATE_DIR}/probe.state"]
    command += options.probe_args
    probe: dict[str, Any] = {"exec": {"command": command}}
    delay = _dig(old, ("initialDelaySeconds",))
    if isinstance(delay, int):  # model loading: keep the operator's delay (a startupProbe is better)
        probe["initialDelaySeconds"] = delay
    probe["periodSeconds"] = options.period
    # Above the probe's own worst case, with room for the interpreter's start on a starved CPU: the
    # scrape, the question whether it is paused (1 s), and with --canary or --server-load one more
    # exchange each, every one under --timeout.
    extra = sum(flag in options.probe_args for flag in ("--canary", "--server-load"))
    probe["timeoutSeconds"] = math.ceil(options.timeout * (1 + extra) + PAUSE_QUERY_TIMEOUT) + 2
    probe["successThreshold"] = 1
    probe["failureThreshold"] = options.failure
    return probe


def _put(items: list[Any], entry: dict[str, Any]) -> None:
    """Add `entry` to a list of named entries, replacing one of the same name in place."""
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("name") == entry["name"]:
            items[i] = entry
            return
    items.append(entry)


def inject_pod(spec: dict[str, Any], options: Options, where: str, log: list[str]) -> bool:
    """Inject the probe into the inference containers of one pod spec; whether anything was injected."""
    injected = False
    needs_state = False
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        name = str(container.get("name", "?"))
        engine = options.engine or engine_of(container)
        if options.container is not None:
            if name != options.container:
                continue
        elif engine is None:
            continue
        old = container.get("livenessProbe")
        if old is not None and not (is_ours(old) or is_plain_health_check(old) or options.force):
            log.append(
                f"{where} container {name}: kept its own liveness probe "
                "(not a plain /health check; --force replaces it)"
            )
            continue
        state_volume = options.state_volume or _read_only_root(container)
        port = port_of(container, engine)
        container["livenessProbe"] = liveness_probe(port, engine, options, old, state_volume)
        mounts = container.setdefault("volumeMounts", [])
        _put(mounts, {"name": VOLUME, "mountPath": PYZ_DIR, "readOnly": True})
        if state_volume:
            _put(mounts, {"name": STATE_VOLUME, "mountPath": STATE_DIR})
            needs_state = True
        lives = options.window + options.period * (options.failure - 1)
        log.append(
            f"{where} container {name}: {'replaced' if old is not None else 'added'} the liveness probe "
            f"({engine or 'engine from the page'}, port {port}); a wedged engine is restarted about {num(lives)} s "
            f"after its last progress (window {num(options.window)} s + period {options.period} s x "
            f"(failureThreshold {options.failure} - 1))"
        )
        injected = True
    if injected:
        volumes = spec.setdefault("volumes", [])
        _put(volumes, {"name": VOLUME, "configMap": {"name": options.configmap, "defaultMode": 0o444}})
        if needs_state:
            _put(volumes, {"name": STATE_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})
    return injected


def configmap(name: str, namespace: str | None, pyz: bytes) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/name": "stallprobe", "app.kubernetes.io/version": __version__}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "binaryData": {PYZ_KEY: base64.b64encode(pyz).decode("ascii")},
    }


def _flatten(docs: list[Any]) -> Iterator[Any]:
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            yield from doc["items"]
        else:
            yield doc


def inject(docs: list[Any], options: Options) -> tuple[list[Any], list[str]]:
    """Inject into every manifest of `docs` (changed in place); the documents to write and the log.

    The ConfigMaps come last: one per namespace of an injected workload, or, where the input already
    holds one of that name and namespace (the output of an earlier run), that one brought up to date.
    """
    log: list[str] = []
    namespaces: list[str | None] = []
    for doc in _flatten(docs):
        kind = doc.get("kind") if isinstance(doc, dict) else None
        where = f"{str(kind).lower()}/{_dig(doc, ('metadata', 'name'))}"
        for spec in pod_specs(doc):
            if inject_pod(spec, options, where, log):
                namespace = _dig(doc, ("metadata", "namespace"))
                if namespace not in namespaces:
                    namespaces.append(namespace)
    if not namespaces:
        log.append("no inference container found: nothing injected (--container NAME picks one)")
    for namespace in namespaces:
        wanted = configmap(options.configmap, namespace, options.pyz)
        existing = [
            doc
            for doc in _flatten(docs)
            if isinstance(doc, dict)
            and doc.get("kind") == "ConfigMap"
            and _dig(doc, ("metadata", "name")) == options.configmap
            and _dig(doc, ("metadata", "namespace")) == namespace
        ]
        if existing:
            existing[0].clear()
            existing[0].update(wanted)
        else:
            docs.append(wanted)
    return docs, log


# --- reading and writing manifests


def _is_json(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def read_documents(text: str) -> tuple[str, list[Any]]:
    """("json" or "yaml", the documents). InjectError when the text is neither."""
    if _is_json(text):
        decoder = json.JSONDecoder()
        docs: list[Any] = []
        pos = 0
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                return "json", docs
            try:
                doc, pos = decoder.raw_decode(text, pos)
            except ValueError as exc:
                raise InjectError(f"the input is not valid JSON: {exc}") from None
            docs.extend(doc if isinstance(doc, list) else [doc])
    try:
        import yaml
    except ImportError:
        raise InjectError(
            "YAML input needs PyYAML: pip install 'stallprobe[kube]' (JSON input works without it)"
        ) from None
    try:
        return "yaml", [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise InjectError(f"the input is not valid YAML: {str(exc).splitlines()[0]}") from None


def write_documents(form: str, docs: list[Any], out: TextIO) -> None:
    if form == "json":
        # One JSON object: the document itself when there is one, else a List that kubectl applies.
        whole = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": list(_flatten(docs))}
        out.write(json.dumps(whole, indent=2) + "\n")
        return
    import yaml

    # Wide lines: a folded `-c` program or URL reads worse and diffs worse than a long line.
    out.write(yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, explicit_start=True, width=4096))


# --- the command

DESCRIPTION = """\
usage: stallprobe inject [-f FILE] [options]

Put the stallprobe exec liveness probe into Kubernetes manifests (YAML or JSON): the manifests go to
stdout, what changed to stderr. The engine flags are the probe's, written into the probe it adds."""


def help_text() -> str:
    return "\n".join(
        [
            DESCRIPTION,
            "",
            "options:",
            *help_lines(INJECT, environment=False),
            "",
            "exit codes: 0 written; 2 usage error",
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


def main(argv: Sequence[str]) -> int:
    """`stallprobe inject ...`: the manifests to stdout, the log to stderr; the exit code."""
    values = parse(argv, INJECT)
    if isinstance(values, str):
        print(help_text() if values == "help" else f"stallprobe {__version__}")
        return 0
    pyz_path = values.text("pyz")
    if pyz_path is not None:
        pyz = _read(pyz_path, "--pyz", binary=True)
        assert isinstance(pyz, bytes)
    else:
        from .pyz import build

        pyz = build(values.text("python"))
    filename = values.text("filename") or "-"
    text = sys.stdin.read() if filename == "-" else _read(filename, "-f", binary=False)
    assert isinstance(text, str)
    form, docs = read_documents(text)
    engine = values.text("engine")
    options = Options(
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
    )
    docs, log = inject(docs, options)
    write_documents(form, docs, sys.stdout)
    for line in log:
        print(f"stallprobe inject: {line}", file=sys.stderr)
    return 0
