"""Which metrics each engine publishes, in one place, and turning a /metrics page into samples.

Each dialect names the four numbers the detector reads, the extra signals whose change shows the engine's
loop is alive, and the label that tells engines apart when several share one page. The comments say why
each signal was chosen; docs/engines.md says what each can and cannot see.
"""

from __future__ import annotations

from .detector import Sample
from .errors import MetricsError
from .exposition import counter_series, find_series, has_samples, is_declared, other_spelling

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .exposition import Series

__all__ = [
    "DIALECTS",
    "ENGINE_NAMES",
    "LLAMACPP",
    "LMDEPLOY",
    "SGLANG",
    "TRTLLM",
    "VLLM",
    "Dialect",
    "Owing",
    "PauseSign",
    "about",
    "choose",
    "detect",
    "dialect_named",
    "health_route",
    "precision_note",
    "read_engines",
]


class PauseSign:
    """A family whose value shows the engine's operator has paused it: when its series (those with
    `label` = `value`, if given) sum to zero (`when_zero`) or to more than zero. `why` says so."""

    __slots__ = ("family", "label", "value", "when_zero", "why")

    def __init__(self, family: str, why: str, *, when_zero: bool = False, label: str = "", value: str = "") -> None:
        self.family = family
        self.why = why
        self.when_zero = when_zero
        self.label = label
        self.value = value

    def __repr__(self) -> str:
        return f"PauseSign({self.family!r})"


class Owing:
    """Which of an engine's waiting requests it owes work (the detector's `Sample.owed`), from its page.

    With `family` on the page (a gauge of waiting requests by `label`): the series whose label is one of
    `owed`; with `strict`, none of them while any series is one of `deferred` and the KV cache (the
    dialect's first signal) is not seen empty: the deferred ones may hold what the owed ones wait for,
    and only what holds KV blocks can. Without it: every waiting request when
    `without`, else none. `excuses` are families whose series (those with `excuse_label` = `excuse_value`,
    if given) summing above zero say that the engine waits on something of its own; `held_by` are family
    name prefixes that show a KV connector, whose blocks held for a peer excuse a queue while the KV
    cache is in use (the dialect's first signal) and nothing runs.
    """

    __slots__ = (
        "deferred",
        "excuse_label",
        "excuse_value",
        "excuses",
        "family",
        "held_by",
        "label",
        "owed",
        "strict",
        "without",
    )

    def __init__(
        self,
        family: str = "",
        *,
        label: str = "",
        owed: Sequence[str] = (),
        deferred: Sequence[str] = (),
        strict: bool = False,
        without: bool = False,
        excuses: Sequence[str] = (),
        excuse_label: str = "",
        excuse_value: str = "",
        held_by: Sequence[str] = (),
    ) -> None:
        self.family = family
        self.label = label
        self.owed = tuple(owed)
        self.deferred = tuple(deferred)
        self.strict = strict
        self.without = without
        self.excuses = tuple(excuses)
        self.excuse_label = excuse_label
        self.excuse_value = excuse_value
        self.held_by = tuple(held_by)

    def __repr__(self) -> str:
        return f"Owing({self.family!r}, without={self.without!r})"


# Every waiting request is owed: the engine's waiting gauge counts only requests waiting for a free slot.
ALL_OWED = Owing(without=True)


class Dialect:
    """The names under which one engine publishes what the detector reads."""

    __slots__ = (
        "caveat",
        "confirm_route",
        "digits",
        "engine_label",
        "finished",
        "generation",
        "health_paused",
        "health_route",
        "hints",
        "live_route",
        "load_route",
        "metrics_path",
        "name",
        "owing",
        "pause_key",
        "pause_route",
        "pause_signs",
        "port",
        "preemptions",
        "prompt",
        "running",
        "signals",
        "totals",
        "waiting",
        "window",
    )

    def __init__(
        self,
        name: str,
        *,
        running: str,
        waiting: str,
        prompt: str,
        generation: str,
        signals: Sequence[str] = (),
        engine_label: str | None = None,
        digits: int | None = None,
        port: int,
        hints: Sequence[str],
        pause_signs: Sequence[PauseSign] = (),
        pause_route: str = "",
        load_route: str = "",
        health_route: str = "/health",
        owing: Owing = ALL_OWED,
        totals: tuple[str, str] = ("", ""),
        live_route: str = "",
        finished: str = "",
        preemptions: str = "",
        pause_key: str = "is_paused",
        metrics_path: str = "/metrics",
        window: float | None = None,
        caveat: str = "",
        confirm_route: str = "",
        health_paused: tuple[str, str] = ("", ""),
    ) -> None:
        self.name = name
        self.running = running  # gauge: requests in the running batch; busy means > 0
        self.waiting = waiting  # gauge: queued requests; tells saturated from progressing, never excuses
        self.prompt = prompt  # counter: prefill tokens
        self.generation = generation  # counter: decoded tokens
        self.signals = tuple(signals)  # counters or gauges whose change is evidence the loop is alive
        self.engine_label = engine_label  # the label naming an engine (data-parallel rank), if any
        self.digits = digits  # significant digits the engine prints numbers with (None: full precision)
        self.port = port  # the port its server listens on when its command line does not say
        self.hints = tuple(hints)  # words in an image or command line that name the engine
        self.pause_signs = tuple(pause_signs)  # families that show its operator has paused it
        # A route that answers whether the engine is paused ("" when it has none); asked only when the
        # engine would otherwise be suspect or stalled.
        self.pause_route = pause_route
        # A route that answers how many HTTP requests are in flight ("" when it has none).
        self.load_route = load_route
        # The route that answers 2xx once the engine serves (llama.cpp's says 503 "Loading model" before).
        self.health_route = health_route
        # Which waiting requests the engine owes work.
        self.owing = owing
        # A route with the scheduler's own running and waiting counts, fresher than the page's gauges
        # ("" when it has none); asked only when the engine would otherwise be suspect or stalled.
        self.live_route = live_route
        # (label, value): a gauge series with `label` set to anything but `value` is a breakdown of the
        # total that the series with `value` (or without the label) carries, so it is not added.
        self.totals = totals
        # Counters of the requests the engine completed and preempted ("" when it has none): what tells an
        # engine that works and completes nothing (the detector's thrashing).
        self.finished = finished
        self.preemptions = preemptions
        # The key of the pause route's JSON answer that says the engine is paused (`{"is_paused": true}`).
        self.pause_key = pause_key
        # Where its server serves the Prometheus page (the probe's --url path, as inject writes it).
        self.metrics_path = metrics_path
        # The liveness window when --window is not given (None: the probe's default): longer where the
        # page can show no progress during a long request.
        self.window = window
        # What its page cannot show, said beside a frozen verdict ("" when nothing).
        self.caveat = caveat
        # A route whose 2xx answer is a request gone through the whole engine (a one-token generation),
        # asked only of an engine that would be stalled: the page alone cannot tell a long request from a
        # wedge ("" when it has none).
        self.confirm_route = confirm_route
        # (key, value): the health route's 2xx JSON answer with `key` at `value` says its operator paused
        # the engine (LMDeploy's /health answers 200 `{"status": "sleeping"}` asleep): a readiness look,
        # which asks that route anyway, takes it out of routing (("", ""): its health says no such thing).
        self.health_paused = health_paused

    def with_names(
        self,
        *,
        running: str | None = None,
        waiting: str | None = None,
        prompt: str | None = None,
        generation: str | None = None,
        engine_label: str | None = None,
    ) -> Dialect:
        """A copy with some names changed (the CLI's overrides, for forks and renames).

        None keeps a name; an empty engine_label reads the page as one engine.
        """
        return Dialect(
            self.name,
            running=running or self.running,
            waiting=waiting or self.waiting,
            prompt=prompt or self.prompt,
            generation=generation or self.generation,
            signals=self.signals,
            engine_label=self.engine_label if engine_label is None else (engine_label or None),
            digits=self.digits,
            port=self.port,
            hints=self.hints,
            pause_signs=self.pause_signs,
            pause_route=self.pause_route,
            load_route=self.load_route,
            health_route=self.health_route,
            owing=self.owing,
            totals=self.totals,
            live_route=self.live_route,
            finished=self.finished,
            preemptions=self.preemptions,
            pause_key=self.pause_key,
            metrics_path=self.metrics_path,
            window=self.window,
            caveat=self.caveat,
            confirm_route=self.confirm_route,
            health_paused=self.health_paused,
        )

    def required(self) -> tuple[str, str, str]:
        """The families without which no sample can be read: running, prompt, generation."""
        return (self.running, self.prompt, self.generation)

    def required_kinds(self) -> tuple[tuple[str, bool], ...]:
        """The required families, each with whether it is a counter (which a page may spell without
        `_total`)."""
        return ((self.running, False), (self.prompt, True), (self.generation, True))

    def __repr__(self) -> str:
        return f"Dialect({self.name!r})"


# vLLM V1 (vllm/v1/metrics/loggers.py) and V0 (vllm/engine/metrics.py) publish the same four names.
# - prompt: in V1 it moves only when a request's whole prefill completes, so it is blind during a long
#   (chunked) prefill; generation moves every decode step.
# - signals: the KV-cache usage is published by the scheduler every step, moves with every prefill chunk
#   (the only thing that moved during a 14 s chunked prefill on vLLM 0.32) and every filled block during
#   decode, and freezes with the engine. V1 calls it kv_cache_usage_perc, V0 gpu_cache_usage_perc.
# - engine: V1 labels each data-parallel engine core's series with its index; V0 has no such label.
# - not vllm:iteration_tokens_total_count: it looks like a per-step heartbeat, but vLLM 0.32 makes its
#   IterationStats only for steps that return outputs (v1/engine/async_llm.py), and a step that only
#   runs a prefill chunk returns none (v1/core/sched/scheduler.py): it moves when the counters do.
# - paused (vLLM 0.32): vllm:engine_sleep_state (v1/metrics/loggers.py) has its `awake` series at 0
#   while the engine sleeps (sleep mode frees the GPU for a trainer); the RL and sleep routes count their
#   operations in flight (entrypoints/rl/online/metrics.py, serve/dev/sleep/metrics.py). /pause (with
#   VLLM_SERVER_DEV_MODE=1) shows on no metric: GET /is_paused answers {"is_paused": true}, through the
#   engine core, so it hangs when the core is wedged (the probe gives it a deadline, and no answer is
#   never paused). /load counts in-flight HTTP requests with --enable-server-load-tracking (else 0).
# - owed waiting (0.20 and later; 0.32 and 0.33 alike): vllm:num_requests_waiting_by_reason splits the
#   waiting gauge, per engine, into `capacity` and `deferred` (v1/metrics/loggers.py; the two always sum
#   to it). Deferred are requests the scheduler skips for a reason of its own: a grammar compile, a KV
#   load from a remote peer, the LoRA budget, an idle streaming-input session, a connector that cannot
#   say yet (v1/core/sched/scheduler.py); capacity is every other one. With nothing running, a healthy
#   scheduler admits a capacity request at its next step (nothing else holds the budget or the KV
#   cache), so capacity > 0 with nothing running and nothing moving for the window is a wedge: the one
#   users report most (running 0, waiting 3, /health 200). Not owed:
#   - any capacity request while some are deferred and the KV cache is not seen empty (strict): idle
#     streaming sessions hold run slots and their KV blocks, and remote KV loads reserve blocks, so the
#     ones waiting for capacity may be waiting behind them. A deferred request that holds no block (a
#     grammar compile, a LoRA skip) holds nothing back, and vLLM keeps a request in its deferred set
#     until it is scheduled: measured on vLLM 0.32, a wedge with one grammar request queued shows
#     capacity 3, deferred 1, KV cache 0 (tests/fixtures/real/vllm-0.32.0-cpu-wedged-sticky-deferred.prom),
#     and is owed;
#   - on a KV consumer's page, while KV fetches are in progress (vllm:num_requests_kv_fetch_by_stage,
#     0.32 and later, only on a consumer's page): their reserved blocks are what the queue waits for;
#   - while a KV connector's families are on the page and the KV cache is in use with nothing running:
#     a prefill instance keeps finished requests' blocks until the decode side reads them (NIXL's lease
#     30 s, Mooncake's up to 480 s);
#   - a pause or sleep (every mode leaves the queue as capacity and freezes the page): `paused`.
#   A request refused at admission (vllm:admission_rejections_total, --max-num-queued-*) never enters
#   the queue: it is answered 503 by the API server. Before 0.20 the page has no breakdown, and its
#   waiting gauge counts grammar compiles, remote KV loads and LoRA skips too: none is owed, unless
#   --include-waiting says so.
# - prompt tokens move once per request, when its first token is out (v1/metrics/stats.py, 0.32 and
#   0.33): a long prefill moves no counter, only the KV-cache usage, chunk by chunk.
VLLM = Dialect(
    "vllm",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    prompt="vllm:prompt_tokens_total",
    generation="vllm:generation_tokens_total",
    signals=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    engine_label="engine",
    port=8000,
    hints=("vllm",),
    pause_signs=(
        PauseSign("vllm:engine_sleep_state", "asleep (sleep mode)", when_zero=True, label="sleep_state", value="awake"),
        PauseSign("vllm:sleep_mode_operations_in_flight", "going to sleep or waking up"),
        PauseSign("vllm:rl_weight_update_operations_in_flight", "a weight update in flight"),
    ),
    pause_route="/is_paused",
    load_route="/load",
    # Every finished request, by finished_reason (stop, length, abort, error, repetition: each created at
    # 0); one preemption per PREEMPTED event (v1/metrics/loggers.py). A recompute after preemption adds
    # nothing to prompt_tokens (counted once, at a request's first token: v1/metrics/stats.py).
    finished="vllm:request_success_total",
    preemptions="vllm:num_preemptions_total",
    owing=Owing(
        "vllm:num_requests_waiting_by_reason",
        label="reason",
        owed=("capacity",),
        deferred=("deferred",),
        strict=True,
        excuses=("vllm:num_requests_kv_fetch_by_stage",),
        excuse_label="stage",
        excuse_value="in_progress",
        held_by=(
            "vllm:nixl_",
            "vllm:kv_offload_",
            "vllm:mooncake_store_",
            "vllm:hisparse_",
            "vllm:num_requests_kv_fetch_",
        ),
    ),
)

# SGLang (python/sglang/srt/observability/metrics_collector.py in 0.5.23, with --enable-metrics) is
# always multiprocess: the scheduler pushes its numbers. Its token counters move only when a request finishes (0.5.23:
# observe_one_finished_request), so the heartbeats are the per-pass counters: cuda_graph_passes_total
# (label mode) gains one per forward pass, decode or prefill, each chunk of a chunked prefill included;
# realtime_tokens_total (label mode) adds the tokens of every decode step and prefill batch.
# num_used_tokens and token_usage follow the KV cache like vLLM's usage does. Newer SGLang labels series
# by dp_rank (and tp_rank, pp_rank); a data-parallel rank is an engine. num_paused_reqs counts requests
# held by an RL weight sync (0.5.23 declares it and resets it; nothing else sets it yet).
# Owed waiting: num_queue_reqs is the scheduler's waiting_queue alone (0.5.23 metrics_reporter.py):
# grammar compiles (num_grammar_queue_reqs) and the disaggregation queues (bootstrap, prealloc, transfer:
# work owed by a peer or the network) have gauges of their own, never counted. With priority scheduling
# the running and queue gauges carry the total under priority="" beside one series per priority.
# The scheduler writes those gauges only after a batch (every decode_log_interval steps) or when fully
# idle, so while requests wait on something and nothing runs the page keeps the last batch (running 3,
# frozen counters) - a decode instance waiting on its prefill peer would look wedged. GET /v1/loads has
# the scheduler's own counts, republished every 50 ms while it waits (scheduler.py
# LOAD_STALL_REFRESH_S): asked only when the page looks stuck, its numbers replace the page's.
SGLANG = Dialect(
    "sglang",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    prompt="sglang:prompt_tokens_total",
    generation="sglang:generation_tokens_total",
    signals=(
        "sglang:cuda_graph_passes_total",
        "sglang:realtime_tokens_total",
        "sglang:num_used_tokens",
        "sglang:token_usage",
    ),
    engine_label="dp_rank",
    port=30000,
    hints=("sglang",),
    pause_signs=(PauseSign("sglang:num_paused_reqs", "requests paused for a weight sync"),),
    totals=("priority", ""),
    live_route="/v1/loads",
)

# llama.cpp's server (tools/server, with --metrics) counts tokens_predicted_total only when a request
# finishes: it stayed flat through a 3000-token generation on a real server. n_decode_total counts every
# llama_decode() call, so it is the heartbeat. Its numbers are printed with 6 significant digits, so
# above 1e6 an advance smaller than the last printed digit is invisible between two scrapes; the line
# says so when that may be why nothing moved. One server is one engine: no label. requests_deferred
# counts tasks that found no free slot (tools/server: the only reasons are a busy slot or too few free
# ones), and a released slot takes the next at once: every one is owed.
LLAMACPP = Dialect(
    "llamacpp",
    running="llamacpp:requests_processing",
    waiting="llamacpp:requests_deferred",
    prompt="llamacpp:prompt_tokens_total",
    generation="llamacpp:tokens_predicted_total",
    signals=("llamacpp:n_decode_total",),
    digits=6,
    port=8080,
    hints=("llama.cpp", "llama-cpp", "llamacpp", "llama_cpp", "llama-server"),
)

# LMDeploy's api_server (lmdeploy/metrics/loggers.py; metrics on by default since late 2025, off with
# --disable-metrics): vLLM-like names under lmdeploy:, labelled model_name and engine (the data-parallel
# rank). The token counters move on every streamed output (the api_server always streams from its engine:
# lmdeploy/serve/core/async_engine.py); the prompt counter once per request, at its first token, so a long
# prefill moves nothing but the KV-cache usage. The running, waiting and KV-cache gauges are refreshed by a
# 10-second tick (api_server.py's log_interval): they lag by up to 10 s, far under the window, so a
# stale "running" of a request that just finished reads as frozen for at most one tick. Sleep mode:
# /is_sleeping answers {"is_sleeping": true} (lmdeploy/serve/openai/endpoints/management.py), and /health
# answers 200 `{"status": "sleeping"}` asleep;
# awake, /health answers 503 once the scheduler has not ticked for 90 s with requests dispatched
# (lmdeploy/serve/core/health.py): a frozen scheduler, not one that ticks and produces nothing, and with no
# drain before the restart.
LMDEPLOY = Dialect(
    "lmdeploy",
    running="lmdeploy:num_requests_running",
    waiting="lmdeploy:num_requests_waiting",
    prompt="lmdeploy:prompt_tokens_total",
    generation="lmdeploy:generation_tokens_total",
    signals=("lmdeploy:gpu_cache_usage_perc",),
    engine_label="engine",
    port=23333,
    hints=("lmdeploy",),
    pause_route="/is_sleeping",
    pause_key="is_sleeping",
    health_paused=("status", "sleeping"),
    # Its waiting gauge counts sequences WAITING_FOR_REMOTE_KVS too (a disaggregated decode engine waiting
    # on its prefill peer), and the page cannot tell them apart: none is owed, so a queue in front of an
    # engine running nothing is never a stall of its own (a frozen running batch still is).
    owing=Owing(),
    # No `finished`: request_success_total moves only for requests that end FINISH (aborted, cancelled
    # and failed ones never count), so a prefill-heavy load whose clients give up would read thrashing.
)

# TensorRT-LLM's trtllm-serve (tensorrt_llm/metrics/collector.py, tensorrt_llm/serve/openai_server.py):
# Prometheus text only at /prometheus/metrics, only with return_perf_metrics: true in its config (its
# /metrics is a JSON list of iteration stats that each read empties: never the probe's). Its token and
# success counters move only when a request finishes; the running and waiting gauges (and the one counter
# that moves while decoding, trtllm_kv_cache_gen_alloc_blocks_total: about one block per 32 tokens per
# request, tokens_per_block's default) come only with enable_iter_perf_stats: true, from a collector that
# wakes when a request finishes and sleeps after half a second without statistics: during one long
# generation every series may hold still, the running gauge included (it keeps its last value). So the
# window is long (the longest request must fit in it), and an engine that would be stalled is asked
# /health_generate, a one-token generation through the whole engine: answered, it is alive. Without the
# iteration statistics there is no running gauge, and the page cannot be judged (the health route decides).
TRTLLM = Dialect(
    "trtllm",
    running="trtllm_num_requests_running",
    waiting="trtllm_num_requests_waiting",
    prompt="trtllm_prompt_tokens_total",
    generation="trtllm_generation_tokens_total",
    signals=("trtllm_kv_cache_gen_alloc_blocks_total",),
    port=8000,
    hints=("tensorrt-llm", "tensorrt_llm", "trtllm"),
    finished="trtllm_request_success_total",
    metrics_path="/prometheus/metrics",
    window=1800.0,
    caveat=(
        "trtllm counts tokens only when a request finishes, and its KV blocks (one per ~32 tokens a request) "
        "only while its statistics collector is awake: the window must outlast its longest request"
    ),
    confirm_route="/health_generate",
)

DIALECTS = (VLLM, SGLANG, LLAMACPP, LMDEPLOY, TRTLLM)
# What --engine takes: a dialect's name, or "auto" for the one whose metrics are on the page.
ENGINE_NAMES = ("auto", *(dialect.name for dialect in DIALECTS))
_INF = float("inf")


def _present(page: bytes, name: str, counter: bool) -> bool:
    # Presence only: read_engines parses the lines once the dialect is chosen. A name nowhere in the page
    # (one search, stopped at the first hit) is on no line of it: another engine's name costs one search,
    # not three (its samples, its # TYPE, its # HELP). A counter may be spelled without its `_total`.
    names = (name, other_spelling(name)) if counter else (name,)
    return any(one.encode() in page and (has_samples(page, one) or is_declared(page, one)) for one in names)


def _html(page: bytes) -> bool:
    # A bounded look: stripping a whole page of many megabytes would copy it.
    return page[:4096].lstrip()[:1] == b"<"


def detect(page: bytes, candidates: Sequence[Dialect] = DIALECTS) -> Dialect:
    """The one dialect whose required families are all on the page; MetricsError when none or several fit.

    When none fits but one has some of its families on the page, the error names the ones it lacks.
    """
    # The usual page: one dialect has every family, and each other lacks its first outright (one search
    # each, where telling what it lacks would search for every one of its names).
    fits = [dialect for dialect in candidates if all(_present(page, name, c) for name, c in dialect.required_kinds())]
    if len(fits) == 1:
        return fits[0]
    if fits:
        names = " and ".join(d.name for d in fits)
        raise MetricsError(f"the page fits {names}: pass --engine to choose")
    # None fits: say what the one that comes closest lacks.
    partial: list[tuple[Dialect, list[str]]] = []
    for dialect in candidates:
        required = dialect.required_kinds()
        missing = [name for name, counter in required if not _present(page, name, counter)]
        if len(missing) < len(required):
            partial.append((dialect, missing))
    if len(partial) == 1:
        dialect, missing = partial[0]
        raise MetricsError(f"required metric missing from the {dialect.name} page: {', '.join(missing)}")
    if _html(page):
        raise MetricsError("not a metrics page: the server sent HTML")
    known = ", ".join(d.name for d in candidates)
    raise MetricsError(f"no known engine's metrics on the page (looked for {known}): pass --engine and names")


def dialect_named(name: str | None) -> Dialect | None:
    """The dialect called `name` (None for "auto", "" or a name no dialect has)."""
    return next((dialect for dialect in DIALECTS if dialect.name == name), None)


def health_route(engine: str | None) -> str:
    """The health route of the engine named by --engine (every engine's server has /health; "auto" or an
    unknown name: /health), for what is asked before any page says which engine serves."""
    dialect = dialect_named(engine)
    return "/health" if dialect is None else dialect.health_route


def choose(page: bytes, engine: str = "auto", names: Mapping[str, str] | None = None) -> Dialect:
    """The dialect to read `page` with: the named engine's, or with "auto" the one the page fits; the
    family names in `names` (running, waiting, prompt, generation, engine_label) override its own."""
    candidates = [d.with_names(**names) if names else d for d in DIALECTS if engine in ("auto", d.name)]
    if not candidates:
        raise ValueError(f"unknown engine {engine!r}")
    return detect(page, candidates) if engine == "auto" else candidates[0]


def _finite(name: str, value: float) -> float:
    if not -_INF < value < _INF:  # NaN fails both
        raise MetricsError(f"{name} is {value!r}, not a finite number")
    return value


def _unreadable(page: bytes, dialect: Dialect, series: Mapping[str, list[Series]]) -> str:
    """Why a required family cannot be read from the page ("" when each has a sample): missing, or
    declared with no sample. Neither is ever read as 0: a counter read as a frozen 0 beside the one the
    engine moves would be a stall the engine never had."""
    missing = [name for name in (dialect.running, dialect.generation, dialect.prompt) if not series[name]]
    if not missing:
        return ""
    if _html(page):
        return "not a metrics page: the server sent HTML"
    counters = (dialect.prompt, dialect.generation)
    declared = [
        name
        for name in missing
        if is_declared(page, name) or (name in counters and is_declared(page, other_spelling(name)))
    ]
    if len(missing) == 3 and not declared:
        return f"not a {dialect.name} metrics page: none of {', '.join(missing)} is on it"
    shown = [f"{name} (declared, with no sample)" if name in declared else name for name in missing]
    return f"required metric missing from the {dialect.name} page: {', '.join(shown)}"


class _Reading:
    """One page read with one dialect: the four families' series, and which engines the page shows.

    Engines are told apart by the dialect's label only when every series of the four families carries
    it; a series without it could belong to any engine, so then the page is read as one engine (summed),
    which can hide one wedged engine among others but can never fake a stall.
    """

    def __init__(self, page: bytes, dialect: Dialect) -> None:
        self.page = page
        self.dialect = dialect
        by, whole = dialect.totals
        counters = (dialect.prompt, dialect.generation)
        self.series: dict[str, list[Series]] = {}
        for name in (dialect.running, dialect.generation, dialect.prompt, dialect.waiting):
            found = counter_series(page, name) if name in counters else find_series(page, name)
            self.series[name] = [(labels, value) for labels, value in found if labels.get(by, whole) == whole]
        why = _unreadable(page, dialect, self.series)
        if why:
            raise MetricsError(why)
        label = dialect.engine_label
        every = [labels for found in self.series.values() for labels, _ in found]
        self.label = label if label is not None and all(label in labels for labels in every) else None
        self.engines = sorted({labels[self.label] for labels in every}) if self.label is not None else [""]
        self.known = frozenset(self.engines)
        if self.label is not None:
            for name in dialect.required():
                shown = {labels[self.label] for labels, _ in self.series[name]}
                lacking = [engine for engine in self.engines if engine not in shown]
                if lacking:
                    raise MetricsError(
                        f"required metric {name} has no series for {self.label} {', '.join(lacking)} on the "
                        f"{dialect.name} page, so that engine's progress cannot be read"
                    )
        self.read: dict[str, list[Series]] = {}  # a family asked for twice (by two label values) is read once

    def sums(self, name: str) -> dict[str, float]:
        """Each engine's sum of one of the four families' series (0 for one it has none of: the waiting
        gauge, which is not required)."""
        found = dict.fromkeys(self.engines, 0.0)
        for labels, value in self.series[name]:
            engine = labels[self.label] if self.label is not None else ""
            found[engine] = _finite(name, found[engine] + _finite(name, value))
        return found

    def totals(self, family: str, key: str = "", values: Sequence[str] = ()) -> dict[str, float]:
        """Each engine's sum of `family`'s series (only those whose label `key` is one of `values`, if a
        key is given; a counter, named with `_total`, also as spelled without it). A series without the
        engine label is evidence for every engine; an engine with no series of the family is left out."""
        if family not in self.read:
            counter = family.endswith("_total")
            self.read[family] = counter_series(self.page, family) if counter else find_series(self.page, family)
        found: dict[str, float] = {}
        label = self.label
        for labels, value in self.read[family]:
            if key and labels.get(key) not in values:
                continue
            for engine in [labels[label]] if label is not None and label in labels else self.engines:
                if engine in self.known:
                    # Two huge finite values can sum past the largest float: check the sum, not the parts.
                    found[engine] = _finite(family, found.get(engine, 0.0) + _finite(family, value))
        return found

    def owed(self, waiting: Mapping[str, float], signals: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
        """Of each engine's waiting requests, those it owes work (Owing says which)."""
        page, dialect = self.page, self.dialect
        owing = dialect.owing
        owed = {engine: waiting[engine] if owing.without else 0.0 for engine in self.engines}
        if owing.family and (has_samples(page, owing.family) or is_declared(page, owing.family)):
            capacity = self.totals(owing.family, owing.label, owing.owed)
            deferred = self.totals(owing.family, owing.label, owing.deferred)
            for engine in self.engines:
                # Nothing deferred, or a KV cache seen empty: nothing the deferred hold can be what waits.
                empty = bool(dialect.signals) and signals[engine].get(dialect.signals[0]) == 0  # None: not seen
                free = deferred.get(engine, 0.0) == 0 or empty
                owed[engine] = capacity.get(engine, 0.0) if free or not owing.strict else 0.0
        for family in owing.excuses:
            for engine, total in self.totals(family, owing.excuse_label, (owing.excuse_value,)).items():
                if total > 0:
                    owed[engine] = 0.0
        # Looked for only where a queue is owed: most pages owe nothing, and each look scans the whole page.
        if any(owed.values()) and dialect.signals and any(prefix.encode() in page for prefix in owing.held_by):
            for engine in self.engines:
                if signals[engine].get(dialect.signals[0], 0.0) > 0:  # the KV cache holds blocks for a peer
                    owed[engine] = 0.0
        return owed


def read_engines(page: bytes, t: float, dialect: Dialect = VLLM, extra: Sequence[str] = ()) -> dict[str, Sample]:
    """One sample per engine that the page shows at time `t`, by engine name ("" for a single engine).

    MetricsError when a required family (running, prompt, generation) cannot be read: missing, declared
    with no sample, or without a series for one of the engines the page shows. A value that cannot be
    read is never taken as 0 (the probe then cannot judge the page, and asks the health route).
    """
    reading = _Reading(page, dialect)
    engines = reading.engines
    running, generation = reading.sums(dialect.running), reading.sums(dialect.generation)
    prompt, waiting = reading.sums(dialect.prompt), reading.sums(dialect.waiting)
    signals: dict[str, dict[str, float]] = {engine: {} for engine in engines}
    for name in dict.fromkeys((*dialect.signals, *extra)):  # a signal named twice counts once
        for engine, value in reading.totals(name).items():
            signals[engine][name] = value
    paused: dict[str, list[str]] = {engine: [] for engine in engines}
    for sign in dialect.pause_signs:
        for engine, total in reading.totals(sign.family, sign.label, (sign.value,)).items():
            if (total == 0) if sign.when_zero else (total > 0):
                paused[engine].append(sign.why)
    owed = reading.owed(waiting, signals)
    finished = reading.totals(dialect.finished) if dialect.finished else {}
    preempted = reading.totals(dialect.preemptions) if dialect.preemptions else {}
    return {
        engine: Sample(
            running[engine],
            generation[engine],
            prompt[engine],
            t,
            waiting[engine],
            signals=signals[engine],
            owed=owed[engine],
            paused="; ".join(paused[engine]),
            finished=finished.get(engine),
            preemptions=preempted.get(engine),
        )
        for engine in engines
    }


# The labels under which an engine's series name what it serves, and which release it is.
_ABOUT_LABELS = (("model_name", "model"), ("version", "version"))


def about(page: bytes, dialect: Dialect) -> str:
    """What the page says of the engine, for a person reading why it was restarted: its dialect, and the
    models and version its running gauge's series name ("vllm, model meta-llama/Llama-3.1-8B")."""
    parts = [dialect.name]
    series = find_series(page, dialect.running)
    for label, word in _ABOUT_LABELS:
        values = sorted({labels[label] for labels, _ in series if label in labels})
        if values:
            parts.append(f"{word} {', '.join(value[:120] for value in values[:4])}")
    return ", ".join(parts)


def precision_note(dialect: Dialect, sample: Sample) -> str:
    """Why a frozen reading may be the printer's rounding or what the page cannot show, not the engine:
    the dialect's caveat, or "" when there is none and rounding cannot hide an advance.

    The heartbeat is the sample's signals when it has any (they move every step), else its counters.
    Only when every heartbeat value is too large to print exactly can rounding hide an advance.
    """
    if dialect.caveat:
        return dialect.caveat
    if dialect.digits is None:
        return ""
    import math  # only on this rare path

    heartbeat = list(sample.signals.values()) or [sample.generation, sample.prompt]
    limit = 10.0**dialect.digits
    if not all(abs(value) >= limit for value in heartbeat):
        return ""
    step = min(10.0 ** (math.floor(math.log10(abs(value))) - dialect.digits + 1) for value in heartbeat)
    return f"{dialect.name} prints {dialect.digits} significant digits, so an advance under {step:g} is invisible"
