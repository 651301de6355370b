"""Put the exec liveness probe into manifests already read: decide per container (decide.py), then write
the probe, the startup guard, the readiness probe, the volume and the ConfigMap. One line per decision.

Only what changes is touched: a value equal to the one there is not written again, so a document whose
containers need nothing is reported unchanged and its text goes out as it came in (manifests.py).
"""

from __future__ import annotations

import base64

from .. import __version__
from ..report import drain_warning, num
from ..stanza import (
    PYZ_DIR,
    PYZ_KEY,
    READY_PERIOD,
    STATE_DIR,
    Plan,
    health_route,
    liveness_probe,
    probe_command,
    readiness_probe,
    restart_after,
    startup_probe,
)
from .decide import Choice, Decision, decide

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any

__all__ = ["Options", "configmap", "container_fields", "inject", "pod_specs"]

VOLUME = "stallprobe"
STATE_VOLUME = "stallprobe-state"
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


class Options(Plan):
    """inject's settings: the stanza's plan, and where and how to write it."""

    __slots__ = ("configmap", "container", "engine", "force", "pyz", "state_volume")

    def __init__(
        self,
        *,
        configmap: str = "stallprobe",
        container: str | None = None,
        engine: str | None = None,
        force: bool = False,
        state_volume: bool = False,
        pyz: bytes = b"",
        **plan: Any,
    ) -> None:
        super().__init__(**plan)
        self.configmap = configmap
        self.container = container
        self.engine = engine
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
    for spec, _ in _templates(doc):
        yield spec


def _templates(doc: Any) -> Iterator[tuple[dict[str, Any], str]]:
    if not isinstance(doc, dict):
        return
    paths = TEMPLATE_PATHS.get(str(doc.get("kind")), [])
    shared = doc.get("kind") == "LeaderWorkerSet" and _dig(doc, paths[0][0]) is None
    for path, role in paths:
        spec = _dig(doc, path)
        if isinstance(spec, dict):
            yield spec, "shared" if shared else role


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
    command = probe_command(decision.port, decision.engine, options, state_volume=state_volume)
    fields: dict[str, Any] = {"livenessProbe": liveness_probe(command, options, old)}
    if decision.startup:
        fields["startupProbe"] = startup_probe(decision.port, decision.engine, decision.loopback, options)
    if decision.readiness in ("added", "replaced", "ours") and options.drain_after is not None:
        fields["readinessProbe"] = readiness_probe(command, options)
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
    lives = restart_after(options)
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
    spec: dict[str, Any], role: str, options: Options, where: str, log: list[str]
) -> tuple[bool, bool, bool]:
    """Inject into the containers of one pod spec: (any container probed, anything changed, any seen)."""
    choice = Choice(
        container=options.container, engine=options.engine, force=options.force, drain=options.drain_after is not None
    )
    probed = changed = seen = False
    needs_state = False
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        decision = decide(container, role, choice)
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
    if options.drain_after is not None:
        warning = drain_warning(options.drain_after, options.window)
        log += [warning] if warning else []
    namespaces: list[str | None] = []
    changed: set[int] = set()
    seen = False
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
            for spec, role in _templates(doc):
                probed, here, any_seen = inject_pod(spec, role, options, where, log)
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
