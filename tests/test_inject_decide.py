"""inject's decision per container, as a table: one container, its pod's role, the options, and what must
be decided (action, port, where the port came from, what is turned on, the startup guard)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from stallprobe.engines import DIALECTS, VLLM
from stallprobe.inject.decide import Choice, Decision, decide, engine_of
from stallprobe.inject.shell import command_lines, env_values, flag_value, has_flag, k8s_expand, shell_words
from stallprobe.serving import SERVING, VllmServing

HEALTH = {"httpGet": {"path": "/health", "port": 8000}}
OURS = {"exec": {"command": ["python3", "-c", "/opt/stallprobe/stallprobe.pyz"]}}
CUSTOM = {"exec": {"command": ["/bin/check"]}}


def c(image: str = "vllm/vllm-openai:v0.11.0", **fields: Any) -> dict[str, Any]:
    return {"name": "engine", "image": image, **fields}


def sh(script: str, **fields: Any) -> dict[str, Any]:
    return c(image=fields.pop("image", "vllm/vllm-openai:v0.11.0"), command=["/bin/sh", "-c", script], **fields)


SG = "lmsysorg/sglang:v0.5"
LL = "ghcr.io/ggml-org/llama.cpp:server"
UNKNOWN_PORT = (
    "its port is unknown: no port flag, no containerPort, and its command is not the "
    "engine's server (--container NAME with a --port, or a containerPort, says which)"
)
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
            "loopback": False,
            "liveness": "",
            "readiness": "",
        },
    ),
    ("not the named one", c(), "pod", {"container": "other"}, {"action": "ignore"}),
    (
        "named, unknown engine, containerPort",
        c(image="me/own:1", ports=[{"containerPort": 7000}]),
        "pod",
        {"container": "engine"},
        {
            "action": "probe",
            "engine": None,
            "port": 7000,
            "port_from": "its containerPort",
            "enable": ("", ""),
            "loopback": False,
            "liveness": "added",
        },
    ),
    (
        "named, unknown engine, no port",
        c(image="me/own:1"),
        "pod",
        {"container": "engine"},
        {
            "action": "skip",
            "why": UNKNOWN_PORT,
        },
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
            "loopback": False,
            "liveness": "added",
            "readiness": "",
        },
    ),
    (
        "vllm serve --port=9001",
        c(image="me/img:1", command=["vllm", "serve", "m", "--port=9001"]),
        "pod",
        {},
        {"action": "probe", "port": 9001, "port_from": "--port in its command", "loopback": False},
    ),
    (
        "port in a bash -c string",
        sh('echo hi; exec python3 -m vllm.entrypoints.openai.api_server --port 8080 --model "m x"'),
        "pod",
        {},
        {"action": "probe", "port": 8080},
    ),
    (
        "port from $(PORT) in the env",
        c(args=["--port", "$(PORT)"], env=[{"name": "PORT", "value": "8123"}]),
        "pod",
        {},
        {"action": "probe", "port": 8123},
    ),
    (
        "port from $PORT in a script",
        sh("vllm serve m --port ${PORT}", env=[{"name": "PORT", "value": "8124"}]),
        "pod",
        {},
        {"action": "probe", "port": 8124},
    ),
    (
        "port from an unset variable",
        c(args=["--port", "$(PORT)"]),
        "pod",
        {},
        {"action": "skip", "why": "its port is $(PORT), which the manifest does not resolve"},
    ),
    (
        "port from a default in a script",
        sh("vllm serve m --port ${PORT:-8125}"),
        "pod",
        {},
        {"action": "probe", "port": 8125},
    ),
    (
        "llama.cpp port from LLAMA_ARG_PORT, metrics from its variable",
        c(
            image=LL,
            env=[{"name": "LLAMA_ARG_PORT", "value": "80"}, {"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "1"}],
        ),
        "pod",
        {},
        {"action": "probe", "engine": "llamacpp", "port": 80, "port_from": "LLAMA_ARG_PORT", "enable": ("", "")},
    ),
    (
        "llama.cpp bad LLAMA_ARG_PORT",
        c(image=LL, env=[{"name": "LLAMA_ARG_PORT", "value": "http"}]),
        "pod",
        {},
        {"action": "skip", "why": "its LLAMA_ARG_PORT is 'http', not a port"},
    ),
    (
        "llama.cpp without metrics: its variable turns them on; loopback",
        c(image=LL, args=["-m", "/m.gguf"]),
        "pod",
        {},
        {"action": "probe", "port": 8080, "enable": ("env", "LLAMA_ARG_ENDPOINT_METRICS"), "loopback": True},
    ),
    (
        "llama.cpp with --metrics and --host 0.0.0.0",
        c(image=LL, args=["--metrics", "--host", "0.0.0.0", "--port", "8081"]),
        "pod",
        {},
        {"action": "probe", "port": 8081, "enable": ("", ""), "loopback": False},
    ),
    (
        "llama.cpp host from LLAMA_ARG_HOST",
        c(image=LL, args=["--metrics"], env=[{"name": "LLAMA_ARG_HOST", "value": "0.0.0.0"}]),
        "pod",
        {},
        {"action": "probe", "loopback": False},
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
        {"action": "probe", "port": 30001, "enable": ("arg", "--enable-metrics"), "loopback": True},
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
        {"container": "engine"},
        {"action": "probe", "engine": None, "port": 8000},
    ),
    (
        "custom image, no server command, no port",
        c(image="me/vllm-tools:1", command=["python3", "tool.py"]),
        "pod",
        {},
        {
            "action": "skip",
            "why": UNKNOWN_PORT,
        },
    ),
    (
        "containerPort named http wins",
        c(image="me/vllm:1", ports=[{"name": "grpc", "containerPort": 9}, {"name": "http", "containerPort": 8888}]),
        "pod",
        {},
        {"action": "probe", "port": 8888},
    ),
    (
        "containerPort not a number",
        c(image="me/vllm:1", ports=[{"containerPort": "x"}]),
        "pod",
        {},
        {"action": "skip", "why": "its containerPort is 'x', not a port"},
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
        {"container": "engine"},
        {"action": "probe", "engine": None, "port": 7001, "port_from": "--port in its command", "loopback": False},
    ),
    (
        "the engine named by --engine",
        c(image="me/own:1", args=["--port", "7002"]),
        "pod",
        {"engine": "vllm"},
        {"action": "probe", "engine": "vllm", "port": 7002},
    ),
    (
        "the engine named by its args alone",
        c(image="me/img:1", args=["llama-server", "--port", "8082", "--metrics"]),
        "pod",
        {},
        {"action": "probe", "engine": "llamacpp", "port": 8082, "port_from": "--port in its command"},
    ),
    (
        "vllm serve in its own image: default port assumed",
        c(image="me/img:1", command=["vllm", "serve", "m"]),
        "pod",
        {},
        {"action": "probe", "port": 8000, "port_from": "assumed: vllm's default, as its command sets no port"},
    ),
    (
        "vllm serve past the third word is not the server",
        c(image="me/img:1", command=["nice", "-n5", "vllm", "serve", "m"]),
        "pod",
        {},
        {"action": "skip", "why": UNKNOWN_PORT},
    ),
    (
        "a command in the entrypoint image that is not the server",
        c(command=["python3", "tool.py"]),
        "pod",
        {},
        {"action": "skip", "why": UNKNOWN_PORT},
    ),
    (
        "the server's port, not the one of the command beside it",
        sh("vllm serve m --port 8001 & proxy --port 9000"),
        "pod",
        {},
        {"action": "probe", "port": 8001},
    ),
    ("port 1", c(args=["--port", "1"]), "pod", {}, {"action": "probe", "port": 1}),
    ("port 65535", c(args=["--port", "65535"]), "pod", {}, {"action": "probe", "port": 65535}),
    (
        "port 0",
        c(args=["--port", "0"]),
        "pod",
        {},
        {"action": "skip", "why": "its port is 0, which the manifest does not resolve"},
    ),
    (
        "port 65536",
        c(args=["--port", "65536"]),
        "pod",
        {},
        {"action": "skip", "why": "its port is 65536, which the manifest does not resolve"},
    ),
    (
        "port past what int() converts",
        c(args=["--port", "9" * 5000]),
        "pod",
        {},
        {"action": "skip", "why": f"its port is {'9' * 5000}, which the manifest does not resolve", "port": 0},
    ),
    (
        "port in digits other than ASCII's",
        c(args=["--port", "\u0668\u0660\u0660\u0660"]),
        "pod",
        {},
        {"action": "skip", "why": "its port is \u0668\u0660\u0660\u0660, which the manifest does not resolve"},
    ),
    (
        "containerPort past what int() converts",
        c(image="me/vllm:1", ports=[{"containerPort": "9" * 5000}]),
        "pod",
        {},
        {"action": "skip", "why": f"its containerPort is {'9' * 5000!r}, not a port", "port": 0},
    ),
    (
        "containerPort entry without a port",
        c(image="me/vllm:1", ports=[{"name": "http"}]),
        "pod",
        {},
        {"action": "skip", "why": UNKNOWN_PORT},
    ),
    (
        "llama.cpp on localhost",
        c(image=LL, args=["--metrics", "--host", "localhost"]),
        "pod",
        {},
        {"action": "probe", "loopback": True},
    ),
    (
        "llama.cpp on ::1",
        c(image=LL, args=["--metrics", "--host", "::1"]),
        "pod",
        {},
        {"action": "probe", "loopback": True},
    ),
    (
        "llama.cpp metrics variable True",
        c(image=LL, env=[{"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "True"}]),
        "pod",
        {},
        {"action": "probe", "enable": ("", "")},
    ),
    (
        "llama.cpp metrics variable 0: turned on",
        c(image=LL, env=[{"name": "LLAMA_ARG_ENDPOINT_METRICS", "value": "0"}]),
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
    ("readiness added", c(), "pod", {"drain": True}, {"readiness": "added"}),
    ("readiness not asked", c(), "pod", {}, {"readiness": ""}),
    ("readiness plain replaced", c(readinessProbe=HEALTH), "pod", {"drain": True}, {"readiness": "replaced"}),
    ("readiness ours", c(readinessProbe=OURS), "pod", {"drain": True}, {"readiness": "ours"}),
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


def test_engines_are_named_by_image_or_command() -> None:
    assert engine_of(c(image="me/x:1", command=["llama-server"])) == "llamacpp"
    assert engine_of(c(image=SG)) == "sglang"
    assert engine_of(c(image="nginx")) is None
    assert set(SERVING) == {"vllm", "sglang", "llamacpp"}


def test_the_shell_splits_as_a_shell_does() -> None:
    env = {"P": "1", "Q": "two words"}
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
    assert shell_words("if true; then vllm serve; fi", {}) == [["true"], ["vllm", "serve"], ["fi"]]
    assert shell_words("unclosed 'quote", {}) == []
    assert shell_words("${unclosed", {}) == [["${unclosed"]]
    assert shell_words('a${R:-$X} "${P}${Q $P"', {"P": "1"}) == [["a${R:-$X}", "1${Q $P"]]
    assert shell_words("a |& b", {}) == [["a"], ["b"]]
    assert shell_words("${P}-${P} ${P}:80 ${S}/v $P/x a$/b $MY_PORT ${}:-1}", {"P": "1", "MY_PORT": "8"}) == [
        ["1-1", "1:80", "${S}/v", "1/x", "a$/b", "8", "${}:-1}"]
    ]


def test_the_kubelets_expansion() -> None:
    assert k8s_expand("$(A)-$$(A)-$(B)-$(", {"A": "x"}) == "x-$(A)-$(B)-$("
    assert k8s_expand("p$(A)$(A)-$(A", {"A": "x"}) == "pxx-$(A"
    assert k8s_expand("$(A))$$$(A)$(B$(A))$$$$", {"A": "x"}) == "x)$x$(Bx)$$"
    assert env_values({"env": [{"name": "A", "value": 1}, {"name": "B", "value": "$(A)2"}, {"name": "C"}, "x"]}) == {
        "A": "1",
        "B": "12",
    }


def test_command_lines() -> None:
    assert command_lines({}, {}) == []
    assert command_lines({"command": ["bash", "-ex", "-c", "a --x_y=1", "sh"]}, {}) == [["a", "--x-y=1"]]
    assert command_lines({"command": ["bash", "-e"], "args": ["script.sh"]}, {}) == [["bash", "-e", "script.sh"]]
    assert command_lines({"command": ["bash", "--login", "-c"]}, {}) == [["bash", "--login", "-c"]]
    assert command_lines({"command": ["bash", "--rcfile", "/r", "-c", "a"]}, {}) == [
        ["bash", "--rcfile", "/r", "-c", "a"]
    ]
    assert command_lines({"args": ["-x_y", "--a_b", "--c_d=e_f"]}, {}) == [["-x_y", "--a-b", "--c-d=e_f"]]


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
        "Decision({'action': 'skip', 'enable': ('', ''), 'engine': None, 'liveness': '', 'loopback': False, "
        "'port': 0, 'port_from': '', 'readiness': '', 'startup': False, 'why': 'why'})"
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
