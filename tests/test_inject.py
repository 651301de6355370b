"""`stallprobe inject`: manifests in, manifests out, each one valid for Kubernetes, and the probe it writes
run exactly as the kubelet would run it."""

from __future__ import annotations

import base64
import copy
import difflib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from conftest import REPO, clean_env, configmap_volume, rewind, run_inject, validate
from stallprobe.errors import ExitCode
from stallprobe.inject import LAUNCHER_PATH, Choice, InjectConfig, decide, engine_of, inject, read_documents
from stallprobe.inject.core import TEMPLATE_PATHS
from stallprobe.inject.manifests import MAX_BYTES, MAX_DEPTH, MAX_NODES, NO_RUAMEL
from stallprobe.inject.shell import k8s_expand
from stallprobe.launcher import launcher
from stallprobe.serving import TERMINATION_LOG
from stallprobe.settings import parse
from stallprobe.stanza import PYZ_DIR
from stubengine import StubEngine


def container(name: str = "vllm", image: str = "vllm/vllm-openai:v0.11.0", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, **extra}


def pod_spec(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"containers": list(containers)}


def template(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "llm"}}, "spec": spec}


def workload(kind: str, spec: dict[str, Any], namespace: str | None = "inference") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"llm-{kind.lower()}"}
    if namespace:
        metadata["namespace"] = namespace
    selector = {"matchLabels": {"app": "llm"}}
    body: dict[str, Any]
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    if kind == "Job":
        spec = {**spec, "restartPolicy": "Never"}
        body = {"template": template(spec)}
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": metadata, "spec": body}
    if kind == "CronJob":
        spec = {**spec, "restartPolicy": "Never"}
        body = {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template(spec)}}}
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": metadata, "spec": body}
    if kind == "LeaderWorkerSet":
        body = {
            "leaderWorkerTemplate": {
                "size": 2,
                "leaderTemplate": template(spec),
                "workerTemplate": template(copy.deepcopy(spec)),
            }
        }
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": kind, "metadata": metadata, "spec": body}
    body = {"selector": selector, "template": template(spec)}
    if kind == "StatefulSet":
        body["serviceName"] = "llm"
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": metadata, "spec": body}


def probe_of(doc: dict[str, Any], path: tuple[str, ...] = ("spec", "template", "spec")) -> dict[str, Any]:
    spec: Any = doc
    for key in path:
        spec = spec[key]
    probe = spec["containers"][0]["livenessProbe"]
    assert isinstance(probe, dict)
    return probe


def pod_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The pod specs a manifest holds, where inject's TEMPLATE_PATHS say each kind keeps them."""
    for path, _ in TEMPLATE_PATHS.get(str(doc.get("kind")), []):
        spec: Any = doc
        for key in path:
            spec = spec.get(key) if isinstance(spec, dict) else None
        if isinstance(spec, dict):
            yield spec


KINDS = ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod", "LeaderWorkerSet"]


# The flags only the liveness probe carries: where a failing run leaves its evidence (the container's
# termination message file, Kubernetes' default here), and the kill switch's file.
LIVENESS_ONLY = ["--termination-log", "/dev/termination-log", "--report-only-file", "/opt/stallprobe/report-only"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_workload_kind_gets_the_probe_and_stays_valid(kind: str) -> None:
    docs = [workload(kind, pod_spec(container(args=["--port", "8000"])))]
    out, log, _ = inject(docs, InjectConfig(), b"PK")
    assert [d["kind"] for d in out] == [kind, "ConfigMap"]
    for doc in out:
        validate(doc)
    specs = list(pod_specs(out[0]))
    # A LeaderWorkerSet's worker joins the leader's engine and serves no HTTP: skipped, and said so.
    worker = kind == "LeaderWorkerSet"
    assert len(specs) == 1 + worker
    assert ["livenessProbe" in spec["containers"][0] for spec in specs] == [True] + [False] * worker
    assert ["skipped: a LeaderWorkerSet worker" in line for line in log] == [False] + [True] * worker
    specs = specs[:1]
    for spec in specs:
        assert spec["containers"][0]["startupProbe"]["httpGet"] == {"path": "/health", "port": 8000}
        probe = spec["containers"][0]["livenessProbe"]
        # What runs: the launcher the ConfigMap mounts beside the archive, not a program on the command line.
        assert probe["exec"]["command"][:6] == [
            "python3",
            "-I",
            "-S",
            "/opt/stallprobe/probe",
            "--url",
            "http://127.0.0.1:8000/metrics",
        ]
        # Liveness alone leaves evidence for the kubelet and reads the kill switch.
        live, liveness_only = probe["exec"]["command"][:-4], probe["exec"]["command"][-4:]
        assert liveness_only == LIVENESS_ONLY
        ready = spec["containers"][0]["readinessProbe"]  # by default: drained after --drain-after 30
        assert ready["exec"]["command"] == [*live, "--ready", "--drain-after", "30"]
        # The build's ConfigMap is named by its content: a new build rolls the workload.
        name = build_name(b"PK")
        assert {"name": "stallprobe", "configMap": {"name": name, "defaultMode": 0o444}} in spec["volumes"]
    assert out[-1]["metadata"]["name"] == name
    assert len(log) == (2 if kind == "LeaderWorkerSet" else 1)


@pytest.mark.parametrize(
    ("entry", "engine", "port"),
    [
        (container(args=["--model", "m", "--port", "9000"]), "vllm", 9000),
        (container(image="registry/custom:1", command=["vllm", "serve", "m", "--port=9001"]), "vllm", 9001),
        (
            container(image="registry/custom:1", command=["python3", "-m", "vllm.entrypoints.openai.api_server"]),
            "vllm",
            8000,
        ),
        (container(image="lmsysorg/sglang:v0.5", command=["python3", "-m", "sglang.launch_server"]), "sglang", 30000),
        (
            container(image="ghcr.io/ggml-org/llama.cpp:full", args=["--server", "-m", "/m.gguf", "--port", "8081"]),
            "llamacpp",
            8081,
        ),
        (  # llama.cpp's server image has no python3, which the probe runs with: skipped
            container(image="ghcr.io/ggml-org/llama.cpp:server", args=["-m", "/m.gguf", "--port", "8081"]),
            "llamacpp",
            0,
        ),
        (  # llama.cpp (C++) in an image inject does not know to have a python3: skipped
            container(image="me/llm:1", command=["llama-server", "--metrics"], ports=[{"containerPort": 7000}]),
            "llamacpp",
            0,
        ),
        (  # a script the manifest does not show, in the container --container names: its port named http
            container(
                command=["/start.sh"],
                ports=[{"name": "grpc", "containerPort": 9999}, {"name": "http", "containerPort": 8888}],
            ),
            "vllm",
            8888,
        ),
        (  # the image's entrypoint runs vLLM, on its default 8000 here: a port named http elsewhere is not it
            container(ports=[{"name": "grpc", "containerPort": 9999}, {"name": "http", "containerPort": 8888}]),
            "vllm",
            0,
        ),
        (container(image="python:3.12-slim", ports=[{"containerPort": 80}]), None, 80),
        (container(image="nginx:1.27", ports=[{"containerPort": 80}]), None, 0),  # no python3 inject knows of
        (container(args=["--port", "\u00b2"]), "vllm", 0),  # not a port: skipped, never guessed
    ],
)
def test_engine_and_port_are_read_from_the_container(entry: dict[str, Any], engine: str | None, port: int) -> None:
    assert engine_of(entry) == engine
    decision = decide(entry, "pod", Choice(container=entry["name"], engine=engine))
    assert (decision.action, decision.port) == ("probe", port) if port else decision.action == "skip"


def test_only_inference_containers_are_touched() -> None:
    spec = pod_spec(container(), container(name="sidecar", image="envoyproxy/envoy:v1"))
    out, _, _ = inject([workload("Deployment", spec)], InjectConfig(), b"")
    sidecar = out[0]["spec"]["template"]["spec"]["containers"][1]
    assert sidecar == container(name="sidecar", image="envoyproxy/envoy:v1")


def test_the_probe_targets_the_engine_never_a_proxy_sidecar_holding_the_services_port() -> None:
    """An auth proxy in the engine's pod holds the port its Service targets; --engine names the probe's
    dialect, not the containers: the proxy is never probed, even when its upstream names vLLM."""
    proxy = container(
        name="auth",
        image="quay.io/oauth2-proxy/oauth2-proxy:v7.6.0",
        args=["--http-address=0.0.0.0:4180", "--upstream=http://vllm.inference.svc:8000"],
        ports=[{"name": "http", "containerPort": 4180}],
    )
    envoy = container(name="envoy", image="envoyproxy/envoy:v1", ports=[{"name": "http", "containerPort": 8443}])
    engine = container(args=["--model", "m"], ports=[{"name": "api", "containerPort": 8000}])
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "llm", "namespace": "inference"},
        "spec": {"selector": {"app": "llm"}, "ports": [{"name": "http", "port": 443, "targetPort": "http"}]},
    }
    out, log, _ = inject(
        [workload("Deployment", pod_spec(proxy, envoy, engine)), service], InjectConfig(engine="vllm"), b""
    )
    auth, side, vllm = out[0]["spec"]["template"]["spec"]["containers"]
    assert (auth, side) == (proxy, envoy)  # not a byte added
    assert "http://127.0.0.1:8000/metrics" in vllm["livenessProbe"]["exec"]["command"]
    assert vllm["startupProbe"]["httpGet"]["port"] == 8000
    assert log[0] == (
        "deployment/llm-deployment container auth: skipped: its port is not proven: its image "
        "quay.io/oauth2-proxy/oauth2-proxy:v7.6.0 runs an entrypoint the manifest does not show (--container auth "
        "--port N settles it)"
    )
    assert "container vllm: added the liveness probe (vllm, port 8000 from its containerPort)" in log[1]


@pytest.mark.parametrize(
    ("service", "port"),
    [
        ({"metadata": {"name": "s", "namespace": "inference"}, "spec": {"selector": {"app": "llm"}}}, 8000),
        ({"metadata": {"name": "s", "namespace": "elsewhere"}, "spec": {"selector": {"app": "llm"}}}, 0),
        ({"metadata": {"name": "s", "namespace": "inference"}, "spec": {"selector": {"app": "other"}}}, 0),
        ({"metadata": {"name": "s", "namespace": "inference"}, "spec": {"selector": {"tier": "llm"}}}, 0),
        ({"metadata": {"name": "s", "namespace": "inference"}, "spec": {"selector": {}}}, 0),
        ({"metadata": {"name": "s", "namespace": "inference"}, "spec": {}}, 0),
        ({"metadata": {"name": "s", "namespace": "inference"}, "spec": "x"}, 0),
    ],
    ids=["selects it", "another namespace", "another app", "a label it lacks", "empty selector", "none", "bad"],
)
def test_a_service_names_the_http_port_only_of_pods_it_selects(service: dict[str, Any], port: int) -> None:
    """A wrapper script with two unnamed ports: a Service port named http, targeting one of them by name,
    says which serves HTTP, when it is in the pod's namespace and its selector selects the pod."""
    ports = [{"name": "engine", "containerPort": 8000}, {"name": "kv", "containerPort": 5557}]
    engine = container(command=["bash", "/start.sh"], ports=ports)
    spec = service["spec"]
    if isinstance(spec, dict):
        spec["ports"] = [{"name": "http", "port": 80, "targetPort": "engine"}]
    doc = {"apiVersion": "v1", "kind": "Service", **service}
    out, log, _ = inject([workload("Deployment", pod_spec(engine)), doc], InjectConfig(container="vllm"), b"")
    probed = out[0]["spec"]["template"]["spec"]["containers"][0]
    if port:
        assert f"http://127.0.0.1:{port}/metrics" in probed["livenessProbe"]["exec"]["command"]
    else:
        assert "livenessProbe" not in probed
        assert "none of its containerPorts (8000, 5557) is named for HTTP" in log[0]


def test_configmaps_are_read_from_the_workloads_namespace_only() -> None:
    engine = container(args=["--port", "$(PORT)"], envFrom=[{"configMapRef": {"name": "cfg"}}])

    def configmap(namespace: str | None, port: str) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": "cfg"}
        if namespace:
            metadata["namespace"] = namespace
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"PORT": port}}

    for namespace, configmaps, port in [
        ("inference", [configmap("other", "1"), configmap("inference", "8123")], 8123),
        (None, [configmap("inference", "1"), configmap(None, "8124")], 8124),
        ("inference", [configmap(None, "1")], 0),
    ]:
        docs = [workload("Deployment", pod_spec(copy.deepcopy(engine)), namespace=namespace), *configmaps]
        out, log, _ = inject(docs, InjectConfig(), b"")
        probed = out[0]["spec"]["template"]["spec"]["containers"][0]
        if port:
            assert f"http://127.0.0.1:{port}/metrics" in probed["livenessProbe"]["exec"]["command"]
        else:
            assert "PORT may come from its envFrom ConfigMap cfg, which is not in the input" in log[0]


def test_container_flag_picks_one_by_name() -> None:
    spec = pod_spec(
        container(name="engine", image="my/own:1", args=["--port", "8000"]),
        container(name="other", image="vllm/vllm-openai"),
    )
    out, _, _ = inject([workload("Deployment", spec)], InjectConfig(container="engine", engine="vllm"), b"")
    containers = out[0]["spec"]["template"]["spec"]["containers"]
    assert "livenessProbe" in containers[0]
    assert "livenessProbe" not in containers[1]


HEALTH = {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10, "initialDelaySeconds": 600}
CUSTOM = {"exec": {"command": ["/bin/check-engine"]}, "periodSeconds": 30}


def test_a_plain_health_check_is_replaced_keeping_its_initial_delay() -> None:
    spec = pod_spec(container(livenessProbe=HEALTH, readinessProbe=HEALTH, startupProbe=HEALTH))
    out, log, _ = inject([workload("Deployment", spec)], InjectConfig(), b"")
    c = out[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["livenessProbe"]["initialDelaySeconds"] == 600
    assert c["livenessProbe"]["timeoutSeconds"] == 6  # above --timeout 3 and the 1 s question whether it is paused
    assert c["startupProbe"] == HEALTH  # never touched
    assert c["readinessProbe"]["exec"]["command"][-3:] == ["--ready", "--drain-after", "30"]  # a plain check too
    assert "replaced the liveness probe" in log[0]
    assert "replaced the readiness probe: traffic stops about 35 s after the last progress" in log[0]
    assert "restarted about 140 s after its last progress" in log[0]


def test_the_operators_own_liveness_probe_wins_unless_forced() -> None:
    doc = workload("Deployment", pod_spec(container(livenessProbe=CUSTOM)))
    out, log, _ = inject([copy.deepcopy(doc)], InjectConfig(), b"")
    assert out == [doc]  # nothing injected, so no ConfigMap either
    assert "kept its own liveness probe" in log[0]
    forced, _, _ = inject([copy.deepcopy(doc)], InjectConfig(force=True), b"")
    assert probe_of(forced[0])["exec"]["command"][3] == LAUNCHER_PATH


def test_read_only_root_gets_an_emptydir_for_the_state() -> None:
    entry = container(securityContext={"readOnlyRootFilesystem": True})
    out, _, _ = inject([workload("StatefulSet", pod_spec(entry))], InjectConfig(), b"")
    spec = out[0]["spec"]["template"]["spec"]
    assert probe_of(out[0])["exec"]["command"][-6:-4] == ["--state-file", "/run/stallprobe/probe.state"]
    assert {"name": "stallprobe-state", "emptyDir": {"sizeLimit": "1Mi"}} in spec["volumes"]
    assert {"name": "stallprobe-state", "mountPath": "/run/stallprobe"} in spec["containers"][0]["volumeMounts"]
    validate(out[0])


def test_timing_flags_reach_the_probe_and_the_report() -> None:
    config = InjectConfig(window=300.0, timeout=4.5, period=15, failure_threshold=5, engine="sglang")
    entry = container(
        image="lmsysorg/sglang:v0.5",
        command=["python3", "-m", "sglang.launch_server", "--enable-metrics", "--port", "30000"],
    )
    out, log, _ = inject([workload("Deployment", pod_spec(entry))], config, b"")
    probe = probe_of(out[0])
    assert probe["exec"]["command"][6:-4] == ["--window", "300", "--timeout", "4.5", "--engine", "sglang"]
    assert (probe["periodSeconds"], probe["timeoutSeconds"], probe["failureThreshold"]) == (15, 8, 5)
    assert (
        "restarted about 360 s after its last progress (window 300 s + period 15 s x (failureThreshold 5 - 1))"
        in log[0]
    )


def test_one_configmap_per_namespace_last_and_other_documents_kept_in_order() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llm"}, "spec": {"ports": [{"port": 80}]}}
    docs = [
        workload("Deployment", pod_spec(container()), "team-a"),
        service,
        workload("Pod", pod_spec(container()), "team-b"),
        workload("DaemonSet", pod_spec(container()), "team-a"),
    ]
    out, _, _ = inject(docs, InjectConfig(configmap="probe-build"), b"zip bytes")
    assert [d["kind"] for d in out] == ["Deployment", "Service", "Pod", "DaemonSet", "ConfigMap", "ConfigMap"]
    assert out[1] == service
    maps = out[4:]
    assert [(m["metadata"]["name"], m["metadata"]["namespace"]) for m in maps] == [
        ("probe-build", "team-a"),
        ("probe-build", "team-b"),
    ]
    assert base64.b64decode(maps[0]["binaryData"]["stallprobe.pyz"]) == b"zip bytes"
    assert out[0]["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == "probe-build"


MANIFEST = yaml.safe_dump_all(
    [workload("Deployment", pod_spec(container(livenessProbe=HEALTH))), workload("Pod", pod_spec(container(name="x")))],
    sort_keys=False,
)


def test_the_command_is_idempotent_in_yaml() -> None:
    first = run_inject(MANIFEST)
    assert first.returncode == 0, first.stderr
    second = run_inject(first.stdout)
    assert second.returncode == 0
    assert second.stdout == first.stdout
    docs = list(yaml.safe_load_all(first.stdout))
    assert [d["kind"] for d in docs] == ["Deployment", "Pod", "ConfigMap"]
    for doc in docs:
        validate(doc)
    archive = zipfile.ZipFile(io.BytesIO(base64.b64decode(docs[-1]["binaryData"]["stallprobe.pyz"])))
    assert "stallprobe/cli.py" in archive.namelist()
    assert first.stderr.count("stallprobe inject: ") == 2


def test_json_in_json_out_and_idempotent() -> None:
    doc = workload("Deployment", pod_spec(container()))
    first = run_inject(json.dumps(doc))
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert (out["kind"], [d["kind"] for d in out["items"]]) == ("List", ["Deployment", "ConfigMap"])
    for item in out["items"]:
        validate(item)
    assert run_inject(first.stdout).stdout == first.stdout


def test_without_ruamel_inject_injects_json_and_says_why_not_yaml() -> None:
    """Where ruamel.yaml is missing (a `pip install --no-deps`; -I -S here keeps site-packages off the
    path, the package itself on it): JSON works, YAML says what it needs in one line."""
    program = f"import sys; sys.path.insert(0, {str(REPO / 'src')!r}); from stallprobe.cli import run; run()"
    command = [sys.executable, "-I", "-S", "-c", program, "inject", "--pyz", os.devnull]
    doc = json.dumps(workload("Pod", pod_spec(container())))
    ok = subprocess.run(command, input=doc, capture_output=True, text=True, check=False, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["kind"] == "List"
    no = subprocess.run(command, input=MANIFEST, capture_output=True, text=True, check=False, timeout=60)
    assert (no.returncode, no.stdout) == (2, "")
    assert no.stderr == f"stallprobe inject: {NO_RUAMEL}\n"


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        ("{not json", [], "the input is not valid JSON"),
        ("a: [unclosed", [], "the input is not valid YAML"),
        (MANIFEST, ["--window", "0"], "--window must be a number > 0"),
        (MANIFEST, ["--period", "0"], "--period must be a whole number >= 1"),
        (MANIFEST, ["--configmap", "Bad_Name"], "--configmap must be a DNS subdomain name"),
        (MANIFEST, ["--configmap", "caf\u00e9"], "--configmap must be a DNS subdomain name"),
        (MANIFEST, ["-f", "/nonexistent.yaml"], "-f /nonexistent.yaml: No such file or directory"),
    ],
)
def test_bad_input_is_a_one_line_usage_error(text: str, args: list[str], message: str) -> None:
    result = run_inject(text, *args)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"stallprobe inject: {message}")
    assert result.stderr.count("\n") == 1


def test_nothing_to_inject_is_said() -> None:
    result = run_inject(yaml.safe_dump({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}))
    assert result.returncode == 0
    assert [d["kind"] for d in yaml.safe_load_all(result.stdout)] == ["Service"]
    assert "no inference container found" in result.stderr


# Written by hand in styles no dumper picks: indented by 4 with the dash at the key's column, flow lists
# and mappings, comments everywhere (above the first document, between documents, on and in the probe).
HAND_WRITTEN = """\
# A comment block above the first document,
# two lines long.
apiVersion: v1
kind: Service
metadata: {name: llm}
---
# between the documents
apiVersion: apps/v1
kind: Deployment
metadata:
    name: llm
spec:
    selector: {matchLabels: {app: llm}}
    template:
        metadata: {labels: {app: llm}}
        spec:
            containers:
            -   name: sglang   # the engine
                image: lmsysorg/sglang:v0.5
                command: ["python3", "-m", "sglang.launch_server"]
                args: ["--port", "30000", '--host', "0.0.0.0"]
                livenessProbe:   # on the probe's key
                    # inside the probe
                    httpGet:
                        path: /health   # at the path
                        port: 30000
                    periodSeconds: 5
                volumeMounts:
                -   {name: cache, mountPath: /cache}
            volumes:
            -   {name: cache, emptyDir: {}}
# after everything
"""


def build_name(build: bytes) -> str:
    """The ConfigMap name a build gets: `stallprobe-` and 10 hex digits of the sha256 of what it ships, the
    archive and then its launcher."""
    return "stallprobe-" + hashlib.sha256(build + launcher().encode()).hexdigest()[:10]


# The ConfigMap of an empty build (--pyz /dev/null): named by its content, as every build's is.
EMPTY = build_name(b"")


def test_a_changed_document_keeps_every_line_inject_does_not_change() -> None:
    done = run_inject(HAND_WRITTEN, "--pyz", os.devnull)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # Lines only come in, but for the probe inject replaces and the flow list it appends to.
    before, after = HAND_WRITTEN.splitlines(), out.splitlines()
    start, end = (
        before.index("                livenessProbe:   # on the probe's key"),
        before.index("                volumeMounts:"),
    )
    changing = {*range(start, end), before.index('                args: ["--port", "30000", \'--host\', "0.0.0.0"]')}
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        assert tag in ("equal", "insert") or set(range(i1, i2)) <= changing, (tag, before[i1:i2])
    # The replaced probe's comments, above the probe that replaces it, at its indentation.
    assert (
        "                # on the probe's key\n                # inside the probe\n                # at the path\n"
        "                livenessProbe:\n                    exec:\n"
    ) in out
    # What is appended is written as the list it joins is: a flow list, flow mappings, quotes.
    assert '                args: ["--port", "30000", \'--host\', "0.0.0.0", "--enable-metrics"]\n' in out
    assert "                -   {name: stallprobe, mountPath: /opt/stallprobe, readOnly: true}\n" in out
    assert (
        f"            -   {{name: stallprobe, configMap: {{name: {EMPTY}, defaultMode: 292}}}}\n# after everything\n"
        in out
    )
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["Service", "Deployment", "ConfigMap"]
    for doc in docs:
        validate(doc)
    assert run_inject(out, "--pyz", os.devnull).stdout == out


def test_crlf_and_a_missing_last_newline_stay_as_they_were() -> None:
    text = (
        "apiVersion: v1\r\nkind: Pod\r\nmetadata:\r\n  name: p\r\nspec:\r\n  containers:\r\n  - name: vllm\r\n"
        '    image: vllm/vllm-openai:v0.11.0\r\n    args: ["--port", "8000"]'
    )
    done = subprocess.run(
        [sys.executable, "-m", "stallprobe", "inject", "--pyz", os.devnull],
        input=text.encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert out.startswith(text + "\r\n    livenessProbe:\r\n")
    assert "\n" not in out.replace("\r\n", "")  # every line ends as the input's do
    for doc in yaml.safe_load_all(out):
        validate(doc)


def test_what_cannot_be_changed_in_place_is_written_whole_and_right() -> None:
    """A merge key (`<<`) makes the container's keys differ from its text's: that container is written
    out whole, merged, and the rest of the document keeps its lines."""
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p  # the pod\nspec:\n  containers:\n"
        "  - <<: {image: 'vllm/vllm-openai:v0.11.0'}\n    name: vllm\n    args: [--port, '8000']\n"
    )
    done = run_inject(text, "--pyz", os.devnull)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p  # the pod\nspec:\n")
    pod = next(yaml.safe_load_all(done.stdout))
    validate(pod)
    container = pod["spec"]["containers"][0]
    assert (container["image"], container["args"]) == ("vllm/vllm-openai:v0.11.0", ["--port", "8000"])
    assert "http://127.0.0.1:8000/metrics" in container["livenessProbe"]["exec"]["command"]


def test_the_deploy_example_is_what_inject_makes_of_it() -> None:
    before = (REPO / "deploy" / "examples" / "vllm-deployment.yaml").read_text()
    after = list(yaml.safe_load_all((REPO / "deploy" / "examples" / "vllm-deployment.injected.yaml").read_text()))
    result = run_inject(before)
    assert result.returncode == 0, result.stderr
    made = list(yaml.safe_load_all(result.stdout))
    assert made[-1]["kind"] == "ConfigMap"
    # The example names the ConfigMap of the build it was made with; each build has its own name.
    name = made[-1]["metadata"]["name"]
    shown = after[0]["spec"]["template"]["spec"]["volumes"][0]["configMap"]
    assert re.fullmatch(r"stallprobe-[0-9a-f]{10}", shown["name"])
    shown["name"] = name
    assert made[:-1] == after
    # What docs/kubernetes.md says inject says of it.
    said = (REPO / "docs" / "kubernetes.md").read_text().split("stallprobe inject: deployment/vllm-llama")[1]
    assert result.stderr == "stallprobe inject: deployment/vllm-llama" + said.split("\n")[0] + "\n"
    for doc in made:
        validate(doc)


# --- the injected command, run as the kubelet runs it


def test_the_injected_command_as_the_kubelet_runs_it(served: StubEngine, tmp_path: Path) -> None:
    manifest = workload("Deployment", pod_spec(container(args=["--port", str(served.port)])))
    result = run_inject(json.dumps(manifest), "--window", "1")
    assert result.returncode == 0, result.stderr
    deployment, configmap = json.loads(result.stdout)["items"]
    probe = probe_of(deployment)
    command = as_the_kubelet_runs(probe, configmap, tmp_path)
    env = clean_env(TMPDIR=str(tmp_path))

    def kubelet() -> tuple[int, str]:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=probe["timeoutSeconds"], check=False
        )
        return done.returncode, done.stdout

    served.set(4, 100, 50)
    assert kubelet()[0] == 0  # baseline
    served.set(4, 180, 50)
    code, line = kubelet()
    assert (code, line[:12]) == (0, "progressing:")
    [state] = tmp_path.glob("stallprobe-*.state")  # the probe's own file, in TMPDIR
    rewind(state, 1.2)  # the counters stop for longer than the window
    code, line = kubelet()
    assert (code, line[:8]) == (1, "stalled:")
    served.set(4, 181, 50)
    assert kubelet()[0] == 0


def as_the_kubelet_runs(
    probe: dict[str, Any], configmap: dict[str, Any], tmp_path: Path, env: list[dict[str, Any]] | None = None
) -> list[str]:
    """An exec probe's command as it runs in the pod: the ConfigMap's files where its volume mounts them
    (an update of the ConfigMap updates them in place, as the kubelet does), this interpreter for the
    image's, and `$(VAR)` expanded as the kubelet expands it in a probe's command
    (kubecontainer.ExpandContainerCommandOnlyStatic: the container's `env` by name, a valueFrom one to
    nothing; `$$` to `$`)."""
    files: dict[str, bytes | str] = dict(configmap.get("data") or {})
    files.update({key: base64.b64decode(value) for key, value in configmap["binaryData"].items()})
    mount = configmap_volume(tmp_path / "opt" / "stallprobe", files)
    # The default termination message file, which the kubelet makes empty and mounts at /dev/termination-log.
    termination = tmp_path / "dev-termination-log"
    termination.touch()
    static = {str(var["name"]): str(var.get("value", "")) for var in env or []}
    return [
        sys.executable
        if word == "python3"
        else str(termination)
        if word == TERMINATION_LOG
        else k8s_expand(word.replace(PYZ_DIR, str(mount)), static)
        for word in probe["exec"]["command"]
    ]


def injected(engine: dict[str, Any], *flags: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The engine's container as inject writes it, the build's ConfigMap, and what inject said."""
    result = run_inject(json.dumps(workload("Deployment", pod_spec(engine))), "--window", "1", *flags)
    assert result.returncode == 0, result.stderr
    deployment, configmap = json.loads(result.stdout)["items"]
    return deployment["spec"]["template"]["spec"]["containers"][0], configmap, result.stderr


def test_the_kill_switch_turns_liveness_report_only_between_two_runs_and_readiness_never(
    served: StubEngine, tmp_path: Path
) -> None:
    """The kill switch, as an operator throws it: `kubectl patch configmap NAME --type merge -p
    '{"data":{"report-only":"true"}}'`. The kubelet updates the mounted ConfigMap in place (no rollout,
    no model reloaded), and the next liveness run of the same stalled engine is report-only: exit 0,
    saying so, where the run before failed it. The readiness probe reads no switch: it still drains the
    stalled engine. Removing the key lets liveness act again."""
    fields, configmap, _ = injected(container(args=["--port", str(served.port)]), "--drain-after", "1")
    liveness = as_the_kubelet_runs(fields["livenessProbe"], configmap, tmp_path)
    readiness = as_the_kubelet_runs(fields["readinessProbe"], configmap, tmp_path)
    switch = str(tmp_path / "opt" / "stallprobe" / "report-only")
    assert liveness[liveness.index("--report-only-file") + 1] == switch
    assert "--report-only-file" not in readiness
    assert "--termination-log" not in readiness
    log = tmp_path / "container.log"  # a stand-in for PID 1's stdout, where the transition lines go
    log.touch()
    env = clean_env(TMPDIR=str(tmp_path), STALLPROBE_TRANSITION_LOG=str(log))

    def kubelet(command: list[str]) -> tuple[int, str]:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=10, check=False)
        return done.returncode, done.stdout

    def patch(data: dict[str, str]) -> None:
        """The ConfigMap as kubectl patch leaves it, and its volume as the kubelet then updates it."""
        configmap["data"] = data
        as_the_kubelet_runs(fields["livenessProbe"], configmap, tmp_path)

    served.set(4, 100, 50)
    assert kubelet(liveness)[0] == 0  # baseline
    [state] = tmp_path.glob("stallprobe-*.state")
    rewind(state, 1.5)  # busy, and no counter moved for longer than the window (1 s)
    code, line = kubelet(liveness)
    assert (code, line[:8]) == (1, "stalled:")
    patch({**configmap["data"], "report-only": "true"})
    assert Path(switch).read_text() == "true"
    code, line = kubelet(liveness)
    assert code == 0, line
    assert line.startswith("stalled:")
    assert line.rstrip().endswith("report-only: exit 0, not 1")
    code, line = kubelet(readiness)  # readiness keeps draining the stalled engine
    assert (code, line[:10]) == (1, "not ready:")
    patch({key: value for key, value in configmap["data"].items() if key != "report-only"})
    assert not Path(switch).exists()
    assert kubelet(liveness)[0] == 1
    assert "stallprobe: liveness: stalled:" in log.read_text()


def test_a_failing_liveness_run_leaves_its_evidence_where_the_container_says(
    served: StubEngine, tmp_path: Path
) -> None:
    """The probe writes its evidence into the container's own terminationMessagePath (which inject never
    changes), there being where the kubelet reads the message when the container ends, a liveness kill
    included. A path with a `$` in it reaches the probe as written: the kubelet expands `$(VAR)` in a
    probe's command, so inject writes each `$` as `$$`."""
    path = tmp_path / "termination-$(HOME).log"
    path.touch()  # the kubelet makes it and mounts it there
    engine = container(args=["--port", str(served.port)], terminationMessagePath=str(path))
    fields, configmap, _ = injected(engine)
    assert fields["terminationMessagePath"] == str(path)
    written = fields["livenessProbe"]["exec"]["command"]
    assert written[written.index("--termination-log") + 1] == str(path).replace("$", "$$")
    home = [{"name": "HOME", "value": "/root"}]  # a variable the kubelet would expand, were it not escaped
    command = as_the_kubelet_runs(fields["livenessProbe"], configmap, tmp_path, home)
    assert command[command.index("--termination-log") + 1] == str(path)
    env = clean_env(TMPDIR=str(tmp_path), STALLPROBE_TRANSITION_LOG="none")
    served.set(4, 100, 50)
    assert subprocess.run(command, env=env, capture_output=True, timeout=10, check=False).returncode == 0
    [state] = tmp_path.glob("stallprobe-*.state")
    rewind(state, 1.5)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=10, check=False)
    assert done.returncode == 1, done
    message = path.read_text()
    assert done.stdout.strip() in message  # the line the kubelet's event shows, kept past the event
    assert not (tmp_path / "dev-termination-log").read_text()  # nothing at the default path


@pytest.mark.parametrize(
    ("host", "bound", "dialled"),
    [("::1", "::1", "[::1]"), ("::", "::1", "[::1]"), ("127.0.0.2", "127.0.0.2", "127.0.0.2")],
)
def test_the_probe_and_its_startup_guard_dial_where_the_engine_binds(
    host: str, bound: str, dialled: str, tmp_path: Path
) -> None:
    """An engine bound to ::1 (or to `::`, which asyncio makes IPv6 only) or to another loopback address
    refuses 127.0.0.1: the probe and the startup guard, run inside the container, dial where it binds."""
    with StubEngine("sglang", host=bound) as stub:
        engine = container(
            image="lmsysorg/sglang:v0.5",
            command=["python3", "-m", "sglang.launch_server", "--enable-metrics"],
            args=["--host", host, "--port", str(stub.port)],
        )
        fields, configmap, said = injected(engine)
        assert f"dialled at {dialled}" in said
        command = as_the_kubelet_runs(fields["livenessProbe"], configmap, tmp_path)
        assert f"http://{dialled}:{stub.port}/metrics" in command
        guard = [sys.executable, *fields["startupProbe"]["exec"]["command"][1:]]
        assert f"http://{dialled}:{stub.port}/health" in guard[-1]
        env = clean_env(TMPDIR=str(tmp_path))
        assert subprocess.run(guard, env=env, capture_output=True, timeout=10, check=False).returncode == 0
        stub.set(4, 100, 50)
        first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=10, check=False)
        assert (first.returncode, first.stdout[:9]) == (0, "baseline:"), first
        stub.set(4, 180, 50)
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=10, check=False)
        assert (second.returncode, second.stdout[:12]) == (0, "progressing:"), second
        # Where it does not listen, the same probe is refused: what inject wrote before.
        loopback = [word.replace(f"http://{dialled}:", "http://127.0.0.1:") for word in command]
        refused = subprocess.run(loopback, env=env, capture_output=True, text=True, timeout=10, check=False)
        assert refused.returncode == 3, refused


def test_the_probe_reads_the_pods_ip_from_its_environment_at_run_time(tmp_path: Path) -> None:
    """`--host $(POD_IP)`, POD_IP from status.podIP: the kubelet expands a valueFrom variable in an exec
    probe's command to nothing, so the probe's URL is written `$$(POD_IP)`, reaches the probe as
    `$(POD_IP)`, and the probe reads it from the container's environment."""
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    with StubEngine(host="127.0.0.2") as stub:
        engine = container(args=["--host", "$(POD_IP)", "--port", str(stub.port)], env=[pod_ip])
        fields, configmap, _ = injected(engine)
        assert f"http://$$(POD_IP):{stub.port}/metrics" in fields["livenessProbe"]["exec"]["command"]
        command = as_the_kubelet_runs(fields["livenessProbe"], configmap, tmp_path, [pod_ip])
        assert f"http://$(POD_IP):{stub.port}/metrics" in command
        assert fields["startupProbe"]["httpGet"] == {"path": "/health", "port": stub.port}  # at the pod's IP
        env = clean_env(TMPDIR=str(tmp_path), POD_IP="127.0.0.2")
        stub.set(4, 100, 50)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=10, check=False)
        assert (done.returncode, done.stdout[:9]) == (0, "baseline:"), done


def test_the_probe_reads_the_key_from_the_variable_the_engine_takes_it_from(tmp_path: Path) -> None:
    """llama.cpp started with `--api-key $(API_KEY)`, API_KEY from a Secret: the probe gets
    `--api-key-env API_KEY` (never the key) and sends it, where without it every run is a 401."""
    key = {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "llm", "key": "api-key"}}}
    with StubEngine("llamacpp") as stub:
        stub.key = "sk-inject-test"
        engine = container(
            name="llama",
            image="ghcr.io/ggml-org/llama.cpp:full",
            args=["--server", "--metrics", "--port", str(stub.port), "--api-key", "$(API_KEY)"],
            env=[key],
        )
        fields, configmap, _ = injected(engine)
        command = as_the_kubelet_runs(fields["livenessProbe"], configmap, tmp_path)
        assert command[command.index("--api-key-env") + 1] == "API_KEY"
        env = clean_env(TMPDIR=str(tmp_path), API_KEY=stub.key)
        stub.set(1, 100, 50)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=10, check=False)
        assert (done.returncode, done.stdout[:9]) == (0, "baseline:"), done


def test_read_documents_accepts_a_stream_of_json_objects() -> None:
    read = read_documents('{"kind": "A"}\n{"kind": "B"} [{"kind": "C"}]')
    assert (read.form, [d["kind"] for d in read.docs]) == ("json", ["A", "B", "C"])


def test_the_probes_new_flags_are_carried_through_and_the_timeout_covers_them() -> None:
    """--canary, --server-load and --api-key-file reach the probe; each extra exchange raises timeoutSeconds."""
    manifest = json.dumps(workload("Deployment", pod_spec(container(args=["--port", "8000"]))))
    key = "/var/run/secrets/vllm/api-key"
    result = run_inject(manifest, "--canary", "--canary-interval", "300", "--api-key-file", key)
    assert result.returncode == 0, result.stderr
    deployment = json.loads(result.stdout)["items"][0]
    probe = probe_of(deployment)
    command = probe["exec"]["command"]
    assert command[command.index("--api-key-file") + 1] == key
    assert command[command.index("--canary-interval") + 1] == "300"
    assert "--canary" in command
    # The scrape and the canary under --timeout 3 each, and 1 s for /is_paused: 7 s, plus the start.
    assert probe["timeoutSeconds"] == 9


def test_the_docs_give_the_input_limits_the_code_has() -> None:
    readme = (REPO / "docs" / "kubernetes.md").read_text()
    assert f"larger than {MAX_BYTES // (1024 * 1024)} MiB" in readme
    assert f"nested deeper than {MAX_DEPTH} levels" in readme
    assert MAX_NODES == 1_000_000
    assert "expand past a million\nnodes" in readme
    assert "exits 6 when a run would change something" in readme
    assert ExitCode.CHANGES == 6


# --- the build's ConfigMap, named by its content


def names_of(docs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(the ConfigMaps the build's volumes name, the ConfigMaps' names), in document order."""
    volumes = [
        volume["configMap"]["name"]
        for doc in docs
        for spec in pod_specs(doc)
        for volume in spec.get("volumes", [])
        if volume["name"] == "stallprobe"
    ]
    maps = [doc["metadata"]["name"] for doc in docs if doc["kind"] == "ConfigMap"]
    return volumes, maps


def test_the_configmap_ships_the_launcher_as_text_and_is_named_by_both_files(tmp_path: Path) -> None:
    """The ConfigMap holds the launcher as text (what the pod's command runs, for anyone reading it) beside
    the archive; its name is the sha256 of the two files, as docs/kubernetes.md says a pod can check it
    (`cat stallprobe.pyz probe | sha256sum`, in the folder the volume mounts)."""
    out, _, _ = inject([workload("Deployment", pod_spec(container()))], InjectConfig(), b"PK-build")
    configmap = out[-1]
    assert configmap["data"] == {"probe": launcher()}
    assert list(configmap) == ["apiVersion", "kind", "metadata", "data", "binaryData"]  # the text before the blob
    files = {
        "probe": configmap["data"]["probe"],
        "stallprobe.pyz": base64.b64decode(configmap["binaryData"]["stallprobe.pyz"]),
    }
    mount = configmap_volume(tmp_path / "opt" / "stallprobe", files)
    digest = hashlib.sha256((mount / "stallprobe.pyz").read_bytes() + (mount / "probe").read_bytes()).hexdigest()
    assert configmap["metadata"]["name"] == f"stallprobe-{digest[:10]}"
    assert "`cat stallprobe.pyz probe | sha256sum`" in (REPO / "docs" / "kubernetes.md").read_text()


def test_an_earlier_releases_c_program_is_replaced_and_its_configmap_kept() -> None:
    """What an earlier release wrote (`python3 -I -S -c "<a launcher naming the archive>"`, and a ConfigMap
    holding the archive alone) is ours: a run rewrites both probes to run the launcher, and adds the new
    build's ConfigMap (launcher and archive) beside the earlier one, which the old ReplicaSet's pods and a
    roll-back still mount."""
    earlier = (REPO / "tests" / "fixtures" / "inject-golden" / "inputs" / "earlier-release.injected.yaml").read_text()
    old = next(yaml.safe_load_all(earlier))["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    built = f"kind: ConfigMap\napiVersion: v1\nmetadata: {{name: {old}, namespace: inference}}\n"
    done = run_inject(f"{earlier}---\n{built}binaryData: {{stallprobe.pyz: UEs=}}\n", "--pyz", os.devnull)
    assert done.returncode == 0, done.stderr
    deployment, _, earlier_map, configmap = yaml.safe_load_all(done.stdout)  # the Service between them
    for probe in ("livenessProbe", "readinessProbe"):
        command = deployment["spec"]["template"]["spec"]["containers"][0][probe]["exec"]["command"]
        assert command[:4] == ["python3", "-I", "-S", LAUNCHER_PATH]
        assert "-c" not in command
    assert (configmap["metadata"]["name"], configmap["data"]) == (EMPTY, {"probe": launcher()})
    assert earlier_map == yaml.safe_load(f"{built}binaryData: {{stallprobe.pyz: UEs=}}\n")
    assert f"configmap/{old} in namespace inference: kept beside configmap/{EMPTY}" in done.stderr
    assert "replaced the liveness probe" in done.stderr


def test_a_rerun_keeps_the_kill_switch_an_operator_turned_on_and_says_so() -> None:
    """An operator turned the kill switch on in place; the manifests fetched back (or kept with the key)
    are injected again: the key stays in the ConfigMap, whether the build is the same or a new one (its
    probes move to a new ConfigMap, which takes the key), and stderr says so and how to take it away. A
    switch said off is kept too, and said off."""
    first = run_inject(json.dumps(workload("Deployment", pod_spec(container()))), "--pyz", os.devnull)
    assert first.returncode == 0, first.stderr
    deployment, configmap = json.loads(first.stdout)["items"]
    configmap["data"]["report-only"] = "true"  # kubectl patch ... -p '{"data":{"report-only":"true"}}'
    again = run_inject(json.dumps([deployment, configmap]), "--pyz", os.devnull)
    assert again.returncode == 0, again.stderr
    kept = json.loads(again.stdout)["items"][-1]
    assert kept == configmap
    said = again.stderr.splitlines()[-1]
    assert said == (
        f"stallprobe inject: configmap/{EMPTY} in namespace inference: kept its report-only key ('true': on): "
        "every liveness probe that mounts it stays report-only and restarts nothing (the kill switch an "
        "operator turned on); to let them act again: kubectl patch configmap "
        f'{EMPTY} -n inference --type json -p \'[{{"op": "remove", "path": "/data/report-only"}}]\''
    )
    build = REPO / "tests" / "fixtures" / "inject-golden" / "fixed.pyz"
    newer = run_inject(json.dumps([deployment, configmap]), "--pyz", str(build))
    assert newer.returncode == 0, newer.stderr
    items = json.loads(newer.stdout)["items"]
    assert [item["kind"] for item in items] == ["Deployment", "ConfigMap", "ConfigMap"]  # the old one kept
    assert items[1] == configmap
    assert items[-1]["metadata"]["name"] != EMPTY
    assert items[-1]["data"]["report-only"] == "true"
    assert f"kept the report-only key of configmap/{EMPTY} ('true': on)" in newer.stderr
    configmap["data"]["report-only"] = "false"
    off = run_inject(json.dumps([deployment, configmap]), "--pyz", os.devnull)
    assert json.loads(off.stdout)["items"][-1]["data"]["report-only"] == "false"
    assert off.stderr.splitlines()[-1].endswith("kept its report-only key ('false': off, the liveness probes act)")


def test_the_configmap_is_mounted_whole_so_the_switch_reaches_running_pods() -> None:
    """A ConfigMap volume updates its files in place, but only when mounted whole: a subPath mount never
    updates, and a volume listing its `items` never shows a key added later (the kill switch). A volume or
    mount of the build that says either is written whole again."""
    entry = container(volumeMounts=[{"name": "stallprobe", "mountPath": "/opt/stallprobe/probe", "subPath": "probe"}])
    spec = pod_spec(entry)
    spec["volumes"] = [{"name": "stallprobe", "configMap": {"name": "x", "items": [{"key": "probe", "path": "probe"}]}}]
    out, _, _ = inject([workload("Deployment", spec)], InjectConfig(), b"PK")
    spec = out[0]["spec"]["template"]["spec"]
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": "stallprobe", "mountPath": "/opt/stallprobe", "readOnly": True}
    ]
    assert spec["volumes"] == [{"name": "stallprobe", "configMap": {"name": build_name(b"PK"), "defaultMode": 0o444}}]


def test_a_new_build_is_a_new_configmap_and_rolls_the_workload() -> None:
    """The pod template names the build's ConfigMap by its content: a new build changes the template (the
    Deployment rolls), the probe's command stays as it was, and the old ConfigMap stays beside the new one
    (the old ReplicaSet's pods and `kubectl rollout undo` mount it), said with how to delete it."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llm", "namespace": "inference"}}
    first, _, _ = inject([workload("Deployment", pod_spec(container())), service], InjectConfig(), b"one")
    one, two = (build_name(build) for build in (b"one", b"two"))
    assert names_of(first) == ([one], [one])
    command = copy.deepcopy(probe_of(first[0])["exec"]["command"])
    second, log, changed = inject(copy.deepcopy(first), InjectConfig(), b"two")
    assert [doc["kind"] for doc in second] == ["Deployment", "Service", "ConfigMap", "ConfigMap"]
    assert names_of(second) == ([two], [one, two])
    assert changed == {0, 3}
    assert second[2] == first[2]
    assert base64.b64decode(second[3]["binaryData"]["stallprobe.pyz"]) == b"two"
    assert probe_of(second[0])["exec"]["command"] == command  # only the volume's configMap.name moved
    assert log[-1] == (
        f"configmap/{one} in namespace inference: kept beside configmap/{two}, the build the probes now mount: "
        "the pods of earlier revisions mount it (a rolling update's old ReplicaSet, `kubectl rollout undo`), and "
        "a pod whose ConfigMap is gone does not start. Once none does, delete it: kubectl delete configmap "
        f"{one} -n inference (docs/kubernetes.md: Upgrades and roll-backs)"
    )
    again, log, changed = inject(copy.deepcopy(second), InjectConfig(), b"two")
    assert (again, changed) == (second, set())
    assert not any(line.startswith("configmap/") for line in log)  # said once, at the upgrade
    again, log, changed = inject(copy.deepcopy(second), InjectConfig(), b"two")
    assert (again, changed) == (second, set())
    assert "already injected, unchanged" in log[0]


def test_the_fixed_name_of_earlier_versions_is_brought_to_the_new_one() -> None:
    """What an earlier inject wrote, a volume naming the ConfigMap `stallprobe` and that ConfigMap, becomes
    the new build's name; `--configmap stallprobe` keeps the fixed name."""
    earlier, _, _ = inject([workload("Deployment", pod_spec(container()))], InjectConfig(configmap="stallprobe"), b"v1")
    assert names_of(earlier) == (["stallprobe"], ["stallprobe"])
    kept, _, changed = inject(copy.deepcopy(earlier), InjectConfig(configmap="stallprobe"), b"v1")
    assert (kept, changed) == (earlier, set())
    moved, _, _ = inject(copy.deepcopy(earlier), InjectConfig(), b"v2")
    name = build_name(b"v2")
    assert names_of(moved) == ([name], ["stallprobe", name])
    for doc in moved:
        validate(doc)


def released(doc: dict[str, Any], release: str | None, name: str | None = None) -> dict[str, Any]:
    """`doc` as a release of its chart renders it: its metadata labelled app.kubernetes.io/instance (when
    `release` is given), and renamed after the release (`name`)."""
    doc = copy.deepcopy(doc)
    if release is not None:
        doc["metadata"].setdefault("labels", {})["app.kubernetes.io/instance"] = release
    if name is not None:
        doc["metadata"]["name"] = name
    return doc


def test_two_releases_of_one_chart_in_one_namespace_each_own_their_build_s_configmap() -> None:
    """Two installs of one chart (Helm releases, or Argo CD applications) in one namespace: each names the
    build's ConfigMap after itself, so neither renders an object the other owns (Helm refuses a second
    install that would, and a prune of one would delete the other's); injecting its own output changes
    nothing."""
    chart = [workload("Deployment", pod_spec(container())), workload("StatefulSet", pod_spec(container()))]
    build = build_name(b"v1")
    outputs = {}
    for release in ("llama", "qwen"):
        docs = [released(doc, release, f"{release}-{doc['metadata']['name']}") for doc in chart]
        outputs[release], _, _ = inject(docs, InjectConfig(), b"v1")
        assert names_of(outputs[release]) == ([f"{release}-{build}"] * 2, [f"{release}-{build}"])
        again, _, changed = inject(copy.deepcopy(outputs[release]), InjectConfig(), b"v1")
        assert (again, changed) == (outputs[release], set())
        for doc in outputs[release]:
            validate(doc)
    # --configmap still names it outright.
    fixed, _, _ = inject([released(chart[0], "llama")], InjectConfig(configmap="probe-build"), b"v1")
    assert names_of(fixed) == (["probe-build"], ["probe-build"])


@pytest.mark.parametrize(
    ("releases", "owned"),
    [
        (["llama", "llama"], True),
        (["llama", "qwen"], False),  # two installs in one input: no one owner
        (["llama", None], False),  # a workload that says of no install
        (["Llama", "Llama"], False),  # not a DNS label: no name can start with it
        (["llama_3", "llama_3"], False),
        (["-llama", "-llama"], False),
        (["x" * 63, "x" * 63], True),
        (["x" * 64, "x" * 64], False),
    ],
)
def test_the_configmap_is_the_install_s_only_when_every_workload_says_the_same_one(
    releases: list[str | None], owned: bool
) -> None:
    """A Service of another install, or a ConfigMap, says nothing of who owns the workloads: only the
    workloads' own labels count."""
    kinds = ["Deployment", "StatefulSet"]
    docs = [released(workload(kind, pod_spec(container())), release) for kind, release in zip(kinds, releases)]
    other = released({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "inference"}}, "b")
    out, _, _ = inject([*docs, other], InjectConfig(), b"v1")
    build = build_name(b"v1")
    name = f"{releases[0]}-{build}" if owned else build
    assert names_of(out) == ([name, name], [name])


def test_an_earlier_build_s_configmap_is_kept_beside_the_release_s() -> None:
    """The output of an earlier version (the ConfigMap `stallprobe-OLDHASH`, shared by every install) moves
    to the release's own name; the earlier one stays for the pods of earlier revisions."""
    docs = [released(workload("Deployment", pod_spec(container())), "llama")]
    earlier, _, _ = inject(docs, InjectConfig(configmap="stallprobe-0123456789"), b"v1")
    moved, log, _ = inject(copy.deepcopy(earlier), InjectConfig(), b"v2")
    name = "llama-" + build_name(b"v2")
    assert names_of(moved) == ([name], ["stallprobe-0123456789", name])
    assert [doc["kind"] for doc in moved] == ["Deployment", "ConfigMap", "ConfigMap"]
    assert log[-1].startswith(f"configmap/stallprobe-0123456789 in namespace inference: kept beside configmap/{name}")


def test_an_old_configmap_a_workload_still_mounts_is_kept() -> None:
    """Another workload of the namespace (here one --container leaves alone) still mounts the old build:
    that ConfigMap stays, and the new one comes after it. Two builds live side by side."""
    a = workload("Deployment", pod_spec(container(name="a")))
    b = workload("StatefulSet", pod_spec(container(name="b")))
    first, _, _ = inject([a, b], InjectConfig(), b"one")
    one, two = (build_name(build) for build in (b"one", b"two"))
    second, log, _ = inject(copy.deepcopy(first), InjectConfig(container="a"), b"two")
    assert names_of(second) == ([two, one], [one, two])
    assert not any(line.startswith("configmap/") for line in log)


def test_the_same_run_on_json_and_a_list_keeps_the_old_build() -> None:
    doc = workload("Pod", pod_spec(container()))
    first = run_inject(json.dumps(doc), "--pyz", os.devnull, "--configmap", "stallprobe")
    assert first.returncode == 0, first.stderr
    second = run_inject(first.stdout, "--pyz", os.devnull)
    assert second.returncode == 0, second.stderr
    items = json.loads(second.stdout)["items"]
    assert names_of(items) == ([EMPTY], ["stallprobe", EMPTY])
    assert [item["kind"] for item in items] == ["Pod", "ConfigMap", "ConfigMap"]
    assert run_inject(second.stdout, "--pyz", os.devnull).stdout == second.stdout


def test_in_yaml_the_old_build_keeps_its_bytes_and_the_new_one_comes_last() -> None:
    """The ConfigMap an earlier version wrote keeps its place, its comment and its bytes; the new build's
    comes after the last document."""
    first = run_inject(MANIFEST, "--pyz", os.devnull, "--configmap", "stallprobe")
    assert first.returncode == 0, first.stderr
    earlier = first.stdout.replace("kind: ConfigMap\n", "kind: ConfigMap  # the probe's build\n")
    second = run_inject(earlier + "---\nkind: Service\napiVersion: v1\nmetadata: {name: s}\n", "--pyz", os.devnull)
    assert second.returncode == 0, second.stderr
    docs = list(yaml.safe_load_all(second.stdout))
    assert [d["kind"] for d in docs] == ["Deployment", "Pod", "ConfigMap", "Service", "ConfigMap"]
    assert names_of(docs) == ([EMPTY, EMPTY], ["stallprobe", EMPTY])
    old = earlier[earlier.index("kind: ConfigMap  # the probe's build\n") :]
    assert f"{old}---\nkind: Service\napiVersion: v1\nmetadata: {{name: s}}\n---\n" in second.stdout
    assert "configmap/stallprobe in namespace inference: kept beside configmap/" in second.stderr
    assert run_inject(second.stdout, "--pyz", os.devnull).stdout == second.stdout


# --- readiness by default, and report-only


def test_no_ready_leaves_readiness_as_it_is() -> None:
    spec = pod_spec(container(readinessProbe=HEALTH))
    out, log, _ = inject([workload("Deployment", spec)], InjectConfig(no_ready=True), b"")
    assert out[0]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] == HEALTH
    assert "readiness" not in log[0]
    bare, _, _ = inject([workload("Deployment", pod_spec(container()))], InjectConfig(no_ready=True), b"")
    assert "readinessProbe" not in bare[0]["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("entry", "check"),
    [
        (container(args=["--port", "8000"]), {"httpGet": {"path": "/health", "port": 8000}}),
        (
            container(
                image="lmsysorg/sglang:v0.5",
                command=["python3", "-m", "sglang.launch_server", "--port", "30000", "--enable-metrics"],
            ),
            {"exec": {"command": ["python3", "-I", "-S", "-c", mock.ANY]}},
        ),
    ],
    ids=["vllm", "sglang on loopback"],
)
def test_no_ready_takes_the_draining_away_from_a_readiness_probe_inject_wrote(
    entry: dict[str, Any], check: dict[str, Any]
) -> None:
    """Backing out of readiness (the rollout's stage 2): the readiness probe inject wrote only asks the
    engine's health route again (inside the container where it binds loopback, as the startup guard
    does), so a stuck engine keeps its traffic; a second run changes nothing."""
    drained, _, _ = inject([workload("Deployment", pod_spec(entry))], InjectConfig(), b"")
    back, log, changed = inject(copy.deepcopy(drained), InjectConfig(no_ready=True), b"")
    ready = back[0]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert ready == {**check, "periodSeconds": 5, "timeoutSeconds": 5, "successThreshold": 1, "failureThreshold": 3}
    assert changed == {0}
    assert log[0].endswith(
        "made the readiness probe inject wrote a plain check of /health again (--no-ready: no draining)"
    )
    again, log, changed = inject(copy.deepcopy(back), InjectConfig(no_ready=True), b"")
    assert (again, changed) == (back, set())
    for doc in back:
        validate(doc)


def test_the_operators_own_readiness_probe_is_kept_unless_forced() -> None:
    spec = pod_spec(container(readinessProbe=CUSTOM))
    out, log, _ = inject([workload("Deployment", copy.deepcopy(spec))], InjectConfig(), b"")
    assert out[0]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] == CUSTOM
    assert "kept its own readiness probe (--force replaces it)" in log[0]
    forced, _, _ = inject([workload("Deployment", spec)], InjectConfig(force=True), b"")
    assert "--ready" in forced[0]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]


def test_no_ready_and_drain_after_together_are_a_usage_error() -> None:
    done = run_inject(MANIFEST, "--pyz", os.devnull, "--no-ready", "--drain-after", "20")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "stallprobe inject: --drain-after sets the readiness probe, which --no-ready leaves out: give one of them\n"
    )


def test_report_only_writes_the_probes_flag_into_liveness_alone() -> None:
    """--report-only: the liveness probe judges and says, and restarts nothing. The readiness probe still
    drains (the rollout's stage 2) and never carries the flag; with --no-ready nothing acts (stage 1)."""
    spec = pod_spec(container(readinessProbe=HEALTH))
    config = parse(["--report-only", "--drain-after", "20"], InjectConfig)
    assert isinstance(config, InjectConfig)
    out, log, _ = inject([workload("Deployment", copy.deepcopy(spec))], config, b"")
    c = out[0]["spec"]["template"]["spec"]["containers"][0]
    live, ready = c["livenessProbe"]["exec"]["command"], c["readinessProbe"]["exec"]["command"]
    assert live[-7:] == ["--engine", "vllm", *LIVENESS_ONLY, "--report-only"]
    assert ready == [*live[:-5], "--ready", "--drain-after", "20"]
    assert log[0].startswith(
        "deployment/llm-deployment container vllm: added the liveness probe, report-only (vllm, port 8000 from "
        "assumed: vllm's default, as its command sets no port): it says a wedged engine is stalled about 120 s "
        "after its last progress (the window) and never fails: nothing is restarted; added a startupProbe"
    )
    assert log[0].endswith(
        "replaced the readiness probe: traffic stops about 25 s after the last progress (drain-after 20 s + period 5 s)"
    )
    for doc in out:
        validate(doc)
    quiet = parse(["--report-only", "--no-ready"], InjectConfig)
    assert isinstance(quiet, InjectConfig)
    out, log, _ = inject([workload("Deployment", spec)], quiet, b"")
    c = out[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["livenessProbe"]["exec"]["command"][-1] == "--report-only"
    assert c["readinessProbe"] == HEALTH
    assert "readiness" not in log[0]


# --- --pyz checked against the sha256 a release lists (scripts/release writes SHA256SUMS beside the archive)


def test_pyz_is_checked_against_the_sha256_given_and_a_mismatch_writes_nothing() -> None:
    build = REPO / "tests" / "fixtures" / "inject-golden" / "fixed.pyz"
    digest = hashlib.sha256(build.read_bytes()).hexdigest()
    good = run_inject(MANIFEST, "--pyz", str(build), "--pyz-sha256", digest.upper())
    assert good.returncode == 0, good.stderr
    assert f"--pyz {build}: sha256 {digest}, as --pyz-sha256 says" in good.stderr
    assert good.stdout == run_inject(MANIFEST, "--pyz", str(build)).stdout
    bad = run_inject(MANIFEST, "--pyz", str(build), "--pyz-sha256", "0" * 64)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == (
        f"stallprobe inject: --pyz {build}: its sha256 is {digest}, not the {'0' * 64} --pyz-sha256 says: "
        "nothing written\n"
    )
    for wrong in ("abc", "g" * 64, ""):
        refused = run_inject(MANIFEST, "--pyz", str(build), "--pyz-sha256", wrong)
        assert (refused.returncode, refused.stdout) == (2, ""), wrong
        assert "--pyz-sha256" in refused.stderr
        assert refused.stderr.count("\n") == 1
    alone = run_inject(MANIFEST, "--pyz-sha256", digest)
    assert (alone.returncode, alone.stdout) == (2, "")
    assert "--pyz-sha256" in alone.stderr
    assert "--pyz" in alone.stderr


def test_pyz_is_checked_against_the_sha256sums_beside_it(tmp_path: Path) -> None:
    """A release's folder as scripts/release writes it: the archive and SHA256SUMS (`sha256sum` format, the
    binary-mode star too). Listed and matching: injected, and stderr says what it matched; listed with
    another sum: refused, nothing written; SHA256SUMS there but the archive not listed: refused (a
    release's folder with a stray file); no SHA256SUMS: the archive ships as it is, as before."""
    pyz = tmp_path / "stallprobe.pyz"
    pyz.write_bytes((REPO / "tests" / "fixtures" / "inject-golden" / "fixed.pyz").read_bytes())
    digest = hashlib.sha256(pyz.read_bytes()).hexdigest()
    sums = tmp_path / "SHA256SUMS"
    plain = run_inject(MANIFEST, "--pyz", str(pyz))
    assert plain.returncode == 0
    assert "sha256" not in plain.stderr
    for line in (f"{digest}  stallprobe.pyz\n", f"{digest} *stallprobe.pyz\n"):
        sums.write_text(f"{'1' * 64}  probe\n{line}")
        listed = run_inject(MANIFEST, "--pyz", str(pyz))
        assert listed.returncode == 0, listed.stderr
        assert f"--pyz {pyz}: sha256 {digest}, as {sums} says" in listed.stderr
        assert listed.stdout == plain.stdout
    sums.write_text(f"{'1' * 64}  stallprobe.pyz\n")
    other = run_inject(MANIFEST, "--pyz", str(pyz))
    assert (other.returncode, other.stdout) == (2, "")
    assert f"its sha256 is {digest}, not the {'1' * 64} {sums} says: nothing written" in other.stderr
    sums.write_text(f"{digest}  probe\n")
    unlisted = run_inject(MANIFEST, "--pyz", str(pyz))
    assert (unlisted.returncode, unlisted.stdout) == (2, "")
    assert unlisted.stderr == (
        f"stallprobe inject: --pyz {pyz}: {sums} lists no stallprobe.pyz once: give --pyz-sha256 HEX\n"
    )
    given = run_inject(MANIFEST, "--pyz", str(pyz), "--pyz-sha256", digest)  # the flag wins over the file
    assert given.returncode == 0, given.stderr
