"""How each engine's server is started in a container, for `inject` and `doctor`: which command serves,
where its port, host and metrics switch are read from. Facts from each engine's own argument parser and
docs, cited per engine below. Plain class attributes, one subclass per engine: data, nothing that runs.
(What each engine publishes, and how its page is read, is engines.py: the probe's path, which this
module stays off.)
"""

from __future__ import annotations

__all__ = ["PYZ_KEY", "SERVING", "LlamacppServing", "Serving", "SglangServing", "VllmServing"]

# The probe's single-file build as it reaches a container: its key in the ConfigMap inject ships, and its
# file where the pod mounts it (stanza.PYZ_PATH); a probe whose command names it is one inject wrote.
PYZ_KEY = "stallprobe.pyz"


class Serving:
    """How an engine's server is started in a container: which command serves, where its port, host and
    metrics switch are read from."""

    servers: tuple[str, ...] = ()  # the start of a command line that runs its HTTP server
    images: tuple[str, ...] = ()  # images whose entrypoint is that server (args alone go to it)
    port_flags: tuple[str, ...] = ("--port",)  # flags that set its port
    port_env: tuple[str, ...] = ()  # variables it reads its port from when no flag says
    host_env: tuple[str, ...] = ()  # variables it reads its address from
    default_host = "127.0.0.1"  # the address it binds when nothing says (loopback: the pod's IP fails)
    # Metrics: on when one of metrics_on is given (or a metrics_env variable is true); with none of
    # metrics_on (empty) they are on unless one of metrics_off is given.
    metrics_on: tuple[str, ...] = ()
    metrics_off: tuple[str, ...] = ()
    metrics_env: tuple[str, ...] = ()


class VllmServing(Serving):
    # vLLM (vllm/entrypoints/openai/cli_args.py, vllm/entrypoints/cli/serve.py): `vllm serve` or the
    # api_server module; --port 8000, --host all interfaces. The vllm/vllm-openai image's entrypoint is
    # the api server. --disable-log-stats creates no stat logger: no vllm: family is registered at all.
    servers = ("vllm serve", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
    images = ("vllm/vllm-openai",)
    default_host = "0.0.0.0"
    metrics_off = ("--disable-log-stats",)


class SglangServing(Serving):
    # SGLang (python/sglang/srt/server_args.py): sglang.launch_server; --port 30000, --host 127.0.0.1;
    # metrics only with --enable-metrics. Its images run nothing by default.
    servers = ("sglang.launch_server", "sglang serve")
    metrics_on = ("--enable-metrics",)


class LlamacppServing(Serving):
    # llama.cpp's server (common/arg.cpp): llama-server, --port 8080 or LLAMA_ARG_PORT, --host 127.0.0.1
    # or LLAMA_ARG_HOST; /metrics answers 501 unless --metrics or LLAMA_ARG_ENDPOINT_METRICS (1, true,
    # on, enabled). The ghcr.io/ggml-org/llama.cpp:server images' entrypoint is llama-server.
    servers = ("llama-server", "llama.cpp/server")
    images = ("llama.cpp:server",)
    port_env = ("LLAMA_ARG_PORT",)
    host_env = ("LLAMA_ARG_HOST",)
    metrics_on = ("--metrics",)
    metrics_env = ("LLAMA_ARG_ENDPOINT_METRICS",)


SERVING: dict[str, type[Serving]] = {"vllm": VllmServing, "sglang": SglangServing, "llamacpp": LlamacppServing}
