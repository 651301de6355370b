"""The doctor's words: one topic a line, each from what the looks found and the detector judged, and the
summary: what the probe would do now. Pure: no I/O; report.py says each look (its line, its readiness,
its precision note, its exit code), and this module only puts those lines in their places.

The summary reads the last look's assessment: a stalled engine is failed now; a busy engine that has not
moved is told how long it has not, and when the probe would drain it (the earlier of --drain-after and
the window: detector.readiness's rule), call it stalled (the window) and have it restarted (the window,
then the kubelet's further failed runs: stanza.restart_after); a thrashing one is said so, and failed only
past --fail-thrashing-after; a paused one is never failed; any other can be read and judged. The window is
the one the looks were judged with: --window, else the engine's own (TensorRT-LLM's), else the default.
"""

from __future__ import annotations

from ..detector import THRASHED, Verdict
from ..engines import LMDEPLOY, TRTLLM
from ..report import look_line, num, ready_line, secs, thrash_words
from ..stanza import restart_after
from .first import TRT_ITERATION_OPTION, TRT_JSON_METRICS, family_state, trtllm_options
from .looks import BUSY, MOVING, loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ..detector import Sample
    from ..engines import Dialect
    from ..settings import LookSettings
    from ..stanza import Plan
    from .first import First
    from .looks import Look, Looks

__all__ = ["Topics", "rollout", "summary", "topics", "unreadable"]

Topics = list[tuple[str, str]]


def runs(verdicts: Sequence[Verdict]) -> str:
    """Each run of one verdict, and its length when more than one: "baseline, then progressing x9"."""
    counted: list[tuple[str, int]] = []
    for verdict in verdicts:
        if counted and counted[-1][0] == verdict.value:
            counted[-1] = (verdict.value, counted[-1][1] + 1)
        else:
            counted.append((verdict.value, 1))
    return ", then ".join(value + (f" x{n}" if n > 1 else "") for value, n in counted)


def engine_lines(config: LookSettings, dialect: Dialect, samples: Mapping[str, Sample]) -> Topics:
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
    if dialect.name == LMDEPLOY.name:
        rank = next(iter(samples)) or "0"
        return [
            (
                "engine",
                f"{dialect.name}{how}, one engine on the page (rank {rank}): with --dp N LMDeploy runs one api_server "
                "per data-parallel rank, each on its own port from --server-port up, each page its own rank's, so a "
                "probe on this port watches this rank alone",
            )
        ]
    return [("engine", f"{dialect.name}{how}, one engine on the page")]


def progress_lines(config: LookSettings, dialect: Dialect, page: bytes | None, looks: Looks) -> Topics:
    seen_signals: set[str] = set()
    for one in looks.answered:
        for sample in one.seen.samples.values():
            seen_signals.update(sample.signals)
    heartbeats = []
    for family in dict.fromkeys((*dialect.signals, *config.progress_metric)):
        if family in seen_signals or family_state(page, family) == "samples":
            heartbeats.append(family)
        elif family_state(page, family) == "declared":
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
    moved = looks.moved()
    families = [
        dialect.prompt,
        dialect.generation,
        *sorted((seen_signals | set(moved)) - {dialect.prompt, dialect.generation}),
    ]
    changed = [
        f"{family} (+{num(rise)})" if rise is not None else family
        for family in families
        if family in moved
        for rise in (moved[family],)
    ]
    still = [family for family in families if family not in moved]
    verdicts = looks.verdicts
    if any(verdict in MOVING for verdict in verdicts) or changed:
        text = ", ".join(changed) + (f"; not {', '.join(still)}" if still else "")
    elif any(verdict in BUSY for verdict in verdicts):
        text = "nothing, while the engine owed work (requests running, or waiting for capacity)"
    elif Verdict.PAUSED in verdicts:
        text = "nothing, while its operator paused it: a paused engine owes nothing until it resumes"
    else:
        text = "nothing: nothing ran, so nothing had to move. Look again while it serves requests."
    lines.append(("moved", text))
    return lines


def waiting_lines(config: LookSettings, dialect: Dialect, page: bytes | None) -> Topics:
    owing = dialect.owing
    if config.include_waiting is True:
        text = "--include-waiting=always: every waiting request counts as work the engine owes"
    elif config.include_waiting is False:
        text = "--include-waiting=never: waiting requests never count, only running ones do"
    elif owing.family and family_state(page, owing.family):
        text = (
            f"the page tells requests waiting for capacity from those the engine defers ({owing.family}): "
            "requests waiting for capacity while nothing runs are owed work, and judged"
        )
    elif owing.family:
        text = (
            f"the page has no {owing.family} (an older {dialect.name}), so waiting requests cannot be told "
            "apart: a queue with nothing running is not judged unless --include-waiting=always"
        )
    elif owing.without:
        text = f"every waiting request ({dialect.waiting}) is owed work, and judged"
    else:
        text = (
            f"{dialect.waiting} counts requests that wait on a peer too, and the page cannot tell them apart: "
            "a queue with nothing running is not judged unless --include-waiting=always"
        )
    return [("waiting", text)]


def key_lines(config: LookSettings, first: First) -> Topics:
    if not config.key:
        return [("api key", "none needed for the page")]
    source = f"--api-key-file {config.api_key_file}" if config.api_key_file else first.key_from
    if first.key_needed:
        return [("api key", f"needed for the page, and the one given ({source}) works")]
    return [("api key", f"not needed for the page (the one given, {source}, is sent anyway)")]


def pause_lines(dialect: Dialect, page: bytes | None, looks: Looks) -> Topics:
    from ..api import paused_answer

    texts = []
    reply = looks.pause
    vllm = dialect.name == "vllm"  # its pause route is served only in its dev mode
    if dialect.pause_route and reply is not None:
        route = dialect.pause_route
        paused = paused_answer(reply.data, dialect.pause_key)
        if paused is not None and vllm:
            now = ", and says it is paused now" if paused else ""
            texts.append(
                f"{route} answers (VLLM_SERVER_DEV_MODE=1){now}: the probe asks it before it calls a frozen "
                "engine stuck, so an engine paused on purpose is never restarted."
            )
        elif paused is not None:
            now = ", and says it is asleep now" if paused else ""
            texts.append(
                f"{route} answers{now}: the probe asks it before it calls a frozen engine stuck, so an engine put to "
                "sleep on purpose is never restarted."
            )
        elif reply.code == 404 and vllm:
            texts.append(
                f"{route} answers 404, as vLLM does without VLLM_SERVER_DEV_MODE=1: fine, no one can pause the "
                "engine over HTTP then."
            )
        elif reply.code == 404:
            texts.append(f"{route} answers 404: this release has no sleep mode, so no one can put it to sleep.")
        else:
            how = f"answers, not as {dialect.name} does" if reply.code == 200 else reply.why
            texts.append(f"{route} {how}: the probe takes that as not paused.")
        if dialect.name == LMDEPLOY.name and reply.code == 200:
            key, value = dialect.health_paused
            texts.append(
                "Nothing on its page says it sleeps: POST /sleep aborts every request, and from the next 10-second "
                f"tick an asleep engine reads idle. Its {dialect.health_route} answers 200 with {key} {value} "
                "then, and readiness, which asks that route at every run, takes it out of routing (every "
                "generation is answered 503 until it is woken); liveness never restarts it."
            )
    signs = list(dict.fromkeys(sign.family for sign in dialect.pause_signs if family_state(page, sign.family)))
    if signs:
        texts.append(
            f"The page shows {', '.join(signs)}: an engine asleep or held for a weight update is paused, never stalled."
        )
    return [("pause", " ".join(texts))] if texts else []


def load_lines(config: LookSettings, dialect: Dialect, looks: Looks) -> tuple[Topics, bool]:
    """What the server-load route told, and whether --server-load would help."""
    route = dialect.load_route
    if not route:
        return [], False
    counted = loads(looks)
    given = " (given)" if config.server_load else ""
    if not counted:
        asked = [one.load for one in looks.all if one.load is not None]
        why = asked[-1].why if asked else "was not asked"
        return [("load", f"{route} {why}, with no count: --server-load{given} would learn nothing there")], False
    most = max(value for value, _ in counted)
    if most > 0:
        text = (
            f"{route} counts requests in flight (up to {num(most)}: vLLM runs with --enable-server-load-tracking). "
            "With --server-load the probe asks it when the engine looks idle, and finds requests hung outside "
            "the engine's gauges: the probes below have it."
        )
        return [("load", text)], True
    if any(running for value, running in counted if not value):
        text = (
            f"{route} said 0 while requests ran: vLLM counts them only with --enable-server-load-tracking, "
            f"and without it --server-load{given} adds nothing."
        )
    else:
        text = (
            f"{route} said 0, and nothing ran: vLLM counts requests only with --enable-server-load-tracking. "
            "With it, --server-load finds requests hung outside the engine's gauges (look under load to tell)."
        )
    return [("load", text)], config.server_load


def live_lines(dialect: Dialect, looks: Looks) -> Topics:
    from ..api import live_loads

    reply = looks.live
    if not dialect.live_route or reply is None:
        return []
    route = dialect.live_route
    if live_loads(reply.data) is not None:
        text = (
            f"{route} answers: when the page looks stuck, the probe reads the scheduler's own counts there "
            "(the page's gauges can show a stale batch)"
        )
    else:
        text = (
            f"{route} {'answers, not as SGLang does' if reply.code == 200 else reply.why}: a page that shows a "
            "stale batch cannot be checked against the scheduler's own counts (newer SGLang serves them)"
        )
    return [("loads", text)]


def moves_lines(dialect: Dialect, page: bytes | None) -> Topics:
    """When each family of an engine whose page tells progress its own way moves (LMDeploy's, TensorRT-LLM's:
    engines.py's comments on them), and, for TensorRT-LLM, what its config options buy."""
    if dialect.name == LMDEPLOY.name:
        usage = dialect.signals[0]
        text = (
            f"{dialect.generation} on every streamed output (its api_server always streams from its engine); "
            f"{dialect.prompt} once a request, by its whole prompt, at its first token, so a long prefill moves "
            f"only {usage}. {dialect.running}, {dialect.waiting} and {usage} are set by a 10-second tick: they lag "
            "by up to 10 s (a request that just finished may read as running, frozen, for one tick: far under the "
            "window). Its request_success_total moves only for requests that end FINISH (aborted and cancelled "
            "ones never count), so the probe reads no thrashing from it."
        )
        return [("moves when", text)]
    if dialect.name != TRTLLM.name:
        return []
    text = (
        f"{dialect.prompt}, {dialect.generation} and {dialect.finished} only when a request finishes; "
        f"{dialect.running}, {dialect.waiting} and {dialect.signals[0]} only while its statistics collector is "
        "awake: it wakes when a request finishes and sleeps at the first half second without statistics, so "
        "during one long generation every series may hold still, the running gauge at its last value. So its "
        f"window is its own, {num(dialect.window or 0)} s, where --window does not say (it must outlast the longest "
        f"request), and an engine whose page would be stalled is asked {dialect.confirm_route} first."
    )
    iterations = family_state(page, dialect.running)
    state = (
        "the iteration statistics are on"
        if iterations
        else f"no {dialect.running}: {TRT_ITERATION_OPTION} is off, and the probe cannot judge this page"
    )
    config = f"{trtllm_options(dialect)}. On this page: {state}. {TRT_JSON_METRICS}."
    return [("moves when", text), ("config", config)]


def drain_lines(config: LookSettings, dialect: Dialect, window: float) -> Topics:
    """For an engine whose page holds still through a long request (one with a window of its own): what
    readiness does at --drain-after, where the page alone would drain a healthy engine. With a route through
    the whole engine (Dialect.confirm_route), readiness asks it first (judge.would_be_stalled, ready=True)."""
    if dialect.window is None or config.drain_after >= window:
        return []
    after = f"busy with nothing moving for --drain-after ({num(config.drain_after)} s)"
    if dialect.confirm_route:
        from ..api import CONFIRM_TIMEOUT

        text = (
            f"this page holds still through a long generation, so readiness, once an engine has been {after}, "
            f"asks {dialect.confirm_route} (a one-token generation through the whole engine) before it takes the "
            f"engine out of routing: an answer within {num(CONFIRM_TIMEOUT)} s keeps it in, none drains it (an "
            "engine too busy to answer in time leaves routing until a request finishes). Give --drain-after above "
            "the longest request to ask it less often"
        )
    else:
        text = (
            f"readiness takes an engine out of routing once it has been {after}, and this page holds still through "
            f"a long generation: a healthy engine leaves routing {num(config.drain_after)} s into every long "
            "request, until a request finishes. Give --drain-after above the longest request, or leave readiness "
            "to its health route"
        )
    return [("drain", text)]


def confirm_lines(dialect: Dialect, looks: Looks) -> Topics:
    """What the engine's request through its whole engine (TensorRT-LLM's /health_generate) answered."""
    reply = looks.confirm
    if not dialect.confirm_route or reply is None:
        return []
    route = dialect.confirm_route
    if reply.code is not None and 200 <= reply.code < 300:
        text = (
            f"{route} answers {reply.code} (a one-token generation through the whole engine): when the page alone "
            "would call the engine stalled, the probe asks it, and its answer is life the page could not show. It "
            "is itself a request that finishes: it moves the page's counters"
        )
    else:
        text = (
            f"{route} {reply.why}: an engine whose page holds still for the window would be stalled, with nothing "
            "to tell a long generation from a wedge"
        )
    return [("generate", text)]


def own_health_lines(dialect: Dialect) -> Topics:
    """What the engine's own health route already catches, and what the probe adds (LMDeploy's)."""
    if dialect.name != LMDEPLOY.name:
        return []
    text = (
        f"LMDeploy's own {dialect.health_route} answers 503 once its scheduler has not ticked for 90 s with "
        "requests dispatched (LMDEPLOY_HEALTH_UNHEALTHY_AFTER), or schedules none of them that long, and 200 "
        "while it sleeps. Used as a probe alone it restarts a frozen scheduler with no drain before, and never "
        "sees one that ticks and produces nothing. The probe adds the window on its tokens, readiness that drains "
        "at --drain-after long before the restart (its 503 drains readiness at once: --ready asks it), and the "
        "pool's view (stallprobe watch)."
    )
    return [("own health", text)]


def health_lines(dialect: Dialect, looks: Looks) -> Topics:
    """What the health route said at the last look that asked it (observe asks it at every look)."""
    route = dialect.health_route
    told = [one.seen.health for one in looks.answered if one.seen.health is not None]
    if not told:
        return []
    if not told[-1]:
        return [("health", f"{route} says the engine serves: readiness (--ready) can use it")]
    return [("health", f"{told[-1]}: readiness (--ready) says not ready while it does")]


def verdict_lines(config: LookSettings, looks: Looks, window: float) -> Topics:
    lines = [("verdicts", f"{runs(looks.verdicts)} (window {num(window)} s)")]
    last = looks.all[-1]
    seen, result = last.seen, last.result
    line = look_line(result, last.before, "", window, seen.dialect, unanswered=seen.unanswered, note=seen.note)
    lines.append(("last look", line))
    ready = ready_line(
        last.routing, last.before, "", config.drain_after, seen.dialect,
        ready=last.ready, health=seen.health, unanswered=seen.unanswered, note=seen.note,
    )  # fmt: skip
    lines.append(("readiness", ready))
    return lines


def topics(config: LookSettings, first: First, dialect: Dialect, looks: Looks, window: float) -> tuple[Topics, bool]:
    """Every topic of a report whose looks began, `window` the one they were judged with; and whether
    --server-load goes into the probes."""
    lines = engine_lines(config, dialect, looks.all[0].seen.samples)  # the first look answered
    lines += progress_lines(config, dialect, first.page, looks)
    lines += moves_lines(dialect, first.page)
    lines += waiting_lines(config, dialect, first.page)
    lines += key_lines(config, first)
    lines += pause_lines(dialect, first.page, looks)
    load, server_load = load_lines(config, dialect, looks)
    lines += load
    lines += live_lines(dialect, looks)
    lines += confirm_lines(dialect, looks)
    lines += health_lines(dialect, looks)
    lines += own_health_lines(dialect)
    lines += drain_lines(config, dialect, window)
    lines += verdict_lines(config, looks, window)  # there is always a look: the first contact's
    return lines, server_load


def summary(config: LookSettings, last: Look, plan: Plan) -> str:
    """What the probe would do now, by the last look's assessment."""
    result = last.result
    worst = result.engines[result.worst]
    window = plan.window  # the window the looks were judged with
    restart = restart_after(plan)
    kubelet = (
        f"the kubelet restarts it about {num(restart)} s after its last progress (window {num(window)} s + period "
        f"{plan.period} s x (failureThreshold {plan.failure} - 1))"
    )
    how = "no answer" if last.seen.unanswered else "busy with no progress"
    frozen = f"{how} for {secs(worst.stalled_for)} s"
    if result.verdict is Verdict.STALLED and worst.reason == THRASHED:
        after = num(config.fail_thrashing_after or 0)
        return (
            f"stalled now: thrashing, {thrash_words(worst)}, past --fail-thrashing-after {after} s, so the probe "
            f"fails it now and readiness drains it; {kubelet}"
        )
    if result.verdict is Verdict.THRASHING:
        return (
            f"thrashing: {thrash_words(worst)}. Said, not acted on: exit 0, and ready. With --fail-thrashing-after S "
            "the probe fails it (and readiness drains it) once it has thrashed S s; off by default, as a whole pool "
            "overloaded at once thrashes together, and draining every member would empty it"
        )
    if result.verdict is Verdict.STALLED:
        return f"stalled now: {frozen} (window {num(window)} s), so the probe fails it now; {kubelet}"
    if result.verdict is Verdict.SUSPECT:
        drain = min(config.drain_after, window)
        return (
            f"suspect: {frozen}. If nothing moves, readiness takes it out of routing at {num(drain)} s (the "
            f"earlier of --drain-after {num(config.drain_after)} s and the window), the probe fails it at "
            f"{num(window)} s, and {kubelet}"
        )
    if result.verdict is Verdict.PAUSED:
        return (
            f"paused: {worst.reason}. The probe never fails a paused engine (readiness keeps it out of routing) "
            "and judges it afresh once it resumes"
        )
    return "the probe can read and judge this engine: use the probes above"


def rollout() -> list[str]:
    """How to measure the staged rollout of the probes above (docs/kubernetes.md, its stage gates): the
    transition lines on the container's log, the alerts, and the kubelet's own count of failed runs."""
    return [
        "roll it out in stages, report-only first (stallprobe inject --report-only --no-ready), and measure each",
        "stage by what the probe leaves: its changes on the container's log, the alerts, the kubelet's count:",
        "  kubectl -n NS logs -l app=APP -c CONTAINER --prefix --tail=-1 | grep 'stallprobe: liveness: "
        "\\(stalled\\|unjudged\\):'",
        '  Loki: {namespace="NS", container="CONTAINER"} |~ "stallprobe: liveness: (stalled|unjudged):"',
        '  Prometheus: sum by (pod) (increase(prober_probe_total{probe_type="Liveness", result="failed"}[7d])) > 0',
        "  and the alerts of deploy/prometheus/ (docs/kubernetes.md: Rolling it out in stages)",
    ]


def unreadable(code: int, window: float, timeout: float, *, silent: bool = False, answered: bool = True) -> str:
    """What the probe would do at an engine whose page it cannot read (`code`: the exit code of its runs):
    whose server gave no HTTP answer at all (not `answered`: refused, reset), that gave no answer within
    --timeout (`silent`), or whose answer it cannot judge (it asks the health route instead)."""
    if silent:
        return (
            f"no answer within --timeout {num(timeout)} s: the probe would call it suspect, and fail it once "
            f"nothing has answered for the window ({num(window)} s)"
        )
    if not answered:
        return (
            f"nothing answers there: every run would exit {code}, a failed probe to the kubelet, which restarts "
            "the container after failureThreshold of them: mend what is said above before adopting it"
        )
    return (
        "the probe cannot judge this engine: every run falls back to its health route (exit 0, unjudged, while "
        f"that answers 2xx; exit {code} when it does not, or with --strict), no more than an httpGet of it: "
        "mend what is said above before adopting it"
    )
