"""`stallprobe inject`: put the exec liveness probe into the Kubernetes manifests people already have.

    stallprobe inject -f deploy.yaml | kubectl apply -f -

For every pod template (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, and the
leader template of a LeaderWorkerSet) it decides per container (decide.py, a pure function): only a
container that serves HTTP on a port its manifest shows, with its metrics on, gets the probe; workers,
sidecars and init containers never do. It replaces a liveness probe that is absent, or a plain HTTP
check of /health (any other is the operator's and stays unless --force), and the readiness probe the
same way unless --no-ready; adds a startupProbe where nothing guards the model's loading; mounts a
ConfigMap that holds the single-file build and its launcher (the probe's command runs `python3 -I -S
/opt/stallprobe/probe`), named by their content (stallprobe-<sha256, 10 hex digits>:
a new build rolls the workload; after the install's app.kubernetes.io/instance when every workload has the
same one, so that two releases of a chart in a namespace own one each); and emits that ConfigMap last, one
per namespace, in place of an older build's that nothing mounts any more. Injecting its own output changes
nothing, byte for byte.

The modules: shell.py (command lines as a shell splits them), decide.py (the decision), core.py (the
walk over documents, writing the stanzas stanza.py builds), manifests.py (YAML and JSON read with their
limits, and written back), splice.py (a changed document written as its own text with only the changed parts
rewritten), command.py (the command, Helm's post-renderer and Kustomize's KRM function). YAML goes
through ruamel.yaml, a dependency of the package; the probe itself never imports it.
"""

from __future__ import annotations

from ..errors import InjectError
from ..stanza import LAUNCHER_PATH, PYZ_PATH
from .command import main
from .core import InjectConfig, configmap_name, inject, plan_of
from .decide import Choice, Decision, decide, engine_of
from .manifests import read_documents, write_documents

__all__ = [
    "LAUNCHER_PATH",
    "PYZ_PATH",
    "Choice",
    "Decision",
    "InjectConfig",
    "InjectError",
    "configmap_name",
    "decide",
    "engine_of",
    "inject",
    "main",
    "plan_of",
    "read_documents",
    "write_documents",
]
