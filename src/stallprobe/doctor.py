"""`stallprobe doctor`: look at an engine for a few seconds, as the probe would, and say in plain lines what
was found and what to do, for someone about to adopt the probe.

It reads the page once at the door (what answers at the URL, whether it wants an API key, which engine
wrote it), then looks once a second through the one pipeline every command uses (observe.observe), judges
each look with the detector in memory (no state file), and asks the engine's other routes what the probe
may ask them (whether it is paused, its load at each look, its scheduler's counts, its health). Then one
topic a line: the engine, its progress signals and which moved, which waiting requests count, the key,
the routes, the verdicts the probe would have given and its readiness, and the probe's exact command for
this engine. Nothing here decides a verdict: the detector does, and report.py words it.
"""

from __future__ import annotations

import time

from . import __version__
from .api import MAX_JSON
from .console import emit, tell
from .detector import Verdict, assess_engines, readiness
from .engines import DIALECTS, choose, precision_note
from .errors import ExitCode, MetricsError, OutputError, ScrapeError, ScrapeTimeout
from .exposition import has_samples, is_declared
from .observe import kubelet_timeout, observe, origin
from .options import (
    DEFAULT_CANARY_INTERVAL,
    DEFAULT_DRAIN_AFTER,
    DEFAULT_FAILURE_THRESHOLD,
    DEFAULT_PERIOD,
    DOCTOR,
    ENGINE_OPTIONS,
    LookSettings,
    api_key,
    given_flags,
    help_page,
    key_source,
    parse,
)
from .report import describe, num, secs
from .scrape import exchange, parse_url, status_error
from .serving import SERVING

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .detector import EnginesAssessment, Sample, State
    from .engines import Dialect
    from .observe import Observation

__all__ = ["DoctorConfig", "configure", "help_text", "main", "run"]

USAGE = "usage: stallprobe doctor [--url URL] [--seconds S] [--timeout S] [--api-key-file PATH] [options]"

DESCRIPTION = """\
Before adopting the probe: read the engine for a while (one look a second) and say, one topic a line,
what was found and what to do: the engine and how many share its page, its progress signals and which
moved, which waiting requests count as owed work, whether an API key is needed, which of its routes
answer (pause, load, health), the verdicts the probe would have given and its readiness, and the exact
liveness command for this engine. It keeps no state file: the looks are judged in memory."""

# The pod's command: `python3 -m stallprobe` without runpy (cli.run; the README's "In the pod").
POD_PROGRAM = "from stallprobe.cli import run; run()"
# Each topic's label, then its text wrapped to the width (but a command, which is never broken).
LABEL_WIDTH = 12
WIDTH = 104
# The families vLLM's API server publishes through its FastAPI instrumentation, with or without its own.
_FASTAPI_FAMILIES = ("http_requests_total", "http_request_duration_highr_seconds")


def help_text() -> str:
    title = "each flag also reads the probe's environment variable; the flag wins"
    return help_page("doctor", f"{USAGE}\n\n{DESCRIPTION}", DOCTOR, environment=True, title=title)


class DoctorConfig(LookSettings):
    """What the doctor needs: the option table's DOCTOR selection, then the API key and where it came from.
    It sends no canary and asks no load on its looks (it asks /load itself, to say whether --server-load
    would help), and judges readiness with the probe's default drain window."""

    OPTIONS = DOCTOR

    url: str
    seconds: float
    canary = False
    canary_interval = DEFAULT_CANARY_INTERVAL
    server_load = False
    drain_after = DEFAULT_DRAIN_AFTER
    # Where the key came from: "--api-key-file", VLLM_API_KEY or LLAMA_API_KEY; "" for no key.
    key_from = ""


def configure(argv: Sequence[str], environ: Mapping[str, str]) -> DoctorConfig | str:
    """Every flag and environment variable, validated: a DoctorConfig, or "help"/"version"."""
    config = parse(argv, DoctorConfig, environ=environ)
    if isinstance(config, str):
        return config
    config.key = api_key(config.api_key_file, environ)
    config.key_from = key_source(config.api_key_file, environ)
    return config


class _Out:
    """The report's lines, written as they come. OutputError when stdout takes one no more (`| head -1`):
    the report cannot be whole, and nothing more is asked of the engine."""

    def say(self, label: str, text: str) -> None:
        """One topic: its label, then its text wrapped to the width, each line after the first indented."""
        import textwrap  # off the probe's path: textwrap loads re

        width = WIDTH - LABEL_WIDTH
        lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
        head = f"{label}:" if label else ""
        self.line(f"{head:<{LABEL_WIDTH}}{lines[0]}")
        for line in lines[1:]:
            self.line(f"{'':<{LABEL_WIDTH}}{line}")

    def line(self, text: str) -> None:
        if not emit(text.rstrip()):
            raise OutputError("stdout was closed before the report was whole")


class _Asked:
    """An answer from one of the engine's routes: its status (None: no answer), its JSON (None when it is
    not JSON or not 2xx), and what a person reads of a failure ("" for a 2xx)."""

    __slots__ = ("code", "data", "why")

    def __init__(self, code: int | None, data: object, why: str) -> None:
        self.code = code
        self.data = data
        self.why = why


def _ask(url: str, config: DoctorConfig, timeout: float) -> _Asked:
    """Ask one of the engine's routes; `why` says what it did, after the route's name ("answers HTTP 404
    Not Found", "gives no answer within 1 s")."""
    try:
        answer = exchange(url, timeout, key=config.key, max_bytes=MAX_JSON, what="ask")
    except ScrapeTimeout:
        return _Asked(None, None, f"gives no answer within {num(timeout)} s")
    except ScrapeError as exc:
        return _Asked(None, None, f"fails: {str(exc).removeprefix(f'ask {url}: ')}")
    if not 200 <= answer.code < 300:
        key = ": it wants the API key" if answer.code in (401, 403) else ""
        return _Asked(answer.code, None, f"answers HTTP {answer.code} {answer.reason}".rstrip() + key)
    import json

    try:
        data = json.loads(answer.body.decode("utf-8"))
    except ValueError:
        data = None
    return _Asked(answer.code, data, f"answers {answer.code}")


# --- the door: what answers at the URL, before any look


class _Door:
    """What the URL answered: the page (None when there is none to read), the dialect to read it with,
    the lines that say why not, and the exit code (OK when the looks can go on). `key_needed`: the page
    answers only with the key; `engine_needed`: --engine auto would not choose the dialect given."""

    def __init__(self, page: bytes | None = None, dialect: Dialect | None = None) -> None:
        self.page = page
        self.dialect = dialect
        self.lines: list[tuple[str, str]] = []
        self.code: int = ExitCode.OK
        self.key_needed = False
        self.engine_needed = False

    def fail(self, code: int, *lines: tuple[str, str]) -> _Door:
        self.code = code
        self.lines += lines
        return self


def _ports() -> str:
    return ", ".join(f"{dialect.name} {dialect.port}" for dialect in DIALECTS)


_KEY_ADVICE = (
    "give it with --api-key-file PATH, or put the engine's own key in VLLM_API_KEY or LLAMA_API_KEY (the "
    "probe reads them in the engine's container too)"
)


def _door(config: DoctorConfig) -> _Door:
    url = config.url
    door = _Door()
    try:
        answer = exchange(url, config.timeout, key=config.key)
    except ScrapeTimeout as exc:
        return door.fail(
            ExitCode.SCRAPE,
            (
                "engine",
                f"unknown: {exc}. A busy engine's page can be that slow: the probe calls it suspect, then "
                "stalled once nothing has answered for the window. If the engine is well, give a longer --timeout.",
            ),
        )
    except ScrapeError as exc:
        # scrape.exchange raises from a refused connection, which stays the error's context.
        if isinstance(exc.__context__, ConnectionRefusedError):
            host, port, _ = parse_url(url)
            return door.fail(
                ExitCode.SCRAPE,
                (
                    "engine",
                    f"none: nothing listens on {host}:{port} (connection refused). Is the engine up, and is "
                    f"that its port? (by default: {_ports()})",
                ),
            )
        return door.fail(ExitCode.SCRAPE, ("engine", f"none: {exc}"))
    status = f"{url} answered HTTP {answer.code} {answer.reason}".rstrip()
    if answer.code in (401, 403):
        if config.key:
            why = f"refused: the engine does not take the key from {config.key_from}"
            return door.fail(ExitCode.SCRAPE, ("engine", f"unknown: {status}"), ("api key", why))
        return door.fail(
            ExitCode.SCRAPE,
            ("engine", f"unknown: {status}"),
            ("api key", f"needed: the page wants one; {_KEY_ADVICE}"),
        )
    if answer.code == 404:
        return door.fail(
            ExitCode.SCRAPE,
            (
                "engine",
                f"none: no metrics page there ({status}). Is that the engine's port and path? (by default: "
                f"{_ports()}; path /metrics). SGLang serves /metrics only when started with "
                f"{SERVING['sglang'].metrics_on[0]}.",
            ),
        )
    if answer.code == 501:  # llama.cpp's server without its metrics switch
        llamacpp = SERVING["llamacpp"]
        return door.fail(
            ExitCode.SCRAPE,
            (
                "engine",
                f"llamacpp, with its metrics off ({status}): the probe could read nothing. Start llama-server "
                f"with {llamacpp.metrics_on[0]} (or {llamacpp.metrics_env[0]}=1).",
            ),
        )
    if not 200 <= answer.code < 300:
        return door.fail(ExitCode.SCRAPE, ("engine", f"none: {status_error(url, answer)}"))
    page = answer.body
    door.page = page
    try:
        door.dialect = choose(page, config.engine, config.names)
    except MetricsError as exc:
        return door.fail(ExitCode.METRICS, ("engine", _not_an_engine(page, config, str(exc))))
    if config.engine != "auto":
        try:
            door.engine_needed = choose(page, "auto", config.names).name != config.engine
        except MetricsError:
            door.engine_needed = True
    if config.key:
        try:
            bare = exchange(url, config.timeout)
        except ScrapeError:
            bare = None
        door.key_needed = bare is not None and bare.code in (401, 403)
    return door


def _not_an_engine(page: bytes | None, config: DoctorConfig, why: str) -> str:
    """Why a page that answered 2xx is none the probe can read, and what to do."""
    if why.startswith("not a metrics page"):  # engines.py's word for HTML
        return (
            "none: not a metrics page, the server sent HTML. Is the URL the engine's own /metrics? (a web UI, a "
            "proxy or a login page answers here)"
        )
    fastapi = any(_present(page, name) for name in _FASTAPI_FAMILIES)
    if fastapi and page is not None and b"vllm:" not in page and config.engine in ("auto", "vllm"):
        flag = SERVING["vllm"].metrics_off[0]
        return (
            f"vLLM's API server, it seems (its http_* families), with no vllm: family on the page: vLLM started "
            f"with {flag} publishes none, so the probe could only fail. Start vLLM without {flag}."
        )
    if why.startswith("no known engine"):
        return (
            f"none: {why}. The probe reads vLLM, SGLang and llama.cpp's server; for another engine, name its "
            "families with --engine and --running-metric, --prompt-metric and --generation-metric."
        )
    return f"none: {why}"


# --- the looks


class _Looks:
    """What the looks found: each look's observation and assessment (and the history it was judged
    against), which families moved and by how much, and what /load said."""

    def __init__(self) -> None:
        self.seen: list[Observation] = []
        self.results: list[EnginesAssessment] = []
        self.before: list[dict[str, State] | None] = []
        self.rises: dict[str, float] = {}  # counter -> how much it rose over the look
        self.moved: set[str] = set()  # the families that changed between two looks
        self.busy = False  # requests ran (or were owed work) at some look
        self.loads: list[float] = []  # /load's answers
        self.load_asked: _Asked | None = None  # its last answer
        self.busy_load_zero = False  # /load said 0 at a look where requests ran
        self.error: ScrapeError | MetricsError | None = None
        self.interrupted = False

    def add(self, seen: Observation, result: EnginesAssessment, before: dict[str, State] | None) -> None:
        self.seen.append(seen)
        self.results.append(result)
        self.before.append(before)
        dialect = seen.dialect
        if dialect is None:
            return
        for name, sample in seen.samples.items():
            if sample.running or sample.owed or sample.pending:
                self.busy = True
            last = before.get(name) if before else None
            if last is None or not last.last.answered:
                continue
            prev = last.last
            for family, now, then in (
                (dialect.prompt, sample.prompt, prev.prompt),
                (dialect.generation, sample.generation, prev.generation),
            ):
                if now > then:
                    self.moved.add(family)
                    self.rises[family] = self.rises.get(family, 0.0) + now - then
            for family, value in sample.signals.items():
                if family in prev.signals and value != prev.signals[family]:
                    self.moved.add(family)

    @property
    def answered(self) -> list[Observation]:
        return [seen for seen in self.seen if seen.dialect is not None]


def _intervals(seconds: float) -> int:
    """How many intervals of about a second --seconds makes (at least one: a look, then one more)."""
    import math

    return max(1, math.ceil(seconds))


def _look(config: DoctorConfig) -> _Looks:
    """Look once a second for --seconds (a look at the start and one at the end), each through observe()
    and judged in memory; stop early at a failure, or at Ctrl-C."""
    intervals = _intervals(config.seconds)
    step = config.seconds / intervals
    looks = _Looks()
    previous: dict[str, State] | None = None
    facts: dict[str, float] = {}
    base = origin(config.url)
    start = time.monotonic()
    try:
        for i in range(intervals + 1):
            wait = start + i * step - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                seen = observe(config.url, config, previous, facts, time.monotonic, readiness=True)
            except (ScrapeError, MetricsError) as exc:
                looks.error = exc
                break
            result = assess_engines(
                previous, seen.samples, config.window, config.saturation, include_waiting=config.include_waiting
            )
            looks.add(seen, result, previous)
            previous = result.states
            if seen.dialect is not None and seen.dialect.load_route:
                asked = _ask(base + seen.dialect.load_route, config, config.timeout)
                looks.load_asked = asked
                value = asked.data.get("server_load") if isinstance(asked.data, dict) else None
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    looks.loads.append(float(value))
                    if not value and any(s.running for s in seen.samples.values()):
                        looks.busy_load_zero = True
    except KeyboardInterrupt:
        looks.interrupted = True
    return looks


# --- the report


def _runs(verdicts: Sequence[str]) -> str:
    """Each run of one verdict, and its length when more than one: "baseline, then progressing x9"."""
    runs: list[tuple[str, int]] = []
    for verdict in verdicts:
        if runs and runs[-1][0] == verdict:
            runs[-1] = (verdict, runs[-1][1] + 1)
        else:
            runs.append((verdict, 1))
    return ", then ".join(verdict + (f" x{n}" if n > 1 else "") for verdict, n in runs)


def _present(page: bytes | None, family: str) -> str:
    """Whether `family` is on the page: "samples", "declared" (HELP/TYPE, no samples yet) or "" (not)."""
    if page is None:
        return ""
    if has_samples(page, family):
        return "samples"
    return "declared" if is_declared(page, family) else ""


def _engine_lines(config: DoctorConfig, dialect: Dialect, samples: Mapping[str, Sample]) -> list[tuple[str, str]]:
    how = f" (--engine {config.engine})" if config.engine != "auto" else ""
    if len(samples) > 1:
        return [
            (
                "engine",
                f"{dialect.name}{how}, {len(samples)} engines on one page (data parallelism: its "
                f"{dialect.engine_label} label says {', '.join(sorted(samples))}). Each is judged on its own, "
                "and the page is as bad as its worst.",
            )
        ]
    return [("engine", f"{dialect.name}{how}, one engine on the page")]


def _progress_lines(config: DoctorConfig, dialect: Dialect, page: bytes | None, looks: _Looks) -> list[tuple[str, str]]:
    seen_signals: set[str] = set()
    for seen in looks.answered:
        for sample in seen.samples.values():
            seen_signals.update(sample.signals)
    heartbeats = []
    for family in dict.fromkeys((*dialect.signals, *config.progress_metric)):
        if family in seen_signals or _present(page, family) == "samples":
            heartbeats.append(family)
        elif _present(page, family) == "declared":
            heartbeats.append(f"{family} (declared, no samples yet)")
    text = f"the token counters {dialect.prompt} and {dialect.generation}"
    if heartbeats:
        text += f"; heartbeats {', '.join(heartbeats)}. Any change of one is progress."
    else:
        looked = f" (looked for {', '.join(dialect.signals)})" if dialect.signals else ""
        text += (
            f"; no heartbeat on the page{looked}: only the token counters show progress, so keep --window "
            "above the longest prefill."
        )
    lines = [("progress", text)]
    if len(looks.answered) < 2:
        return lines
    families = [dialect.prompt, dialect.generation, *sorted(seen_signals - {dialect.prompt, dialect.generation})]
    moved = [
        f"{family} (+{num(looks.rises[family])})" if family in looks.rises else family
        for family in families
        if family in looks.moved
    ]
    still = [family for family in families if family not in looks.moved]
    if moved:
        text = ", ".join(moved) + (f"; not {', '.join(still)}" if still else "")
    elif looks.busy:
        text = "nothing, while the engine owed work (requests running, or waiting for capacity)"
    else:
        text = "nothing: nothing ran, so nothing had to move. Look again while it serves requests."
    lines.append(("moved", text))
    return lines


def _waiting_lines(config: DoctorConfig, dialect: Dialect, page: bytes | None) -> list[tuple[str, str]]:
    owing = dialect.owing
    if config.include_waiting is True:
        text = "--include-waiting=always: every waiting request counts as work the engine owes"
    elif config.include_waiting is False:
        text = "--include-waiting=never: waiting requests never count, only running ones do"
    elif owing.family and _present(page, owing.family):
        text = (
            f"the page tells requests waiting for capacity from those the engine defers ({owing.family}): "
            "requests waiting for capacity while nothing runs are owed work, and judged"
        )
    elif owing.family:
        text = (
            f"the page has no {owing.family} (an older {dialect.name}), so waiting requests cannot be told "
            "apart: a queue with nothing running is not judged unless --include-waiting=always"
        )
    else:
        text = f"every waiting request ({dialect.waiting}) is owed work, and judged"
    return [("waiting", text)]


def _key_lines(config: DoctorConfig, door: _Door) -> list[tuple[str, str]]:
    if not config.key:
        return [("api key", "none needed for the page")]
    source = f"--api-key-file {config.api_key_file}" if config.api_key_file else config.key_from
    if door.key_needed:
        return [("api key", f"needed for the page, and the one given ({source}) works")]
    return [("api key", f"not needed for the page (the one given, {source}, is sent anyway)")]


def _pause_lines(config: DoctorConfig, dialect: Dialect, page: bytes | None) -> list[tuple[str, str]]:
    texts = []
    if dialect.pause_route:
        from .api import PAUSE_QUERY_TIMEOUT

        route = dialect.pause_route
        asked = _ask(origin(config.url) + route, config, PAUSE_QUERY_TIMEOUT)
        if isinstance(asked.data, dict) and "is_paused" in asked.data:
            now = ", and says it is paused now" if asked.data.get("is_paused") is True else ""
            texts.append(
                f"{route} answers (VLLM_SERVER_DEV_MODE=1){now}: the probe asks it before it calls a frozen "
                "engine stuck, so an engine paused on purpose is never restarted."
            )
        elif asked.code == 404:
            texts.append(
                f"{route} answers 404, as vLLM does without VLLM_SERVER_DEV_MODE=1: fine, no one can pause the "
                "engine over HTTP then."
            )
        else:
            how = "answers, not as vLLM does" if asked.code == 200 else asked.why
            texts.append(f"{route} {how}: the probe takes that as not paused.")
    signs = list(dict.fromkeys(sign.family for sign in dialect.pause_signs if _present(page, sign.family)))
    if signs:
        texts.append(
            f"The page shows {', '.join(signs)}: an engine asleep or held for a weight update is paused, never stalled."
        )
    return [("pause", " ".join(texts))] if texts else []


def _load_lines(config: DoctorConfig, dialect: Dialect, looks: _Looks) -> tuple[list[tuple[str, str]], bool]:
    """What the server-load route told, and whether --server-load would help."""
    route = dialect.load_route
    if not route:
        return [], False
    asked = looks.load_asked
    if not looks.loads:
        why = asked.why if asked is not None else "was not asked"
        return [("load", f"{route} {why}, with no count: --server-load would learn nothing there")], False
    most = max(looks.loads)
    if most > 0:
        text = (
            f"{route} counts requests in flight (up to {num(most)}: vLLM runs with --enable-server-load-tracking). "
            "With --server-load the probe asks it when the engine looks idle, and finds requests hung outside "
            "the engine's gauges: the command below has it."
        )
        return [("load", text)], True
    if looks.busy_load_zero:
        text = (
            f"{route} said 0 while requests ran: vLLM counts them only with --enable-server-load-tracking, "
            "and without it --server-load adds nothing."
        )
    else:
        text = (
            f"{route} said 0, and nothing ran: vLLM counts requests only with --enable-server-load-tracking. "
            "With it, --server-load finds requests hung outside the engine's gauges (look under load to tell)."
        )
    return [("load", text)], False


def _live_lines(config: DoctorConfig, dialect: Dialect) -> list[tuple[str, str]]:
    if not dialect.live_route:
        return []
    from .api import PAUSE_QUERY_TIMEOUT

    route = dialect.live_route
    asked = _ask(origin(config.url) + route, config, PAUSE_QUERY_TIMEOUT)
    loads = asked.data.get("loads") if isinstance(asked.data, dict) else None
    if isinstance(loads, list) and loads:  # api.ask_live reads nothing from an empty list
        text = (
            f"{route} answers: when the page looks stuck, the probe reads the scheduler's own counts there "
            "(the page's gauges can show a stale batch)"
        )
    else:
        text = (
            f"{route} {'answers, not as SGLang does' if asked.code == 200 else asked.why}: a page that shows a "
            "stale batch cannot be checked against the scheduler's own counts (newer SGLang serves them)"
        )
    return [("loads", text)]


def _health_lines(config: DoctorConfig, dialect: Dialect) -> list[tuple[str, str]]:
    route = dialect.health_route
    asked = _ask(origin(config.url) + route, config, config.timeout)
    if asked.code is not None and 200 <= asked.code < 300:
        return [("health", f"{route} answers {asked.code}: readiness (--ready) can use it")]
    if asked.code == 404:
        return [("health", f"{route} answers 404: readiness (--ready) goes by the page alone")]
    return [("health", f"{route} {asked.why}: readiness (--ready) says not ready while it does")]


def _verdict_lines(config: DoctorConfig, looks: _Looks) -> list[tuple[str, str]]:
    verdicts = [result.verdict.value for result in looks.results]
    lines = [("verdicts", f"{_runs(verdicts)} (window {num(config.window)} s)")]
    seen, result, before = looks.seen[-1], looks.results[-1], looks.before[-1]
    precision = ""
    if seen.dialect is not None and result.verdict in (Verdict.SUSPECT, Verdict.STALLED):
        precision = precision_note(seen.dialect, result.engines[result.worst].state.last)
    line = describe(result, before, "", config.window, precision, silence=seen.silence, note=seen.note)
    lines.append(("last look", line))
    ready, judged = readiness(result, config.drain_after, healthy=not seen.health)
    if ready:
        lines.append(("readiness", f"ready (with --ready, stuck for {num(config.drain_after)} s is not ready)"))
    else:
        stuck = judged.verdict is Verdict.STALLED or judged.verdict is Verdict.PAUSED
        why = describe(judged, before, "", config.drain_after, silence=seen.silence) if stuck else seen.health
        lines.append(("readiness", f"not ready: {why}"))
    return lines


def _commands(config: DoctorConfig, door: _Door, dialect: Dialect, server_load: bool) -> tuple[list[str], list[str]]:
    """The probe's command for the engine's container, and inject's for those who deploy from manifests:
    the same flags in both."""
    _, port, path = parse_url(config.url)
    flags = []
    if door.engine_needed:
        flags += ["--engine", dialect.name]
    flags += given_flags(config, ENGINE_OPTIONS, leave_out=("--window", "--engine"))
    if door.key_needed and config.api_key_file:
        flags += ["--api-key-file", config.api_key_file]
    if server_load:
        flags.append("--server-load")
    # In the pod the probe runs in the engine's container, where the engine is on loopback.
    command = ["python3", "-c", POD_PROGRAM, "--url", f"http://127.0.0.1:{port}{path}"]
    command += ["--window", num(config.window), "--timeout", num(config.timeout), *flags]
    inject = ["stallprobe", "inject", "-f", "your-deployment.yaml", *flags]
    for flag, key in (("--window", "window"), ("--timeout", "timeout")):
        if key in config.given:
            inject += [flag, num(getattr(config, key))]
    return command, inject


def _probe_block(config: DoctorConfig, door: _Door, dialect: Dialect, server_load: bool, out: _Out) -> None:
    import json
    import shlex

    command, inject = _commands(config, door, dialect, server_load)
    out.say("probe", "in the engine's container (stallprobe installed in its image), as its liveness probe:")
    indent = " " * (LABEL_WIDTH + 2)
    out.line(f"{indent}livenessProbe:")
    out.line(f"{indent}  exec:")
    out.line(f"{indent}    command: {json.dumps(command)}")
    out.line(f"{indent}  periodSeconds: {DEFAULT_PERIOD}")
    out.line(f"{indent}  timeoutSeconds: {kubelet_timeout(config.timeout, int(server_load))}")
    out.line(f"{indent}  failureThreshold: {DEFAULT_FAILURE_THRESHOLD}")
    if door.key_needed and config.api_key_file:
        out.say("", "Mount the key file at that path in the container.")
    elif door.key_needed:
        out.say("", f"The probe reads {config.key_from} in the engine's container, as the engine does.")
    out.line(f"{'inject:':<{LABEL_WIDTH}}from manifests: {shlex.join(inject)} | kubectl apply -f -")


def run(config: DoctorConfig) -> int:
    """Look, then report; the exit code. What the engine gets wrong is reported here, not raised; a
    stdout that takes no more raises OutputError."""
    out = _Out()
    intervals = _intervals(config.seconds)
    out.line(f"stallprobe doctor: reading {config.url} for {secs(config.seconds)} s, {intervals + 1} looks")
    door = _door(config)
    if door.code != ExitCode.OK or door.dialect is None:
        for label, text in door.lines:
            out.say(label, text)
        return door.code
    looks = _look(config)
    if looks.error is not None and not looks.seen:
        # The dialect named by --engine is not checked at the door: the first look's reading is.
        if isinstance(looks.error, MetricsError):
            out.say("engine", _not_an_engine(door.page, config, str(looks.error)))
        else:
            out.say("engine", f"none: {looks.error}")
        return looks.error.exit_code
    return _report(config, door, looks, out)


def _report(config: DoctorConfig, door: _Door, looks: _Looks, out: _Out) -> int:
    lines: list[tuple[str, str]] = []
    answered = looks.answered
    dialect = answered[-1].dialect if answered else door.dialect
    assert dialect is not None
    if answered:
        lines += _engine_lines(config, dialect, answered[0].samples)
    elif looks.interrupted and not looks.seen:
        lines.append(("engine", f"{dialect.name}, by its page; interrupted before the first look"))
    else:
        lines.append(("engine", f"{dialect.name} by the first answer; no look got one since"))
    lines += _progress_lines(config, dialect, door.page, looks)
    lines += _waiting_lines(config, dialect, door.page)
    lines += _key_lines(config, door)
    lines += _pause_lines(config, dialect, door.page)
    load, server_load = _load_lines(config, dialect, looks)
    lines += load
    lines += _live_lines(config, dialect)
    lines += _health_lines(config, dialect)
    if looks.results:
        lines += _verdict_lines(config, looks)
    code: int = ExitCode.OK
    if looks.interrupted:
        lines.append(("stopped", f"interrupted after {len(looks.results)} looks"))
    if looks.interrupted and not looks.seen:
        code = ExitCode.INTERRUPTED
    elif looks.error is not None:
        lines.append(("stopped", f"at look {len(looks.results) + 1}: {looks.error}"))
        code = looks.error.exit_code
    elif not answered:
        lines.append(("stopped", f"no look got an answer within {num(config.timeout)} s"))
        code = ExitCode.SCRAPE
    elif looks.results[-1].verdict is Verdict.STALLED:
        code = ExitCode.STALLED
    for label, text in lines:
        out.say(label, text)
    _probe_block(config, door, dialect, server_load, out)
    if code == ExitCode.STALLED:
        out.say("in short", "stalled now: busy with no progress for the window, so the probe would fail it")
    elif code == ExitCode.OK:
        out.say("in short", "the probe can read and judge this engine: use the command above")
    return code


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """`stallprobe doctor [options]`: look, then report (or print help or the version); the exit code."""
    config = configure(argv, environ)
    if isinstance(config, str):
        _Out().line(help_text() if config == "help" else f"stallprobe {__version__}")
        return ExitCode.OK
    try:
        return run(config)
    except KeyboardInterrupt:  # at the door or among the last questions (the looks report what they saw)
        tell("stallprobe doctor: interrupted")
        return ExitCode.INTERRUPTED
