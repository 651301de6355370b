"""`stallprobe inject` on real public manifests (tests/fixtures/manifests/SOURCES.md says where each came
from), through the real command: exact expectations per container, strict schema validation,
idempotence, untouched documents byte for byte, Helm's post-renderer contract, and Kustomize's exec KRM
function run by a real `kubectl kustomize`."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, run_inject, validate
from stallprobe.engines import dialect_named
from stallprobe.errors import ExitCode
from stallprobe.launcher import launcher

MANIFESTS = REPO / "tests" / "fixtures" / "manifests"
# The ConfigMap of the empty build every run here ships (--pyz /dev/null) and its launcher, named by their
# content.
EMPTY = "stallprobe-" + hashlib.sha256(launcher().encode()).hexdigest()[:10]


def run(text: str, *args: str) -> subprocess.CompletedProcess[str]:
    """inject with the empty build (EMPTY)."""
    return run_inject(text, "--pyz", os.devnull, *args)


def split(text: str) -> list[str]:
    """The stream's documents as text, cut where each `---` line starts (as inject cuts them)."""
    pieces: list[str] = []
    for line in text.splitlines(keepends=True):
        if (line.startswith("---") and pieces) or not pieces:
            pieces.append(line)
        else:
            pieces[-1] += line
    return pieces


# file -> (expected stderr lines after "stallprobe inject: ", the containers probed: (path, port, startup))
EXPECTED: dict[str, tuple[list[str], list[tuple[tuple[Any, ...], int, bool]]]] = {
    "gaie-vllm-gpu-deployment-092fdaa.yaml": (
        ["deployment/vllm-qwen3-32b container vllm: replaced the liveness probe (vllm, port 8000 from --port"],
        [(("spec", "template", "spec", "containers", 0), 8000, False)],
    ),
    "lws-vllm-gpu-0e2e095.yaml": (
        [
            "leaderworkerset/vllm leader container vllm-leader: added the liveness probe (vllm, port 8080 from --port",
            "leaderworkerset/vllm worker container vllm-worker: skipped: a LeaderWorkerSet worker",
        ],
        [(("spec", "leaderWorkerTemplate", "leaderTemplate", "spec", "containers", 0), 8080, True)],
    ),
    "lws-sglang-0377103.yaml": (
        [
            "leaderworkerset/sglang leader container sglang-leader: added the liveness probe (sglang, port 40000",
            "leaderworkerset/sglang worker container sglang-worker: skipped: a LeaderWorkerSet worker",
        ],
        [(("spec", "leaderWorkerTemplate", "leaderTemplate", "spec", "containers", 0), 40000, True)],
    ),
    "sglang-distributed-sts-622284e.yaml": (
        [
            "statefulset/distributed-sglang container sglang-container: skipped: a multi-node worker: its "
            "--node-rank is $POD_INDEX, which differs from pod to pod"
        ],
        [],
    ),
    "kserve-vllmserver-1cb62ae.yaml": (
        ["clusterservingruntime/kserve-vllmserver: skipped: kind ClusterServingRuntime is not supported"],
        [],
    ),
    "gke-vllm-llama4-maverick-0e0c515.yaml": (
        [
            "deployment/llama-deployment container inference-server: skipped: metrics are off "
            "(--disable-log-stats): vllm publishes no vllm: family, so a probe could only fail"
        ],
        [],
    ),
    "llmd-optimized-baseline-vllm-ae9f98f.yaml": (
        [
            "deployment/optimized-baseline-nvidia-gpu-vllm-decode container modelserver: replaced the liveness "
            "probe (vllm, port 8000 from its containerPort"
        ],
        [(("spec", "template", "spec", "containers", 0), 8000, False)],
    ),
    "llmd-async-vllm-6e1ac07.yaml": (
        ["deployment/vllm container vllm-server: replaced the liveness probe (vllm, port 8000 from its containerPort"],
        [(("spec", "template", "spec", "containers", 0), 8000, False)],
    ),
    "production-stack-pd-decode-036e791.yaml": (
        ["deployment/decode container app: replaced the liveness probe (vllm, port 8000 from --port in its command"],
        [(("spec", "template", "spec", "containers", 0), 8000, False)],
    ),
    "aibrix-quickstart-model-16bf1ba.yaml": (
        [
            "deployment/deepseek-r1-distill-llama-8b container vllm-openai: replaced the liveness probe (vllm, "
            "port 8000 from --port in its command"
        ],
        [(("spec", "template", "spec", "containers", 0), 8000, False)],
    ),
    "ramalama-k8s-base-model-deployment-c6c334e.yaml": (
        [
            "deployment/ramalama-deployment container ramalama: skipped: its port is $(PORT): PORT may come from "
            "its envFrom ConfigMap ramalama-config, which is not in the input (--container ramalama --port N "
            "settles it)"
        ],
        [],
    ),
    "opea-genaiinfra-vllm-306b573.yaml": (
        [
            "deployment/vllm container vllm: replaced the liveness probe (vllm, port 2080 from --port in its args, "
            "as its containerPort says)"
        ],
        [(("spec", "template", "spec", "containers", 0), 2080, False)],
    ),
    "boettiger-sglang-nemotron-3f7e02c.yaml": (
        [
            "deployment/nemotron container sglang: added the liveness probe (sglang, port 8000 from --port in its "
            "command)"
        ],
        [(("spec", "template", "spec", "containers", 0), 8000, True)],
    ),
    "kubeai-llama-server-cuda-cc91e82.yaml": (
        [
            "deployment/llama-server container llama: skipped: its image ghcr.io/ggml-org/llama.cpp:server-cuda has "
            "no python3, which the probe runs with (ghcr.io/ggml-org/llama.cpp:full (--server first in its args) has "
            "one, or --python PATH names the image's own)"
        ],
        [],
    ),
    "boettiger-vllm-nimbus-349f2f8.yaml": (
        [
            "deployment/vllm-nimbus-deployment container vllm: added the liveness probe (vllm, port 8000 from its "
            "containerPort)"
        ],
        [(("spec", "template", "spec", "containers", 0), 8000, True)],
    ),
    # LMDeploy's own example: its probes are TCP checks, the operator's own, which only --force replaces.
    "lmdeploy-k8s-api-server-a3af2ae.yaml": (
        [
            "deployment/internlm2-chat-7b container internlm2-chat-7b: kept its own liveness probe (not a plain "
            "/health check; --force replaces it)"
        ],
        [],
    ),
    "modelexpress-trtllm-single-node-f5902e2.yaml": (
        [
            "deployment/mx-trtllm container trtllm: added the liveness probe (trtllm, port 8000 from --port in its "
            "command)"
        ],
        [(("spec", "template", "spec", "containers", 0), 8000, True)],
    ),
}
# Manifests whose probes only --force replaces (EXPECTED says what a run without it does).
FORCED = {"lmdeploy-k8s-api-server-a3af2ae.yaml"}


def workload(docs: Iterable[Any]) -> Any:
    """The first document with pod templates (the one a manifest's expectations are about)."""
    return next(doc for doc in docs if doc and doc["kind"] in ("Deployment", "StatefulSet", "LeaderWorkerSet"))


def dig(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_manifest(name: str) -> None:
    text = (MANIFESTS / name).read_text()
    lines, probed = EXPECTED[name]
    first = run(text)
    assert first.returncode == 0, first.stderr
    said = [line.removeprefix("stallprobe inject: ") for line in first.stderr.splitlines()]
    assert len(said) == len(lines), said
    for line, start in zip(said, lines):
        assert line.startswith(start), (line, start)
    if not probed:  # nothing to inject: the very bytes that came in (GKE's Secret is a template, no YAML)
        assert first.stdout == text
        assert run(text, "--check").returncode == ExitCode.OK
        return
    docs = [d for d in yaml.safe_load_all(first.stdout) if d is not None]
    for doc in docs:
        validate(doc)
    for path, port, startup in probed:
        container = dig(workload(docs), path)
        command = container["livenessProbe"]["exec"]["command"]
        engine = dialect_named(command[command.index("--engine") + 1])
        assert engine is not None
        assert f"http://127.0.0.1:{port}{engine.metrics_path}" in command
        assert ("startupProbe" in container) is (
            startup or "startupProbe" in dig(workload(yaml.safe_load_all(text)), path)
        )
    # Untouched documents come back byte for byte; a probed one is followed by the ConfigMap.
    before, after = split(text), split(first.stdout)
    untouched = [piece for piece in before if piece in after]
    changed = len(before) - len(untouched)
    assert changed == 1
    assert len(after) == len(before) + 1
    # A second run changes nothing, says so, and --check agrees.
    second = run(first.stdout)
    assert second.stdout == first.stdout
    assert all("skipped" in line or "already injected, unchanged" in line for line in second.stderr.splitlines())
    assert run(first.stdout, "--check").returncode == ExitCode.OK
    check = run(text, "--check")
    assert (check.returncode, check.stdout) == (ExitCode.CHANGES, "")


def probe_blocks(text: str) -> set[int]:
    """The lines (0-based) of every probe in `text`: from its key's line to the last line of its value,
    found by PyYAML's composer, which shares no code with inject's reader."""
    lines: set[int] = set()
    for root in yaml.compose_all(text):
        stack = [root]
        while stack:
            node = stack.pop()
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    stack.append(value)
                    if key.value in ("livenessProbe", "readinessProbe", "startupProbe"):
                        last = value
                        while isinstance(last, (yaml.MappingNode, yaml.SequenceNode)):
                            last = last.value[-1][1] if isinstance(last, yaml.MappingNode) else last.value[-1]
                        lines.update(range(key.start_mark.line, last.end_mark.line + 1))
            elif isinstance(node, yaml.SequenceNode):
                stack.extend(node.value)
    return lines


def comments(lines: list[str]) -> Counter[str]:
    """Every whole-line comment, as its text without the indentation."""
    return Counter(line.strip() for line in lines if line.strip().startswith("#"))


@pytest.mark.parametrize(
    "args", [[], ["--drain-after", "20", "--force", "--state-volume", "--report-only"]], ids=["", "all"]
)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inject_loses_nothing(name: str, args: list[str]) -> None:
    """Between input and output, lines are only inserted, but in a probe that is replaced: every other
    line keeps its bytes (indentation, quotes, comments, blank lines), and every comment is still there.
    With --force, every readiness probe is replaced too (--report-only writes one only because
    --drain-after asks for it), and with --state-volume a second volume comes in."""
    text = (MANIFESTS / name).read_text()
    done = run(text, *args)
    assert done.returncode == 0, done.stderr
    before, after = text.splitlines(keepends=True), done.stdout.splitlines(keepends=True)
    composes = EXPECTED[name][1] or name in FORCED  # GKE's Secret is a template, no YAML
    probes = probe_blocks(text) if composes else set()
    opcodes = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    for tag, i1, i2, _, _ in opcodes:
        if tag in ("replace", "delete"):
            assert set(range(i1, i2)) <= probes, (tag, before[i1:i2])
    kept = sum(i2 - i1 for tag, i1, i2, _, _ in opcodes if tag == "equal")
    assert kept >= len(before) - len(probes)
    assert not comments(before) - comments(after)  # none lost, those inside a replaced probe included
    for doc in yaml.safe_load_all(done.stdout) if composes else ():
        if doc:
            validate(doc)


def test_comments_and_block_scalars_survive_in_a_changed_document() -> None:
    text = (MANIFESTS / "gaie-vllm-gpu-deployment-092fdaa.yaml").read_text()
    out = run(text).stdout
    for kept in (
        "# IMPORTANT: preStop.sleep is beta as of Kubernetes 1.30",
        "  configmap.yaml: |\n      vLLMLoRAConfig:\n",
        "volumeMounts: # DO NOT USE subPath",
        '"/adapters"',
    ):
        assert kept in out, kept
    assert "lora-adapter-syncer" in out  # the sidecar init container, untouched
    syncer = next(yaml.safe_load_all(out))["spec"]["template"]["spec"]["initContainers"][0]
    assert "livenessProbe" not in syncer


def test_helm_post_renderer_contract() -> None:
    """Helm pipes every rendered manifest (`---` and `# Source:` comments) to the command's stdin and
    takes its stdout; a non-zero exit fails the release."""
    rendered = "".join(
        f"---\n# Source: chart/templates/{name}\n" + (MANIFESTS / name).read_text().removeprefix("---\n")
        for name in ("lws-sglang-0377103.yaml", "kserve-vllmserver-1cb62ae.yaml")
    )
    done = subprocess.run(
        [
            "stallprobe" if shutil.which("stallprobe") else sys.executable,
            *([] if shutil.which("stallprobe") else ["-m", "stallprobe"]),
            "inject",
            "--pyz",
            os.devnull,
        ],
        input=rendered,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(done.stdout) if d]
    assert kinds == ["LeaderWorkerSet", "Service", "ClusterServingRuntime", "ConfigMap"]
    assert "# Source: chart/templates/kserve-vllmserver-1cb62ae.yaml" in done.stdout
    bad = run("kind: [unclosed")
    assert (bad.returncode, bad.stdout) == (2, "")


@pytest.mark.needs("kubectl")
def test_kubectl_kustomize_runs_inject_as_an_exec_transformer_plugin(tmp_path: Path) -> None:
    """Real `kubectl kustomize --enable-alpha-plugins`, with inject as the exec transformer plugin it runs
    (its kustomize has no --enable-exec for KRM functions; the ResourceList test above covers those)."""
    for name in ("lws-vllm-gpu-0e2e095.yaml", "gaie-vllm-gpu-deployment-092fdaa.yaml"):
        shutil.copy(MANIFESTS / name, tmp_path / name)
    plugin = tmp_path / "plugins" / "stallprobe.dev" / "v1" / "inject" / "Inject"
    plugin.parent.mkdir(parents=True)
    plugin.write_text(
        f"#!/bin/sh\nexec {sys.executable} -m stallprobe inject --pyz {os.devnull} --window 300 --startup-budget 3600\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "inject.yaml").write_text(
        "apiVersion: stallprobe.dev/v1\nkind: Inject\nmetadata:\n  name: stallprobe\n"
    )
    (tmp_path / "kustomization.yaml").write_text(
        "resources:\n- lws-vllm-gpu-0e2e095.yaml\n- gaie-vllm-gpu-deployment-092fdaa.yaml\n"
        "transformers:\n- inject.yaml\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "KUSTOMIZE_PLUGIN_HOME": str(tmp_path / "plugins")}
    done = subprocess.run(
        ["kubectl", "kustomize", "--enable-alpha-plugins", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("ConfigMap") >= 1
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    command = leader["livenessProbe"]["exec"]["command"]
    assert command[command.index("--window") + 1] == "300"
    assert leader["startupProbe"]["failureThreshold"] == 360
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    assert "livenessProbe" not in worker
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert "stallprobe" in str(deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"])
    for doc in docs:
        validate(doc)


def test_print_probe_gives_the_fields_to_embed() -> None:
    done = run("", "--print-probe", "--engine", "vllm", "--port", "8000", "--output", "json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {"container", "volumes", "configMap"}
    assert set(out["container"]) == {"livenessProbe", "readinessProbe", "startupProbe", "volumeMounts"}
    assert out["volumes"][0]["configMap"]["name"] == out["configMap"]["metadata"]["name"] == EMPTY
    assert out["container"]["startupProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert "http://127.0.0.1:8000/metrics" in out["container"]["livenessProbe"]["exec"]["command"]
    assert out["configMap"]["kind"] == "ConfigMap"
    assert out["configMap"]["data"] == {"probe": launcher()}  # what the command runs, beside the archive
    assert out["container"]["livenessProbe"]["exec"]["command"][:4] == ["python3", "-I", "-S", "/opt/stallprobe/probe"]
    as_yaml = run("", "--print-probe", "--engine", "llamacpp", "--port", "8080")
    assert yaml.safe_load(as_yaml.stdout)["container"]["startupProbe"]["exec"]["command"][:2] == ["python3", "-I"]
    bare = run("", "--print-probe", "--engine", "vllm", "--port", "8000", "--no-ready", "--configmap", "probe")
    fields = yaml.safe_load(bare.stdout)
    assert set(fields["container"]) == {"livenessProbe", "startupProbe", "volumeMounts"}
    assert fields["volumes"][0]["configMap"]["name"] == fields["configMap"]["metadata"]["name"] == "probe"
    missing = run("", "--print-probe")
    assert missing.returncode == 2
    assert "--print-probe needs --engine" in missing.stderr


def test_drain_after_writes_the_readiness_probe() -> None:
    text = (MANIFESTS / "gaie-vllm-gpu-deployment-092fdaa.yaml").read_text()
    done = run(text, "--drain-after", "30")
    assert done.returncode == 0, done.stderr
    c = next(yaml.safe_load_all(done.stdout))["spec"]["template"]["spec"]["containers"][0]
    live, ready = c["livenessProbe"], c["readinessProbe"]
    # The readiness probe: the same command without what only liveness carries (its evidence, the kill switch).
    assert live["exec"]["command"][-4:-2] == ["--termination-log", "/dev/termination-log"]
    assert ready["exec"]["command"] == [*live["exec"]["command"][:-4], "--ready", "--drain-after", "30"]
    assert (ready["periodSeconds"], ready["failureThreshold"], ready["successThreshold"]) == (5, 1, 1)
    assert ready["timeoutSeconds"] == live["timeoutSeconds"] + 3  # it asks the health route too: --timeout more
    assert "traffic stops about 35 s after the last progress" in done.stderr


def test_krm_function_contract_resource_list_in_and_out() -> None:
    """What kustomize sends an exec function: a ResourceList, functionConfig carrying the options."""
    items = [d for d in yaml.safe_load_all((MANIFESTS / "lws-vllm-gpu-0e2e095.yaml").read_text()) if d]
    resource_list = {
        "apiVersion": "config.kubernetes.io/v1",
        "kind": "ResourceList",
        "items": items,
        "functionConfig": {"apiVersion": "x/v1", "kind": "Inject", "spec": {"window": 300, "startup-budget": 3600}},
    }
    done = run(yaml.safe_dump(resource_list))
    assert done.returncode == 0, done.stderr
    out = yaml.safe_load(done.stdout)
    assert out["kind"] == "ResourceList"
    kinds = [item["kind"] for item in out["items"]]
    assert kinds == ["LeaderWorkerSet", "ConfigMap"]
    leader = out["items"][0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    command = leader["livenessProbe"]["exec"]["command"]
    assert command[command.index("--window") + 1] == "300"
    assert leader["startupProbe"]["failureThreshold"] == 360
    bad = run(yaml.safe_dump({**resource_list, "functionConfig": {"spec": {"window": 0}}}))
    assert bad.returncode == 2
    assert "--window must be a number > 0" in bad.stderr


def test_a_port_from_a_configmap_in_the_same_input() -> None:
    """The ramalama base: `--port $(PORT)`, PORT from `envFrom` its ConfigMap. Given with it (as kustomize
    and Helm give them), the port is read from it; the Deployment's text keeps every byte it did not change."""
    configmap = (MANIFESTS / "ramalama-k8s-base-configmap-c6c334e.yaml").read_text()
    deployment = (MANIFESTS / "ramalama-k8s-base-model-deployment-c6c334e.yaml").read_text()
    bare = run(f"{configmap}\n---\n{deployment}\n")
    assert bare.stderr.startswith(  # its image is a placeholder kustomize fills: no python3 inject knows of
        "stallprobe inject: deployment/ramalama-deployment container ramalama: skipped: its image MODEL_IMAGE is "
        "not one inject knows to have a python3, which the probe runs with (ghcr.io/ggml-org/llama.cpp:full "
        "(--server first in its args) has one, or --python PATH names the image's own)"
    )
    done = run(f"{configmap}\n---\n{deployment}\n", "--python", "/usr/bin/python3")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0].startswith(
        "stallprobe inject: deployment/ramalama-deployment container ramalama: added the liveness probe (llamacpp, "
        "port 8080 from --port in its command); "
    )
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "ConfigMap"]
    assert docs[0] == yaml.safe_load(configmap)  # read, not changed
    engine = docs[1]["spec"]["template"]["spec"]["containers"][0]
    assert engine["livenessProbe"]["exec"]["command"][0] == "/usr/bin/python3"
    assert "http://127.0.0.1:8080/metrics" in engine["livenessProbe"]["exec"]["command"]
    assert engine["startupProbe"]["httpGet"] == {"path": "/health", "port": 8080}  # HOST is 0.0.0.0 there
    assert {"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "1"} in engine["env"]
    for doc in docs:
        validate(doc)
    # In another namespace the ConfigMap says nothing about this Deployment's PORT.
    elsewhere = configmap.replace("  name: ramalama-config\n", "  name: ramalama-config\n  namespace: other\n")
    assert "PORT may come from its envFrom ConfigMap ramalama-config" in run(f"{elsewhere}\n---\n{deployment}").stderr
    # A host the ConfigMap does not hold: `--host $(HOST)` is left as written, no address.
    unknown = configmap.replace('HOST: "0.0.0.0"', "")
    assert unknown != configmap
    skipped = run(f"{unknown}\n---\n{deployment}", "--python", "/usr/bin/python3").stderr
    assert "skipped: its address is $(HOST): HOST is set nowhere in the manifest (--container ramalama" in skipped


def test_container_settles_a_rendered_chart_whose_image_the_manifest_does_not_show() -> None:
    text = (MANIFESTS / "opea-genaiinfra-vllm-306b573.yaml").read_text()
    done = run(text, "--container", "vllm")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(
        "stallprobe inject: deployment/vllm container vllm: replaced the liveness probe (vllm, port 2080 from --port "
        "in its command); "
    )
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    engine = docs[2]["spec"]["template"]["spec"]["containers"][0]
    assert "http://127.0.0.1:2080/metrics" in engine["livenessProbe"]["exec"]["command"]
    assert (
        engine["startupProbe"]
        == yaml.safe_load(text.split("---")[3])["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    )  # its own, kept
    given = run(text, "--container", "vllm", "--port", "2080")
    assert "port 2080 from --port given to inject" in given.stderr
    alone = run(text, "--port", "2080")
    assert (alone.returncode, alone.stdout) == (ExitCode.USAGE, "")
    assert "--port needs --container NAME" in alone.stderr


def test_a_key_in_a_flag_is_read_from_its_variable_and_never_copied() -> None:
    """NVIDIA's SGLang image, started with `python -m sglang.launch_server ... --api-key $(SGLANG_API_KEY)`, the
    key from a Secret: the probe runs with the same `python`, reads the key from SGLANG_API_KEY at run time,
    and the kubelet's httpGet guards the start (it binds 0.0.0.0)."""
    done = run((MANIFESTS / "boettiger-sglang-nemotron-3f7e02c.yaml").read_text())
    assert done.returncode == 0, done.stderr
    engine = workload(yaml.safe_load_all(done.stdout))["spec"]["template"]["spec"]["containers"][0]
    command = engine["livenessProbe"]["exec"]["command"]
    assert command[0] == "python"
    assert command[command.index("--api-key-env") + 1] == "SGLANG_API_KEY"
    assert "--api-key" not in command
    assert "$(SGLANG_API_KEY)" not in command
    assert engine["startupProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert engine["readinessProbe"]["exec"]["command"][: len(command) - 4] == command[:-4]  # but liveness's own


def test_llama_cpps_server_image_is_probed_only_with_an_interpreter_named() -> None:
    """llama.cpp's server image has no python3: skipped, saying so; with --python PATH (an image the user
    knows has one), the probe runs with it, dialling loopback, and the kubelet guards the start (0.0.0.0)."""
    text = (MANIFESTS / "kubeai-llama-server-cuda-cc91e82.yaml").read_text()
    done = run(text, "--python", "/usr/local/bin/python3")
    assert done.returncode == 0, done.stderr
    engine = workload(yaml.safe_load_all(done.stdout))["spec"]["template"]["spec"]["containers"][0]
    command = engine["livenessProbe"]["exec"]["command"]
    assert command[0] == "/usr/local/bin/python3"
    assert "http://127.0.0.1:8080/metrics" in command
    assert engine["startupProbe"]["httpGet"] == {"path": "/health", "port": 8080}
    assert {"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "1"} in engine["env"]


def test_lmdeploys_own_example_with_force_is_probed_on_its_port() -> None:
    """LMDeploy's k8s/api_server.yaml starts `lmdeploy serve api_server` from a `sh -c` script with
    --server-port 23333 and checks a TCP port: with --force, both checks become the probe's, reading
    /metrics on 23333 (metrics on by default, --server-name 0.0.0.0), keeping its initialDelaySeconds."""
    done = run((MANIFESTS / "lmdeploy-k8s-api-server-a3af2ae.yaml").read_text(), "--force")
    assert done.returncode == 0, done.stderr
    _, deployment, configmap = yaml.safe_load_all(done.stdout)  # the Service, untouched, first
    engine = deployment["spec"]["template"]["spec"]["containers"][0]
    command = engine["livenessProbe"]["exec"]["command"]
    assert command[:6] == ["python3", "-I", "-S", "/opt/stallprobe/probe", "--url", "http://127.0.0.1:23333/metrics"]
    assert command[command.index("--engine") + 1] == "lmdeploy"
    assert engine["livenessProbe"]["initialDelaySeconds"] == 900  # its own guard of the model's loading
    assert "startupProbe" not in engine
    assert engine["readinessProbe"]["exec"]["command"][-3:] == ["--ready", "--drain-after", "30"]
    assert "port 23333 from --server-port in its command" in done.stderr
    assert configmap["kind"] == "ConfigMap"


def test_trtllm_gets_its_own_window_and_is_told_what_its_config_lacks() -> None:
    """ModelExpress's trtllm-serve Deployment gives --config a YAML from a ConfigMap of the same input,
    which sets neither option the page needs: the probe goes in (without them every run is a health
    check), reading /prometheus/metrics with TensorRT-LLM's own window (its readiness keeps
    --drain-after: it asks /health_generate before it drains), and stderr says what the config lacks.
    With the options in the ConfigMap, nothing is said."""
    text = (MANIFESTS / "modelexpress-trtllm-single-node-f5902e2.yaml").read_text()
    done = run(text)
    assert done.returncode == 0, done.stderr
    engine = workload(yaml.safe_load_all(done.stdout))["spec"]["template"]["spec"]["containers"][0]
    live, ready = engine["livenessProbe"]["exec"]["command"], engine["readinessProbe"]["exec"]["command"]
    assert "http://127.0.0.1:8000/prometheus/metrics" in live
    assert live[live.index("--window") + 1] == "1800"
    assert ready[ready.index("--drain-after") + 1] == "30"
    assert "its window is 1800 s, trtllm's own, as --window does not say" in done.stderr
    assert (
        "its /etc/trtllm/config.yaml (key config.yaml of ConfigMap mx-trtllm-config) lacks return_perf_metrics: "
        "true, which serves its Prometheus page at all, and enable_iter_perf_stats: true"
    ) in done.stderr
    fixed = text.replace(
        "    checkpoint_format: MX\n", "    return_perf_metrics: true\n    enable_iter_perf_stats: true\n"
    )
    assert fixed != text
    quiet = run(fixed, "--window", "3600", "--drain-after", "60")
    assert quiet.returncode == 0, quiet.stderr
    assert "lacks" not in quiet.stderr
    assert "its window is" not in quiet.stderr
    engine = workload(yaml.safe_load_all(quiet.stdout))["spec"]["template"]["spec"]["containers"][0]
    live, ready = engine["livenessProbe"]["exec"]["command"], engine["readinessProbe"]["exec"]["command"]
    assert (live[live.index("--window") + 1], ready[ready.index("--drain-after") + 1]) == ("3600", "60")
