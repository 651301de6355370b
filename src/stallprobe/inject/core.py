"""Put the exec liveness probe into manifests already read: decide per container (decide.py), then write
the probe, the startup guard, the readiness probe, the volume and the ConfigMap. One line per decision.

Only what changes is touched: a value equal to the one there is not written again, so a document whose
containers need nothing is reported unchanged and its text goes out as it came in (manifests.py).
"""

from __future__ import annotations

import base64
import hashlib

from .. import __version__
from ..engines import health_route
from ..errors import UsageError
from ..launcher import launcher
from ..options import INJECT, PASSED_ON
from ..report import drain_warning, num
from ..serving import LAUNCHER_KEY, LOOPBACK, PYZ_KEY, REPORT_ONLY_KEY, address
from ..settings import EngineSettings, given_flags
from ..stanza import (
    PYZ_DIR,
    READY_PERIOD,
    STATE_DIR,
    Plan,
    health_readiness_probe,
    liveness_probe,
    probe_command,
    readiness_probe,
    restart_after,
    startup_probe,
)
from ..switches import FALSE_WORDS
from .decide import Choice, Context, Decision, decide, is_ours

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any

__all__ = [
    "InjectConfig",
    "build_digest",
    "configmap",
    "configmap_name",
    "container_fields",
    "inject",
    "owner_of",
    "plan_for",
    "plan_of",
    "state_volume",
    "volume",
]

VOLUME = "stallprobe"
# Kustomize's configMapGenerator suffixes 10 characters of a sha256 too: enough that two builds never
# share a name, short enough to read in `kubectl get configmap`.
HASH_DIGITS = 10
STATE_VOLUME = "stallprobe-state"
# The recommended label that names the install a workload belongs to (a Helm release, an Argo CD app).
INSTANCE = "app.kubernetes.io/instance"
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


class InjectConfig(EngineSettings):
    """Every flag of `stallprobe inject` (the option table's INJECT selection): inject's one configuration.
    The walk reads its choices here, and the stanza's Plan is made from it (plan_of)."""

    OPTIONS = INJECT

    filename: str
    container: str | None
    timeout: float
    api_key_file: str | None
    api_key_env: str | None
    canary: bool
    canary_interval: float
    server_load: bool
    strict: bool
    report_only: bool
    period: int
    failure_threshold: int
    force: bool
    state_volume: bool
    configmap: str | None
    pyz: str | None
    python: str | None
    drain_after: float
    no_ready: bool
    startup_budget: float
    check: bool
    print_probe: bool
    port: int | None
    host_address: str | None
    output: str
    pyz_sha256: str | None

    def verify(self) -> None:
        """inject's rules across its flags: what contradicts, and what one flag needs of another."""
        if self.no_ready and "drain_after" in self.given:
            raise UsageError("--drain-after sets the readiness probe, which --no-ready leaves out: give one of them")
        if self.port is not None and self.container is None and not self.print_probe:
            # One port for every engine in a chart would probe some on a port that is not theirs.
            raise UsageError("--port needs --container NAME: it is the port of the one container it names")
        given = self.host_address
        if given is not None and self.container is None and not self.print_probe:
            raise UsageError("--host-address needs --container NAME: it is the address of the one container it names")
        if given is not None and address(given) is None and not _reference(given):
            raise UsageError(
                f"--host-address must be an IP address, localhost, or $(VAR) naming a variable that holds one "
                f"(got {given!r})"
            )
        if self.pyz_sha256 is not None and self.pyz is None:
            raise UsageError("--pyz-sha256 checks the archive --pyz names: give --pyz FILE too")
        if "output" in self.given and not self.print_probe:
            raise UsageError("--output says how --print-probe prints: give --print-probe too")


def plan_of(config: InjectConfig) -> Plan:
    """The stanza's plan from the configuration: the probe's engine flags that were given, as its command
    line takes them (--window and --engine are always written, so left out here; --report-only goes to
    the liveness probe alone, as the readiness probe, which only moves traffic, acts even then: the
    second stage of a rollout), and the readiness probe unless --no-ready leaves it out (the parser has
    checked the flags against each other: InjectConfig.verify)."""
    return Plan(
        window=config.window,
        timeout=config.timeout,
        period=config.period,
        failure=config.failure_threshold,
        probe_args=given_flags(config, PASSED_ON, leave_out=("--window", "--engine", "--report-only")),
        startup_budget=config.startup_budget,
        drain_after=None if config.no_ready else config.drain_after,
        report_only=config.report_only,
    )


def _reference(text: str) -> bool:
    """Whether `text` is `$(NAME)`: a variable of the container the probe reads at run time."""
    return text.startswith("$(") and text.endswith(")") and text[2:-1].isidentifier()


def build_digest(pyz: bytes) -> str:
    """The sha256 of the build the ConfigMap ships, in hex: its archive, then its launcher (what
    `cat stallprobe.pyz probe | sha256sum` prints, in a pod's /opt/stallprobe)."""
    digest = hashlib.sha256(pyz)
    digest.update(launcher().encode("utf-8"))
    return digest.hexdigest()


def configmap_name(config: InjectConfig, pyz: bytes, owner: str | None = None) -> str:
    """The ConfigMap's name: --configmap's, else `stallprobe-` and the first 10 hex digits of the build's
    sha256 (build_digest: the archive and the launcher), so a new build is a new ConfigMap: the pod template
    that names it changes, the workload rolls, and two builds live side by side in a namespace. With an
    `owner` (owner_of: the Helm release or Argo CD application every workload of the input belongs to),
    `OWNER-stallprobe-HASH`: two releases of one chart in one namespace each own their ConfigMap, where one
    shared name made Helm refuse the second install and a prune of one delete the other's."""
    if config.configmap is not None:
        return config.configmap
    name = f"{VOLUME}-{build_digest(pyz)[:HASH_DIGITS]}"
    return f"{owner}-{name}" if owner else name


def owner_of(docs: list[Any]) -> str | None:
    """The `app.kubernetes.io/instance` label that every workload of the input carries in its metadata, when
    they all carry the same one and it can start a ConfigMap's name (a DNS label: lowercase letters,
    digits and dashes, at most 63); else None. Helm's charts set it to the release's name, Argo CD to its
    application's: what tells two installs of one chart apart in one namespace."""
    owners = set()
    for doc in flatten(docs):
        if not isinstance(doc, dict) or doc.get("kind") not in TEMPLATE_PATHS:
            continue
        labels = _dig(doc, ("metadata", "labels"))
        value = labels.get(INSTANCE) if isinstance(labels, dict) else None
        if not isinstance(value, str) or not _dns_label(value):
            return None
        owners.add(value)
    return owners.pop() if len(owners) == 1 else None


def _dns_label(text: str) -> bool:
    return (
        0 < len(text) <= 63
        and all(ch in "abcdefghijklmnopqrstuvwxyz0123456789-" for ch in text)
        and text[0] != "-"
        and text[-1] != "-"
    )


def _dig(doc: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


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

    def context(self, namespace: Any, labels: dict[str, Any], volumes: Any = None) -> Context:
        """The ConfigMaps of the namespace, the ports of its Services whose selector selects a pod with
        these labels (a Service without a selector selects none), and the pod's `volumes`."""
        ports: list[Any] = []
        for spec in self.services.get(namespace, []):
            selector = spec.get("selector")
            if (
                isinstance(selector, dict)
                and selector
                and all(str(labels.get(k)) == str(v) and k in labels for k, v in selector.items())
            ):
                ports += spec.get("ports") or []
        return Context(self.configmaps.get(namespace, {}), ports, volumes if isinstance(volumes, list) else ())


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


def plan_for(plan: Plan, decision: Decision) -> Plan:
    """The run's plan for one container: with its engine's own window where the decision gives one
    (decide.py, rule 13)."""
    if decision.window is None or decision.window == plan.window:
        return plan
    return Plan(
        window=decision.window,
        timeout=plan.timeout,
        period=plan.period,
        failure=plan.failure,
        probe_args=plan.probe_args,
        startup_budget=plan.startup_budget,
        drain_after=plan.drain_after,
        report_only=plan.report_only,
    )


def container_fields(decision: Decision, plan: Plan, old: Any, state_volume: bool) -> dict[str, Any]:
    """The fields inject writes into one container: liveness, and as the decision says, startup and
    readiness probes; then the volume mounts. The plan is the run's: the container's own is made here."""
    plan = plan_for(plan, decision)
    reached = decision.address or LOOPBACK
    # A key file given to inject is the operator's word for every probe: it wins over what the engine's
    # command says (the probe takes one key).
    key = () if "--api-key-file" in plan.probe_args else decision.key
    command = probe_command(
        decision.port,
        decision.engine,
        plan,
        state_volume=state_volume,
        address=reached,
        python=decision.python or "python3",
        key=key,
    )
    fields: dict[str, Any] = {"livenessProbe": liveness_probe(command, plan, old, termination=decision.termination)}
    if decision.startup:
        fields["startupProbe"] = startup_probe(
            decision.port, decision.engine, reached, plan, decision.python or "python3"
        )
    if decision.readiness in ("added", "replaced", "ours") and plan.drain_after is not None:
        fields["readinessProbe"] = readiness_probe(command, plan)
    mounts = [{"name": VOLUME, "mountPath": PYZ_DIR, "readOnly": True}]
    if state_volume:
        mounts.append({"name": STATE_VOLUME, "mountPath": STATE_DIR})
    fields["volumeMounts"] = mounts
    return fields


def state_volume() -> dict[str, Any]:
    """The pod's volume for the state file where the root filesystem is read-only: an emptyDir, which a
    container restart keeps (a pod's replacement does not), of a size a state file never nears."""
    return {"name": STATE_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}}


def volume(name: str) -> dict[str, Any]:
    """The pod's volume of the build: its name (and the mount path) never change, only the ConfigMap's."""
    return {"name": VOLUME, "configMap": {"name": name, "defaultMode": 0o444}}


def _line(where: str, decision: Decision, plan: Plan, changed: bool, undrained: bool = False) -> str:
    engine = decision.engine or "engine from the page"
    if not changed:
        return f"{where}: already injected, unchanged ({engine}, port {decision.port})"
    verb = "replaced" if decision.liveness in ("replaced", "ours") else "added"
    lives = restart_after(plan)
    source = f"{engine}, port {decision.port} from {decision.port_from}"
    reached = decision.address or LOOPBACK
    if reached.host != LOOPBACK.host:
        source += f", dialled at {reached.host}"
    if plan.report_only:
        head = (
            f"{where}: {verb} the liveness probe, report-only ({source}): it says a wedged engine is stalled "
            f"about {num(plan.window)} s after its last progress (the window) and never fails: nothing is "
            "restarted"
        )
    else:
        head = (
            f"{where}: {verb} the liveness probe ({source}); a wedged engine is restarted about {num(lives)} s "
            f"after its last progress (window {num(plan.window)} s + period {plan.period} s x (failureThreshold "
            f"{plan.failure} - 1))"
        )
    parts = [head]
    if decision.window is not None:
        parts.append(
            f"its window is {num(decision.window)} s, {engine}'s own, as --window does not say: its page shows no "
            "progress while a long request runs (--window sets another, above the longest request)"
        )
    kind, name = decision.enable
    if kind == "arg":
        parts.append(f"turned its metrics on with {name} ({engine} publishes none without it)")
    elif kind == "env":
        parts.append(f"turned its metrics on with {name}=1 ({engine} answers /metrics with 501 without it)")
    if decision.startup:
        route = health_route(decision.engine)
        how = (
            "inside the container, as it binds loopback"
            if reached.kubelet is None
            else f"by the kubelet{' at ' + reached.kubelet if reached.kubelet else ''}"
        )
        parts.append(
            f"added a startupProbe (GET {route} on port {decision.port} {how}; liveness waits up to "
            f"{num(plan.startup_budget)} s for the model to load: --startup-budget)"
        )
    if undrained:
        parts.append(
            f"made the readiness probe inject wrote a plain check of {health_route(decision.engine)} again "
            "(--no-ready: no draining)"
        )
    if decision.readiness == "kept":
        parts.append("kept its own readiness probe (--force replaces it)")
    elif decision.readiness and plan.drain_after is not None:
        stop = plan.drain_after + READY_PERIOD
        restart = "" if plan.report_only else f", the restart comes about {num(lives)} s after it"
        parts.append(
            f"{'added' if decision.readiness == 'added' else 'replaced'} the readiness probe: traffic stops about "
            f"{num(stop)} s after the last progress (drain-after {num(plan.drain_after)} s + period "
            f"{READY_PERIOD} s){restart}"
        )
    return "; ".join([*parts, *decision.notes])


class _Walk:
    """One run over the documents: the configuration, the plan made from it, the ConfigMap's name, and
    what the run learns on the way (the log, the namespaces probed, the ConfigMaps the rewritten volumes
    named before)."""

    def __init__(self, config: InjectConfig, plan: Plan, name: str) -> None:
        self.config = config
        self.plan = plan
        self.name = name
        self.choice = Choice(
            container=config.container,
            engine=None if config.engine == "auto" else config.engine,
            force=config.force,
            drain=plan.drain_after is not None,
            port=config.port,
            host=config.host_address,
            python=config.python,
            window_given="window" in config.given,
        )
        self.log: list[str] = []
        self.namespaces: list[str | None] = []
        self.replaced: set[tuple[str | None, str]] = set()  # (namespace, name) of a ConfigMap no longer named

    def pod(
        self, spec: dict[str, Any], role: str, where: str, namespace: str | None, context: Context | None = None
    ) -> tuple[bool, bool]:
        """Inject into the containers of one pod spec (`context`: what decide reads beside its containers):
        (anything changed, any inference container seen)."""
        probed = changed = seen = False
        needs_state = False
        for container in spec.get("containers") or []:
            if not isinstance(container, dict):
                continue
            decision = decide(container, role, self.choice, context)
            if decision.action == "ignore":
                continue
            seen = True
            label = f"{where}{'' if role == 'pod' else ' ' + role} container {container.get('name', '?')}"
            if decision.action == "skip":
                self.log.append(f"{label}: skipped: {decision.why}")
                continue
            if decision.action == "keep":
                self.log.append(f"{label}: kept its own liveness probe ({decision.why})")
                continue
            own_state = self.config.state_volume or bool(_dig(container, ("securityContext", "readOnlyRootFilesystem")))
            old = container.get("livenessProbe")
            here = False
            if decision.enable[0]:
                _enable_metrics(container, decision.enable)
                here = True
            fields = container_fields(decision, self.plan, old, own_state)
            # --no-ready after a run that drained: the probe inject wrote only asks the health route now.
            undrained = self.plan.drain_after is None and is_ours(container.get("readinessProbe"))
            if undrained:
                fields["readinessProbe"] = health_readiness_probe(
                    decision.port, decision.engine, decision.address or LOOPBACK, decision.python or "python3"
                )
            for key in ("livenessProbe", "startupProbe", "readinessProbe"):
                if key in fields:
                    here = _set(container, key, fields[key]) or here
            mounts = container.setdefault("volumeMounts", [])
            for mount in fields["volumeMounts"]:
                here = _put(mounts, mount) or here
            needs_state = needs_state or own_state
            self.log.append(_line(label, decision, plan_for(self.plan, decision), here, undrained and here))
            probed = True
            changed = changed or here
        if probed:
            volumes = spec.setdefault("volumes", [])
            before = _mounted(volumes)
            if before is not None and before != self.name:
                self.replaced.add((namespace, before))
            changed = _put(volumes, volume(self.name)) or changed
            if needs_state:
                changed = _put(volumes, state_volume()) or changed
            if namespace not in self.namespaces:
                self.namespaces.append(namespace)
        return changed, seen


def _mounted(volumes: Any) -> str | None:
    """The ConfigMap the build's volume names, in a pod's volumes; None without one."""
    for item in volumes if isinstance(volumes, list) else []:
        if isinstance(item, dict) and item.get("name") == VOLUME:
            name = _dig(item, ("configMap", "name"))
            return name if isinstance(name, str) else None
    return None


# What tells the applying tools not to delete a build's ConfigMap once it leaves the manifests: the pods of
# earlier revisions (a rolling update's old ReplicaSet, `kubectl rollout undo`) still mount it, and a pod
# whose ConfigMap is gone never starts. Helm (resource policy), Argo CD (sync option) and Flux
# (kustomize-controller) each read their own; the operator deletes it once nothing mounts it
# (docs/kubernetes.md, Upgrades and roll-backs).
KEEP = (
    ("helm.sh/resource-policy", "keep"),
    ("argocd.argoproj.io/sync-options", "Prune=false"),
    ("kustomize.toolkit.fluxcd.io/prune", "disabled"),
)


def configmap(name: str, namespace: str | None, pyz: bytes) -> dict[str, Any]:
    """The build's ConfigMap: the launcher as text (the file the pod's command runs: a reader of the
    manifest sees what runs), then the archive, in base64; annotated so that no applying tool prunes it
    while earlier revisions may mount it (KEEP)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/name": "stallprobe", "app.kubernetes.io/version": __version__}
    metadata["annotations"] = dict(KEEP)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {LAUNCHER_KEY: launcher()},
        "binaryData": {PYZ_KEY: base64.b64encode(pyz).decode("ascii")},
    }


def flatten(docs: list[Any]) -> Iterator[Any]:
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            yield from doc["items"]
        else:
            yield doc


def _configmaps(docs: list[Any]) -> Iterator[tuple[int, dict[str, Any], str | None, Any]]:
    """Every ConfigMap of the documents: (index of its document, the ConfigMap, namespace, name)."""
    for index, top in enumerate(docs):
        for doc in flatten([top]):
            if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
                yield index, doc, _dig(doc, ("metadata", "namespace")), _dig(doc, ("metadata", "name"))


def _still_named(docs: list[Any]) -> set[tuple[str | None, str]]:
    """(namespace, name) of every ConfigMap a pod template's build volume names, after the walk."""
    named = set()
    for top in docs:
        for doc in flatten([top]):
            for spec, _ in _templates(doc):
                name = _mounted(spec.get("volumes"))
                if name is not None:
                    named.add((_dig(doc, ("metadata", "namespace")), name))
    return named


def _held_switch(
    maps: list[tuple[int, dict[str, Any], str | None, Any]],
    namespace: str | None,
    name: str,
    replaced: set[tuple[str | None, str]],
) -> tuple[str, Any] | None:
    """The kill switch the input's ConfigMaps hold for the probes of `namespace`: (the ConfigMap's name, the
    value of its `report-only` key), from the build's ConfigMap of this name, else from one the rewritten
    volumes named before (a new build: its probes move to a new ConfigMap); None when none holds the key."""
    for own in (True, False):
        for _, doc, ns, held in maps:
            data = doc.get("data")
            value = data.get(REPORT_ONLY_KEY) if isinstance(data, dict) else None
            if ns == namespace and value is not None and (held == name if own else (ns, held) in replaced):
                return str(held), value
    return None


def _kept_switch(name: str, where: str, namespace: str | None, held: str, value: Any) -> str:
    """What inject says of the kill switch it kept: the ConfigMap holds it, the value it holds and what the
    probes make of it (killswitch.py: any word but one read as off is on), and how to take it away."""
    words = str(value).split()
    on = (words[0].lower() if words else "") not in FALSE_WORDS
    came = "kept its report-only key" if held == name else f"kept the report-only key of configmap/{held}"
    if not on:
        return f"configmap/{name}{where}: {came} ({value!r}: off, the liveness probes act)"
    flag = f" -n {namespace}" if namespace is not None else ""
    return (
        f"configmap/{name}{where}: {came} ({value!r}: on): every liveness probe that mounts it stays "
        "report-only and restarts nothing (the kill switch an operator turned on); to let them act again: "
        f'kubectl patch configmap {name}{flag} --type json -p \'[{{"op": "remove", "path": '
        f'"/data/{REPORT_ONLY_KEY}"}}]\''
    )


def _kept_build(old: str, name: str, where: str, namespace: str | None) -> str:
    """What inject says of the earlier build's ConfigMap it keeps beside the new one: who still mounts it,
    and how to delete it once nothing does (docs/kubernetes.md, Upgrades and roll-backs)."""
    flag = f" -n {namespace}" if namespace is not None else ""
    return (
        f"configmap/{old}{where}: kept beside configmap/{name}, the build the probes now mount: the pods of "
        "earlier revisions mount it (a rolling update's old ReplicaSet, `kubectl rollout undo`), and a pod "
        "whose ConfigMap is gone does not start. Once none does, delete it: kubectl delete configmap "
        f"{old}{flag} (docs/kubernetes.md: Upgrades and roll-backs)"
    )


def inject(docs: list[Any], config: InjectConfig, pyz: bytes) -> tuple[list[Any], list[str], set[int]]:
    """Inject into every manifest of `docs` (changed in place) as `config` says, shipping the build `pyz`;
    the documents to write, the log, and the indexes (in the returned list) of the documents that changed.

    The ConfigMaps come last: one per namespace of an injected workload. Where the input already holds
    one of that name and namespace (the output of an earlier run), that one is brought up to date; else
    the new one is added. The build's ConfigMap of an earlier version that the rewritten volumes named is
    kept as it was, beside it, and said: the pods of earlier revisions (a rolling update's old
    ReplicaSet, `kubectl rollout undo`) mount it, and a pod whose ConfigMap is gone never starts, so the
    output must not let an applying tool's prune delete it; the operator deletes it once nothing mounts
    it (docs/kubernetes.md, Upgrades and roll-backs). A `report-only`
    key (the kill switch, which an operator adds in place) that the input's ConfigMap of this build, or
    of the build the probes mounted before, holds is kept in the new one, and said: a re-apply never
    undoes the switch in silence. UsageError when the configuration contradicts itself.
    """
    plan = plan_of(config)
    walk = _Walk(config, plan, configmap_name(config, pyz, owner_of(docs)))
    if plan.drain_after is not None:
        warning = drain_warning(plan.drain_after, plan.window)
        walk.log += [warning] if warning else []
    changed: set[int] = set()
    seen = False
    surroundings = Surroundings(docs)
    for index, top in enumerate(docs):
        for doc in flatten([top]):
            kind = doc.get("kind") if isinstance(doc, dict) else None
            where = f"{str(kind).lower()}/{_dig(doc, ('metadata', 'name'))}"
            if kind not in TEMPLATE_PATHS:
                if kind not in (None, "List") and _has_containers(doc.get("spec") if isinstance(doc, dict) else None):
                    walk.log.append(
                        f"{where}: skipped: kind {kind} is not supported (inject reads {SUPPORTED}); "
                        "its containers were left alone"
                    )
                    seen = True
                continue
            for spec, role, labels in _templates_labelled(doc):
                namespace = _dig(doc, ("metadata", "namespace"))
                context = surroundings.context(namespace, labels, spec.get("volumes"))
                here, any_seen = walk.pod(spec, role, where, namespace, context)
                seen = seen or any_seen
                if here:
                    changed.add(index)
    if not seen:
        walk.log.append("no inference container found: nothing injected (--container NAME picks one)")
    named = _still_named(docs) if walk.replaced else set()
    for namespace in walk.namespaces:
        wanted = configmap(walk.name, namespace, pyz)
        maps = list(_configmaps(docs))
        existing = [(i, doc) for i, doc, ns, name in maps if ns == namespace and name == walk.name]
        stale = [
            (i, doc, name)
            for i, doc, ns, name in maps
            if ns == namespace
            and (ns, name) in walk.replaced
            and (ns, name) not in named
            and isinstance(doc.get("binaryData"), dict)
            and PYZ_KEY in doc["binaryData"]
        ]
        where = f" in namespace {namespace}" if namespace is not None else ""
        # The kill switch an operator turned on in place: a re-apply must not undo it in silence.
        held = _held_switch(maps, namespace, walk.name, walk.replaced)
        if held is not None:
            wanted["data"][REPORT_ONLY_KEY] = held[1]
            walk.log.append(_kept_switch(walk.name, where, namespace, *held))
        for _, _, old in stale:
            walk.log.append(_kept_build(old, walk.name, where, namespace))
        if not existing:
            docs.append(wanted)
            changed.add(len(docs) - 1)
            continue
        index, doc = existing[0]
        if doc != wanted:
            doc.clear()
            doc.update(wanted)
            changed.add(index)
    return docs, walk.log, changed
