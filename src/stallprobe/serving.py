"""How each engine's server is started in a container, for `inject` and `doctor`: which command serves,
where its port, address, API key and metrics switch are read from; which images carry the Python the
probe runs with; and where the probe dials an engine that binds a given address (address()). Facts from
each engine's own argument parser, Dockerfiles and docs, cited beside each. Data, and two small pure
functions on it. (What each engine publishes, and how its page is read, is engines.py: the probe's path,
which this module stays off.)
"""

from __future__ import annotations

__all__ = [
    "LAUNCHER_KEY",
    "LOOPBACK",
    "MOUNT",
    "PYZ_KEY",
    "REPORT_ONLY_KEY",
    "SERVING",
    "TERMINATION_LOG",
    "Address",
    "LlamacppServing",
    "LmdeployServing",
    "Serving",
    "SglangServing",
    "TrtllmServing",
    "VllmServing",
    "address",
    "default_address",
    "python_in",
]

# The probe as it reaches a container: the ConfigMap inject ships, mounted whole at MOUNT, holds the
# single-file build (PYZ_KEY) and its launcher (LAUNCHER_KEY: the file the pod's command runs, which runs
# the archive beside it); a probe whose command names either is one inject wrote (the launcher's path, or
# an earlier release's `-c` program, which named the archive). REPORT_ONLY_KEY is the kill switch: absent
# until an operator adds it to the ConfigMap in place (kubectl patch), when its file appears in every pod
# that mounts the ConfigMap whole (a subPath mount, or `items` listing keys, would never show it).
MOUNT = "/opt/stallprobe"
PYZ_KEY = "stallprobe.pyz"
LAUNCHER_KEY = "probe"
REPORT_ONLY_KEY = "report-only"
# Where the kubelet reads a container's termination message when it sets no terminationMessagePath
# (Kubernetes' default, core/v1 TerminationMessagePathDefault): a liveness run that fails writes its
# evidence there, for `kubectl describe pod` to show as the last state of the restarted container.
TERMINATION_LOG = "/dev/termination-log"


class Serving:
    """How an engine's server is started in a container: which command serves, where its port, address,
    key and metrics switch are read from."""

    servers: tuple[str, ...] = ()  # the start of a command line that runs its HTTP server
    # Images whose entrypoint is that server, each with the first argument that picks the server ("": its
    # args alone go to the server).
    images: tuple[tuple[str, str], ...] = ()
    port_flags: tuple[str, ...] = ("--port",)  # flags that set its port
    port_env: tuple[str, ...] = ()  # variables it reads its port from when no flag says
    host_flags: tuple[str, ...] = ("--host",)  # flags that set the address it binds
    host_env: tuple[str, ...] = ()  # variables it reads its address from
    default_host = "127.0.0.1"  # the address it binds when nothing says (loopback: the pod's IP fails)
    socket_flags: tuple[str, ...] = ()  # flags that make it serve on a UNIX socket instead of TCP
    key_flags: tuple[str, ...] = ("--api-key",)  # flags whose value is an API key its routes want
    # Variables it reads a key from; the probe reads the same ones by itself (scrape.KEY_VARIABLES).
    key_env: tuple[str, ...] = ()
    key_file_flags: tuple[str, ...] = ()  # flags naming a file of keys (one a line)
    key_file_env: tuple[str, ...] = ()  # variables naming such a file
    python = False  # a Python program: wherever it runs, an interpreter is there
    python_image = ""  # its official image that carries python3, for the line that skips a container
    # Metrics: on when one of metrics_on is given (or a metrics_env variable is true); with none of
    # metrics_on (empty) they are on unless one of metrics_off is given.
    metrics_on: tuple[str, ...] = ()
    metrics_off: tuple[str, ...] = ()
    metrics_env: tuple[str, ...] = ()
    # Options of a YAML config file its page needs, none by a flag: the flags that name the file (as
    # command lines are read: `--flag-name`), how to name them in a line, and each option that must be
    # true in it with what it buys the probe (a clause: "which ...").
    config_flags: tuple[str, ...] = ()
    config_shown = ""
    config_needs: tuple[tuple[str, str], ...] = ()


class VllmServing(Serving):
    # vLLM (vllm/entrypoints/openai/cli_args.py, vllm/entrypoints/cli/serve.py): `vllm serve` or the
    # api_server module; --port 8000; --host None, which create_server_socket binds as "" (all IPv4
    # interfaces); --uds PATH serves on a UNIX socket instead (create_server_unix_socket). The
    # vllm/vllm-openai image's entrypoint is the api server. --disable-log-stats creates no stat logger:
    # no vllm: family is registered at all. --api-key (or VLLM_API_KEY) guards its /v1 routes.
    servers = ("vllm serve", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
    images = (("vllm/vllm-openai", ""),)
    default_host = "0.0.0.0"
    socket_flags = ("--uds",)
    key_env = ("VLLM_API_KEY",)
    python = True
    metrics_off = ("--disable-log-stats",)


class SglangServing(Serving):
    # SGLang (python/sglang/srt/server_args.py): sglang.launch_server; --port 30000, --host 127.0.0.1;
    # metrics only with --enable-metrics; --api-key guards every route but /health* and /metrics
    # (srt/utils.py, add_api_key_middleware). Its images run nothing by default.
    servers = ("sglang.launch_server", "sglang serve")
    python = True
    metrics_on = ("--enable-metrics",)


class LlamacppServing(Serving):
    # llama.cpp's server (common/arg.cpp): llama-server, --port 8080 or LLAMA_ARG_PORT, --host 127.0.0.1
    # or LLAMA_ARG_HOST (an address ending in .sock is a UNIX socket); /metrics answers 501 unless
    # --metrics or LLAMA_ARG_ENDPOINT_METRICS (1, true, on, enabled); --api-key KEY or LLAMA_API_KEY,
    # --api-key-file FNAME or LLAMA_ARG_API_KEY_FILE, wanted on every route but /health and the model
    # list. Its images (.devops/*.Dockerfile): the server's entrypoint is llama-server, the full one's
    # tools.sh, which runs llama-server when its first argument is --server (or -s).
    servers = ("llama-server", "llama.cpp/server")
    images = (("llama.cpp:server", ""), ("llama.cpp:full", "--server"), ("llama.cpp:full", "-s"))
    port_env = ("LLAMA_ARG_PORT",)
    host_env = ("LLAMA_ARG_HOST",)
    key_env = ("LLAMA_API_KEY",)
    key_file_flags = ("--api-key-file",)
    key_file_env = ("LLAMA_ARG_API_KEY_FILE",)
    python_image = "ghcr.io/ggml-org/llama.cpp:full (--server first in its args)"
    metrics_on = ("--metrics",)
    metrics_env = ("LLAMA_ARG_ENDPOINT_METRICS",)


class LmdeployServing(Serving):
    # LMDeploy (lmdeploy/cli/serve.py, lmdeploy/serve/openai/api_server.py): `lmdeploy serve api_server
    # MODEL`; --server-port 23333, --server-name 0.0.0.0; metrics on by default since late 2025 (PR #4108),
    # off with --disable-metrics (older releases served /metrics only with --enable-metrics, which newer
    # ones reject as an unknown argument: inject never adds it); --api-keys K... (nargs *), wanted on every
    # route but /health, /docs, /redoc and /nodes, /metrics included (serve/utils/server_utils.py). Its
    # images (openmmlab/lmdeploy) run nothing of their own: the command says `lmdeploy serve api_server`.
    servers = ("lmdeploy serve api_server",)
    port_flags = ("--server-port",)
    host_flags = ("--server-name",)
    default_host = "0.0.0.0"
    key_flags = ("--api-keys",)
    python = True
    metrics_off = ("--disable-metrics",)


class TrtllmServing(Serving):
    # TensorRT-LLM (tensorrt_llm/commands/serve.py): `trtllm-serve [serve] MODEL`; --port 8000, --host
    # localhost (loopback: the kubelet cannot reach it); no API key of any kind (issue #9950). Its
    # Prometheus page is mounted only with return_perf_metrics: true in the YAML that
    # --extra_llm_api_options (--config in newer releases) names, and its per-iteration families (the
    # running gauge without which the probe cannot judge the page, and the KV-block counter that moves
    # while it decodes) only with enable_iter_perf_stats: true too (tensorrt_llm/llmapi/llm_args.py:
    # both False by default; serve/openai_server.py). Its images (nvcr.io/nvidia/tensorrt-llm/release)
    # run their command through nvidia_entrypoint.sh.
    servers = ("trtllm-serve",)
    # --host localhost, which uvicorn (its server) binds on an IPv4 socket: 127.0.0.1 alone.
    default_host = "127.0.0.1"
    key_flags = ()
    python = True
    config_flags = ("--extra-llm-api-options", "--config")
    config_shown = "--extra_llm_api_options (or --config)"
    config_needs = (
        ("return_perf_metrics", "which serves its Prometheus page at all"),
        (
            "enable_iter_perf_stats",
            "which adds the running gauge (without it the page cannot be judged) and the KV-block counter that "
            "moves while it decodes",
        ),
    )


SERVING: dict[str, type[Serving]] = {
    "vllm": VllmServing,
    "sglang": SglangServing,
    "llamacpp": LlamacppServing,
    "lmdeploy": LmdeployServing,
    "trtllm": TrtllmServing,
}

# Whether an image carries a `python3` on its PATH, which the probe runs with: (its repository, how its
# tag starts, whether it does). The repository matches the image's own or its end after a `/` (a
# registry or a mirror's owner before it: ghcr.io/ggml-org/llama.cpp and ghcr.io/ggerganov/llama.cpp
# alike); the first row that matches says. An image no row matches is one inject does not know.
IMAGES: tuple[tuple[str, str, bool], ...] = (
    # vLLM's docker/Dockerfile: the vllm-base stage (vllm-openai's) apt-installs python3.12 and makes it
    # /usr/bin/python3 (update-alternatives).
    ("vllm/vllm-openai", "", True),
    # SGLang's docker/Dockerfile: nvidia/cuda with python3.12 as /usr/bin/python3 (update-alternatives).
    ("lmsysorg/sglang", "", True),
    # llama.cpp's .devops/{cpu,cuda,vulkan,rocm,musa,intel}.Dockerfile: the full stage apt-installs
    # python3 (its conversion scripts need it); the light (llama-cli) and server stages add only libgomp1
    # and curl to their base (ubuntu, nvidia/cuda runtime, mthreads/musa runtime; rocm's and intel's are
    # vendors' images whose own tools are theirs to keep, not a promise of this image), so
    # :server, :server-cuda, :server-vulkan, :server-rocm, :server-musa, :server-intel, :light* and
    # tagged builds (:server-b4567) have none; nor has the older ghcr.io/ggerganov/llama.cpp:server
    # (.devops/llama-server.Dockerfile: ubuntu with libcurl, libgomp1 and curl).
    ("llama.cpp", "full", True),
    ("llama.cpp", "server", False),
    ("llama.cpp", "light", False),
    # LMDeploy's docker/Dockerfile: nvidia/cuda with a venv of python3.10 at /opt/py3 first on PATH
    # (docker/install.sh), which `python3` finds.
    ("openmmlab/lmdeploy", "", True),
    # TensorRT-LLM's release images (docker/Dockerfile.multi) are built on nvcr.io/nvidia/pytorch, whose
    # python3 they run (docker/release.md checks the install with `python3 -c "import tensorrt_llm"`).
    ("tensorrt-llm/release", "", True),
    # Ollama's Dockerfile: ubuntu with ca-certificates and its Go binary.
    ("ollama/ollama", "", False),
    # The official Python images (docker-library/python): python3 is what they are.
    ("python", "", True),
    # `scratch` is the empty image: nothing runs in it, the probe least of all.
    ("scratch", "", False),
)


def _repository(image: str) -> tuple[str, str]:
    """An image reference's repository and tag (`latest` when none; a digest is no tag)."""
    name = image.partition("@")[0]
    repository, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:  # no tag, or the colon was a registry's port
        return name, "latest"
    return repository, tag


def python_in(image: str) -> bool | None:
    """Whether the image carries a python3 (IMAGES says which do), None for an image inject does not know."""
    repository, tag = _repository(image)
    if "distroless" in repository:
        # GoogleContainerTools/distroless: static, base, base-nossl and cc hold no interpreter (no shell
        # either), java and nodejs their own; python3 (python3-debian12, ...) holds python3. RamaLama's
        # distroless llama.cpp images (rlcr.io/ramalama/llamacpp-cpu-distroless) are built the same way.
        return repository.rpartition("/")[2].startswith("python")
    for known, prefix, python in IMAGES:
        if (repository == known or repository.endswith("/" + known)) and tag.startswith(prefix):
            return python
    return None


class Address:
    """Where the probe reaches an engine: `host`, the URL's host (127.0.0.1, [::1], localhost, 10.0.0.5,
    [fd00::5], or `$(POD_IP)`, which the probe replaces at run time with the value of POD_IP in its own
    environment: the kubelet expands a valueFrom variable in an exec probe's command to nothing, so the
    command carries it as `$$(POD_IP)`, stanza.py); `kubelet`, where the
    kubelet's httpGet reaches it: "" at the pod's IP (no host written), an address (its host), or None
    when it cannot (loopback): the health check then runs inside the container, at `host`."""

    __slots__ = ("host", "kubelet")

    def __init__(self, host: str, kubelet: str | None) -> None:
        self.host = host
        self.kubelet = kubelet

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Address) and (self.host, self.kubelet) == (other.host, other.kubelet)

    def __hash__(self) -> int:
        return hash((self.host, self.kubelet))

    def __repr__(self) -> str:
        return f"Address({self.host!r}, {self.kubelet!r})"


LOOPBACK = Address("127.0.0.1", None)


def address(bind: str) -> Address | None:
    """Where the probe dials an engine that binds the literal address `bind`; None for a host name (but
    localhost) or anything else no address is: where a name leads is not the manifest's to say."""
    if bind == "localhost":
        return Address("localhost", None)  # the probe tries every address the name resolves to
    import ipaddress

    try:
        ip = ipaddress.ip_address(bind)
    except ValueError:  # a name, or no address at all
        return None
    if "%" in bind:  # a scoped address (fe80::1%eth0): a URL would need its zone escaped, the kubelet's too
        return None
    if ip.version == 4:
        if ip.is_unspecified:  # 0.0.0.0: every IPv4 address, loopback and the pod's alike
            return Address("127.0.0.1", "")
        return Address(bind, None) if ip.is_loopback else Address(bind, bind)
    # `::` is dialled at [::1], never 127.0.0.1, and checked from inside the container: asyncio (uvicorn,
    # SGLang's server) sets IPV6_V6ONLY on an AF_INET6 listener, so an IPv4 connection to it, the kubelet's
    # to an IPv4 pod IP included, may be refused.
    if ip.is_unspecified or ip.is_loopback:
        return Address("[::1]", None)
    return Address(f"[{bind}]", bind)


def default_address(engine: str | None) -> Address:
    """Where the probe dials an engine whose manifest says nothing of its address: its default bind
    address (Serving.default_host); for an engine inject does not know, loopback, with the kubelet's
    httpGet at the pod's IP (where it binds is not inject's to guess: --host-address says)."""
    serving = SERVING.get(str(engine))
    found = address(serving.default_host) if serving else None
    return found or Address("127.0.0.1", "")
