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

import argparse
import base64
import json
import math
import sys

from . import __version__
from .cli import _num
from .detector import DEFAULT_WINDOW
from .errors import StallprobeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any, TextIO

__all__ = ["InjectError", "inject", "main"]

PYZ_DIR = "/opt/stallprobe"
PYZ_KEY = "stallprobe.pyz"
PYZ_PATH = f"{PYZ_DIR}/{PYZ_KEY}"
STATE_DIR = "/run/stallprobe"
VOLUME = "stallprobe"
STATE_VOLUME = "stallprobe-state"
# How an engine is recognized in a container's image or command line, and the port it listens on when
# the command does not say (vLLM's, SGLang's and llama-server's own defaults).
ENGINES = (
    ("vllm", ("vllm",), 8000),
    ("sglang", ("sglang",), 30000),
    ("llamacpp", ("llama.cpp", "llama-cpp", "llamacpp", "llama_cpp", "llama-server"), 8080),
)
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


class InjectError(StallprobeError):
    """The input or a flag cannot be used; the message says why."""


class Options:
    __slots__ = (
        "configmap",
        "container",
        "engine",
        "failure",
        "force",
        "period",
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
        timeout: float = 3.0,
        period: int = 10,
        failure: int = 3,
        force: bool = False,
        state_volume: bool = False,
        pyz: bytes = b"",
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
    for name, hints, _ in ENGINES:
        if any(hint in haystack for hint in hints):
            return name
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
    return next((default for name, _, default in ENGINES if name == engine), 8000)


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
    command = ["python3", "-I", "-S", PYZ_PATH, "--url", f"http://127.0.0.1:{port}/metrics"]
    command += ["--window", _num(options.window), "--timeout", _num(options.timeout)]
    if engine is not None:
        command += ["--engine", engine]
    if state_volume:
        command += ["--state-file", f"{STATE_DIR}/probe.state"]
    probe: dict[str, Any] = {"exec": {"command": command}}
    delay = _dig(old, ("initialDelaySeconds",))
    if isinstance(delay, int):  # model loading: keep the operator's delay (a startupProbe is better)
        probe["initialDelaySeconds"] = delay
    probe["periodSeconds"] = options.period
    # Above the probe's own deadline, with room for the interpreter's start on a starved CPU.
    probe["timeoutSeconds"] = math.ceil(options.timeout) + 2
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
            f"({engine or 'engine from the page'}, port {port}); a wedged engine is restarted about {_num(lives)} s "
            f"after its last progress (window {_num(options.window)} s + period {options.period} s x "
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

    out.write(yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, explicit_start=True))


# --- the command


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stallprobe inject",
        description="Put the stallprobe exec liveness probe into Kubernetes manifests (YAML or JSON).",
        epilog="exit codes: 0 written; 2 usage error or input that is not YAML/JSON manifests",
    )
    parser.add_argument("-f", "--filename", default="-", help="the manifests (default: stdin)")
    parser.add_argument("--container", help="inject into the container of this name only")
    parser.add_argument(
        "--engine", choices=[name for name, _, _ in ENGINES], help="the engine (default: from the image)"
    )
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW, help="the probe's --window, seconds (120)")
    parser.add_argument("--timeout", type=float, default=3.0, help="the probe's --timeout, seconds (3)")
    parser.add_argument("--period", type=int, default=10, help="periodSeconds (10)")
    parser.add_argument("--failure-threshold", type=int, default=3, help="failureThreshold (3)")
    parser.add_argument("--force", action="store_true", help="replace any liveness probe, not just /health")
    parser.add_argument("--state-volume", action="store_true", help="keep the state in an emptyDir always")
    parser.add_argument("--configmap", default="stallprobe", help="the ConfigMap's name (stallprobe)")
    parser.add_argument("--pyz", help="a stallprobe.pyz to ship (default: built from this installation)")
    parser.add_argument(
        "--python",
        help="also ship bytecode for this interpreter, the image's Python (e.g. python3.12): ~10 ms less CPU a run",
    )
    return parser


def _validate(args: argparse.Namespace) -> None:
    for flag, value in (("--window", args.window), ("--timeout", args.timeout)):
        if not 0 < value < math.inf:
            raise InjectError(f"{flag} must be a number > 0 (got {value!r})")
    for flag, count in (("--period", args.period), ("--failure-threshold", args.failure_threshold)):
        if count < 1:
            raise InjectError(f"{flag} must be >= 1 (got {count})")
    name = args.configmap
    if not name or len(name) > 253 or not all(ch in "abcdefghijklmnopqrstuvwxyz0123456789-." for ch in name):
        raise InjectError(f"--configmap must be a DNS subdomain name (got {name!r})")


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        _validate(args)
        if args.pyz:
            try:
                with open(args.pyz, "rb") as f:
                    pyz = f.read()
            except OSError as exc:
                raise InjectError(f"--pyz {args.pyz}: {exc.strerror}") from None
        else:
            from .pyz import build

            pyz = build(args.python)
        if args.filename == "-":
            text = sys.stdin.read()
        else:
            try:
                with open(args.filename, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise InjectError(f"-f {args.filename}: {getattr(exc, 'strerror', None) or exc}") from None
        form, docs = read_documents(text)
        options = Options(
            configmap=args.configmap,
            container=args.container,
            engine=args.engine,
            window=args.window,
            timeout=args.timeout,
            period=args.period,
            failure=args.failure_threshold,
            force=args.force,
            state_volume=args.state_volume,
            pyz=pyz,
        )
        docs, log = inject(docs, options)
    except InjectError as exc:
        print(f"stallprobe inject: {exc}", file=sys.stderr)
        return 2
    write_documents(form, docs, sys.stdout)
    for line in log:
        print(f"stallprobe inject: {line}", file=sys.stderr)
    return 0
