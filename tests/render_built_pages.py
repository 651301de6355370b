"""Render the LMDeploy and TensorRT-LLM pages of tests/fixtures/built/ with prometheus_client itself.

No LMDeploy or TensorRT-LLM runs here (neither has a CPU build), so their pages are built the way their
servers write them: each family declared as the engine's source declares it (name, type, HELP text,
label names, buckets, registration order), given numbers for one situation, and written by
prometheus_client as that server writes it: LMDeploy's default registry in single-process mode
(`prometheus_client.disable_created_metrics()`, so no `_created` series), TensorRT-LLM's
`MultiProcessCollector` (a `pid` label on every gauge, no `_created` series; the HELP texts kept, as
prometheus_client has done since 0.15, and one page as older clients wrote it: "Multiprocess metric"). The sources,
versions and situations are in tests/fixtures/built/SOURCES.md; the names below are copied from them
and nowhere else.

    python tests/render_built_pages.py           # write the pages
    python tests/render_built_pages.py --check   # exit 1 when a page differs from what this renders

Run in a process of its own: it switches prometheus_client's created series off and its values to
multiprocess files, which would change every page rendered after it in the same process.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest, values
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

BUILT = Path(__file__).resolve().parent / "fixtures" / "built"

# --- LMDeploy 0.18.0 (lmdeploy/metrics/loggers.py, PrometheusStatLogger.__init__)

LMDEPLOY_MODEL = "Qwen/Qwen2.5-7B-Instruct"
# session_len of the deployment: the request token histograms' buckets (build_1_2_5_buckets(max_model_len)).
LMDEPLOY_SESSION_LEN = 32768
# lmdeploy/messages.py ResponseType: every member's child of request_success_total is made at start,
# labelled str(member) (a plain enum.Enum: "ResponseType.FINISH").
RESPONSE_TYPES = (
    "SUCCESS",
    "FINISH",
    "ENGINE_STOP_ERROR",
    "SESSION_REPEAT",
    "SESSION_NOT_EXIST",
    "HANDLER_NOT_EXIST",
    "INPUT_LENGTH_ERROR",
    "INTERNAL_ENGINE_ERROR",
    "CANCEL",
    "PREFIX_CACHE_CONFLICT",
    "NO_QUEUE",
    "NOT_SUPPORTED",
    "OUT_OF_MEMORY",
)
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
LMDEPLOY_TPOT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                         10.0, 20.0, 40.0, 80.0]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip


def one_two_five(most: int) -> list[float]:
    """lmdeploy's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to `most`."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > most:
                return buckets
            buckets.append(float(value))
        exponent += 1


class Request:
    """One request as LMDeploy's metrics saw it: its prompt, the tokens generated so far, whether it
    finished (ResponseType.FINISH)."""

    def __init__(self, prompt: int, generated: int, finished: bool = False) -> None:
        self.prompt = prompt
        self.generated = generated
        self.finished = finished


class LmdeployState:
    """One scrape of one LMDeploy api_server: the requests whose outputs its metrics task has recorded,
    and the scheduler's gauges as the last 10-second tick set them."""

    def __init__(
        self,
        rank: int,
        requests: Sequence[Request],
        *,
        running: int,
        waiting: int,
        routed: int,
        cache_usage: float,
        succeeded: int,
        failed: int = 0,
    ) -> None:
        self.rank = rank
        self.requests = requests
        self.running = running
        self.waiting = waiting
        self.routed = routed
        self.cache_usage = cache_usage
        self.succeeded = succeeded
        self.failed = failed


def lmdeploy_page(state: LmdeployState) -> bytes:
    """The page of one api_server (one dp rank: `engine` is its rank), as PrometheusStatLogger declares
    its families and metrics_processor records them: every streamed output records its tokens (the first
    also the prompt, its time to first token), every later one its inter-token latency, every finished
    request its histograms and its FINISH child."""
    registry = CollectorRegistry()
    labelnames = ["model_name", "engine"]
    labelvalues = [LMDEPLOY_MODEL, str(state.rank)]

    def gauge(name: str, documentation: str) -> Gauge:
        return Gauge(name, documentation, labelnames, registry=registry).labels(*labelvalues)

    def counter(name: str, documentation: str) -> Counter:
        return Counter(name, documentation, labelnames, registry=registry).labels(*labelvalues)

    def histogram(name: str, documentation: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, documentation, labelnames, buckets=buckets, registry=registry).labels(*labelvalues)

    Info("lmdeploy:backend_config", "information of backend_config", registry=registry)
    gauge("lmdeploy:num_requests_succeeded", "Number of current succeeded requests.").set(state.succeeded)
    gauge("lmdeploy:num_requests_failed", "Number of current failed requests.").set(state.failed)
    gauge("lmdeploy:num_api_requests_routed", "Number of requests routed to request handles.").set(state.routed)
    gauge("lmdeploy:num_api_requests_waiting", "Number of requests waiting for free request handles.").set(0)
    gauge("lmdeploy:num_requests_running", "Number of requests in model execution batches.").set(state.running)
    gauge("lmdeploy:num_requests_waiting", "Number of requests waiting to be processed.").set(state.waiting)
    gauge("lmdeploy:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.").set(state.cache_usage)
    gauge("lmdeploy:prefix_cache_hit_rate", "Prefix-cache hit rate. 1 means 100 percent of queried prefix tokens hit.")
    prompt = counter("lmdeploy:prompt_tokens_total", "Number of prefill tokens processed.")
    generation = counter("lmdeploy:generation_tokens_total", "Number of generation tokens processed.")
    counter("lmdeploy:spec_decode_num_drafts_total", "Number of speculative decoding drafts.")
    counter("lmdeploy:spec_decode_num_draft_tokens_total", "Number of speculative decoding draft tokens.")
    counter("lmdeploy:spec_decode_num_accepted_tokens_total", "Number of speculative decoding accepted tokens.")
    Counter(
        "lmdeploy:spec_decode_num_accepted_tokens_per_pos_total",
        "Number of accepted speculative decoding tokens per draft position.",
        [*labelnames, "position"],
        registry=registry,
    )
    gauge(
        "lmdeploy:spec_decode_mean_accept_rate",
        "Mean speculative decoding acceptance rate. 1 means 100 percent accepted.",
    )
    gauge(
        "lmdeploy:spec_decode_mean_accept_length",
        "Mean speculative decoding acceptance length, including the bonus token.",
    )
    Gauge(
        "lmdeploy:spec_decode_per_position_accept_rate",
        "Speculative decoding acceptance rate per draft position. 1 means 100 percent accepted.",
        [*labelnames, "position"],
        registry=registry,
    )
    success = Counter(
        "lmdeploy:request_success_total",
        "Count of successfully processed requests.",
        [*labelnames, "finished_reason"],
        registry=registry,
    )
    children = {reason: success.labels(*labelvalues, f"ResponseType.{reason}") for reason in RESPONSE_TYPES}
    tokens = one_two_five(LMDEPLOY_SESSION_LEN)
    prompt_hist = histogram("lmdeploy:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
    generation_hist = histogram("lmdeploy:request_generation_tokens", "Number of generation tokens processed.", tokens)
    cached_hist = histogram(
        "lmdeploy:request_cached_tokens", "Number of prefix-cached input tokens per request.", tokens
    )
    ratio_hist = histogram(
        "lmdeploy:request_cache_hit_ratio",
        "Prefix cache hit ratio (cached_tokens / prompt_tokens) per request.",
        [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
    )
    cached = counter("lmdeploy:cached_tokens_total", "Total prefix-cached input tokens served.")
    iteration = histogram(
        "lmdeploy:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    )
    ttft = histogram(
        "lmdeploy:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
    )
    tpot = histogram(
        "lmdeploy:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        LMDEPLOY_TPOT_BUCKETS,
    )
    itl = histogram("lmdeploy:iter_token_latency", "Histogram of inter-token latency", LMDEPLOY_TPOT_BUCKETS)
    e2e = histogram(
        "lmdeploy:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS
    )
    queue = histogram(
        "lmdeploy:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        REQUEST_LATENCY_BUCKETS,
    )
    inference = histogram(
        "lmdeploy:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        REQUEST_LATENCY_BUCKETS,
    )
    prefill = histogram(
        "lmdeploy:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        REQUEST_LATENCY_BUCKETS,
    )
    decode = histogram(
        "lmdeploy:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        REQUEST_LATENCY_BUCKETS,
    )
    for request in state.requests:
        # One streamed output per generated token: the first carries the prompt (record_iteration).
        for token in range(request.generated):
            first = token == 0
            prompt.inc(request.prompt if first else 0)
            generation.inc(1)
            iteration.observe((request.prompt if first else 0) + 1)
            if first:
                ttft.observe(0.21)
            else:
                tpot.observe(0.045)
                itl.observe(0.045)
        if request.finished:  # record_finish: only for ResponseType.FINISH
            children["FINISH"].inc()
            decode_time = 0.045 * (request.generated - 1)
            e2e.observe(0.03 + 0.18 + decode_time)
            queue.observe(0.03)
            prefill.observe(0.18)
            inference.observe(0.18 + decode_time)
            decode.observe(decode_time)
            prompt_hist.observe(request.prompt)
            generation_hist.observe(request.generated)
            cached_hist.observe(0)
            ratio_hist.observe(0.0)
            cached.inc(0)
    return generate_latest(registry)


def finished(count: int) -> list[Request]:
    return [Request(512, 256, finished=True) for _ in range(count)]


# The KV cache of every page: 1200 blocks of 64 tokens (a sequence holds ceil(tokens / 64) blocks).
LMDEPLOY_BLOCKS = 1200.0

LMDEPLOY_PAGES: dict[str, LmdeployState] = {
    # dp rank 0 under load: 12 finished, 3 generating (40, 90, 130 tokens: 9 + 10 + 11 blocks), 1 waiting.
    "lmdeploy-0.18.0-busy.prom": LmdeployState(
        0,
        [*finished(12), Request(512, 40), Request(512, 90), Request(512, 130)],
        running=3,
        waiting=1,
        routed=4,
        cache_usage=30 / LMDEPLOY_BLOCKS,
        succeeded=12,
    ),
    # The same server at its next 10-second tick: the third finished, the waiting one admitted.
    "lmdeploy-0.18.0-busy-later.prom": LmdeployState(
        0,
        [*finished(13), Request(512, 160), Request(512, 210), Request(512, 94)],
        running=3,
        waiting=0,
        routed=3,
        cache_usage=33 / LMDEPLOY_BLOCKS,
        succeeded=13,
    ),
    # dp rank 1 of the same deployment: its own api_server on the next port, its own page.
    "lmdeploy-0.18.0-dp-rank1-busy.prom": LmdeployState(
        1,
        [*finished(9), Request(512, 70), Request(512, 200)],
        running=2,
        waiting=0,
        routed=2,
        cache_usage=22 / LMDEPLOY_BLOCKS,
        succeeded=9,
    ),
    # Every request of busy-later finished, at the tick after: nothing runs or waits, the blocks freed.
    "lmdeploy-0.18.0-idle.prom": LmdeployState(
        0, finished(16), running=0, waiting=0, routed=0, cache_usage=0.0, succeeded=16
    ),
    # POST /sleep a few seconds after busy-later: the three generations aborted (not FINISH), the counters
    # where their last outputs left them, the gauges still the last tick's (busy-later's).
    "lmdeploy-0.18.0-asleep-stale-gauges.prom": LmdeployState(
        0,
        [*finished(13), Request(512, 190), Request(512, 240), Request(512, 124)],
        running=3,
        waiting=0,
        routed=3,
        cache_usage=33 / LMDEPLOY_BLOCKS,
        succeeded=13,
    ),
    # Asleep at the next tick: the scheduler empty, the KV cache discarded, the three counted as failed.
    "lmdeploy-0.18.0-asleep.prom": LmdeployState(
        0,
        [*finished(13), Request(512, 190), Request(512, 240), Request(512, 124)],
        running=0,
        waiting=0,
        routed=0,
        cache_usage=0.0,
        succeeded=13,
        failed=3,
    ),
}

# --- TensorRT-LLM (tensorrt_llm/metrics/collector.py, MetricsCollector; tensorrt_llm/serve/openai_server.py)

TRT_LABELS = {"model_name": "meta-llama/Llama-3.1-8B-Instruct", "engine_type": "pytorch"}
TRT_PID = 4183  # the trtllm-serve process, the one process writing the multiprocess files
TRT_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                    80.0]  # fmt: skip
TRT_PREFILL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
                       640.0, 2560.0]  # fmt: skip
TRT_BLOCKS = 12000  # maxNumBlocks; tokensPerBlock 32 (KvCacheConfig.tokens_per_block's default)


class TrtState:
    """One scrape of trtllm-serve: the requests finished (finish reason, prompt, generated), whether its
    iteration statistics are on (enable_iter_perf_stats), and the last iteration its collector drained."""

    def __init__(
        self,
        finished: Sequence[tuple[str, int, int]],
        *,
        iterations: bool,
        active: int = 0,
        generating: Sequence[int] = (),
        gen_alloc: int = 0,
        missed: int = 0,
        prefills: int = 0,
        latency: float = 0.021,
    ) -> None:
        self.finished = finished
        self.iterations = iterations
        self.active = active  # numActiveRequests of the last stat drained
        self.generating = generating  # tokens generated by the requests of that iteration
        self.gen_alloc = gen_alloc  # sum of iterGenAllocBlocks drained so far
        self.missed = missed  # kvCacheStats.missedBlocks (cumulative), and the iteration deltas' sum
        self.prefills = prefills  # context iterations drained (one 1000-token prompt each)
        self.latency = latency


def trt_blocks(generated: int, prompt: int = 1000) -> tuple[int, int]:
    """The blocks of one request: its context's, and those allocated while generating (the last context
    block takes the first tokens; then one per 32)."""
    context = -(-prompt // 32)
    spare = context * 32 - prompt
    return context, max(0, -(-(generated - spare) // 32))


def trt_page(state: TrtState) -> None:
    """The page of trtllm-serve with return_perf_metrics: the collector's families as MetricsCollector
    declares them, only the children it has written (a labelled child exists once it is set or
    incremented; counters are incremented only by amounts above 0), read back by MultiProcessCollector."""
    names = list(TRT_LABELS)

    # Registered nowhere: in multiprocess mode each value is its file's, and MultiProcessCollector reads them.
    def counter(name: str, documentation: str, labels: Sequence[str] = names) -> Counter:
        return Counter(name, documentation, labels, registry=None)

    def gauge(name: str, documentation: str, labels: Sequence[str] = names) -> Gauge:
        return Gauge(name, documentation, labels, registry=None)

    def histogram(name: str, documentation: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, documentation, names, buckets=buckets, registry=None)

    # Declared in MetricsCollector.__init__'s order.
    success = counter(
        "trtllm_request_success_total", "Count of successfully processed requests.", [*names, "finished_reason"]
    )
    e2e = histogram(
        "trtllm_e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        REQUEST_LATENCY_BUCKETS,
    )
    ttft = histogram("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
    tpot = histogram(
        "trtllm_time_per_output_token_seconds", "Histogram of time per output token in seconds.", TRT_TPOT_BUCKETS
    )
    queue = histogram(
        "trtllm_request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        REQUEST_LATENCY_BUCKETS,
    )
    prefill = histogram(
        "trtllm_request_prefill_time_seconds",
        "Histogram of prefill (context) phase duration in seconds (first_token_time - first_scheduled_time).",
        TRT_PREFILL_BUCKETS,
    )
    decode = histogram(
        "trtllm_request_decode_time_seconds",
        "Histogram of decode (generation) phase duration in seconds (last_token_time - first_token_time).",
        REQUEST_LATENCY_BUCKETS,
    )
    inference = histogram(
        "trtllm_request_inference_time_seconds",
        "Histogram of total inference duration in seconds (last_token_time - first_scheduled_time).",
        REQUEST_LATENCY_BUCKETS,
    )
    prompt = counter("trtllm_prompt_tokens_total", "Cumulative number of prompt (input) tokens processed.")
    generation = counter("trtllm_generation_tokens_total", "Cumulative number of generation (output) tokens produced.")
    hit_rate = gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate")
    counter("trtllm_kv_cache_reused_blocks", "Cumulative number of KV cache blocks reused (cache hits)")
    missed = counter("trtllm_kv_cache_missed_blocks", "Cumulative number of KV cache blocks missed (cache misses)")
    utilization = gauge("trtllm_kv_cache_utilization", "KV cache utilization")
    gauge("trtllm_kv_cache_host_utilization", "KV cache host (secondary) pool utilization")
    reuse_rate = gauge("trtllm_kv_cache_iter_reuse_rate", "Per-iteration KV cache block reuse rate")
    counter("trtllm_kv_cache_iter_reused_blocks", "Total reused KV cache blocks (full + partial)")
    counter("trtllm_kv_cache_iter_full_reused_blocks", "Total fully reused KV cache blocks")
    counter("trtllm_kv_cache_iter_partial_reused_blocks", "Total partially reused KV cache blocks")
    iter_missed = counter("trtllm_kv_cache_iter_missed_blocks", "Total missed KV cache blocks (context phase)")
    gen_alloc = counter("trtllm_kv_cache_gen_alloc_blocks_total", "Total blocks allocated during generation phase")
    counter("trtllm_kv_cache_onboard_bytes_total", "Total bytes transferred from host to GPU (onboard)")
    counter("trtllm_kv_cache_offload_bytes_total", "Total bytes transferred from GPU to host (offload)")
    counter(
        "trtllm_kv_cache_intra_device_copy_bytes_total", "Total bytes copied within GPU (intra-device block copies)"
    )
    running = gauge("trtllm_num_requests_running", "Number of active requests")
    waiting = gauge("trtllm_num_requests_waiting", "Number of queued requests")
    completed = counter("trtllm_num_requests_completed_total", "Total number of completed requests across iterations")
    max_active = gauge("trtllm_max_num_active_requests", "Maximum number of active requests")
    latency = gauge("trtllm_iteration_latency_seconds", "Iteration latency in seconds")
    gpu_memory = gauge("trtllm_gpu_memory_usage_bytes", "GPU memory usage in bytes")
    cpu_memory = gauge("trtllm_cpu_memory_usage_bytes", "CPU memory usage in bytes")
    pinned = gauge("trtllm_pinned_memory_usage_bytes", "Pinned memory usage in bytes")
    batch_static = gauge("trtllm_max_batch_size_static", "Static maximum batch size")
    batch_runtime = gauge("trtllm_max_batch_size_runtime", "Runtime maximum batch size")
    tokens_runtime = gauge("trtllm_max_num_tokens_runtime", "Runtime maximum number of tokens")
    max_blocks = gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks")
    free_blocks = gauge("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks")
    used_blocks = gauge("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks")
    per_block = gauge("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block")
    context_requests = gauge("trtllm_num_context_requests", "Number of context (prefill) requests")
    generation_requests = gauge("trtllm_num_generation_requests", "Number of generation (decode) requests")
    paused = gauge("trtllm_num_paused_requests", "Number of paused requests")
    scheduled = gauge("trtllm_num_scheduled_requests", "Number of scheduled requests")
    context_tokens = gauge("trtllm_total_context_tokens", "Total number of context tokens")
    decoded = gauge("trtllm_avg_decoded_tokens_per_iter", "Average number of decoded tokens per iteration")
    counter("trtllm_spec_decode_num_draft_tokens_total", "Total number of draft tokens in speculative decoding")
    counter("trtllm_spec_decode_num_accepted_tokens_total", "Total number of accepted tokens in speculative decoding")
    gauge("trtllm_spec_decode_acceptance_length", "Acceptance length in speculative decoding")
    gauge("trtllm_spec_decode_draft_overhead", "Draft overhead in speculative decoding")
    counter("trtllm_prompt_cached_tokens_total", "Total prompt tokens served from KV cache.")
    cached_hist = histogram(
        "trtllm_prompt_cached_tokens_per_request",
        "Histogram of cached prompt tokens per request.",
        [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
    )
    position = [*names, "token_position"]
    counter(
        "trtllm_spec_decode_drafted_tokens_total", "Total drafted tokens per speculative decoding position.", position
    )
    counter(
        "trtllm_spec_decode_accepted_tokens_total", "Total accepted tokens per speculative decoding position.", position
    )
    perplexity = [1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 500.0, 1000.0]
    histogram("trtllm_prefill_perplexity", "Histogram of prefill perplexity per request.", perplexity)
    histogram("trtllm_generation_perplexity", "Histogram of generation perplexity per request.", perplexity)
    occupancy = gauge("trtllm_prefill_batch_occupancy", "Fraction of max active slots occupied by context requests.")
    batch_tokens = histogram(
        "trtllm_prefill_batch_tokens",
        "Histogram of total context tokens per iteration.",
        [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
    )
    counter("trtllm_request_error_total", "Total request errors, labeled by HTTP status code.", [*names, "http_code"])

    # _log_config_info_metrics at start (log_config_info: one gauge each, set to 1).
    model_config = {
        "model": "/models/Llama-3.1-8B-Instruct",
        "served_model_name": TRT_LABELS["model_name"],
        "dtype": "auto",
        "quantization": "none",
        "max_model_len": "131072",
        "gpu_type": "NVIDIA H100 80GB HBM3",
    }
    parallel_config = {
        "tensor_parallel_size": "1",
        "pipeline_parallel_size": "1",
        "context_parallel_size": "1",
        "gpu_count": "1",
    }
    kv_config = {"enable_block_reuse": "True", "enable_partial_reuse": "True", "free_gpu_memory_fraction": "0.9"}
    for name, documentation, config in (
        ("trtllm_model_config_info", "Model configuration info", model_config),
        ("trtllm_parallel_config_info", "Parallelism configuration info", parallel_config),
        ("trtllm_kv_cache_config_info", "KV cache configuration info", kv_config),
    ):
        labels = {**TRT_LABELS, **config}
        gauge(name, documentation, list(labels)).labels(**labels).set(1)

    if state.iterations:  # log_iteration_stats of the last stat drained (gauges) and of every one (counters)
        running.labels(**TRT_LABELS).set(state.active)
        waiting.labels(**TRT_LABELS).set(0)
        if state.finished:
            completed.labels(**TRT_LABELS).inc(len(state.finished))
        max_active.labels(**TRT_LABELS).set(2048)
        latency.labels(**TRT_LABELS).set(state.latency if state.active else 0.0)
        gpu_memory.labels(**TRT_LABELS).set(76931907584)
        cpu_memory.labels(**TRT_LABELS).set(2147483648)
        pinned.labels(**TRT_LABELS).set(536870912)
        batch_static.labels(**TRT_LABELS).set(2048)
        batch_runtime.labels(**TRT_LABELS).set(2048)
        tokens_runtime.labels(**TRT_LABELS).set(8192)
        hit_rate.labels(**TRT_LABELS).set(0.0)
        if state.missed:
            missed.labels(**TRT_LABELS).inc(state.missed)
        used = sum(sum(trt_blocks(tokens)) for tokens in state.generating)
        utilization.labels(**TRT_LABELS).set(used / TRT_BLOCKS)
        max_blocks.labels(**TRT_LABELS).set(TRT_BLOCKS)
        free_blocks.labels(**TRT_LABELS).set(TRT_BLOCKS - used)
        used_blocks.labels(**TRT_LABELS).set(used)
        per_block.labels(**TRT_LABELS).set(32)
        context_requests.labels(**TRT_LABELS).set(0)
        generation_requests.labels(**TRT_LABELS).set(state.active)
        paused.labels(**TRT_LABELS).set(0)
        scheduled.labels(**TRT_LABELS).set(state.active)
        context_tokens.labels(**TRT_LABELS).set(0)
        decoded.labels(**TRT_LABELS).set(1.0 if state.active else 0.0)
        for _ in range(state.prefills):
            batch_tokens.labels(**TRT_LABELS).observe(1000)
        occupancy.labels(**TRT_LABELS).set(0.0)
        if state.prefills:
            reuse_rate.labels(**TRT_LABELS).set(0.0)  # set by the last iteration with a context phase
        if state.missed:
            iter_missed.labels(**TRT_LABELS).inc(state.missed)
        if state.gen_alloc:
            gen_alloc.labels(**TRT_LABELS).inc(state.gen_alloc)

    for reason, prompt_tokens, generated in state.finished:  # log_request_metrics_dict, per finished request
        success.labels(**TRT_LABELS, finished_reason=reason).inc()
        decode_time = 0.02 * (generated - 1)
        e2e.labels(**TRT_LABELS).observe(0.01 + 0.09 + decode_time)
        ttft.labels(**TRT_LABELS).observe(0.1)
        tpot.labels(**TRT_LABELS).observe(0.02)
        queue.labels(**TRT_LABELS).observe(0.01)
        prefill.labels(**TRT_LABELS).observe(0.09)
        decode.labels(**TRT_LABELS).observe(decode_time)
        inference.labels(**TRT_LABELS).observe(0.09 + decode_time)
        prompt.labels(**TRT_LABELS).inc(prompt_tokens)
        generation.labels(**TRT_LABELS).inc(generated)
        cached_hist.labels(**TRT_LABELS).observe(0)


def trt_finished(stop: int, length: int) -> list[tuple[str, int, int]]:
    return [("stop", 1000, 500)] * stop + [("length", 1000, 500)] * length


def trt_alloc(generating: Iterable[int], done: int) -> int:
    """gen_alloc_blocks so far: 15 per finished request (500 tokens after a 1000-token prompt), and those
    of the requests still generating."""
    return done * trt_blocks(500)[1] + sum(trt_blocks(tokens)[1] for tokens in generating)


TRT_PAGES: dict[str, TrtState] = {
    # Steady traffic, iteration statistics on: 8 finished, 4 generating (100..400 tokens), the collector
    # awake since the last finish (iterations under 0.5 s apart).
    "trtllm-iter-stats-decoding.prom": TrtState(
        trt_finished(6, 2),
        iterations=True,
        active=4,
        generating=(100, 200, 300, 400),
        gen_alloc=trt_alloc((100, 200, 300, 400), 8),
        missed=12 * 32,
        prefills=12,
    ),
    # 3 s later, no request finished: only the per-iteration series moved (60 tokens each, 8 more blocks).
    "trtllm-iter-stats-decoding-later.prom": TrtState(
        trt_finished(6, 2),
        iterations=True,
        active=4,
        generating=(160, 260, 360, 460),
        gen_alloc=trt_alloc((160, 260, 360, 460), 8),
        missed=12 * 32,
        prefills=12,
        latency=0.022,
    ),
    # One long generation, nothing finished since the collector fell asleep: the page as the last drained
    # iteration left it (1 active request, its blocks), every series frozen until a request finishes.
    "trtllm-iter-stats-long-generation.prom": TrtState(
        trt_finished(10, 2),
        iterations=True,
        active=1,
        generating=(500,),
        gen_alloc=trt_alloc((), 12),
        missed=12 * 32,
        prefills=12,
    ),
    # Just started, iteration statistics on: the startup stats drained, no request finished yet.
    "trtllm-iter-stats-fresh.prom": TrtState((), iterations=True),
    # return_perf_metrics without enable_iter_perf_stats: the request-level families of 12 finished requests.
    "trtllm-request-metrics-only.prom": TrtState(trt_finished(10, 2), iterations=False),
    # return_perf_metrics alone, just started: the configuration gauges and nothing else.
    "trtllm-no-iter-stats-fresh.prom": TrtState((), iterations=False),
}


class SortedFiles:
    """MultiProcessCollector's merge of a multiprocess folder's files, read in name order."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def collect(self) -> list[Metric]:
        files = sorted(str(path) for path in Path(self.folder).glob("*.db"))
        return list(MultiProcessCollector.merge(files, accumulate=True))  # type: ignore[no-untyped-call]


def multiprocess_page(write: Callable[[TrtState], None], state: TrtState) -> bytes:
    """What MultiProcessCollector serves after `write` has set the metrics of `state` (one process, TRT_PID), in a
    multiprocess folder of its own. Its files are read in name order: the real collector reads them in
    the order the folder lists them, which is any order."""
    with tempfile.TemporaryDirectory() as folder:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        before = values.ValueClass
        # A value class of its own, so that its values open files in this folder (each keeps its files).
        values.ValueClass = values.MultiProcessValue(lambda: TRT_PID)  # type: ignore[no-untyped-call]
        try:
            write(state)
            registry = CollectorRegistry()
            registry.register(SortedFiles(folder))
            return generate_latest(registry)
        finally:
            values.ValueClass = before
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]


def help_lost(page: bytes) -> bytes:
    """The page as prometheus_client before 0.15 serves it in multiprocess mode: its files kept no HELP
    text, so MultiProcessCollector wrote "Multiprocess metric" for every family (client_python #804 kept
    the text, from 0.15 on); nothing else differs."""
    lines = page.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"# HELP "):
            lines[i] = b" ".join(line.split(b" ")[:3]) + b" Multiprocess metric"
    return b"\n".join(lines)


def render() -> dict[str, bytes]:
    """Every page, by file name."""
    import prometheus_client

    pages: dict[str, bytes] = {}
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # as LMDeploy's logger does first
    for name, state in LMDEPLOY_PAGES.items():
        pages[name] = lmdeploy_page(state)
    for name, trt in TRT_PAGES.items():
        pages[name] = multiprocess_page(trt_page, trt)
    old = "trtllm-iter-stats-long-generation-help-lost.prom"
    pages[old] = help_lost(pages["trtllm-iter-stats-long-generation.prom"])
    return pages


def main(argv: Sequence[str]) -> int:
    check = "--check" in argv
    differ = []
    for name, page in render().items():
        path = BUILT / name
        if check:
            if not path.is_file() or path.read_bytes() != page:
                differ.append(name)
        else:
            path.write_bytes(page)
    for name in differ:
        print(f"{name}: not what tests/render_built_pages.py renders", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
