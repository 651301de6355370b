"""The doctor's first contact: what answers at the URL, whether it wants an API key, and the first look.

The page is asked for once (scrape.exchange, which tells its status: a 401, a 404 and llama.cpp's 501
each have their own advice), and that page is the first look's: observe.observe reads it with the dialect
it chooses, so the doctor never picks the engine itself. What a page that is no engine's says is read off
the same page. With a key given, the page is asked for once more without it, to tell whether it is needed.
"""

from __future__ import annotations

from ..engines import DIALECTS, TRTLLM, choose
from ..errors import ExitCode, MetricsError, ScrapeError, ScrapeTimeout
from ..exposition import has_samples, is_declared
from ..judge import Memory
from ..observe import observe
from ..scrape import exchange, status_error
from ..serving import SERVING, TrtllmServing
from ..urls import parse_url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..engines import Dialect
    from ..judge import Observation
    from ..scrape import Answer
    from ..settings import LookSettings

__all__ = ["First", "family_state", "first_contact", "not_an_engine", "trtllm_options"]

# The families vLLM's API server publishes through its FastAPI instrumentation, with or without its own.
_FASTAPI_FAMILIES = ("http_requests_total", "http_request_duration_highr_seconds")

# TensorRT-LLM's two options of its config YAML (trtllm-serve --config, or --extra_llm_api_options) that
# its Prometheus page needs, both False by default (tensorrt_llm/llmapi/llm_args.py): the page itself is
# mounted only with return_perf_metrics (tensorrt_llm/serve/openai_server.py, register_routes), and its
# per-iteration families (the running gauge among them) are fed only with enable_iter_perf_stats on the
# PyTorch backend (the loop _iteration_stats_collector_loop is started only then).
# Named once, in what inject knows of its server (serving.TrtllmServing.config_needs).
TRT_PAGE_OPTION, TRT_ITERATION_OPTION = (f"{option}: true" for option, _ in TrtllmServing.config_needs)
# Its /metrics is no Prometheus page: get_iteration_stats answers the iteration statistics buffered since
# the last read as a JSON list, and empties the buffer.
TRT_JSON_METRICS = (
    "TensorRT-LLM's /metrics is not a Prometheus page but a JSON list of iteration statistics that every read "
    "empties (each reader takes them from every other): point nothing at it, neither the probe nor Prometheus"
)


def trtllm_options(dialect: Dialect) -> str:
    """What each of TensorRT-LLM's config options buys the probe."""
    return (
        f"trtllm-serve serves {dialect.metrics_path} only with {TRT_PAGE_OPTION} in its config (--config or "
        f"--extra_llm_api_options, a YAML file): its request-level families, {dialect.prompt}, {dialect.generation} "
        f"and {dialect.finished}, which move only when a request finishes. {TRT_ITERATION_OPTION} adds the "
        f"per-iteration ones: {dialect.running} and {dialect.waiting}, without which the probe cannot judge the page "
        f"(its health route alone decides), and {dialect.signals[0]}, the one counter that moves while it decodes "
        "(about one block per 32 tokens a request)"
    )


KEY_ADVICE = (
    "give it with --api-key-file PATH, or put the engine's own key in VLLM_API_KEY or LLAMA_API_KEY (the "
    "probe reads them in the engine's container too)"
)


class First:
    """What the first contact found: the page (None when there is none to read), the first look (None
    when there was none), the lines that say why the looks cannot go on and the exit code (OK when they
    can), and what the printed probes need: `key_needed` (the page answers only with the key) and
    `engine_needed` (--engine auto would not choose the dialect the looks read). `started`: the clock when
    the page was asked for, from which the looks are paced."""

    def __init__(self, started: float, key_from: str) -> None:
        self.started = started
        self.key_from = key_from  # where the key came from: "--api-key-file", an engine's variable, ""
        self.page: bytes | None = None
        self.seen: Observation | None = None
        self.lines: list[tuple[str, str]] = []
        self.code: int = ExitCode.OK
        self.key_needed = False
        self.engine_needed = False
        self.silent = False  # the page gave no answer within --timeout
        self.answered = False  # the server gave an HTTP answer (else: refused, reset, not HTTP)

    def fail(self, code: int, *lines: tuple[str, str]) -> First:
        self.code = code
        self.lines += lines
        return self


def _ports() -> str:
    return ", ".join(f"{dialect.name} {dialect.port}" for dialect in DIALECTS)


def first_contact(url: str, settings: LookSettings, key_from: str, clock: Callable[[], float]) -> First:
    """Ask for the page once and take it as the first look; `key_from` says where the key came from."""
    first = First(clock(), key_from)
    try:
        answer = exchange(url, settings.timeout, key=settings.key)
    except ScrapeError as exc:
        return _unanswered(first, url, exc)
    first.answered = True
    if not 200 <= answer.code < 300:
        return _refused(first, url, answer, settings.key, key_from)
    first.page = answer.body
    try:
        first.seen = observe(url, settings, Memory(), clock, readiness=True, page=answer.body)
    except MetricsError as exc:
        return first.fail(ExitCode.METRICS, ("engine", not_an_engine(answer.body, settings.engine, str(exc))))
    except ScrapeError as exc:  # a canary refused (an idle engine is asked nothing at a first look, but)
        return first.fail(exc.exit_code, ("engine", f"none: {exc}"))
    dialect = first.seen.dialect
    if settings.engine != "auto" and dialect is not None:
        try:
            first.engine_needed = choose(answer.body, "auto", settings.names).name != dialect.name
        except MetricsError:
            first.engine_needed = True
    if settings.key:
        try:
            bare = exchange(url, settings.timeout)
        except ScrapeError:
            bare = None
        first.key_needed = bare is not None and bare.code in (401, 403)
    return first


def _unanswered(first: First, url: str, exc: ScrapeError) -> First:
    """The first look when the page gave no answer: none in time, a refused connection, or another error."""
    if isinstance(exc, ScrapeTimeout):
        first.silent = True
        return first.fail(
            ExitCode.SCRAPE,
            (
                "engine",
                f"unknown: {exc}. A busy engine's page can be that slow: the probe calls it suspect, then "
                "stalled once nothing has answered for the window. If the engine is well, give a longer --timeout.",
            ),
        )
    # scrape.exchange raises from a refused connection, which stays the error's context.
    if isinstance(exc.__context__, ConnectionRefusedError):
        host, port, _ = parse_url(url)
        return first.fail(
            ExitCode.SCRAPE,
            (
                "engine",
                f"none: nothing listens on {host}:{port} (connection refused). Is the engine up, and is "
                f"that its port? (by default: {_ports()})",
            ),
        )
    return first.fail(ExitCode.SCRAPE, ("engine", f"none: {exc}"))


def _refused(first: First, url: str, answer: Answer, key: str, key_from: str) -> First:
    """The first look when the page answered a status other than 2xx: what that status says of the key,
    the port and path, or the engine's metrics switch."""
    status = f"{url} answered HTTP {answer.code} {answer.reason}".rstrip()
    if answer.code in (401, 403):
        if key:
            why = f"refused: the engine does not take the key from {key_from}"
            return first.fail(ExitCode.SCRAPE, ("engine", f"unknown: {status}"), ("api key", why))
        return first.fail(
            ExitCode.SCRAPE,
            ("engine", f"unknown: {status}"),
            ("api key", f"needed: the page wants one; {KEY_ADVICE}"),
        )
    if answer.code == 404:
        return first.fail(
            ExitCode.SCRAPE,
            (
                "engine",
                f"none: no metrics page there ({status}). Is that the engine's port and path? (by default: "
                f"{_ports()}; path /metrics). SGLang serves /metrics only when started with "
                f"{SERVING['sglang'].metrics_on[0]}. LMDeploy serves it unless started with --disable-metrics "
                f"(before late 2025: only with --enable-metrics). TensorRT-LLM serves its page at "
                f"{TRTLLM.metrics_path}, and only with {TRT_PAGE_OPTION} in its config.",
            ),
        )
    if answer.code == 501:  # llama.cpp's server without its metrics switch
        llamacpp = SERVING["llamacpp"]
        return first.fail(
            ExitCode.SCRAPE,
            (
                "engine",
                f"llamacpp, with its metrics off ({status}): the probe could read nothing. Start llama-server "
                f"with {llamacpp.metrics_on[0]} (or {llamacpp.metrics_env[0]}=1).",
            ),
        )
    return first.fail(ExitCode.SCRAPE, ("engine", f"none: {status_error(url, answer)}"))


def family_state(page: bytes | None, family: str) -> str:
    """Whether `family` is on the page: "samples", "declared" (HELP/TYPE, no samples yet) or "" (not)."""
    if page is None:
        return ""
    if has_samples(page, family):
        return "samples"
    try:
        return "declared" if is_declared(page, family) else ""
    except MetricsError:  # declared as a histogram or summary: declared all the same
        return "declared"


def not_an_engine(page: bytes | None, engine: str, why: str) -> str:
    """Why a page that answered 2xx is none the probe can read (with --engine `engine`), and what to do."""
    if why.startswith("not a metrics page"):  # engines.py's word for HTML
        return (
            "none: not a metrics page, the server sent HTML. Is the URL the engine's own /metrics? (a web UI, a "
            "proxy or a login page answers here)"
        )
    if page is not None and page[:4096].lstrip()[:1] == b"[":
        where = TRTLLM.metrics_path
        return f"none: a JSON list, not a metrics page. {TRT_JSON_METRICS}; its Prometheus page is {where}."
    if page is not None and b"trtllm_" in page and why.startswith("no known engine"):
        return (
            f"trtllm, it seems (its trtllm_ families), with none of the families the probe reads: "
            f"{trtllm_options(TRTLLM)}. Its token counters appear at the first request that finishes."
        )
    fastapi = any(family_state(page, name) for name in _FASTAPI_FAMILIES)
    if fastapi and page is not None and b"vllm:" not in page and engine in ("auto", "vllm"):
        flag = SERVING["vllm"].metrics_off[0]
        return (
            f"vLLM's API server, it seems (its http_* families), with no vllm: family on the page: vLLM started "
            f"with {flag} publishes none, so the probe could only fail. Start vLLM without {flag}."
        )
    if why.startswith("no known engine"):
        return (
            f"none: {why}. The probe reads {', '.join(dialect.name for dialect in DIALECTS)}; for another engine, "
            "name its families with --engine and --running-metric, --prompt-metric and --generation-metric."
        )
    try:
        dialect = choose(page or b"", engine)
    except (MetricsError, ValueError):
        # The page has some of one engine's families (the error names it): that engine, unreadable.
        named = [known for known in DIALECTS if f"the {known.name} page" in why]
        if not named:
            return f"none: {why}"
        dialect = named[0]
    # The engine is known, but a value the probe needs cannot be read (never taken as 0): the probe's runs
    # say the same, and fall back to the health route.
    said = f"{dialect.name}, but the probe cannot read its page: {why}"
    if dialect.name == TRTLLM.name and dialect.running in why:
        return f"{said}. {trtllm_options(dialect)}."
    if dialect.name == TRTLLM.name:
        return f"{said}. Its token counters appear when a request first finishes; its health route decides till then."
    return said
