"""Put the exec liveness probe into manifests already read: decide per container (decide.py), then write
the probe, the startup guard, the readiness probe, the volume and the ConfigMap. One line per decision.

Only what changes is touched: a value equal to the one there is not written again, so a document whose
containers need nothing is reported unchanged and its text goes out as it came in (manifests.py).
"""

from __future__ import annotations

import base64
import math

from .. import __version__
from ..detector import DEFAULT_WINDOW
from ..engines import DIALECTS
from ..observe import kubelet_timeout
from ..options import DEFAULT_FAILURE_THRESHOLD, DEFAULT_PERIOD, DEFAULT_STARTUP_BUDGET, DEFAULT_TIMEOUT
from ..pyz import launcher
from ..report import num
from .decide import PYZ_KEY, Choice, Context, Decision, decide

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any

__all__ = ["Options", "configmap", "container_fields", "inject", "pod_specs"]

PYZ_DIR = "/opt/stallprobe"
PYZ_PATH = f"{PYZ_DIR}/{PYZ_KEY}"
# The pod runs the archive through `-c`, not as `python3 stallprobe.pyz`: running a zip goes through
# runpy, ~8 ms of CPU a run (a third of the probe's cost) for nothing.
LAUNCHER = launcher(PYZ_PATH)
STATE_DIR = "/run/stallprobe"
VOLUME = "stallprobe"
STATE_VOLUME = "stallprobe-state"
STARTUP_PERIOD = 10
# Readiness is asked often and fails at once: it only moves new requests elsewhere, it restarts nothing.
READY_PERIOD = 5
# Where each workload kind keeps its pod templates' specs, and the role each template plays.
TEMPLATE_PATHS: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "Pod": [(("spec",), "pod")],
    "Deployment": [(("spec", "template", "spec"), "pod")],
    "StatefulSet": [(("spec", "template", "spec"), "pod")],
    "DaemonSet": [(("spec", "template", "spec"), "pod")],
    "ReplicaSet": [(("spec", "template", "spec"), "pod")],
    "Job": [(("spec", "template", "spec"), "pod")],
    "CronJob": [(("spec", "jobTemplate", "spec", "template", "spec"), "pod")],
    "LeaderWorkerSet": [
        (("spec", "leaderWorkerTemplate", "leaderTemplate", "spec"), "leader"),
        (("spec", "leaderWorkerTemplate", "workerTemplate", "spec"), "worker"),
    ],
}
SUPPORTED = ", ".join(TEMPLATE_PATHS)


class Options:
    __slots__ = (
        "configmap",
        "container",
        "drain_after",
        "engine",
        "failure",
        "force",
        "period",
        "port",
        "probe_args",
        "pyz",
        "startup_budget",
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
        startup_budget: float = DEFAULT_STARTUP_BUDGET,
        drain_after: float | None = None,
        port: int | None = None,
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
        self.startup_budget = startup_budget
        self.drain_after = drain_after  # None: no readiness probe
        self.port = port  # the port the engine serves HTTP on, when the manifest does not show it


def _dig(doc: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def pod_specs(doc: Any) -> Iterator[dict[str, Any]]:
    """The pod specs a manifest holds, whatever its kind (none for kinds without pods)."""
    for spec, _ in _templates(doc):
        yield spec


def _templates(doc: Any) -> Iterator[tuple[dict[str, Any], str]]:
    for spec, role, _ in _templates_labelled(doc):
        yield spec, role


def _templates_labelled(doc: Any) -> Iterator[tuple[dict[str, Any], str, dict[str, Any]]]:
    """Each pod template's spec, its role, and its pod's labels (those the manifest gives)."""
    if not isinstance(doc, dict):
        return
    paths = TEMPLATE_PATHS.get(str(doc.get("kind")), [])
    shared = doc.get("kind") == "LeaderWorkerSet" and _dig(doc, paths[0][0]) is None
    for path, role in paths:
        spec = _dig(doc, path)
        labels = _dig(doc, (*path[:-1], "metadata", "labels"))
        if isinstance(spec, dict):
            yield spec, "shared" if shared else role, labels if isinstance(labels, dict) else {}


class Surroundings:
    """What decide reads beside a container, per namespace: the ConfigMaps' data (name to data) and the
    Services (to find those selecting a pod). A document without a namespace is in the one the tool
    applying it picks: the same as another document without one, never the same as a named one."""

    def __init__(self, docs: list[Any]) -> None:
        self.configmaps: dict[Any, dict[str, dict[str, str]]] = {}
        self.services: dict[Any, list[dict[str, Any]]] = {}
        for doc in flatten(docs):
            if not isinstance(doc, dict):
                continue
            namespace = _dig(doc, ("metadata", "namespace"))
            data = doc.get("data")
            if doc.get("kind") == "ConfigMap" and isinstance(data, dict):
                name = str(_dig(doc, ("metadata", "name")))
                self.configmaps.setdefault(namespace, {})[name] = {str(k): str(v) for k, v in data.items()}
            spec = doc.get("spec")
            if doc.get("kind") == "Service" and isinstance(spec, dict):
                self.services.setdefault(namespace, []).append(spec)

    def context(self, namespace: Any, labels: dict[str, Any]) -> Context:
        """The ConfigMaps of the namespace, and the ports of its Services whose selector selects a pod
        with these labels (a Service without a selector selects none)."""
        ports: list[Any] = []
        for spec in self.services.get(namespace, []):
            selector = spec.get("selector")
            if (
                isinstance(selector, dict)
                and selector
                and all(str(labels.get(k)) == str(v) and k in labels for k, v in selector.items())
            ):
                ports += spec.get("ports") or []
        return Context(self.configmaps.get(namespace, {}), ports)


def _has_containers(node: Any, depth: int = 0) -> bool:
    """Whether a document of a kind inject does not know holds containers (a pod template in disguise)."""
    if depth > 12:
        return False
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            return True
        return any(_has_containers(value, depth + 1) for value in node.values())
    if isinstance(node, list):
        return any(_has_containers(item, depth + 1) for item in node)
    return False


def probe_command(port: int, engine: str | None, options: Options, state_volume: bool) -> list[str]:
    command = ["python3", "-I", "-S", "-c", LAUNCHER, "--url", f"http://127.0.0.1:{port}/metrics"]
    command += ["--window", num(options.window), "--timeout", num(options.timeout)]
    if engine is not None:
        command += ["--engine", engine]
    if state_volume:
        command += ["--state-file", f"{STATE_DIR}/probe.state"]
    command += options.probe_args
    return command


def timeout_seconds(options: Options, *, ready: bool = False) -> int:
    """The probe's timeoutSeconds: a readiness run also asks the engine's health route."""
    extra = sum(flag in options.probe_args for flag in ("--canary", "--server-load"))
    return kubelet_timeout(options.timeout, extra + ready)


def liveness_probe(command: list[str], options: Options, old: Any) -> dict[str, Any]:
    probe: dict[str, Any] = {"exec": {"command": command}}
    delay = _dig(old, ("initialDelaySeconds",))
    if isinstance(delay, int):  # model loading: keep the operator's delay (a startupProbe is better)
        probe["initialDelaySeconds"] = delay
    probe["periodSeconds"] = options.period
    probe["timeoutSeconds"] = timeout_seconds(options)
    probe["successThreshold"] = 1
    probe["failureThreshold"] = options.failure
    return probe


def health_route(engine: str | None) -> str:
    return next((d.health_route for d in DIALECTS if d.name == engine), "/health")


def startup_probe(port: int, engine: str | None, loopback: bool, options: Options) -> dict[str, Any]:
    """GET the engine's health route until it answers, for up to the budget. An engine bound to loopback
    (SGLang's and llama.cpp's default) cannot be reached by the kubelet's httpGet, which dials the pod's
    IP: there the same GET runs inside the container."""
    route = health_route(engine)
    probe: dict[str, Any]
    if loopback:
        program = (
            "import sys, urllib.request as u\n"
            f"try: u.urlopen('http://127.0.0.1:{port}{route}', timeout=3)\n"
            "except Exception as e: sys.exit(str(e))"
        )
        probe = {"exec": {"command": ["python3", "-I", "-S", "-c", program]}}
    else:
        probe = {"httpGet": {"path": route, "port": port}}
    probe["periodSeconds"] = STARTUP_PERIOD
    probe["timeoutSeconds"] = 5
    probe["failureThreshold"] = math.ceil(options.startup_budget / STARTUP_PERIOD)
    return probe


def readiness_probe(command: list[str], drain_after: float, options: Options) -> dict[str, Any]:
    return {
        "exec": {"command": [*command, "--ready", "--drain-after", num(drain_after)]},
        "periodSeconds": READY_PERIOD,
        "timeoutSeconds": timeout_seconds(options, ready=True),
        "successThreshold": 1,
        "failureThreshold": 1,
    }


def _put(items: list[Any], entry: dict[str, Any]) -> bool:
    """Add `entry` to a list of named entries, replacing one of the same name in place; whether it changed."""
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("name") == entry["name"]:
            if item == entry:
                return False
            items[i] = entry
            return True
    items.append(entry)
    return True


def _set(mapping: dict[str, Any], key: str, value: Any) -> bool:
    if key in mapping and mapping[key] == value:
        return False
    mapping[key] = value
    return True


def _enable_metrics(container: dict[str, Any], how: tuple[str, str]) -> None:
    kind, name = how
    if kind == "env":
        _put(container.setdefault("env", []), {"name": name, "value": "1"})
    else:
        words = container["args"] if isinstance(container.get("args"), list) else container["command"]
        words.append(name)


def container_fields(decision: Decision, options: Options, old: Any, state_volume: bool) -> dict[str, Any]:
    """The fields inject writes into one container: liveness, and as the decision says, startup and
    readiness probes; then the volume mounts."""
    command = probe_command(decision.port, decision.engine, options, state_volume)
    fields: dict[str, Any] = {"livenessProbe": liveness_probe(command, options, old)}
    if decision.startup:
        fields["startupProbe"] = startup_probe(decision.port, decision.engine, decision.loopback, options)
    if decision.readiness in ("added", "replaced", "ours") and options.drain_after is not None:
        fields["readinessProbe"] = readiness_probe(command, options.drain_after, options)
    mounts = [{"name": VOLUME, "mountPath": PYZ_DIR, "readOnly": True}]
    if state_volume:
        mounts.append({"name": STATE_VOLUME, "mountPath": STATE_DIR})
    fields["volumeMounts"] = mounts
    return fields


def _line(where: str, decision: Decision, options: Options, changed: bool) -> str:
    engine = decision.engine or "engine from the page"
    if not changed:
        return f"{where}: already injected, unchanged ({engine}, port {decision.port})"
    verb = "replaced" if decision.liveness in ("replaced", "ours") else "added"
    lives = options.window + options.period * (options.failure - 1)
    parts = [
        f"{where}: {verb} the liveness probe ({engine}, port {decision.port} from {decision.port_from}); a wedged "
        f"engine is restarted about {num(lives)} s after its last progress (window {num(options.window)} s + "
        f"period {options.period} s x (failureThreshold {options.failure} - 1))"
    ]
    kind, name = decision.enable
    if kind == "arg":
        parts.append(f"turned its metrics on with {name} ({engine} publishes none without it)")
    elif kind == "env":
        parts.append(f"turned its metrics on with {name}=1 ({engine} answers /metrics with 501 without it)")
    if decision.startup:
        route = health_route(decision.engine)
        how = "inside the container, as it binds loopback" if decision.loopback else "by the kubelet"
        parts.append(
            f"added a startupProbe (GET {route} on port {decision.port} {how}; liveness waits up to "
            f"{num(options.startup_budget)} s for the model to load: --startup-budget)"
        )
    if decision.readiness == "kept":
        parts.append("kept its own readiness probe (--force replaces it)")
    elif decision.readiness and options.drain_after is not None:
        stop = options.drain_after + READY_PERIOD
        parts.append(
            f"{'added' if decision.readiness == 'added' else 'replaced'} the readiness probe: traffic stops about "
            f"{num(stop)} s after the last progress (drain-after {num(options.drain_after)} s + period "
            f"{READY_PERIOD} s), the restart comes about {num(lives)} s after it"
        )
    return "; ".join(parts)


def inject_pod(
    spec: dict[str, Any], role: str, options: Options, where: str, log: list[str], *, context: Context | None = None
) -> tuple[bool, bool, bool]:
    """Inject into the containers of one pod spec: (any container probed, anything changed, any seen)."""
    choice = Choice(
        container=options.container,
        engine=options.engine,
        force=options.force,
        drain=options.drain_after is not None,
        port=options.port,
    )
    probed = changed = seen = False
    needs_state = False
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        decision = decide(container, role, choice, context)
        if decision.action == "ignore":
            continue
        seen = True
        label = f"{where}{'' if role == 'pod' else ' ' + role} container {container.get('name', '?')}"
        if decision.action == "skip":
            log.append(f"{label}: skipped: {decision.why}")
            continue
        if decision.action == "keep":
            log.append(f"{label}: kept its own liveness probe ({decision.why})")
            continue
        state_volume = options.state_volume or bool(_dig(container, ("securityContext", "readOnlyRootFilesystem")))
        old = container.get("livenessProbe")
        here = False
        if decision.enable[0]:
            _enable_metrics(container, decision.enable)
            here = True
        fields = container_fields(decision, options, old, state_volume)
        for key in ("livenessProbe", "startupProbe", "readinessProbe"):
            if key in fields:
                here = _set(container, key, fields[key]) or here
        mounts = container.setdefault("volumeMounts", [])
        for mount in fields["volumeMounts"]:
            here = _put(mounts, mount) or here
        needs_state = needs_state or state_volume
        log.append(_line(label, decision, options, here))
        probed = True
        changed = changed or here
    if probed:
        volumes = spec.setdefault("volumes", [])
        changed = (
            _put(volumes, {"name": VOLUME, "configMap": {"name": options.configmap, "defaultMode": 0o444}}) or changed
        )
        if needs_state:
            changed = _put(volumes, {"name": STATE_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}}) or changed
    return probed, changed, seen


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


def flatten(docs: list[Any]) -> Iterator[Any]:
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            yield from doc["items"]
        else:
            yield doc


def inject(docs: list[Any], options: Options) -> tuple[list[Any], list[str], set[int]]:
    """Inject into every manifest of `docs` (changed in place); the documents to write, the log, and the
    indexes (in the returned list) of the documents that changed.

    The ConfigMaps come last: one per namespace of an injected workload, or, where the input already
    holds one of that name and namespace (the output of an earlier run), that one brought up to date.
    """
    log: list[str] = []
    namespaces: list[str | None] = []
    changed: set[int] = set()
    seen = False
    surroundings = Surroundings(docs)
    for index, top in enumerate(docs):
        for doc in flatten([top]):
            kind = doc.get("kind") if isinstance(doc, dict) else None
            where = f"{str(kind).lower()}/{_dig(doc, ('metadata', 'name'))}"
            if kind not in TEMPLATE_PATHS:
                if kind not in (None, "List") and _has_containers(doc.get("spec") if isinstance(doc, dict) else None):
                    log.append(
                        f"{where}: skipped: kind {kind} is not supported (inject reads {SUPPORTED}); "
                        "its containers were left alone"
                    )
                    seen = True
                continue
            for spec, role, labels in _templates_labelled(doc):
                context = surroundings.context(_dig(doc, ("metadata", "namespace")), labels)
                probed, here, any_seen = inject_pod(spec, role, options, where, log, context=context)
                seen = seen or any_seen
                if here:
                    changed.add(index)
                if probed:
                    namespace = _dig(doc, ("metadata", "namespace"))
                    if namespace not in namespaces:
                        namespaces.append(namespace)
    if not seen:
        log.append("no inference container found: nothing injected (--container NAME picks one)")
    for namespace in namespaces:
        wanted = configmap(options.configmap, namespace, options.pyz)
        existing = [
            (i, doc)
            for i, top in enumerate(docs)
            for doc in flatten([top])
            if isinstance(doc, dict)
            and doc.get("kind") == "ConfigMap"
            and _dig(doc, ("metadata", "name")) == options.configmap
            and _dig(doc, ("metadata", "namespace")) == namespace
        ]
        if existing:
            index, doc = existing[0]
            if doc != wanted:
                doc.clear()
                doc.update(wanted)
                changed.add(index)
        else:
            docs.append(wanted)
            changed.add(len(docs) - 1)
    return docs, log, changed
