"""An upgrade and a roll-back walked with inject's own output, as docs/kubernetes.md's "Upgrades and
roll-backs" tells an operator: a real manifest (the Gateway API inference extension's vLLM Deployment,
tests/fixtures/manifests/SOURCES.md; it names no namespace, as a manifest applied with `-n` does)
injected with one build, then with a release's build checked against its SHA256SUMS, then back; and the
docs' prune command run over what a cluster would hold after each.

The cluster is not here: the prune command's `kubectl` is a stand-in that answers `get` from the documents
this test gives it, in kubectl's own JSON layout (4-space indent, `"key": "value"`, each object's keys
sorted, as Go prints a map); the command strips the blanks before it greps.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from conftest import REPO, run_inject
from stallprobe.inject.core import KEEP
from stallprobe.pyz import build

MANIFEST = REPO / "tests" / "fixtures" / "manifests" / "gaie-vllm-gpu-deployment-092fdaa.yaml"
EARLIER = REPO / "tests" / "fixtures" / "inject-golden" / "fixed.pyz"  # a build of an earlier version
DOCS = REPO / "docs" / "kubernetes.md"


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = (doc for doc in docs if doc["kind"] == "Deployment")
    return found


def mounted(doc: dict[str, Any]) -> str:
    (volume,) = (v for v in doc["spec"]["template"]["spec"]["volumes"] if v["name"] == "stallprobe")
    name: str = volume["configMap"]["name"]
    return name


def configmaps(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "ConfigMap" and "binaryData" in doc}


def replicaset(doc: dict[str, Any], revision: int) -> dict[str, Any]:
    """The ReplicaSet a Deployment's controller keeps for a revision: the template as it was."""
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": f"{doc['metadata']['name']}-{revision}"},
        "spec": {"template": copy.deepcopy(doc["spec"]["template"])},
    }


def prune_command() -> str:
    """The docs' prune command: the sh block after the `<!-- prune -->` marker."""
    text = DOCS.read_text()
    found = re.search(r"<!-- prune -->\n```sh\n(.*?)```", text, re.DOTALL)
    assert found is not None, "docs/kubernetes.md has no prune command after <!-- prune -->"
    return found.group(1)


KUBECTL = """\
import json, os, sys
args = sys.argv[1:]
if "configmap" in args:
    print("\\n".join("configmap/" + name for name in json.loads(os.environ["FAKE_CONFIGMAPS"])))
else:
    objects = json.loads(os.environ["FAKE_OBJECTS"])
    print(json.dumps({"apiVersion": "v1", "items": objects, "kind": "List"}, indent=4, sort_keys=True))
"""


def prune(tmp_path: Path, objects: list[dict[str, Any]], names: list[str]) -> list[str]:
    """The docs' prune command run over a cluster holding `objects` and the builds' ConfigMaps `names`:
    the lines it prints."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    command = prune_command()
    called = re.search(r"^([a-z]+) -n ", command, re.MULTILINE)  # the cluster's client the command calls
    assert called is not None, command
    tool = called.group(1)
    fake = bin_dir / tool
    fake.write_text(f"#!{sys.executable}\n{KUBECTL}")
    fake.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_OBJECTS": json.dumps(objects),
        "FAKE_CONFIGMAPS": json.dumps(names),
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout.splitlines()


def test_roll_forward_roll_back_and_prune(tmp_path: Path) -> None:
    # 1. The first install, with an earlier version's build.
    first = run_inject(MANIFEST.read_text(), "--pyz", str(EARLIER))
    assert first.returncode == 0, first.stderr
    one = configmaps(documents(first.stdout))
    (old,) = one
    assert mounted(deployment(documents(first.stdout))) == old
    assert one[old]["metadata"]["annotations"] == dict(KEEP)

    # 2. Roll forward: a release's archive, checked against the SHA256SUMS beside it.
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "stallprobe.pyz").write_bytes(build())
    digest = hashlib.sha256((dist / "stallprobe.pyz").read_bytes()).hexdigest()
    (dist / "SHA256SUMS").write_text(f"{digest}  stallprobe.pyz\n")
    second = run_inject(first.stdout, "--pyz", str(dist / "stallprobe.pyz"))
    assert second.returncode == 0, second.stderr
    assert f"sha256 {digest}, as {dist / 'SHA256SUMS'} says" in second.stderr
    two = configmaps(documents(second.stdout))
    (new,) = set(two) - {old}
    assert two[old] == one[old]  # the earlier build kept, as it was
    forward = deployment(documents(second.stdout))
    assert mounted(forward) == new
    assert f"configmap/{old}: kept beside configmap/{new}" in second.stderr
    assert f"kubectl delete configmap {old} (docs/kubernetes.md: Upgrades and roll-backs)" in second.stderr
    # only the volume's ConfigMap moved: the same probes, so the same command line
    before, after = deployment(documents(first.stdout)), copy.deepcopy(forward)
    for volume in after["spec"]["template"]["spec"]["volumes"]:
        if volume["name"] == "stallprobe":
            volume["configMap"]["name"] = old
    assert after == before

    # 3. Roll back in the manifests: the earlier archive, checked against its sha256.
    earlier_sum = hashlib.sha256(EARLIER.read_bytes()).hexdigest()
    back = run_inject(second.stdout, "--pyz", str(EARLIER), "--pyz-sha256", earlier_sum)
    assert back.returncode == 0, back.stderr
    three = configmaps(documents(back.stdout))
    assert three == two  # both builds, as they were
    assert deployment(documents(back.stdout)) == before  # the template of step 1: what `rollout undo` restores
    assert f"configmap/{new}: kept beside configmap/{old}" in back.stderr

    # 4. Prune, in the cluster after the roll forward: the Deployment at revision 2, its ReplicaSets for
    # revisions 1 and 2, and a ConfigMap 0.1.0 wrote that nothing mounts any more.
    cluster = [forward, replicaset(before, 1), replicaset(forward, 2)]
    assert prune(tmp_path, cluster, [old, new, "stallprobe"]) == ["kubectl -n inference delete configmap/stallprobe"]
    # revision 1's ReplicaSet gone (past revisionHistoryLimit): its build may go too, and only it
    cluster = [forward, replicaset(forward, 2)]
    assert prune(tmp_path, cluster, [old, new]) == [f"kubectl -n inference delete configmap/{old}"]
    # every build mounted: nothing to delete
    assert prune(tmp_path, [forward, replicaset(before, 1)], [old, new]) == []
    # a pod of someone's own that mounts 0.1.0's ConfigMap with items, and one through a projected volume
    own = {"name": "stallprobe", "items": [{"key": "stallprobe.pyz", "path": "stallprobe.pyz"}], "defaultMode": 292}
    pods = [
        {"kind": "Pod", "metadata": {"name": "a"}, "spec": {"volumes": [{"name": "v", "configMap": own}]}},
        {
            "kind": "Pod",
            "metadata": {"name": "b"},
            "spec": {"volumes": [{"name": "v", "projected": {"sources": [{"configMap": {"name": old}}]}}]},
        },
    ]
    assert prune(tmp_path, [*pods, replicaset(forward, 2)], ["stallprobe", old, new]) == []
