"""`stallprobe inject`: manifests in, manifests out, each one valid for Kubernetes, and the probe it writes
run exactly as the kubelet would run it."""

from __future__ import annotations

import base64
import copy
import difflib
import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, clean_env, rewind, validate
from stallprobe.errors import ExitCode
from stallprobe.inject import PYZ_PATH, Choice, Options, decide, engine_of, inject, pod_specs, read_documents
from stallprobe.inject.manifests import MAX_BYTES, MAX_DEPTH, MAX_NODES, NO_RUAMEL
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


def run_inject(text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stallprobe", "inject", *args],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def probe_of(doc: dict[str, Any], path: tuple[str, ...] = ("spec", "template", "spec")) -> dict[str, Any]:
    spec: Any = doc
    for key in path:
        spec = spec[key]
    probe = spec["containers"][0]["livenessProbe"]
    assert isinstance(probe, dict)
    return probe


KINDS = ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod", "LeaderWorkerSet"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_workload_kind_gets_the_probe_and_stays_valid(kind: str) -> None:
    docs = [workload(kind, pod_spec(container(args=["--port", "8000"])))]
    out, log, _ = inject(docs, Options(pyz=b"PK"))
    assert [d["kind"] for d in out] == [kind, "ConfigMap"]
    for doc in out:
        validate(doc)
    specs = list(pod_specs(out[0]))
    assert len(specs) == (2 if kind == "LeaderWorkerSet" else 1)
    if kind == "LeaderWorkerSet":  # the worker joins the leader's engine and serves no HTTP
        assert "livenessProbe" not in specs.pop()["containers"][0]
        assert "skipped: a LeaderWorkerSet worker" in log[1]
    for spec in specs:
        assert spec["containers"][0]["startupProbe"]["httpGet"] == {"path": "/health", "port": 8000}
        probe = spec["containers"][0]["livenessProbe"]
        assert probe["exec"]["command"][:7] == [
            "python3",
            "-I",
            "-S",
            "-c",
            f'import gc, sys; gc.disable(); sys.path.insert(0, "{PYZ_PATH}"); from stallprobe.cli import run; run()',
            "--url",
            "http://127.0.0.1:8000/metrics",
        ]
        assert {"name": "stallprobe", "configMap": {"name": "stallprobe", "defaultMode": 0o444}} in spec["volumes"]
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
            container(image="ghcr.io/ggml-org/llama.cpp:server", args=["-m", "/m.gguf", "--port", "8081"]),
            "llamacpp",
            8081,
        ),
        (
            container(image="me/llm:1", command=["llama-server", "--metrics"], ports=[{"containerPort": 7000}]),
            "llamacpp",
            7000,
        ),
        (
            container(ports=[{"name": "grpc", "containerPort": 9999}, {"name": "http", "containerPort": 8888}]),
            "vllm",
            8888,
        ),
        (container(image="nginx:1.27", ports=[{"containerPort": 80}]), None, 80),
        (container(args=["--port", "\u00b2"]), "vllm", 0),  # not a port: skipped, never guessed
    ],
)
def test_engine_and_port_are_read_from_the_container(entry: dict[str, Any], engine: str | None, port: int) -> None:
    assert engine_of(entry) == engine
    decision = decide(entry, "pod", Choice(container=entry["name"], engine=engine))
    assert (decision.action, decision.port) == ("probe", port) if port else decision.action == "skip"


def test_only_inference_containers_are_touched() -> None:
    spec = pod_spec(container(), container(name="sidecar", image="envoyproxy/envoy:v1"))
    out, _, _ = inject([workload("Deployment", spec)], Options(pyz=b""))
    sidecar = out[0]["spec"]["template"]["spec"]["containers"][1]
    assert sidecar == container(name="sidecar", image="envoyproxy/envoy:v1")


def test_container_flag_picks_one_by_name() -> None:
    spec = pod_spec(
        container(name="engine", image="my/own:1", args=["--port", "8000"]),
        container(name="other", image="vllm/vllm-openai"),
    )
    out, _, _ = inject([workload("Deployment", spec)], Options(pyz=b"", container="engine", engine="vllm"))
    containers = out[0]["spec"]["template"]["spec"]["containers"]
    assert "livenessProbe" in containers[0]
    assert "livenessProbe" not in containers[1]


HEALTH = {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10, "initialDelaySeconds": 600}
CUSTOM = {"exec": {"command": ["/bin/check-engine"]}, "periodSeconds": 30}


def test_a_plain_health_check_is_replaced_keeping_its_initial_delay() -> None:
    spec = pod_spec(container(livenessProbe=HEALTH, readinessProbe=HEALTH, startupProbe=HEALTH))
    out, log, _ = inject([workload("Deployment", spec)], Options(pyz=b""))
    c = out[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["livenessProbe"]["initialDelaySeconds"] == 600
    assert c["livenessProbe"]["timeoutSeconds"] == 6  # above --timeout 3 and the 1 s question whether it is paused
    assert (c["readinessProbe"], c["startupProbe"]) == (HEALTH, HEALTH)  # never touched
    assert "replaced the liveness probe" in log[0]
    assert "restarted about 140 s after its last progress" in log[0]


def test_the_operators_own_liveness_probe_wins_unless_forced() -> None:
    doc = workload("Deployment", pod_spec(container(livenessProbe=CUSTOM)))
    out, log, _ = inject([copy.deepcopy(doc)], Options(pyz=b""))
    assert out == [doc]  # nothing injected, so no ConfigMap either
    assert "kept its own liveness probe" in log[0]
    forced, _, _ = inject([copy.deepcopy(doc)], Options(pyz=b"", force=True))
    assert PYZ_PATH in probe_of(forced[0])["exec"]["command"][4]


def test_read_only_root_gets_an_emptydir_for_the_state() -> None:
    entry = container(securityContext={"readOnlyRootFilesystem": True})
    out, _, _ = inject([workload("StatefulSet", pod_spec(entry))], Options(pyz=b""))
    spec = out[0]["spec"]["template"]["spec"]
    assert probe_of(out[0])["exec"]["command"][-2:] == ["--state-file", "/run/stallprobe/probe.state"]
    assert {"name": "stallprobe-state", "emptyDir": {"sizeLimit": "1Mi"}} in spec["volumes"]
    assert {"name": "stallprobe-state", "mountPath": "/run/stallprobe"} in spec["containers"][0]["volumeMounts"]
    validate(out[0])


def test_timing_flags_reach_the_probe_and_the_report() -> None:
    options = Options(pyz=b"", window=300, timeout=4.5, period=15, failure=5, engine="sglang")
    entry = container(args=["--enable-metrics", "--port", "30000"])
    out, log, _ = inject([workload("Deployment", pod_spec(entry))], options)
    probe = probe_of(out[0])
    assert probe["exec"]["command"][7:] == ["--window", "300", "--timeout", "4.5", "--engine", "sglang"]
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
    out, _, _ = inject(docs, Options(pyz=b"zip bytes", configmap="probe-build"))
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
        "            -   {name: stallprobe, configMap: {name: stallprobe, defaultMode: 292}}\n# after everything\n"
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
    assert made[:-1] == after
    assert made[-1]["kind"] == "ConfigMap"
    for doc in made:
        validate(doc)


# --- the injected command, run as the kubelet runs it


@pytest.fixture
def stub() -> Iterator[StubEngine]:
    with StubEngine() as engine:
        yield engine


def test_the_injected_command_as_the_kubelet_runs_it(stub: StubEngine, tmp_path: Path) -> None:
    manifest = workload("Deployment", pod_spec(container(args=["--port", str(stub.port)])))
    result = run_inject(json.dumps(manifest), "--window", "1")
    assert result.returncode == 0, result.stderr
    deployment, configmap = json.loads(result.stdout)["items"]
    probe = probe_of(deployment)
    # The ConfigMap's file, where the volume would mount it.
    pyz = tmp_path / "opt" / "stallprobe.pyz"
    pyz.parent.mkdir()
    pyz.write_bytes(base64.b64decode(configmap["binaryData"]["stallprobe.pyz"]))
    command = [
        sys.executable if word == "python3" else word.replace(PYZ_PATH, str(pyz)) for word in probe["exec"]["command"]
    ]
    env = clean_env(TMPDIR=str(tmp_path))

    def kubelet() -> tuple[int, str]:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=probe["timeoutSeconds"], check=False
        )
        return done.returncode, done.stdout

    stub.set(4, 100, 50)
    assert kubelet()[0] == 0  # baseline
    stub.set(4, 180, 50)
    code, line = kubelet()
    assert (code, line[:12]) == (0, "progressing:")
    [state] = tmp_path.glob("stallprobe-*.state")  # the probe's own file, in TMPDIR
    rewind(state, 1.2)  # the counters stop for longer than the window
    code, line = kubelet()
    assert (code, line[:8]) == (1, "stalled:")
    stub.set(4, 181, 50)
    assert kubelet()[0] == 0


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
