"""inject's decision per container, as a table: one container, its pod's role, the options, and what must
be decided (action, port, where the port came from, what is turned on, the startup guard). The port has
a table of its own (ROWS): one row per place a port is read from, one per way a manifest leaves it open."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from stallprobe.engines import DIALECTS, VLLM
from stallprobe.inject.decide import Choice, Context, Decision, decide, engine_of
from stallprobe.inject.shell import (
    Env,
    command_lines,
    environment,
    flag_value,
    has_flag,
    k8s_expand,
    shell_words,
    standing,
)
from stallprobe.serving import LOOPBACK, SERVING, Address, VllmServing, python_in

WILD = Address("127.0.0.1", "")  # a wildcard: dialled at loopback, reached by the kubelet at the pod's IP
HEALTH = {"httpGet": {"path": "/health", "port": 8000}}
# What inject writes (the launcher's file), and what an earlier release wrote (a `-c` program naming the
# archive): both are ours, to rewrite.
OURS = {"exec": {"command": ["python3", "-I", "-S", "/opt/stallprobe/probe", "--url", "http://127.0.0.1:8000/metrics"]}}
OURS_BEFORE = {"exec": {"command": ["python3", "-c", 'p = "/opt/stallprobe/stallprobe.pyz"; run()']}}
CUSTOM = {"exec": {"command": ["/bin/check"]}}


def c(image: str = "vllm/vllm-openai:v0.11.0", **fields: Any) -> dict[str, Any]:
    return {"name": "engine", "image": image, **fields}


def sh(script: str, **fields: Any) -> dict[str, Any]:
    return c(image=fields.pop("image", "vllm/vllm-openai:v0.11.0"), command=["/bin/sh", "-c", script], **fields)


SG = "lmsysorg/sglang:v0.5"
LL = "ghcr.io/ggml-org/llama.cpp:server"  # no python3 in it: skipped, but with --python
LLF = "ghcr.io/ggml-org/llama.cpp:full"  # python3 in it; its entrypoint runs the server after --server


def ll(*args: str, **fields: Any) -> dict[str, Any]:
    """llama.cpp in its full image, whose entrypoint (tools.sh) runs llama-server with the args after --server."""
    return c(image=LLF, args=["--server", *args], **fields)


SGLANG_SCRIPT = (
    "sglang publishes no metrics without --enable-metrics, and its command is a script inject does not edit "
    "(add --enable-metrics to it)"
)
OFF = {
    "action": "skip",
    "why": "metrics are off (--disable-log-stats): vllm publishes no vllm: family, so a probe could only fail",
    "engine": None,
    "port": 0,
}
PROBED = {"action": "probe", "engine": "vllm", "port": 8000, "port_from": "--port in its command"}
RAY = "a multi-node worker: it runs `ray start`: a Ray worker, whose engine serves from the head node"
# (name, container, role, choice, expected): choice holds Choice's keywords (it is built in the test, where
# mutmut sees it); expected holds the Decision fields that must match, each exactly.
SCENARIOS: list[tuple[str, dict[str, Any], str, dict[str, Any], dict[str, Any]]] = [
    (
        "sidecar",
        c(image="envoyproxy/envoy:v1"),
        "pod",
        {},
        {
            "action": "ignore",
            "why": "",
            "engine": None,
            "port": 0,
            "port_from": "",
            "enable": ("", ""),
            "startup": False,
            "address": None,
            "python": "",
            "key": (),
            "notes": (),
            "liveness": "",
            "readiness": "",
        },
    ),
    ("not the named one", c(), "pod", {"container": "other"}, {"action": "ignore"}),
    (
        "the engine --engine names, in the container --container names",
        c(image="me/own:1", args=["--port", "7002"]),
        "pod",
        {"container": "engine", "engine": "vllm"},
        {"action": "probe", "engine": "vllm", "port": 7002},
    ),
    (
        "a named wrapper's --enable-metrics is read",
        c(image=SG, command=["/start.sh", "--port", "30000", "--enable-metrics"]),
        "pod",
        {"container": "engine"},
        {"action": "probe", "engine": "sglang", "port": 30000, "enable": ("", "")},
    ),
    (
        "--engine does not make a sidecar an engine",
        c(image="envoyproxy/envoy:v1"),
        "pod",
        {"engine": "vllm"},
        {"action": "ignore"},
    ),
    (
        "lws worker",
        c(args=["--port", "8000"]),
        "worker",
        {},
        {"action": "skip", "why": "a LeaderWorkerSet worker: it joins the leader's engine and serves no HTTP"},
    ),
    (
        "lws shared template",
        c(),
        "shared",
        {},
        {
            "action": "skip",
            "why": (
                "a LeaderWorkerSet without a leaderTemplate: this template makes the leader and "
                "its workers alike, and the workers serve no HTTP (give the leader its own "
                "template)"
            ),
        },
    ),
    (
        "entrypoint image, args only: default port assumed",
        c(args=["--model", "m"]),
        "pod",
        {},
        {
            "action": "probe",
            "why": "",
            "engine": "vllm",
            "port": 8000,
            "port_from": "assumed: vllm's default, as its command sets no port",
            "enable": ("", ""),
            "startup": True,
            "address": WILD,
            "python": "python3",
            "key": (),
            "notes": (),
            "liveness": "added",
            "readiness": "",
        },
    ),
    (
        "llama.cpp without metrics: its variable turns them on; loopback",
        ll("-m", "/m.gguf"),
        "pod",
        {},
        {"action": "probe", "port": 8080, "enable": ("env", "LLAMA_ARG_ENDPOINT_METRICS"), "address": LOOPBACK},
    ),
    (
        "llama.cpp with --metrics and --host 0.0.0.0",
        ll("--metrics", "--host", "0.0.0.0", "--port", "8081"),
        "pod",
        {},
        {"action": "probe", "port": 8081, "enable": ("", ""), "address": WILD},
    ),
    (
        "llama.cpp host from LLAMA_ARG_HOST",
        ll("--metrics", env=[{"name": "LLAMA_ARG_HOST", "value": "0.0.0.0"}]),
        "pod",
        {},
        {"action": "probe", "address": WILD},
    ),
    (
        "llama.cpp rpc-server worker",
        c(image="ghcr.io/ggml-org/llama.cpp:full", command=["/app/rpc-server", "-p", "50052"]),
        "pod",
        {},
        {
            "action": "skip",
            "why": (
                "a multi-node worker: it runs llama.cpp's rpc-server: a backend for a llama-"
                "server elsewhere, with no HTTP"
            ),
        },
    ),
    (
        "sglang without --enable-metrics: appended",
        c(image=SG, command=["python3", "-m", "sglang.launch_server", "--port", "30001"]),
        "pod",
        {},
        {"action": "probe", "port": 30001, "enable": ("arg", "--enable-metrics"), "address": LOOPBACK},
    ),
    (
        "sglang script without --enable-metrics: skipped",
        sh("python3 -m sglang.launch_server --port 30000", image=SG),
        "pod",
        {},
        {"action": "skip", "why": SGLANG_SCRIPT},
    ),
    (
        "sglang default port assumed",
        c(image=SG, command=["python3", "-m", "sglang.launch_server", "--enable-metrics"]),
        "pod",
        {},
        {"action": "probe", "port": 30000, "port_from": "assumed: sglang's default, as its command sets no port"},
    ),
    (
        "sglang leader: LWS_WORKER_INDEX is 0",
        c(
            image=SG,
            args=["python3", "-m", "sglang.launch_server", "--node-rank", "$(LWS_WORKER_INDEX)", "--enable-metrics"],
        ),
        "leader",
        {},
        {"action": "probe", "port": 30000},
    ),
    (
        "sglang node rank from the pod index",
        sh("python3 -m sglang.launch_server --node-rank $POD_INDEX --port 8000 --enable-metrics", image=SG),
        "pod",
        {},
        {
            "action": "skip",
            "why": (
                "a multi-node worker: its --node-rank is $POD_INDEX, which differs from pod to "
                "pod: only rank 0 serves HTTP"
            ),
        },
    ),
    (
        "node rank 1",
        c(args=["--node-rank", "1"]),
        "pod",
        {},
        {"action": "skip", "why": "a multi-node worker: it runs with --node-rank 1: only rank 0 serves HTTP"},
    ),
    ("node rank 0", c(args=["--node_rank", "0"]), "pod", {}, {"action": "probe"}),
    (
        "sglang's flags to an image inject does not know, its port agreed: --enable-metrics appended",
        c(image="me/sglang:1", args=["--model-path", "m", "--port", "30000"], ports=[{"containerPort": 30000}]),
        "pod",
        {},
        {"action": "probe", "port": 30000, "enable": ("arg", "--enable-metrics"), "python": "python3"},
    ),
    (
        "vllm headless",
        c(args=["--headless"]),
        "pod",
        {},
        {"action": "skip", "why": ("a multi-node worker: it runs with --headless: engine cores without an API server")},
    ),
    (
        "vllm dp start rank without lb",
        c(args=["--data-parallel-start-rank", "2"]),
        "pod",
        {},
        {
            "action": "skip",
            "why": (
                "a multi-node worker: it runs with --data-parallel-start-rank 2 without a load-balanced mode: headless"
            ),
        },
    ),
    (
        "vllm dp start rank with hybrid lb serves",
        c(args=["--data-parallel-start-rank", "2", "--data-parallel-hybrid-lb"]),
        "pod",
        {},
        {"action": "probe"},
    ),
    ("vllm dp start rank 0", c(args=["--data-parallel-start-rank=0"]), "pod", {}, {"action": "probe"}),
    (
        "api-server-count 0",
        c(args=["--api-server-count", "0"]),
        "pod",
        {},
        {"action": "skip", "why": "a multi-node worker: it runs with --api-server-count 0: headless"},
    ),
    ("api-server-count 2", c(args=["--api-server-count", "2"]), "pod", {}, {"action": "probe"}),
    (
        "ray worker",
        sh("ray start --address=$(HEAD):6379 --block"),
        "pod",
        {},
        {
            "action": "skip",
            "why": RAY,
        },
    ),
    (
        "multi-node-serving worker",
        sh("bash /w/multi-node-serving.sh worker --ray_address=x"),
        "pod",
        {},
        {
            "action": "skip",
            "why": (
                "a multi-node worker: it runs multi-node-serving.sh worker: a Ray worker, whose "
                "engine serves from the leader"
            ),
        },
    ),
    # vLLM's metrics off: no probe, wherever the flag is written.
    ("metrics off: an args item", c(args=["--port", "8000", "--disable-log-stats"]), "pod", {}, OFF),
    (
        "metrics off: in command",
        c(image="me/x:1", command=["vllm", "serve", "m", "--disable-log-stats"]),
        "pod",
        {},
        OFF,
    ),
    ("metrics off: with underscores", c(args=["--disable_log_stats", "--port", "8000"]), "pod", {}, OFF),
    ("metrics off: in a shell script", sh("vllm serve m --port 8000 --disable-log-stats"), "pod", {}, OFF),
    (
        "metrics off: a script's later line",
        sh("set -e\nexec python3 -m vllm.entrypoints.openai.api_server \\\n  --port 8000 \\\n  --disable-log-stats"),
        "pod",
        {},
        OFF,
    ),
    (
        "metrics off: the kubelet's $(VAR)",
        c(args=["--port", "8000", "$(EXTRA_ARGS)"], env=[{"name": "EXTRA_ARGS", "value": "--disable-log-stats"}]),
        "pod",
        {},
        OFF,
    ),
    (
        "metrics off: in a $(VAR) of several flags",
        c(args=["$(EXTRA_ARGS)"], env=[{"name": "EXTRA_ARGS", "value": "--max-model-len 4096 --disable-log-stats"}]),
        "pod",
        {},
        OFF,
    ),
    (
        "metrics off: the shell's $VAR",
        sh("vllm serve m --port 8000 $EXTRA_ARGS", env=[{"name": "EXTRA_ARGS", "value": "-tp 2 --disable-log-stats"}]),
        "pod",
        {},
        OFF,
    ),
    (
        "metrics off: the shell's ${VAR}",
        sh("vllm serve m ${EXTRA_ARGS}", env=[{"name": "EXTRA_ARGS", "value": "--disable-log-stats"}]),
        "pod",
        {},
        OFF,
    ),
    (
        "metrics off: the shell's ${VAR:-default}",
        sh("vllm serve m ${EXTRA_ARGS:---disable-log-stats}"),
        "pod",
        {},
        OFF,
    ),
    (
        "metrics off: said before an unknown port",
        c(image="me/vllm:1", command=["python3", "tool.py", "--disable-log-stats"]),
        "pod",
        {},
        OFF,
    ),
    ("metrics on: --no-disable-log-stats", c(args=["--port", "8000", "--no-disable-log-stats"]), "pod", {}, PROBED),
    (
        "metrics on: the flag only in a variable the command does not expand",
        c(args=["--port", "8000"], env=[{"name": "EXTRA_ARGS", "value": "--disable-log-stats"}]),
        "pod",
        {},
        PROBED,
    ),
    (
        "metrics on: the flag in a shell comment",
        sh("vllm serve m --port 8000 # --disable-log-stats"),
        "pod",
        {},
        PROBED,
    ),
    (
        "metrics on: an engine inject does not know has no such flag",
        c(image="me/own:1", args=["--port", "8000", "--disable-log-stats"]),
        "pod",
        {"container": "engine", "python": "python3"},
        {"action": "probe", "engine": None, "port": 8000},
    ),
    (
        "plain health check replaced",
        c(livenessProbe=HEALTH),
        "pod",
        {},
        {"liveness": "replaced", "startup": True},
    ),
    (
        "named, unknown engine: its --port, and a --host it is not known to read",
        c(image="me/own:1", args=["--port", "7001", "--host", "127.0.0.1"]),
        "pod",
        {"container": "engine", "python": "python3"},
        {"action": "probe", "engine": None, "port": 7001, "port_from": "--port in its command", "address": WILD},
    ),
    (
        "the engine named by its args alone",
        c(image="me/img:1", args=["llama-server", "--port", "8082", "--metrics"]),
        "pod",
        {"python": "python3"},
        {"action": "probe", "engine": "llamacpp", "port": 8082, "port_from": "--port in its command"},
    ),
    (
        "llama.cpp on localhost",
        ll("--metrics", "--host", "localhost"),
        "pod",
        {},
        {"action": "probe", "address": Address("localhost", None)},
    ),
    (
        "llama.cpp on ::1",
        ll("--metrics", "--host", "::1"),
        "pod",
        {},
        {"action": "probe", "address": Address("[::1]", None)},
    ),
    (
        "llama.cpp metrics variable True",
        ll(env=[{"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "True"}]),
        "pod",
        {},
        {"action": "probe", "enable": ("", "")},
    ),
    (
        "llama.cpp metrics variable 0: turned on",
        ll(env=[{"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "0"}]),
        "pod",
        {},
        {"action": "probe", "enable": ("env", "LLAMA_ARG_ENDPOINT_METRICS")},
    ),
    (
        "sglang script in its args without --enable-metrics: skipped",
        c(image=SG, args=["sh", "-c", "python3 -m sglang.launch_server"]),
        "pod",
        {},
        {"action": "skip", "why": SGLANG_SCRIPT},
    ),
    (
        "api-server-count 0, short",
        c(args=["-asc", "0"]),
        "pod",
        {},
        {"action": "skip", "why": "a multi-node worker: it runs with --api-server-count 0: headless"},
    ),
    (
        "vllm dp start rank, short",
        c(args=["-dpr", "3"]),
        "pod",
        {},
        {
            "action": "skip",
            "why": (
                "a multi-node worker: it runs with --data-parallel-start-rank 3 without a load-balanced mode: headless"
            ),
        },
    ),
    ("a model named worker", c(args=["--served-model-name", "worker"]), "pod", {}, {"action": "probe"}),
    (
        "ray worker by its path",
        sh("/usr/local/bin/ray start --temp-dir=/tmp/ray --block"),
        "pod",
        {},
        {"action": "skip", "why": RAY},
    ),
    ("/healthz replaced", c(livenessProbe={"httpGet": {"path": "/healthz"}}), "pod", {}, {"liveness": "replaced"}),
    ("/health/ replaced", c(livenessProbe={"httpGet": {"path": "/health/"}}), "pod", {}, {"liveness": "replaced"}),
    (
        "a longer path is the operator's: kept",
        c(livenessProbe={"httpGet": {"path": "/health/X"}}),
        "pod",
        {},
        {"action": "keep", "why": "not a plain /health check; --force replaces it"},
    ),
    (
        "a probe that is not a mapping is kept",
        c(livenessProbe="/health"),
        "pod",
        {},
        {"action": "keep", "why": "not a plain /health check; --force replaces it"},
    ),
    ("ours", c(livenessProbe=OURS, startupProbe=HEALTH), "pod", {}, {"liveness": "ours", "startup": False}),
    ("ours, an earlier release's -c program", c(livenessProbe=OURS_BEFORE), "pod", {}, {"liveness": "ours"}),
    (
        "a file beside ours is not ours",
        c(livenessProbe={"exec": {"command": ["python3", "/opt/stallprobe/probe.d/check"]}}),
        "pod",
        {},
        {"action": "keep", "why": "not a plain /health check; --force replaces it"},
    ),
    (
        "custom kept",
        c(livenessProbe=CUSTOM),
        "pod",
        {},
        {"action": "keep", "why": "not a plain /health check; --force replaces it", "engine": "vllm"},
    ),
    ("custom forced", c(livenessProbe=CUSTOM), "pod", {"force": True}, {"liveness": "replaced"}),
    (
        "initial delay guards loading",
        c(livenessProbe={**HEALTH, "initialDelaySeconds": 600}),
        "pod",
        {},
        {"startup": False},
    ),
    # Where a failing liveness run leaves its evidence: the file the kubelet reads the container's
    # termination message from.
    ("termination: Kubernetes' default", c(), "pod", {}, {"termination": "/dev/termination-log"}),
    (
        "termination: the container's own path",
        c(terminationMessagePath="/var/log/why"),
        "pod",
        {},
        {"termination": "/var/log/why"},
    ),
    (
        "termination: an empty path is the default",
        c(terminationMessagePath=""),
        "pod",
        {},
        {"termination": "/dev/termination-log"},
    ),
    ("termination: not a path", c(terminationMessagePath=5), "pod", {}, {"termination": "/dev/termination-log"}),
    ("readiness added", c(), "pod", {"drain": True}, {"readiness": "added"}),
    ("readiness not asked", c(), "pod", {}, {"readiness": ""}),
    ("readiness plain replaced", c(readinessProbe=HEALTH), "pod", {"drain": True}, {"readiness": "replaced"}),
    ("readiness ours", c(readinessProbe=OURS), "pod", {"drain": True}, {"readiness": "ours"}),
    ("readiness ours, earlier", c(readinessProbe=OURS_BEFORE), "pod", {"drain": True}, {"readiness": "ours"}),
    ("readiness custom kept", c(readinessProbe=CUSTOM), "pod", {"drain": True}, {"readiness": "kept"}),
    (
        "readiness custom forced",
        c(readinessProbe=CUSTOM),
        "pod",
        {"drain": True, "force": True},
        {"readiness": "replaced"},
    ),
]


@pytest.mark.parametrize(("name", "container", "role", "choice", "expected"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_decision(
    name: str, container: dict[str, Any], role: str, choice: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert SCENARIOS
    decision = decide(container, role, Choice(**choice))  # built here, not at import: mutmut sees it
    for field, value in expected.items():
        assert getattr(decision, field) == value, (field, decision)


# The port: one row per place a port is read from, and one per way the manifest leaves it open.
def settle(why: str, name: str = "engine") -> str:
    return f"{why} (--container {name} --port N settles it)"


def cm(name: str, **fields: Any) -> dict[str, Any]:
    return {"configMapRef": {"name": name, **fields}}


def key_ref(kind: str, name: str, key: str = "port", **fields: Any) -> dict[str, Any]:
    return {"valueFrom": {kind: {"name": name, "key": key, **fields}}}


def ports(*pairs: tuple[str | None, Any]) -> list[dict[str, Any]]:
    return [
        {"containerPort": port} if label is None else {"name": label, "containerPort": port} for label, port in pairs
    ]


FLAG = "--port in its command"
DEFAULT = "assumed: vllm's default, as its command sets no port"
GIVEN = "--port given to inject"
SERVE: dict[str, Any] = {"image": "me/img:1", "command": ["vllm", "serve", "m"]}  # vLLM's server, no port flag
WRAPPER: dict[str, Any] = {"command": ["bash", "start.sh"]}  # a script the manifest does not show
NAMED: dict[str, Any] = {"container": "engine"}  # --container engine
PY: dict[str, Any] = {"python": "python3"}  # --python python3: the interpreter of an image inject does not know
PORT_ARG: dict[str, Any] = {"args": ["--port", "$(PORT)"]}
SECRET: dict[str, Any] = {"secretRef": {"name": "s"}}
HIDDEN_SECRET = "its envFrom Secret s, which inject does not read"
NOT_PROVEN = "its port is not proven: it runs bash start.sh, not vllm's server"
# (name, container, choice, context, expected): choice and context hold Choice's and Context's keywords
# (built in the test, where mutmut sees them); expected is (port, where from) for a probe, else the skip's why.
ROWS: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], tuple[int, str] | str]] = [
    # The engine's port flag, on its server's command line.
    ("flag in args to the image's server", c(args=["--port", "9001"]), {}, {}, (9001, FLAG)),
    ("flag=value on vllm serve", c(**SERVE, args=["--port=9002"]), {}, {}, (9002, FLAG)),
    (
        "flag in a bash -c script",
        sh('echo hi; exec python3 -m vllm.entrypoints.openai.api_server --port 8080 --model "m x"'),
        {},
        {},
        (8080, FLAG),
    ),
    ("the last flag wins", c(args=["--port", "1", "--port", "9003"]), {}, {}, (9003, FLAG)),
    (
        "the last server's flag",
        sh("vllm serve m --port 1 || vllm serve m --port 8003"),
        {},
        {},
        (8003, FLAG),
    ),
    (
        "the server's flag, not a proxy's beside it",
        sh("vllm serve m --port 8001 & proxy --port 9000"),
        {},
        {},
        (8001, FLAG),
    ),
    ("a proxy's flag beside a server without one", sh("proxy --port 9000 & vllm serve m"), {}, {}, (8000, DEFAULT)),
    ("port 1", c(args=["--port", "1"]), {}, {}, (1, FLAG)),
    ("port 65535", c(args=["--port", "65535"]), {}, {}, (65535, FLAG)),
    ("port 0", c(args=["--port", "0"]), {}, {}, settle("its port is 0: not a port (1-65535)")),
    ("port 65536", c(args=["--port", "65536"]), {}, {}, settle("its port is 65536: not a port (1-65535)")),
    (
        "port past what int() converts",
        c(args=["--port", "9" * 5000]),
        {},
        {},
        settle(f"its port is {'9' * 5000}: not a port (1-65535)"),
    ),
    (
        "port in digits other than ASCII's",
        c(args=["--port", "\u0668\u0660\u0660\u0660"]),
        {},
        {},
        settle("its port is \u0668\u0660\u0660\u0660: not a port (1-65535)"),
    ),
    # ... with $(VAR) and $VAR resolved from env, and from ConfigMaps the input holds.
    ("$(PORT) from env", c(**PORT_ARG, env=[{"name": "PORT", "value": "8123"}]), {}, {}, (8123, FLAG)),
    (
        "$PORT from env in a script",
        sh("vllm serve m --port ${PORT}", env=[{"name": "PORT", "value": "8124"}]),
        {},
        {},
        (8124, FLAG),
    ),
    ("${PORT:-8125}: the default, PORT surely unset", sh("vllm serve m --port ${PORT:-8125}"), {}, {}, (8125, FLAG)),
    (
        "$(PORT) from envFrom a ConfigMap in the input",
        c(**PORT_ARG, envFrom=["x", cm("cfg")]),
        {},
        {"configmaps": {"cfg": {"PORT": "8200"}}},
        (8200, FLAG),
    ),
    (
        "$(PORT) from envFrom with a prefix",
        c(args=["--port", "$(VLLM_PORT)"], envFrom=[{"prefix": "VLLM_", **cm("cfg")}]),
        {},
        {"configmaps": {"cfg": {"PORT": "8201"}}},
        (8201, FLAG),
    ),
    (
        "a prefixed key is not its bare name",
        c(**PORT_ARG, envFrom=[{"prefix": "VLLM_", **cm("cfg")}]),
        {},
        {"configmaps": {"cfg": {"PORT": "8201"}}},
        settle("its port is $(PORT): PORT is set nowhere in the manifest"),
    ),
    (
        "$(PORT) from configMapKeyRef in the input",
        c(**PORT_ARG, env=[{"name": "PORT", **key_ref("configMapKeyRef", "cfg")}]),
        {},
        {"configmaps": {"cfg": {"port": "8202"}}},
        (8202, FLAG),
    ),
    (
        "env given twice: the last wins",
        c(**PORT_ARG, env=["x", {"name": "PORT", "value": "1"}, {"value": "2"}, {"name": "PORT", "value": "8203"}]),
        {},
        {},
        (8203, FLAG),
    ),
    (
        "env wins over envFrom",
        c(**PORT_ARG, envFrom=[cm("cfg")], env=[{"name": "PORT", "value": "8204"}]),
        {},
        {"configmaps": {"cfg": {"PORT": "1"}}},
        (8204, FLAG),
    ),
    (
        "a later envFrom wins",
        c(**PORT_ARG, envFrom=[cm("a"), cm("b")]),
        {},
        {"configmaps": {"a": {"PORT": "1"}, "b": {"PORT": "8205"}}},
        (8205, FLAG),
    ),
    (
        "env after an unread envFrom is known",
        c(**PORT_ARG, envFrom=[SECRET], env=[{"name": "PORT", "value": "8206"}]),
        {},
        {},
        (8206, FLAG),
    ),
    (
        "an env value from an envFrom variable",
        c(**PORT_ARG, envFrom=[cm("cfg")], env=[{"name": "PORT", "value": "$(BASE)"}]),
        {},
        {"configmaps": {"cfg": {"BASE": "8207"}}},
        (8207, FLAG),
    ),
    (
        "Helm: a number in a ConfigMap's data",
        c(**PORT_ARG, envFrom=[cm("cfg")]),
        {},
        {"configmaps": {"cfg": {"PORT": 8208}}},
        (8208, FLAG),
    ),
    # ... or left open: skipped, saying why.
    ("$(PORT) set nowhere", c(**PORT_ARG), {}, {}, settle("its port is $(PORT): PORT is set nowhere in the manifest")),
    (
        "configMapKeyRef to a ConfigMap not in the input",
        c(**PORT_ARG, env=[{"name": "PORT", **key_ref("configMapKeyRef", "cfg")}]),
        {},
        {},
        settle("its port is $(PORT): PORT is key port of ConfigMap cfg, which is not in the input"),
    ),
    (
        "configMapKeyRef to a missing key",
        c(**PORT_ARG, env=[{"name": "PORT", **key_ref("configMapKeyRef", "cfg")}]),
        {},
        {"configmaps": {"cfg": {}}},
        settle("its port is $(PORT): PORT is key port of ConfigMap cfg, which has no such key"),
    ),
    (
        "configMapKeyRef to a missing optional key: unset",
        c(**PORT_ARG, env=[{"name": "PORT", **key_ref("configMapKeyRef", "cfg", optional=True)}]),
        {},
        {"configmaps": {"cfg": {}}},
        settle("its port is $(PORT): PORT is set nowhere in the manifest"),
    ),
    (
        "secretKeyRef",
        c(**PORT_ARG, env=[{"name": "PORT", **key_ref("secretKeyRef", "s")}]),
        {},
        {},
        settle("its port is $(PORT): PORT is from Secret s, which inject does not read"),
    ),
    (
        "a secret after a literal: the last wins",
        c(**PORT_ARG, env=[{"name": "PORT", "value": "8000"}, {"name": "PORT", **key_ref("secretKeyRef", "s")}]),
        {},
        {},
        settle("its port is $(PORT): PORT is from Secret s, which inject does not read"),
    ),
    (
        "fieldRef",
        c(**PORT_ARG, env=[{"name": "PORT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['port']"}}}]),
        {},
        {},
        settle("its port is $(PORT): PORT is from its fieldRef, which the manifest does not show"),
    ),
    (
        "an empty valueFrom",
        c(**PORT_ARG, env=[{"name": "PORT", "valueFrom": {}}]),
        {},
        {},
        settle("its port is $(PORT): PORT is from its valueFrom, which the manifest does not show"),
    ),
    (
        "$PORT set nowhere, in a script",
        sh("vllm serve m --port $PORT"),
        {},
        {},
        settle("its port is $PORT: PORT is set nowhere in the manifest"),
    ),
    (
        "${PORT:-8000} where PORT is from a Secret",
        sh("vllm serve m --port ${PORT:-8000}", env=[{"name": "PORT", **key_ref("secretKeyRef", "s")}]),
        {},
        {},
        settle("its port is ${PORT:-8000}: PORT is from Secret s, which inject does not read"),
    ),
    (
        "envFrom a ConfigMap not in the input",
        c(**PORT_ARG, envFrom=[cm("other")]),
        {},
        {"configmaps": {"cfg": {"PORT": "1"}}},
        settle("its port is $(PORT): PORT may come from its envFrom ConfigMap other, which is not in the input"),
    ),
    (
        "envFrom an optional ConfigMap not in the input",
        c(**PORT_ARG, envFrom=[cm("other", optional=True)]),
        {},
        {},
        settle("its port is $(PORT): PORT may come from its envFrom ConfigMap other, which is not in the input"),
    ),
    (
        "envFrom a Secret",
        c(**PORT_ARG, envFrom=[SECRET]),
        {},
        {},
        settle(f"its port is $(PORT): PORT may come from {HIDDEN_SECRET}"),
    ),
    (
        "a known value an unread envFrom may overwrite",
        c(**PORT_ARG, envFrom=[cm("cfg"), SECRET]),
        {},
        {"configmaps": {"cfg": {"PORT": "8000"}}},
        settle(f"its port is $(PORT): PORT is perhaps overwritten by {HIDDEN_SECRET}"),
    ),
    (
        "an env value from an unknown variable",
        c(**PORT_ARG, env=[{"name": "B", **key_ref("secretKeyRef", "s")}, {"name": "PORT", "value": "$(B)"}]),
        {},
        {},
        settle("its port is $(B): B is from Secret s, which inject does not read"),
    ),
    (
        "${PORT:-8000} where an unread envFrom may set PORT",
        sh("vllm serve m --port ${PORT:-8000}", envFrom=[SECRET]),
        {},
        {},
        settle(f"its port is ${{PORT:-8000}}: PORT may come from {HIDDEN_SECRET}"),
    ),
    # The engine's own port variable.
    ("LLAMA_ARG_PORT", ll(env=[{"name": "LLAMA_ARG_PORT", "value": "80"}]), {}, {}, (80, "LLAMA_ARG_PORT")),
    (
        "LLAMA_ARG_PORT from envFrom",
        ll(envFrom=[cm("cfg")]),
        {},
        {"configmaps": {"cfg": {"LLAMA_ARG_PORT": "81"}}},
        (81, "LLAMA_ARG_PORT"),
    ),
    (
        "a flag wins over LLAMA_ARG_PORT",
        ll("--port", "82", env=[{"name": "LLAMA_ARG_PORT", "value": "80"}]),
        {},
        {},
        (82, FLAG),
    ),
    (
        "LLAMA_ARG_PORT from a Secret, then given",
        c(
            image=LLF,
            args=["--server"],
            env=[{"name": "LLAMA_ARG_PORT", **key_ref("secretKeyRef", "s")}, {"name": "LLAMA_ARG_PORT", "value": "83"}],
        ),
        {},
        {},
        (83, "LLAMA_ARG_PORT"),
    ),
    (
        "LLAMA_ARG_PORT perhaps overwritten, then set again by a ConfigMap",
        ll(envFrom=[cm("a"), SECRET, cm("b")]),
        {},
        {"configmaps": {"a": {"LLAMA_ARG_PORT": "1"}, "b": {"LLAMA_ARG_PORT": "84"}}},
        (84, "LLAMA_ARG_PORT"),
    ),
    (
        "LLAMA_ARG_PORT not a port",
        ll(env=[{"name": "LLAMA_ARG_PORT", "value": "http"}]),
        {},
        {},
        settle("its LLAMA_ARG_PORT is 'http', not a port"),
    ),
    (
        "LLAMA_ARG_PORT from a Secret",
        ll(env=[{"name": "LLAMA_ARG_PORT", **key_ref("secretKeyRef", "s")}], ports=ports((None, 8080))),
        {},
        {},
        settle("its port is not known: LLAMA_ARG_PORT is from Secret s, which inject does not read"),
    ),
    (
        "LLAMA_ARG_PORT perhaps from an unread envFrom, no containerPort",
        ll(envFrom=[SECRET]),
        {},
        {},
        settle(f"its port is not known: LLAMA_ARG_PORT may come from {HIDDEN_SECRET}"),
    ),
    (
        "LLAMA_ARG_PORT perhaps from an unread envFrom: its containerPort",
        ll(envFrom=[SECRET], ports=ports((None, 9000))),
        {},
        {},
        (9000, "its containerPort"),
    ),
    (
        "llama.cpp's image ENV may set its port: its containerPort",
        c(image="me/llm:1", command=["llama-server", "--metrics"], ports=ports((None, 7000))),
        PY,
        {},
        (7000, "its containerPort"),
    ),
    # The engine's plain server with no port flag: its default, which its containerPorts must not contradict.
    ("default, no containerPort", c(args=["--model", "m"]), {}, {}, (8000, DEFAULT)),
    ("default, vllm serve in its own image", c(**SERVE), {}, {}, (8000, DEFAULT)),
    (
        "default, sglang",
        c(image=SG, command=["python3", "-m", "sglang.launch_server", "--enable-metrics"]),
        {},
        {},
        (30000, "assumed: sglang's default, as its command sets no port"),
    ),
    (
        "default, the one containerPort says it",
        c(**SERVE, ports=ports(("modelserver", 8000))),
        {},
        {},
        (8000, "its containerPort"),
    ),
    ("default among several ports", c(**SERVE, ports=ports((None, 5557), (None, 8000))), {}, {}, (8000, DEFAULT)),
    (
        "a UDP port is not HTTP",
        c(**SERVE, ports=[{"containerPort": 8000}, {"containerPort": 9, "protocol": "UDP"}]),
        {},
        {},
        (8000, "its containerPort"),
    ),
    (
        "the one containerPort contradicts the default",
        c(**SERVE, ports=ports((None, 8080))),
        {},
        {},
        settle("its command sets no port, so vllm serves on its default 8000, but its containerPort is 8080"),
    ),
    (
        "the port named http contradicts the default",
        c(ports=ports(("grpc", 9), ("http", 8888))),
        {},
        {},
        settle("its command sets no port, so vllm serves on its default 8000, but its containerPort http is 8888"),
    ),
    (
        "several ports, none the default",
        c(**SERVE, ports=ports((None, 8080), (None, 5557))),
        {},
        {},
        settle("its command sets no port, so vllm serves on its default 8000, but its containerPorts are 8080, 5557"),
    ),
    # A script or image the manifest does not show: the port is not proven, whatever it declares.
    (
        "a wrapper script with three ports",
        c(**WRAPPER, ports=ports((None, 6379), (None, 8265), (None, 8000))),
        {},
        {},
        settle(NOT_PROVEN),
    ),
    ("a wrapper script with one port", c(**WRAPPER, ports=ports(("http", 8000))), {}, {}, settle(NOT_PROVEN)),
    (
        "a wrapper script with its arguments, by its shell's path",
        c(command=["/bin/bash", "start.sh", "--model", "m"]),
        {},
        {},
        settle("its port is not proven: it runs /bin/bash start.sh, not vllm's server"),
    ),
    (
        "a container without a name",
        {"image": "me/vllm:1"},
        {},
        {},
        "its port is not proven: its image me/vllm:1 runs an entrypoint the manifest does not show "
        "(--container NAME --port N settles it)",
    ),
    (
        "a wrapper's own --port",
        c(command=["/entrypoint.sh", "--port", "8000"]),
        {},
        {},
        settle("its port is not proven: it runs /entrypoint.sh, not vllm's server"),
    ),
    (
        "a custom image, no command",
        c(image="me/vllm:1", ports=ports((None, 8000))),
        {},
        {},
        settle("its port is not proven: its image me/vllm:1 runs an entrypoint the manifest does not show"),
    ),
    (
        "a custom image, args only",
        c(image="me/vllm:1", args=["--model", "m"]),
        {},
        {},
        settle("its port is not proven: its image me/vllm:1 runs an entrypoint the manifest does not show"),
    ),
    (
        "vllm serve past the third word is not the server",
        c(image="me/img:1", command=["nice", "-n5", "vllm", "serve", "m"]),
        {},
        {},
        settle("its port is not proven: it runs nice, not vllm's server"),
    ),
    (
        "a command in the entrypoint image that is not the server",
        c(command=["python3", "tool.py"]),
        {},
        {},
        settle("its port is not proven: it runs python3, not vllm's server"),
    ),
    # ... unless --container names it: then its flag, the one containerPort, or the one named for HTTP.
    ("named: a wrapper's --port", c(command=["/entrypoint.sh", "--port", "8000"]), NAMED, {}, (8000, FLAG)),
    ("named: its one containerPort", c(**WRAPPER, ports=ports((None, 7000))), NAMED, {}, (7000, "its containerPort")),
    (
        "named: an unknown engine's one containerPort",
        c(image="me/own:1", ports=ports((None, 7001))),
        {**NAMED, **PY},
        {},
        (7001, "its containerPort"),
    ),
    (
        "named: an unknown engine's --port",
        c(image="me/own:1", args=["--port", "7002"]),
        {**NAMED, **PY},
        {},
        (7002, FLAG),
    ),
    (
        "named, with --engine",
        c(image="me/own:1", args=["--port", "7003"]),
        {**NAMED, "engine": "vllm"},
        {},
        (7003, FLAG),
    ),
    (
        "named: the one named http",
        c(**WRAPPER, ports=ports(("grpc", 9), ("http", 8888))),
        NAMED,
        {},
        (8888, "its containerPort http"),
    ),
    (
        "named: http-*",
        c(**WRAPPER, ports=ports(("grpc", 9), ("http-api", 8889))),
        NAMED,
        {},
        (8889, "its containerPort http-api"),
    ),
    (
        "named: *-http",
        c(**WRAPPER, ports=ports(("grpc", 9), ("vllm-http", 8890))),
        NAMED,
        {},
        (8890, "its containerPort vllm-http"),
    ),
    (
        "named: api",
        c(**WRAPPER, ports=ports(("grpc", 9), ("api", 8891))),
        NAMED,
        {},
        (8891, "its containerPort api"),
    ),
    (
        "named: openai",
        c(**WRAPPER, ports=ports(("grpc", 9), ("openai", 8892))),
        NAMED,
        {},
        (8892, "its containerPort openai"),
    ),
    (
        "named: http and metrics: http's",
        c(**WRAPPER, ports=ports(("metrics", 9090), ("http", 8000))),
        NAMED,
        {},
        (8000, "its containerPort http"),
    ),
    (
        "named: http and http-alt on one port",
        c(**WRAPPER, ports=ports(("http", 8000), ("http-alt", 8000), ("x", 1))),
        NAMED,
        {},
        (8000, "its containerPort http"),
    ),
    (
        "named: Helm's quoted containerPort",
        c(**WRAPPER, ports=ports(("grpc", "9"), ("http", "8000"))),
        NAMED,
        {},
        (8000, "its containerPort http"),
    ),
    (
        "named: a Service's http port targets it by name",
        c(**WRAPPER, ports=ports(("vllm", 8000), ("kv", 5557))),
        NAMED,
        {"service_ports": [{"name": "http", "port": 80, "targetPort": "vllm"}]},
        (8000, "its containerPort vllm"),
    ),
    (
        "named: a Service's http port targets it by number",
        c(**WRAPPER, ports=ports((None, 8000), (None, 5557))),
        NAMED,
        {"service_ports": [{"name": "http", "port": 80, "targetPort": 8000}]},
        (8000, "its containerPort 8000"),
    ),
    (
        "named: a Service's appProtocol http",
        c(**WRAPPER, ports=ports(("vllm", 8000), ("kv", 5557))),
        NAMED,
        {"service_ports": [{"name": "web", "appProtocol": "http", "targetPort": "vllm"}]},
        (8000, "its containerPort vllm"),
    ),
    (
        "named: a Service's targetPort is its port when unset",
        c(**WRAPPER, ports=ports(("a", 8000), ("b", 5557))),
        NAMED,
        {"service_ports": [{"name": "http", "port": 8000}]},
        (8000, "its containerPort a"),
    ),
    # ... or open: skipped.
    (
        "named: several ports, none named for HTTP",
        c(**WRAPPER, ports=ports(("grpc", 9000), ("metrics", 8000))),
        NAMED,
        {},
        settle("its port is unknown: no port flag, and none of its containerPorts (9000, 8000) is named for HTTP"),
    ),
    (
        "named: https and h2 are not plain HTTP",
        c(**WRAPPER, ports=ports(("https", 8443), ("http2", 8000))),
        NAMED,
        {},
        settle("its port is unknown: no port flag, and none of its containerPorts (8443, 8000) is named for HTTP"),
    ),
    (
        "named: ports named for HTTP disagree",
        c(**WRAPPER, ports=ports(("http", 8000), ("api", 9000))),
        NAMED,
        {},
        settle("its port is unknown: no port flag, and its containerPorts named for HTTP disagree (8000, 9000)"),
    ),
    (
        "named: a Service's port not named for HTTP",
        c(**WRAPPER, ports=ports(("vllm", 8000), ("kv", 5557))),
        NAMED,
        {"service_ports": [{"name": "kv", "targetPort": "kv"}, "x"]},
        settle("its port is unknown: no port flag, and none of its containerPorts (8000, 5557) is named for HTTP"),
    ),
    (
        "named: a sidecar's port the Service targets is not its own",
        c(**WRAPPER, ports=ports(("vllm", 8000), ("kv", 5557))),
        NAMED,
        {"service_ports": [{"name": "https", "targetPort": 8443}, {"name": "http", "targetPort": 8080}]},
        settle("its port is unknown: no port flag, and none of its containerPorts (8000, 5557) is named for HTTP"),
    ),
    (
        "named: no containerPort",
        c(**WRAPPER),
        NAMED,
        {},
        settle("its port is unknown: no port flag, and no containerPort"),
    ),
    (
        "named: a containerPort entry without a port",
        c(**WRAPPER, ports=[{"name": "http"}, "x"]),
        NAMED,
        {},
        settle("its port is unknown: no port flag, and no containerPort"),
    ),
    (
        "named: a containerPort not a number",
        c(**WRAPPER, ports=ports((None, "x"))),
        NAMED,
        {},
        settle("its port is unknown: no port flag, and its containerPort is 'x', not a port"),
    ),
    (
        "named: containerPort 0",
        c(**WRAPPER, ports=ports((None, 0))),
        NAMED,
        {},
        settle("its port is unknown: no port flag, and its containerPort is '0', not a port"),
    ),
    (
        "named: a containerPort past what int() converts",
        c(**WRAPPER, ports=ports((None, "9" * 5000))),
        NAMED,
        {},
        settle(f"its port is unknown: no port flag, and its containerPort is {'9' * 5000!r}, not a port"),
    ),
    # --port given to inject settles it, unless the engine's own flag or variable says another.
    (
        "--port settles a wrapper",
        c(**WRAPPER, ports=ports((None, 1), (None, 2))),
        {**NAMED, "port": 8000},
        {},
        (8000, GIVEN),
    ),
    (
        "--port settles an unresolved $(PORT)",
        c(**PORT_ARG, envFrom=[SECRET]),
        {**NAMED, "port": 8001},
        {},
        (8001, GIVEN),
    ),
    ("--port agrees with its flag", c(args=["--port", "8002"]), {**NAMED, "port": 8002}, {}, (8002, GIVEN)),
    ("--port over the default", c(**SERVE, ports=ports((None, 8080))), {**NAMED, "port": 8080}, {}, (8080, GIVEN)),
    (
        "--port against its flag",
        c(args=["--port", "9000"]),
        {**NAMED, "port": 8000},
        {},
        settle("its port is 9000 (--port in its command), not the 8000 --port gives"),
    ),
    (
        "--port against LLAMA_ARG_PORT",
        ll(env=[{"name": "LLAMA_ARG_PORT", "value": "80"}]),
        {**NAMED, "port": 8080},
        {},
        settle("its port is 80 (LLAMA_ARG_PORT), not the 8080 --port gives"),
    ),
]


@pytest.mark.parametrize(("name", "container", "choice", "context", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_the_port(
    name: str,
    container: dict[str, Any],
    choice: dict[str, Any],
    context: dict[str, Any],
    expected: tuple[int, str] | str,
) -> None:
    assert ROWS
    decision = decide(container, "pod", Choice(**choice), Context(**context))
    if isinstance(expected, str):
        assert (decision.action, decision.why, decision.port) == ("skip", expected, 0)
    else:
        assert (decision.action, decision.port, decision.port_from) == ("probe", *expected)


# The port, from an image whose entrypoint inject does not know: proven only where two sources agree.
OPEA: dict[str, Any] = {"image": "opea/vllm:latest", "ports": ports(("http", 2080))}
AGREED = "--port in its args, as its containerPort says"
ENTRY = settle("its port is not proven: its image opea/vllm:latest runs an entrypoint the manifest does not show")
ENTRY_ROWS: list[tuple[str, dict[str, Any], dict[str, Any], tuple[int, str] | str]] = [
    (
        "the engine's flags, and its one containerPort agrees",
        c(**OPEA, args=["--model", "m", "--port", "2080"]),
        {},
        (2080, AGREED),
    ),
    (
        "Helm's quoted containerPort agrees",
        c(image="opea/vllm:latest", args=["--port", "2080"], ports=ports((None, "2080"))),
        {},
        (2080, AGREED),
    ),
    (
        "$(PORT) from env agrees",
        c(**OPEA, args=["--port", "$(PORT)"], env=[{"name": "PORT", "value": "2080"}]),
        {},
        (2080, AGREED),
    ),
    ("its containerPort disagrees", c(**OPEA, args=["--port", "2081"]), {}, ENTRY),
    (
        "two containerPorts",
        c(image="opea/vllm:latest", args=["--port", "2080"], ports=ports(("http", 2080), ("kv", 5557))),
        {},
        ENTRY,
    ),
    ("no containerPort", c(image="opea/vllm:latest", args=["--port", "2080"]), {}, ENTRY),
    (
        "no port flag, its containerPort the default's",
        c(**{**OPEA, "ports": ports((None, 8000))}, args=["--model", "m"]),
        {},
        ENTRY,
    ),
    ("$(PORT) set nowhere", c(**OPEA, args=["--port", "$(PORT)"]), {}, ENTRY),
    ("args that are no flags", c(**OPEA, args=["serve", "--port", "2080"]), {}, ENTRY),
    ("named: its flag, as for any command", c(**OPEA, args=["--port", "2080"]), NAMED, (2080, FLAG)),
    (
        "an entrypoint python3 given -m and the server's module: its server",
        c(**OPEA, args=["-m", "vllm.entrypoints.openai.api_server", "--port", "2080"]),
        {},
        (2080, FLAG),
    ),
    (
        "a containerPort that is no port",
        c(image="opea/vllm:latest", args=["--port", "x"], ports=ports((None, "x"))),
        {},
        ENTRY,
    ),
    (
        "an engine inject does not know has no flags of its own",
        c(image="me/own:1", args=["--port", "2080"], ports=ports((None, 2080))),
        {"engine": "none"},
        "ignore",
    ),
    # llama.cpp's full image runs the server when its first argument says so.
    ("llama.cpp:full --server", ll("--port", "8088"), {}, (8088, FLAG)),
    ("llama.cpp:full -s", c(image=LLF, args=["-s", "--port", "8089", "--metrics"]), {}, (8089, FLAG)),
    (
        "llama.cpp:full without --server runs its tools, not the server",
        c(image=LLF, args=["--run", "--port", "8090"], ports=ports((None, 8090))),
        {},
        settle(f"its port is not proven: its image {LLF} runs an entrypoint the manifest does not show"),
    ),
    (
        "llama.cpp:full with a command runs that command",
        c(image=LLF, command=["--server"], args=["--port", "8091"]),
        {},
        settle("its port is not proven: it runs --server, not llamacpp's server"),
    ),
]


@pytest.mark.parametrize(("name", "container", "choice", "expected"), ENTRY_ROWS, ids=[r[0] for r in ENTRY_ROWS])
def test_the_port_of_an_entrypoint(
    name: str, container: dict[str, Any], choice: dict[str, Any], expected: tuple[int, str] | str
) -> None:
    assert ENTRY_ROWS
    decision = decide(container, "pod", Choice(**choice))
    if expected == "ignore":
        assert decision.action == "ignore"
    elif isinstance(expected, str):
        assert (decision.action, decision.why) == ("skip", expected)
    else:
        assert (decision.action, decision.port, decision.port_from) == ("probe", *expected)


# The address: one row per place it is read from, and one per way the manifest leaves it open.
def field(name: str, path: str = "status.podIP") -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def unknown_address(why: str, name: str = "engine") -> str:
    return f"{why} (--container {name} --host-address ADDR settles it)"


def vllm(*args: str, **fields: Any) -> dict[str, Any]:
    return c(args=["--port", "8000", *args], **fields)


def sglang(*args: str, **fields: Any) -> dict[str, Any]:
    return c(image=SG, command=["python3", "-m", "sglang.launch_server", "--enable-metrics", *args], **fields)


POD = Address("$(POD_IP)", "")  # the probe reads it at run time; the kubelet reaches the pod's IP
V6 = Address("[::1]", None)
# (name, container, choice, expected: an Address, or the skip's why)
ADDRESSES: list[tuple[str, dict[str, Any], dict[str, Any], Address | str]] = [
    # Its host flag, a literal.
    ("0.0.0.0", vllm("--host", "0.0.0.0"), {}, WILD),
    ("::, IPv6 only under asyncio: [::1], checked inside", sglang("--host", "::"), {}, V6),
    ("::1", sglang("--host", "::1"), {}, V6),
    ("::1 written in full", sglang("--host", "0:0:0:0:0:0:0:1"), {}, V6),
    ("127.0.0.1", vllm("--host", "127.0.0.1"), {}, LOOPBACK),
    ("another loopback address, exactly", vllm("--host=127.0.0.2"), {}, Address("127.0.0.2", None)),
    ("localhost: every address it resolves to", vllm("--host", "localhost"), {}, Address("localhost", None)),
    ("a literal IPv4 address: dialled there", vllm("--host", "10.1.2.3"), {}, Address("10.1.2.3", "10.1.2.3")),
    ("a literal IPv6 address", vllm("--host", "fd00::5"), {}, Address("[fd00::5]", "fd00::5")),
    (
        "a host name",
        vllm("--host", "vllm-0.vllm"),
        {},
        unknown_address("its address is vllm-0.vllm: a name, whose address is not the manifest's to say"),
    ),
    (
        "a scoped IPv6 address",
        vllm("--host", "fe80::1%eth0"),
        {},
        unknown_address("its address is fe80::1%eth0: a name, whose address is not the manifest's to say"),
    ),
    ("the last flag wins", vllm("--host", "10.1.2.3", "--host", "0.0.0.0"), {}, WILD),
    # ... with $(VAR) and $VAR resolved as for the port.
    ("$(HOST) from env", vllm("--host", "$(HOST)", env=[{"name": "HOST", "value": "0.0.0.0"}]), {}, WILD),
    (
        "$(HOST) from a ConfigMap in the input",
        vllm("--host", "$(HOST)", env=[{"name": "HOST", **key_ref("configMapKeyRef", "cfg", "host")}]),
        {"configmaps": {"cfg": {"host": "::1"}}},
        V6,
    ),
    ("$(POD_IP), status.podIP", vllm("--host", "$(POD_IP)", env=[field("POD_IP")]), {}, POD),
    (
        "$(HOST_IP), status.hostIP",
        vllm("--host", "$(HOST_IP)", env=[field("HOST_IP", "status.hostIP")]),
        {},
        Address("$(HOST_IP)", ""),
    ),
    ("--host=$(POD_IP)", vllm("--host=$(POD_IP)", env=[field("POD_IP")]), {}, POD),
    (
        "an env value naming the pod's IP",
        vllm("--host", "$(HOST)", env=[field("POD_IP"), {"name": "HOST", "value": "$(POD_IP)"}]),
        {},
        POD,
    ),
    ("$POD_IP in a script", sh("vllm serve m --host $POD_IP", env=[field("POD_IP")]), {}, POD),
    ("${POD_IP} in a script", sh("vllm serve m --host ${POD_IP}", env=[field("POD_IP")]), {}, POD),
    (
        "$(POD_IP) in a script: the kubelet's, then the same value the shell reads",
        sh("vllm serve m --host $(POD_IP) --port 9000", env=[field("POD_IP")]),
        {},
        POD,
    ),
    (
        "status.podIPs: a list",
        vllm("--host", "$(IPS)", env=[field("IPS", "status.podIPs")]),
        {},
        unknown_address("its address is $(IPS): IPS holds the pod's status.podIPs, not its IP (status.podIP)"),
    ),
    (
        "more than the variable",
        vllm("--host", "[$(POD_IP)]", env=[field("POD_IP")]),
        {},
        unknown_address("its address is [$(POD_IP)]: POD_IP is from its fieldRef, which the manifest does not show"),
    ),
    (
        "a fieldRef, then a Secret: the last wins",
        vllm("--host", "$(POD_IP)", env=[field("POD_IP"), {"name": "POD_IP", **key_ref("secretKeyRef", "s")}]),
        {},
        unknown_address("its address is $(POD_IP): POD_IP is from Secret s, which inject does not read"),
    ),
    (
        "a Secret",
        vllm("--host", "$(HOST)", env=[{"name": "HOST", **key_ref("secretKeyRef", "s")}]),
        {},
        unknown_address("its address is $(HOST): HOST is from Secret s, which inject does not read"),
    ),
    (
        "a ConfigMap not in the input",
        vllm("--host", "$(HOST)", envFrom=[cm("cfg")]),
        {},
        unknown_address(
            "its address is $(HOST): HOST may come from its envFrom ConfigMap cfg, which is not in the input"
        ),
    ),
    (
        "set nowhere",
        vllm("--host", "$(HOST)"),
        {},
        unknown_address("its address is $(HOST): HOST is set nowhere in the manifest"),
    ),
    (
        "a container without a name",
        {"image": "vllm/vllm-openai:v0.11.0", "args": ["--host", "h"]},
        {},
        unknown_address("its address is h: a name, whose address is not the manifest's to say", "NAME"),
    ),
    (
        "a command substitution",
        sh("vllm serve m --host $(hostname -i)"),
        {},
        unknown_address("its address is $: it depends on what the manifest does not show"),
    ),
    (
        "vLLM on a UNIX socket",
        vllm("--uds", "/tmp/v.sock"),
        {},
        unknown_address("it serves on a UNIX socket (--uds), which the probe does not dial"),
    ),
    (
        "llama.cpp on a UNIX socket",
        ll("--host", "/tmp/llama.sock"),
        {},
        unknown_address("its address is /tmp/llama.sock: a UNIX socket, which the probe does not dial"),
    ),
    # The engine's own address variable.
    ("LLAMA_ARG_HOST", ll(env=[{"name": "LLAMA_ARG_HOST", "value": "10.1.2.3"}]), {}, Address("10.1.2.3", "10.1.2.3")),
    ("LLAMA_ARG_HOST, status.podIP", ll(env=[field("LLAMA_ARG_HOST")]), {}, Address("$(LLAMA_ARG_HOST)", "")),
    (
        "the flag wins over LLAMA_ARG_HOST",
        ll("--host", "0.0.0.0", env=[{"name": "LLAMA_ARG_HOST", "value": "::1"}]),
        {},
        WILD,
    ),
    (
        "LLAMA_ARG_HOST from a Secret",
        ll(env=[{"name": "LLAMA_ARG_HOST", **key_ref("secretKeyRef", "s")}]),
        {},
        unknown_address(
            "its address is $(LLAMA_ARG_HOST): LLAMA_ARG_HOST is from Secret s, which inject does not read"
        ),
    ),
    (
        "LLAMA_ARG_HOST perhaps overwritten by a Secret",
        ll(envFrom=[cm("a"), SECRET], ports=ports((None, 8080))),
        {"configmaps": {"a": {"LLAMA_ARG_HOST": "0.0.0.0"}}},
        unknown_address(f"its address is $(LLAMA_ARG_HOST): LLAMA_ARG_HOST is perhaps overwritten by {HIDDEN_SECRET}"),
    ),
    (
        "an envFrom inject cannot read holds no pod's address: the default",
        ll(envFrom=[SECRET], ports=ports((None, 8080))),
        {},
        LOOPBACK,
    ),
    ("vLLM reads no address variable", vllm(env=[{"name": "LLAMA_ARG_HOST", "value": "10.1.2.3"}]), {}, WILD),
    # Its default.
    ("vLLM: all IPv4 interfaces", vllm(), {}, WILD),
    ("SGLang: 127.0.0.1", sglang(), {}, LOOPBACK),
    ("llama.cpp: 127.0.0.1", ll(), {}, LOOPBACK),
    (
        "an engine inject does not know: not its flags to read",
        c(image="python:3.12", args=["--port", "80", "--host", "::1"]),
        {"container": "engine"},
        WILD,
    ),
    # --host-address settles what the manifest leaves open, never against it.
    ("--host-address over a default", sglang(), {"container": "engine", "host": "0.0.0.0"}, WILD),
    ("--host-address: the pod's IP", sglang(), {"container": "engine", "host": "$(MY_IP)"}, Address("$(MY_IP)", "")),
    (
        "--host-address settles a name",
        vllm("--host", "vllm-0.vllm"),
        {"container": "engine", "host": "10.1.2.3"},
        Address("10.1.2.3", "10.1.2.3"),
    ),
    ("--host-address agrees", vllm("--host", "::1"), {"container": "engine", "host": "::1"}, V6),
    (
        "--host-address against its flag",
        vllm("--host", "::1"),
        {"container": "engine", "host": "0.0.0.0"},
        unknown_address("its address is ::1 (--host in its command), not the 0.0.0.0 --host-address gives"),
    ),
    (
        "--host-address against its variable",
        ll(env=[{"name": "LLAMA_ARG_HOST", "value": "::1"}]),
        {"container": "engine", "host": "0.0.0.0"},
        unknown_address("its address is ::1 (LLAMA_ARG_HOST), not the 0.0.0.0 --host-address gives"),
    ),
    (
        "--host-address for an engine inject does not know",
        c(image="python:3.12", args=["--port", "80"]),
        {"container": "engine", "host": "::1"},
        V6,
    ),
    (
        "--host-address does not open a UNIX socket",
        vllm("--uds", "/s"),
        {"container": "engine", "host": "0.0.0.0"},
        unknown_address("it serves on a UNIX socket (--uds), which the probe does not dial"),
    ),
]


@pytest.mark.parametrize(("name", "container", "given", "expected"), ADDRESSES, ids=[r[0] for r in ADDRESSES])
def test_the_address(name: str, container: dict[str, Any], given: dict[str, Any], expected: Address | str) -> None:
    assert ADDRESSES
    configmaps = given.pop("configmaps", None) if "configmaps" in given else None
    decision = decide(container, "pod", Choice(**given), Context(configmaps))
    given.update({"configmaps": configmaps} if configmaps is not None else {})
    if isinstance(expected, str):
        assert (decision.action, decision.why, decision.address) == ("skip", expected, None)
    else:
        assert (decision.action, decision.address) == ("probe", expected), decision


def test_a_script_keeps_its_port_after_the_pods_ip() -> None:
    """`$(POD_IP)` in a script is the kubelet's: read as a command substitution, it split the command and
    lost the port flag after it."""
    decision = decide(sh("vllm serve m --host $(POD_IP) --port 9000", env=[field("POD_IP")]), "pod", Choice())
    assert (decision.port, decision.port_from, decision.address) == (9000, FLAG, POD)


# The interpreter the probe runs with: one row per way it is proven, one per way it is not.
def no_python(image: str, way: str = "") -> str:
    return f"its image {image} has no python3, which the probe runs with ({way}--python PATH names the image's own)"


def unknown_image(image: str, way: str = "") -> str:
    return (
        f"its image {image} is not one inject knows to have a python3, which the probe runs with ({way}--python "
        "PATH names the image's own)"
    )


FULL = "ghcr.io/ggml-org/llama.cpp:full (--server first in its args) has one, or "
PYTHON_NOTE = (
    "image {} is not one inject knows; {} is a Python program, so the probe runs with python3 (--python PATH "
    "names another)"
)
# (name, container, choice, expected: (the interpreter, the note) for a probe, else the skip's why)
INTERPRETERS: list[tuple[str, dict[str, Any], dict[str, Any], tuple[str, str] | str]] = [
    # An image known to carry python3.
    ("vllm/vllm-openai", c(args=["--port", "8000"]), {}, ("python3", "")),
    ("lmsysorg/sglang", sglang(), {}, ("python3", "")),
    ("llama.cpp:full", ll(), {}, ("python3", "")),
    (
        "llama.cpp:full-cuda, mirrored",
        c(image="mirror.io/ggerganov/llama.cpp:full-cuda", args=["--server"]),
        {},
        ("python3", ""),
    ),
    # An image known to carry none: the way out named.
    ("llama.cpp:server", c(image=LL, args=["--port", "8080"]), {}, no_python(LL, FULL)),
    (
        "llama.cpp:server-cuda, by digest",
        c(image="ghcr.io/ggml-org/llama.cpp:server-cuda@sha256:abc", args=["--port", "8080"]),
        {},
        no_python("ghcr.io/ggml-org/llama.cpp:server-cuda@sha256:abc", FULL),
    ),
    (
        "the older ghcr.io/ggerganov/llama.cpp:server-b4567",
        c(image="ghcr.io/ggerganov/llama.cpp:server-b4567", args=["--port", "8080"]),
        {},
        no_python("ghcr.io/ggerganov/llama.cpp:server-b4567", FULL),
    ),
    (
        "distroless",
        c(image="gcr.io/distroless/cc-debian12", command=["/llama-server", "--port", "8080"]),
        {},
        no_python("gcr.io/distroless/cc-debian12", FULL),
    ),
    (
        "--python names the image's own",
        c(image=LL, args=["--port", "8080"]),
        {"python": "/opt/py/bin/python3"},
        ("/opt/py/bin/python3", ""),
    ),
    # A C++ engine in an image inject does not know: skipped.
    (
        "llama-server in an image inject does not know",
        c(image="me/llm:1", command=["/usr/bin/llama-server", "--port", "8080"]),
        {},
        unknown_image("me/llm:1", FULL),
    ),
    (
        "a registry's port is no tag",
        c(image="registry:5000/llama.cpp", command=["llama-server", "--port", "8080"]),
        {},
        unknown_image("registry:5000/llama.cpp", FULL),
    ),
    (
        "--python for it",
        c(image="me/llm:1", command=["/usr/bin/llama-server", "--port", "8080"]),
        {"python": "python3.11"},
        ("python3.11", ""),
    ),
    # A command that runs a Python interpreter: the probe runs with the same word.
    (
        "its command runs python3.12 by its path",
        c(image="me/sg:1", command=["/opt/venv/bin/python3.12", "-m", "sglang.launch_server", "--enable-metrics"]),
        {},
        ("/opt/venv/bin/python3.12", ""),
    ),
    (
        "its command runs python",
        c(image="me/vllm:1", command=["python", "-m", "vllm.entrypoints.openai.api_server"]),
        {},
        ("python", ""),
    ),
    (
        "a script that runs python3 before the server",
        sh("python3 fetch.py && exec llama-server --port 8080 --metrics", image="me/llm:1"),
        {},
        ("python3", ""),
    ),
    (
        "the server's own interpreter first",
        sh("python fetch.py; exec /usr/bin/python3 -m vllm.entrypoints.openai.api_server", image="me/vllm:1"),
        {},
        ("/usr/bin/python3", ""),
    ),
    (
        "--python wins over its command's",
        c(image="me/vllm:1", command=["python", "-m", "vllm.entrypoints.openai.api_server"]),
        {"python": "python3.12"},
        ("python3.12", ""),
    ),
    (
        "a word that only starts like python",
        sh("pythonista run && exec llama-server --port 8080 --metrics", image="me/llm:1"),
        {},
        unknown_image("me/llm:1", FULL),
    ),
    (
        "python-config is no interpreter",
        sh("python3-config --libs && exec llama-server --port 8080 --metrics", image="me/llm:1"),
        {},
        unknown_image("me/llm:1", FULL),
    ),
    # A Python engine in an image inject does not know: python3, said.
    (
        "vllm serve in an image inject does not know",
        c(image="me/vllm:1", command=["vllm", "serve", "m"]),
        {},
        ("python3", PYTHON_NOTE.format("me/vllm:1", "vllm")),
    ),
    (
        "NVIDIA's vLLM image",
        c(image="nvcr.io/nvidia/vllm:25.09-py3", args=["vllm", "serve", "m"], ports=ports(("http", 8000))),
        {},
        ("python3", PYTHON_NOTE.format("nvcr.io/nvidia/vllm:25.09-py3", "vllm")),
    ),
    (
        "vLLM in an image known to have none",
        c(image="gcr.io/distroless/base", command=["vllm", "serve", "m"]),
        {},
        no_python("gcr.io/distroless/base"),
    ),
    # An engine inject does not know, in the container --container names.
    ("an official Python image", c(image="python:3.12-slim", args=["--port", "80"]), NAMED, ("python3", "")),
    (
        "distroless's python3",
        c(image="gcr.io/distroless/python3-debian12", args=["--port", "80"]),
        NAMED,
        ("python3", ""),
    ),
    ("an image inject does not know", c(image="nginx:1.27", args=["--port", "80"]), NAMED, unknown_image("nginx:1.27")),
    ("ollama", c(image="ollama/ollama:0.5", args=["--port", "80"]), NAMED, no_python("ollama/ollama:0.5")),
    ("scratch", c(image="scratch", args=["--port", "80"]), NAMED, no_python("scratch")),
]


@pytest.mark.parametrize(("name", "container", "choice", "expected"), INTERPRETERS, ids=[r[0] for r in INTERPRETERS])
def test_the_interpreter(
    name: str, container: dict[str, Any], choice: dict[str, Any], expected: tuple[str, str] | str
) -> None:
    assert INTERPRETERS
    decision = decide(container, "pod", Choice(**choice))
    if isinstance(expected, str):
        assert (decision.action, decision.why, decision.python) == ("skip", expected, "")
    else:
        assert (decision.action, decision.python, decision.notes) == (
            "probe",
            expected[0],
            tuple(filter(None, [expected[1]])),
        )


# The API key: the probe reads it where the engine does, and is never given it.
def secret(name: str) -> dict[str, Any]:
    return {"name": name, **key_ref("secretKeyRef", "llm", "api-key")}


def literal_key(flag: str = "--api-key") -> str:
    return (
        f"its {flag} is written into its command, which the probe never copies into its own, so the probe sends "
        f"no key (put the key in a Secret and give it as {flag} $(VAR))"
    )


# (name, container, context, expected: (the probe's key flags, what is said))
KEYS: list[tuple[str, dict[str, Any], dict[str, Any], tuple[tuple[str, ...], str]]] = [
    (
        "vLLM --api-key $(KEY), a Secret",
        vllm("--api-key", "$(KEY)", env=[secret("KEY")]),
        {},
        (("--api-key-env", "KEY"), ""),
    ),
    (
        "a value in the manifest: the variable, never the value",
        vllm("--api-key", "$(KEY)", env=[{"name": "KEY", "value": "sk-in-the-manifest"}]),
        {},
        (("--api-key-env", "KEY"), ""),
    ),
    (
        "a ConfigMap's",
        vllm("--api-key=$(KEY)", envFrom=[cm("cfg")]),
        {"configmaps": {"cfg": {"KEY": "sk-1"}}},
        (("--api-key-env", "KEY"), ""),
    ),
    (
        "SGLang ${KEY} in a script",
        sh("python3 -m sglang.launch_server --enable-metrics --api-key ${KEY}", image=SG, env=[secret("KEY")]),
        {},
        (("--api-key-env", "KEY"), ""),
    ),
    ("$KEY in a script", sh("vllm serve m --api-key $KEY", env=[secret("KEY")]), {}, (("--api-key-env", "KEY"), "")),
    (
        "$(KEY) in a script",
        sh("vllm serve m --api-key $(KEY)", env=[secret("KEY")]),
        {},
        (("--api-key-env", "KEY"), ""),
    ),
    (
        "llama.cpp --api-key $(KEY) from an envFrom Secret",
        ll("--api-key", "$(KEY)", envFrom=[SECRET], ports=ports((None, 8080))),
        {},
        (("--api-key-env", "KEY"), ""),
    ),
    (
        "a variable no one sets",
        sh("KEY=x vllm serve m --api-key $KEY"),
        {},
        (
            (),
            "its --api-key is $KEY, which no variable of the container sets, so the probe cannot read it (give it "
            "as --api-key $(VAR), VAR from a Secret)",
        ),
    ),
    ("a literal", vllm("--api-key", "sk-literal-1"), {}, ((), literal_key())),
    ("more than a variable", vllm("--api-key", "sk-$(SUFFIX)", env=[secret("SUFFIX")]), {}, ((), literal_key())),
    (
        "the last flag wins",
        vllm("--api-key", "sk-1", "--api-key", "$(KEY)", env=[secret("KEY")]),
        {},
        (("--api-key-env", "KEY"), ""),
    ),
    # Its file of keys, read where it reads it.
    ("llama.cpp --api-key-file", ll("--api-key-file", "/keys/api"), {}, (("--api-key-file", "/keys/api"), "")),
    (
        "--api-key-file $(KEYS), from env",
        ll("--api-key-file", "$(KEYS)", env=[{"name": "KEYS", "value": "/k/keys"}]),
        {},
        (("--api-key-file", "/k/keys"), ""),
    ),
    (
        "--api-key-file $(KEYS), from a Secret",
        ll("--api-key-file", "$(KEYS)", env=[secret("KEYS")]),
        {},
        ((), "its file of API keys is $(KEYS), which the manifest does not show, so the probe sends no key"),
    ),
    (
        "LLAMA_ARG_API_KEY_FILE",
        ll(env=[{"name": "LLAMA_ARG_API_KEY_FILE", "value": "/k"}]),
        {},
        (("--api-key-file", "/k"), ""),
    ),
    (
        "LLAMA_ARG_API_KEY_FILE from a Secret",
        ll(env=[secret("LLAMA_ARG_API_KEY_FILE")]),
        {},
        (
            (),
            "its file of API keys is $(LLAMA_ARG_API_KEY_FILE), which the manifest does not show, so the probe "
            "sends no key",
        ),
    ),
    (
        "the file flag wins over its variable",
        ll("--api-key-file", "/a", env=[{"name": "LLAMA_ARG_API_KEY_FILE", "value": "/b"}]),
        {},
        (("--api-key-file", "/a"), ""),
    ),
    (
        "the key flag wins over the file",
        ll("--api-key-file", "/a", "--api-key", "$(KEY)", env=[secret("KEY")]),
        {},
        (("--api-key-env", "KEY"), ""),
    ),
    ("vLLM has no file of keys", vllm("--api-key-file", "/a"), {}, ((), "")),
    (
        "a key flag beside the server is another program's",
        sh("vllm serve m --port 8000 & proxy --api-key $(OTHER)", env=[secret("OTHER")]),
        {},
        ((), ""),
    ),
    # Its own key variable: the probe reads it by itself.
    ("VLLM_API_KEY", vllm(env=[secret("VLLM_API_KEY")]), {}, ((), "")),
    ("LLAMA_API_KEY", ll(env=[secret("LLAMA_API_KEY")]), {}, ((), "")),
    (
        "an engine inject does not know",
        c(image="python:3.12", args=["--port", "80", "--api-key", "$(KEY)"], env=[secret("KEY")]),
        {"container": "engine"},
        ((), ""),
    ),
]


@pytest.mark.parametrize(("name", "container", "context", "expected"), KEYS, ids=[r[0] for r in KEYS])
def test_the_key(
    name: str, container: dict[str, Any], context: dict[str, Any], expected: tuple[tuple[str, ...], str]
) -> None:
    assert KEYS
    named = context.pop("container", None)
    decision = decide(container, "pod", Choice(container=named), Context(**context))
    if named is not None:
        context["container"] = named
    assert (decision.action, decision.key, decision.notes) == ("probe", expected[0], tuple(filter(None, [expected[1]])))
    assert "sk-" not in repr(decision.key) + " ".join(decision.notes)  # a key is never copied


def test_the_images_that_carry_python3() -> None:
    """serving.IMAGES read by tag and repository, a registry or a mirror before it."""
    carries = {
        "vllm/vllm-openai:v0.11.0": True,
        "docker.io/vllm/vllm-openai": True,
        "lmsysorg/sglang:latest": True,
        "ghcr.io/ggml-org/llama.cpp:full": True,
        "ghcr.io/ggml-org/llama.cpp:full-cuda-b4567": True,
        "ghcr.io/ggml-org/llama.cpp:server": False,
        "ghcr.io/ggml-org/llama.cpp:server-vulkan": False,
        "ghcr.io/ggml-org/llama.cpp:server-rocm": False,
        "ghcr.io/ggml-org/llama.cpp:server-musa": False,
        "ghcr.io/ggml-org/llama.cpp:server-intel": False,
        "ghcr.io/ggml-org/llama.cpp:light": False,
        "ghcr.io/ggerganov/llama.cpp:server": False,
        "ghcr.io/ggml-org/llama.cpp": None,  # latest: no such tag
        "ollama/ollama": False,
        "gcr.io/distroless/static-debian12": False,
        "gcr.io/distroless/python3-debian12:nonroot": True,
        "rlcr.io/ramalama/llamacpp-cpu-distroless:latest": False,
        "python:3.12-slim": True,
        "docker.io/library/python": True,
        "scratch": False,
        "opea/vllm:latest": None,
        "my-llama.cpp:server": None,
        "localhost:5000/llama.cpp:server": False,
        "localhost:5000/llama.cpp": None,
    }
    assert {image: python_in(image) for image in carries} == carries


def test_engines_are_named_by_image_or_command() -> None:
    assert engine_of(c(image="me/x:1", command=["llama-server"])) == "llamacpp"
    assert engine_of(c(image=SG)) == "sglang"
    assert engine_of(c(image="nginx")) is None
    assert engine_of(c(image="openmmlab/lmdeploy:latest-cu12")) == "lmdeploy"
    assert engine_of(c(image="nvcr.io/nvidia/tensorrt-llm/release:1.2.0")) == "trtllm"
    assert set(SERVING) == {d.name for d in DIALECTS}  # how each engine's server is started, for each one read


def test_the_shell_splits_as_a_shell_does() -> None:
    env = Env({"P": "1", "Q": "two words"})
    assert shell_words("a 'b c' \\\n d; e && f | g\nh # comment", env) == [
        ["a", "b c", "d"],
        ["e"],
        ["f"],
        ["g"],
        ["h"],
    ]
    assert shell_words("exec X=1 vllm serve $P ${Q} ${R:-3} ${S} $ $T", env) == [
        ["vllm", "serve", "1", "two words", "3", "${S}", "$", "$T"]
    ]
    assert shell_words("if true; then vllm serve; fi", Env()) == [["true"], ["vllm", "serve"], ["fi"]]
    assert shell_words("unclosed 'quote", Env()) == []
    assert shell_words("${unclosed", Env()) == [["${unclosed"]]
    assert shell_words('a${R:-$X} "${P}${Q $P"', Env({"P": "1"})) == [["a${R:-$X}", "1${Q $P"]]
    assert shell_words("a |& b", Env()) == [["a"], ["b"]]
    assert shell_words("${P}-${P} ${P}:80 ${S}/v $P/x a$/b $MY_PORT ${}:-1}", Env({"P": "1", "MY_PORT": "8"})) == [
        ["1-1", "1:80", "${S}/v", "1/x", "a$/b", "8", "${}:-1}"]
    ]


def test_the_kubelets_expansion() -> None:
    assert k8s_expand("$(A)-$$(A)-$(B)-$(", {"A": "x"}) == "x-$(A)-$(B)-$("
    assert k8s_expand("p$(A)$(A)-$(A", {"A": "x"}) == "pxx-$(A"
    assert k8s_expand("$(A))$$$(A)$(B$(A))$$$$", {"A": "x"}) == "x)$x$(Bx)$$"
    assert environment(
        {"env": [{"name": "A", "value": 1}, {"name": "B", "value": "$(A)2"}, {"name": "C"}, "x"]}
    ).values == {
        "A": "1",
        "B": "12",
        "C": "",
    }


def test_the_variables_a_container_sets_stand_for_themselves() -> None:
    env = environment(
        {
            "env": [
                {"name": "A", "value": "1"},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "B", "valueFrom": {"fieldRef": "x"}},
            ]
        }
    )
    assert (env.fields, standing(env).values, standing(env).unknown) == (
        {"IP": "status.podIP"},
        {"A": "${A}", "IP": "${IP}", "B": "${B}"},
        {},
    )
    script = {"command": ["sh", "-c", "run --a $(A) --ip $(IP) --b=$(B) --c $(C) $$(IP)"]}
    assert command_lines(script, env) == [
        ["run", "--a", "1", "--ip", "${IP}", "--b=${B}", "--c", "$"],
        ["C"],
        ["$"],
        ["IP"],
    ]
    assert command_lines({"args": ["--ip", "$(IP)"]}, env) == [["--ip", "$(IP)"]]  # no shell: as written


def test_command_lines() -> None:
    assert command_lines({}, Env()) == []
    assert command_lines({"command": ["bash", "-ex", "-c", "a --x_y=1", "sh"]}, Env()) == [["a", "--x-y=1"]]
    assert command_lines({"command": ["bash", "-e"], "args": ["script.sh"]}, Env()) == [["bash", "-e", "script.sh"]]
    assert command_lines({"command": ["bash", "--login", "-c"]}, Env()) == [["bash", "--login", "-c"]]
    assert command_lines({"command": ["bash", "--rcfile", "/r", "-c", "a"]}, Env()) == [
        ["bash", "--rcfile", "/r", "-c", "a"]
    ]
    assert command_lines({"args": ["-x_y", "--a_b", "--c_d=e_f"]}, Env()) == [["-x_y", "--a-b", "--c-d=e_f"]]


def test_an_engines_own_port_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine today takes --port; an engine whose parser takes another flag is read by that one."""

    class ShortPort(VllmServing):
        port_flags = ("--port", "-p")

    monkeypatch.setitem(SERVING, "vllm", ShortPort)
    decision = decide(c(args=["-p", "8090"]), "pod", Choice())
    assert (decision.action, decision.port, decision.port_from) == ("probe", 8090, "--port in its command")


def test_has_flag() -> None:
    assert has_flag(["--a=1"], ("--a",))
    assert has_flag(["--a=b=c"], ("--a",))
    assert not has_flag(["--ab"], ("--a",))


def test_a_decision_shows_every_field() -> None:
    assert repr(Decision("skip", "why")) == (
        "Decision({'action': 'skip', 'address': None, 'enable': ('', ''), 'engine': None, "
        "'key': (), "
        "'liveness': '', 'notes': (), 'port': 0, 'port_from': '', 'python': '', 'readiness': '', "
        "'startup': False, 'termination': '/dev/termination-log', 'why': 'why', 'window': None})"
    )


def test_flag_value_takes_the_last() -> None:
    assert flag_value(["--port", "1", "--port=2"], ("--port",)) == "2"
    assert flag_value(["--port"], ("--port",)) is None
    assert flag_value(["--portx", "1"], ("--port",)) is None


def test_the_family_a_metrics_off_flag_silences_is_the_names_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """The family named is what the engine's metric names start with, up to their first colon."""
    decide_module = importlib.import_module("stallprobe.inject.decide")  # the package's `decide` is the function
    own = VLLM.with_names(running="myengine:pool:running")
    monkeypatch.setattr(decide_module, "DIALECTS", (own, *(d for d in DIALECTS if d.name != "vllm")))
    decision = decide(c(args=["--port", "8000", "--disable-log-stats"]), "pod", Choice())
    assert decision.why == (
        "metrics are off (--disable-log-stats): vllm publishes no myengine: family, so a probe could only fail"
    )


# --- LMDeploy and TensorRT-LLM: their servers, as serving.py says each is started

LM = "openmmlab/lmdeploy:v0.11.0-cu12"
TRT = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0"


def lm(*args: str, **fields: Any) -> dict[str, Any]:
    """LMDeploy's api_server, run as its images are: the command says `lmdeploy serve api_server`."""
    return c(image=LM, command=["lmdeploy", "serve", "api_server", "internlm/internlm2-chat-7b", *args], **fields)


def trt(*args: str, **fields: Any) -> dict[str, Any]:
    """trtllm-serve with a config inject can read (ConfigMap trt, key config.yaml, mounted at /etc/trt)."""
    args = args or ("--config", "/etc/trt/config.yaml")
    mounts = fields.pop("volumeMounts", [{"name": "cfg", "mountPath": "/etc/trt"}])
    return c(image=TRT, command=["trtllm-serve", "serve", "m", *args], volumeMounts=mounts, **fields)


ALL_ON = "return_perf_metrics: true\nenable_iter_perf_stats: true\n"
# The volume holding the config, and the ConfigMap it comes from: what the input shows around the pod.
CFG_VOLUME = {"name": "cfg", "configMap": {"name": "trt"}}
SEEN: dict[str, Any] = {"configmaps": {"trt": {"config.yaml": ALL_ON}}, "volumes": [CFG_VOLUME]}
PAGE = "return_perf_metrics: true, which serves its Prometheus page at all"
ITER = (
    "enable_iter_perf_stats: true, which adds the running gauge (without it the page cannot be judged) and the "
    "KV-block counter that moves while it decodes"
)
UNJUDGED = "every run falls back to its health route ('unjudged')"

ENGINE_ROWS: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    (
        "lmdeploy: its default port and address",
        lm(),
        {},
        {},
        {
            "action": "probe",
            "engine": "lmdeploy",
            "port": 23333,
            "port_from": "assumed: lmdeploy's default, as its command sets no port",
            "address": WILD,  # --server-name 0.0.0.0 by default
            "python": "python3",  # its image's venv, first on PATH
            "key": (),
            "notes": (),
            "window": None,
        },
    ),
    ("lmdeploy: --server-port", lm("--server-port", "9000"), {}, {}, {"port": 9000}),
    ("lmdeploy: --server-name loopback", lm("--server-name", "127.0.0.1"), {}, {}, {"address": LOOPBACK}),
    ("lmdeploy: --port is not its flag", lm("--port", "9000"), {}, {}, {"port": 23333}),
    (
        "lmdeploy: metrics off",
        lm("--disable-metrics"),
        {},
        {},
        {
            "action": "skip",
            "why": "metrics are off (--disable-metrics): lmdeploy publishes no lmdeploy: family, so a probe could "
            "only fail",
        },
    ),
    ("lmdeploy: --enable-metrics, as older releases want", lm("--enable-metrics"), {}, {}, {"action": "probe"}),
    (
        "lmdeploy: its keys from a variable",
        lm("--api-keys", "$(KEY)", env=[secret("KEY")]),
        {},
        {},
        {"key": ("--api-key-env", "KEY"), "notes": ()},
    ),
    (
        "lmdeploy: a key written into its command",
        lm("--api-keys", "sk-1", "sk-2"),
        {},
        {},
        {
            "key": (),
            "notes": (
                "its --api-keys is written into its command, which the probe never copies into its own, so the "
                "probe sends no key (put the key in a Secret and give it as --api-keys $(VAR))",
            ),
        },
    ),
    (
        "lmdeploy: its proxy is no engine",
        c(image=LM, command=["lmdeploy", "serve", "proxy", "--server-port", "8000"]),
        {},
        {},
        {"action": "skip", "why": settle("its port is not proven: it runs lmdeploy, not lmdeploy's server")},
    ),
    (
        "lmdeploy: in a shell script",
        sh("lmdeploy serve api_server m --server-port 23334", image=LM),
        {},
        {},
        {"port": 23334, "port_from": "--server-port in its command"},
    ),
    (
        "trtllm: its defaults",
        trt(),
        {"drain": True},
        SEEN,
        {
            "action": "probe",
            "engine": "trtllm",
            "port": 8000,
            "address": LOOPBACK,  # --host localhost by default, which uvicorn binds as 127.0.0.1
            "python": "python3",
            "key": (),
            "notes": (),
            "window": 1800.0,
        },
    ),
    ("trtllm: no serve word", c(image=TRT, command=["trtllm-serve", "m", "--port", "8001"]), {}, {}, {"port": 8001}),
    (
        "trtllm: --host 0.0.0.0",
        trt("--config", "/etc/trt/config.yaml", "--host", "0.0.0.0"),
        {},
        SEEN,
        {"address": WILD},
    ),
    ("trtllm: --window given", trt(), {"window_given": True}, SEEN, {"window": None}),
    ("vllm: no window of its own", c(), {}, {}, {"window": None}),
    ("vllm: --window given", c(), {"window_given": True}, {}, {"window": None}),
    (
        "trtllm: a key flag it does not have",
        trt("--config", "/etc/trt/config.yaml", "--api-key", "$(KEY)", env=[secret("KEY")]),
        {},
        SEEN,
        {"key": (), "notes": ()},
    ),
    (
        "trtllm: the disaggregated router",
        c(image=TRT, command=["trtllm-serve", "disaggregated", "--config_file=/etc/disagg.yaml"]),
        {},
        {},
        {
            "action": "skip",
            "why": "it runs `trtllm-serve disaggregated`, a router in front of TensorRT-LLM servers, without "
            "their metrics",
        },
    ),
    (
        "trtllm: the router by its path, in a script",
        sh("cd /w && /usr/local/bin/trtllm-serve disaggregated -c d.yaml", image=TRT),
        {},
        {},
        {"action": "skip"},
    ),
    (
        "trtllm: another word after trtllm-serve is its model",
        c(image=TRT, command=["trtllm-serve", "disaggregation-ready-model"]),
        {},
        {},
        {"action": "probe"},
    ),
]


@pytest.mark.parametrize(
    ("name", "container", "choice", "context", "expected"), ENGINE_ROWS, ids=[r[0] for r in ENGINE_ROWS]
)
def test_lmdeploy_and_trtllm(
    name: str, container: dict[str, Any], choice: dict[str, Any], context: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert ENGINE_ROWS
    decision = decide(container, "pod", Choice(**choice), Context(**context))
    assert {field: getattr(decision, field) for field in expected} == expected


# TensorRT-LLM's config YAML: read where the input shows it, and what it lacks said.
def cfg(text: str, **context: Any) -> dict[str, Any]:
    """The context of a pod whose ConfigMap trt holds `text` as config.yaml, mounted by volume cfg."""
    return {"configmaps": {"trt": {"config.yaml": text}}, "volumes": [CFG_VOLUME], **context}


def lacks(*what: str, path: str = "/etc/trt/config.yaml", key: str = "config.yaml") -> str:
    them = "it" if len(what) == 1 else "them"
    return f"its {path} (key {key} of ConfigMap trt) lacks {', and '.join(what)}; without {them} {UNJUDGED}"


def unseen(path: str, why: str) -> str:
    return f"inject cannot see {path} ({why}): the probe needs in it {PAGE}, and {ITER}; without them {UNJUDGED}"


CONFIG_ROWS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("both set", trt(), cfg(ALL_ON), ""),
    ("neither", trt(), cfg("checkpoint_format: MX\n"), lacks(PAGE, ITER)),
    ("the page alone", trt(), cfg("return_perf_metrics: true\n"), lacks(ITER)),
    ("the iteration statistics alone", trt(), cfg("enable_iter_perf_stats: true\n"), lacks(PAGE)),
    (
        "yes, on, 1, quoted, and a comment",
        trt(),
        cfg("return_perf_metrics: 'yes' # on\nenable_iter_perf_stats: On\n"),
        "",
    ),
    ("a 1 and a double quote", trt(), cfg('return_perf_metrics: "1"\nenable_iter_perf_stats: 1\n'), ""),
    ("false is not on", trt(), cfg("return_perf_metrics: false\nenable_iter_perf_stats: true\n"), lacks(PAGE)),
    ("the last line wins", trt(), cfg(ALL_ON + "return_perf_metrics: false\n"), lacks(PAGE)),
    ("an earlier false is undone", trt(), cfg("return_perf_metrics: no\n" + ALL_ON), ""),
    (
        "indented: another option's",
        trt(),
        cfg("x:\n  return_perf_metrics: true\nenable_iter_perf_stats: true\n"),
        lacks(PAGE),
    ),
    ("a space before the colon", trt(), cfg("return_perf_metrics : true\nenable_iter_perf_stats: true\n"), lacks(PAGE)),
    ("a value that is no word", trt(), cfg("return_perf_metrics: truest\nenable_iter_perf_stats: true\n"), lacks(PAGE)),
    ("no colon", trt(), cfg("return_perf_metrics true\nenable_iter_perf_stats: true\n"), lacks(PAGE)),
    ("a line with no colon changes nothing", trt(), cfg(ALL_ON + "return_perf_metrics\n"), ""),
    (
        "a colon in the comment",
        trt(),
        cfg("return_perf_metrics: true  # see: the docs\nenable_iter_perf_stats: on\n"),
        "",
    ),
    (
        "a word that ends like one",
        trt(),
        cfg("return_perf_metrics: trueX\nenable_iter_perf_stats: true\n"),
        lacks(PAGE),
    ),
    (
        "--extra_llm_api_options, the older flag",
        trt("--extra_llm_api_options=/etc/trt/config.yaml"),
        cfg("return_perf_metrics: true\n"),
        lacks(ITER),
    ),
    (
        "no config at all",
        c(image=TRT, command=["trtllm-serve", "serve", "m"]),
        {},
        f"it runs with no --extra_llm_api_options (or --config) YAML, so what the probe reads is off: it needs "
        f"{PAGE}, and {ITER}; without them {UNJUDGED}",
    ),
    (
        "a file of the image",
        trt("--config", "/opt/config.yaml"),
        cfg(ALL_ON),
        unseen(
            "/opt/config.yaml", "no volume of the manifest is mounted there: the image's file, or one written at start"
        ),
    ),
    (
        "a mount whose path only starts the same",
        trt("--config", "/etc/trtx/config.yaml"),
        cfg(ALL_ON),
        unseen(
            "/etc/trtx/config.yaml",
            "no volume of the manifest is mounted there: the image's file, or one written at start",
        ),
    ),
    (
        "the mount point itself is no file in it",
        trt("--config", "/etc/trt"),
        cfg(ALL_ON),
        unseen("/etc/trt", "no volume of the manifest is mounted there: the image's file, or one written at start"),
    ),
    (
        "a mount path that ends in a letter",
        trt("--config", "/etc/trtX/config.yaml", volumeMounts=[{"name": "cfg", "mountPath": "/etc/trtX"}]),
        cfg(ALL_ON),
        "",
    ),
    (
        "a mount path with a slash at its end",
        trt(volumeMounts=[{"name": "cfg", "mountPath": "/etc/trt/"}]),
        cfg(ALL_ON),
        "",
    ),
    (
        "the deepest mount holds it",
        trt(volumeMounts=[{"name": "cfg", "mountPath": "/etc/trt"}, {"name": "other", "mountPath": "/etc"}]),
        cfg(ALL_ON, volumes=[{"name": "other", "emptyDir": {}}, CFG_VOLUME]),
        "",
    ),
    (
        "the deepest mount holds it, listed last",
        trt(volumeMounts=[{"name": "other", "mountPath": "/etc"}, {"name": "cfg", "mountPath": "/etc/trt"}]),
        cfg(ALL_ON, volumes=[{"name": "other", "emptyDir": {}}, CFG_VOLUME]),
        "",
    ),
    (
        "an emptyDir, written at start",
        trt(),
        cfg(ALL_ON, volumes=[{"name": "cfg", "emptyDir": {}}]),
        unseen("/etc/trt/config.yaml", "its volume cfg is no ConfigMap"),
    ),
    (
        "a volume the pod does not have",
        trt(),
        cfg(ALL_ON, volumes=[]),
        unseen("/etc/trt/config.yaml", "its volume cfg is no ConfigMap"),
    ),
    (
        "a ConfigMap not in the input",
        trt(),
        {"volumes": [CFG_VOLUME]},
        unseen("/etc/trt/config.yaml", "ConfigMap trt, which is not in the input"),
    ),
    (
        "a key the ConfigMap does not have",
        trt("--config", "/etc/trt/other.yaml"),
        cfg(ALL_ON),
        unseen("/etc/trt/other.yaml", "ConfigMap trt has no file other.yaml"),
    ),
    (
        "a subPath mount of the one file",
        trt(volumeMounts=[{"name": "cfg", "mountPath": "/etc/trt/config.yaml", "subPath": "config.yaml"}]),
        cfg("return_perf_metrics: true\n"),
        lacks(ITER),
    ),
    (
        "a subPath mount of a folder",
        trt(volumeMounts=[{"name": "cfg", "mountPath": "/etc/trt", "subPath": "sub"}]),
        cfg(ALL_ON),
        unseen("/etc/trt/config.yaml", "ConfigMap trt has no file sub/config.yaml"),
    ),
    (
        "items: the key listed under another path",
        trt(),
        cfg(
            ALL_ON,
            volumes=[{"name": "cfg", "configMap": {"name": "trt", "items": [{"key": "c", "path": "config.yaml"}]}}],
            configmaps={"trt": {"c": "return_perf_metrics: true\n", "config.yaml": ALL_ON}},
        ),
        lacks(ITER, key="c"),
    ),
    (
        "items that do not list the path",
        trt(),
        cfg(
            ALL_ON,
            volumes=[
                {"name": "cfg", "configMap": {"name": "trt", "items": [{"key": "config.yaml", "path": "x.yaml"}]}}
            ],
        ),
        unseen("/etc/trt/config.yaml", "ConfigMap trt has no file config.yaml"),
    ),
    (
        "a path a variable holds, from a Secret",
        trt("--config", "$(CFG)", env=[secret("CFG")]),
        cfg(ALL_ON),
        unseen("$(CFG)", "it depends on a variable"),
    ),
    (
        "a path a variable holds, from the manifest",
        trt("--config", "$(CFG)", env=[{"name": "CFG", "value": "/etc/trt/config.yaml"}]),
        cfg("enable_iter_perf_stats: true\n"),
        lacks(PAGE),
    ),
    ("vllm has no such file", c(), cfg(""), ""),
]


@pytest.mark.parametrize(("name", "container", "context", "note"), CONFIG_ROWS, ids=[r[0] for r in CONFIG_ROWS])
def test_the_config_a_page_needs(name: str, container: dict[str, Any], context: dict[str, Any], note: str) -> None:
    assert CONFIG_ROWS
    decision = decide(container, "pod", Choice(), Context(**context))
    assert decision.action == "probe", decision  # the probe goes in either way: without them it is a health check
    assert decision.notes == ((note,) if note else ())
