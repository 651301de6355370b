"""The words a verdict is told in: the probe's one line, its JSON object, and watch's short notes.

One module, so that the probe and `watch` say the same thing the same way. The line has a stable lowercase
prefix (the verdict), no timestamp, and stays short: the kubelet shows it in `kubectl describe pod` as
`Liveness probe failed: <line>` and keeps at most 10 KiB.
"""

from __future__ import annotations

from .detector import THRASHED, Verdict
from .errors import ExitCode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .detector import Assessment, EnginesAssessment, Sample, State
    from .engines import Dialect

__all__ = [
    "ENDPOINT_VERDICTS",
    "ERROR",
    "UNREACHABLE",
    "WORST_LAST",
    "baseline_why",
    "describe",
    "drain_warning",
    "duration",
    "error_fields",
    "json_fields",
    "look_line",
    "num",
    "owed_words",
    "precision",
    "ready_line",
    "report_only_note",
    "secs",
    "short_why",
    "unjudged_line",
    "verdict_code",
]

# Two verdicts belong to an endpoint that `watch` could not judge, not to an engine: the scrape failed
# (exit 3), or the page is not one an engine writes (exit 4).
UNREACHABLE = "unreachable"
ERROR = "error"
ENDPOINT_VERDICTS = (UNREACHABLE, ERROR)
# Every verdict from the least to the most severe. An endpoint that cannot be read is worse than one that
# is only suspect, and better than one known to be stalled.
WORST_LAST = (
    *(v.value for v in sorted(Verdict, key=lambda v: v.severity) if v is not Verdict.STALLED),
    UNREACHABLE,
    ERROR,
    Verdict.STALLED.value,
)

SATURATED_NOTE = "busy, not stuck: do not restart"


def thrash_words(one: Assessment) -> str:
    """Why a moving engine is thrashing (or stalled by it): nothing finished, for how long."""
    return f"no request finished for {duration(one.unfinished_for)} while its tokens moved"


THRASH_NOTE = "works and completes nothing: page; restarted only with --fail-thrashing-after"


def num(x: float) -> str:
    """A number as a person writes it: 120, not 120.0; 0.5; 1e+20."""
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else f"{x:g}"


def secs(x: float) -> str:
    """Seconds, to a tenth below 10 s."""
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def duration(seconds: float) -> str:
    """How long, for a person: 4.0 s, 12m05s, 3h20m."""
    if seconds < 60:
        return f"{secs(max(0.0, seconds))} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def baseline_why(one: Assessment, before: State | None, previous: Mapping[str, State] | None) -> str:
    """Why an engine is at baseline: the detector's reason, or, with no history of it, whether this is
    the first run at all or an engine new to a page seen before."""
    if before is None:
        return "engine first seen" if previous else "first run"
    return one.reason


def frozen(one: Assessment, precision: str) -> str:
    """How long nothing has moved, and why that may be the engine's printer rather than the engine."""
    text = f"no token progress for {secs(one.stalled_for)} s"
    return f"{text}; {precision}" if precision else text


def owed_words(sample: Sample) -> str:
    """Which requests a frozen engine with nothing running owes: "" when requests run (or are pending
    outside its gauges: their words are in the head), else those waiting and why they count."""
    if sample.running or sample.pending or not sample.waiting or not sample.answered:
        return ""
    if sample.owed:
        return f"{num(sample.owed)} waiting for capacity, nothing running"
    return f"{num(sample.waiting)} waiting, counted by --include-waiting, nothing running"


def paused_for(one: Assessment) -> float:
    """How long a paused engine has been paused (0 when it is not)."""
    since = one.state.paused_since
    return 0.0 if since is None else one.state.last.t - since


def verdict_code(verdict: Verdict) -> int:
    """The exit code of a verdict: 1 (restart me) for stalled, and for nothing else."""
    return ExitCode.STALLED if verdict is Verdict.STALLED else ExitCode.OK


def precision(dialect: Dialect | None, one: Assessment) -> str:
    """Why a frozen reading may be the engine's printer, not the engine (engines.precision_note): said of
    an engine that is suspect or stalled, "" of any other, or when there is no page."""
    if dialect is None or (one.verdict is not Verdict.SUSPECT and one.verdict is not Verdict.STALLED):
        return ""
    from .engines import precision_note  # only for a frozen engine

    return precision_note(dialect, one.state.last)


def drain_warning(drain_after: float, window: float) -> str:
    """What to say once when --drain-after is not shorter than --window: "" when it is."""
    if drain_after < window:
        return ""
    return (
        f"--drain-after {num(drain_after)} s is not shorter than --window {num(window)} s: a wedged engine "
        "keeps its traffic until it is stalled, so the load balancer no longer drains it before the restart"
    )


def describe(
    result: EnginesAssessment,
    previous: Mapping[str, State] | None,
    first: str,
    window: float,
    caveat: str = "",
    *,
    unanswered: str = "",
    note: str = "",
) -> str:
    """The one line a person reads in `kubectl describe pod`: the verdict of the worst engine.

    `first` says why there is no history at all (a state file that could not be used), "" when there is
    none to say; `caveat` is why a frozen reading may not be the engine (precision(): its printer, or what its page
    cannot show); `unanswered` is why the page
    gave no answer (then there are no numbers to tell); `note` is what else the probe learnt (a canary).
    """
    engines = result.engines
    worst = engines[result.worst]
    s = worst.state.last
    verdict = result.verdict
    if unanswered:
        return (
            f"{verdict.value}: {unanswered}; nothing answered for {secs(worst.stalled_for)} s (window {num(window)} s)"
        )
    who = ""
    if len(engines) > 1:
        alike = [name for name, one in engines.items() if one.verdict is verdict]
        if len(alike) > 1 and verdict in (Verdict.STALLED, Verdict.SUSPECT, Verdict.PAUSED):
            who = f"engines {', '.join(alike)} of {len(engines)}: "
        else:
            who = f"engine {result.worst} of {len(engines)}: "
    head = f"{verdict.value}: {who}{num(s.running)} running, {num(s.waiting)} waiting"
    if s.pending:
        head += f", {num(s.pending)} in flight outside them"
    before = previous.get(result.worst) if previous else None
    if verdict is Verdict.BASELINE:
        line = f"{head}; {first or baseline_why(worst, before, previous)}, progress is judged from the next run"
    elif verdict is Verdict.IDLE:
        line = head
    elif verdict is Verdict.PAUSED:
        line = f"{head}; {worst.reason}, paused for {duration(paused_for(worst))}: not judged until it resumes"
    elif verdict in (Verdict.PROGRESSING, Verdict.SATURATED, Verdict.THRASHING) and before is not None:
        p = before.last
        line = (
            f"{head}; +{num(s.prompt - p.prompt)} prompt and "
            f"+{num(s.generation - p.generation)} generation tokens in {secs(s.t - p.t)} s"
        )
        if verdict is Verdict.SATURATED:
            line += f"; {SATURATED_NOTE}"
        elif verdict is Verdict.THRASHING:
            line += f"; {thrash_words(worst)}: {THRASH_NOTE}"
    elif worst.reason == THRASHED:
        line = f"{head}; thrashing: {thrash_words(worst)}, past --fail-thrashing-after"
    else:
        line = f"{head}; {frozen(worst, '')} (window {num(window)} s)" + (f"; {caveat}" if caveat else "")
        line += f"; {owed_words(s)}" if owed_words(s) else ""
    return f"{line}; {note}" if note else line


def look_line(
    result: EnginesAssessment,
    previous: Mapping[str, State] | None,
    first: str,
    window: float,
    dialect: Dialect | None,
    *,
    unanswered: str = "",
    note: str = "",
) -> str:
    """describe() of a look, with the precision note of the engine that speaks for it: the line of the
    probe, of doctor's last look, and (under the drain window) of readiness."""
    worst = result.engines[result.worst]
    return describe(result, previous, first, window, precision(dialect, worst), unanswered=unanswered, note=note)


def ready_line(
    routing: EnginesAssessment,
    previous: Mapping[str, State] | None,
    first: str,
    drain_after: float,
    dialect: Dialect | None,
    *,
    ready: bool,
    health: str | None,
    unanswered: str = "",
    note: str = "",
) -> str:
    """The readiness line, for the probe's --ready and watch's /ready: `routing` is detector.readiness()'s
    step (judged with the drain window), `health` why the health route says the engine does not serve.
    Ready: the step in words; not ready: the step of the engine that takes the page out of routing
    (stuck or paused), else the health route's why."""
    line = look_line(routing, previous, first, drain_after, dialect, unanswered=unanswered, note=note)
    if ready:
        return f"ready: {line}"
    stuck = routing.verdict is Verdict.STALLED or routing.verdict is Verdict.PAUSED
    return f"not ready: {line if stuck or not health else health}"


def unjudged_line(why: str, route: str) -> str:
    """The line of a run that could not judge the engine but found it serving by its health route."""
    return f"unjudged: {why}; {route} answers 2xx, so the engine serves (the probe cannot judge its progress)"


def report_only_note(code: int) -> str:
    """What --report-only adds to a run that would have failed: the exit it did not take."""
    return f"report-only: exit 0, not {code}"


def short_why(
    one: Assessment, before: State | None, previous: Mapping[str, State] | None, first: str, precision: str
) -> str:
    """The short why of one engine's verdict, for watch's table ("" when the verdict says it all)."""
    if one.verdict is Verdict.BASELINE:
        return first or baseline_why(one, before, previous)
    if one.verdict is Verdict.SATURATED:
        return SATURATED_NOTE
    if one.verdict is Verdict.THRASHING or one.reason == THRASHED:
        return thrash_words(one)
    if one.verdict in (Verdict.SUSPECT, Verdict.STALLED):
        why = owed_words(one.state.last)
        return f"{frozen(one, precision)}; {why}" if why else frozen(one, precision)
    return ""


def json_fields(
    result: EnginesAssessment, samples: Mapping[str, Sample], dialect: str | None, window: float, line: str
) -> dict[str, object]:
    """The probe's --json object: the verdict, the page's totals (null when the page gave no answer),
    and each engine's own numbers."""
    worst = result.engines[result.worst]
    answered = [sample for sample in samples.values() if sample.answered]

    def total(field: str) -> float | None:
        return sum(getattr(sample, field) for sample in answered) if answered else None

    return {
        "verdict": result.verdict.value,
        "engine": result.worst if len(samples) > 1 else None,
        "dialect": dialect,
        # Page totals: with several engines, the sums; the worst engine's own numbers are in "engines".
        "running": total("running"),
        "waiting": total("waiting"),
        "owed_waiting": total("owed"),
        "prompt_tokens": total("prompt"),
        "generation_tokens": total("generation"),
        "stalled_for": worst.stalled_for,
        "unfinished_for": worst.unfinished_for,
        "paused": worst.reason if result.verdict is Verdict.PAUSED else None,
        "paused_for": paused_for(worst),
        "window": window,
        "message": line,
        "engines": [
            {
                "engine": name,
                "verdict": one.verdict.value,
                "running": one.state.last.running,
                "waiting": one.state.last.waiting,
                "owed_waiting": one.state.last.owed,
                "prompt_tokens": one.state.last.prompt,
                "generation_tokens": one.state.last.generation,
                "stalled_for": one.stalled_for,
                "finished_requests": one.state.last.finished,
                "unfinished_for": one.unfinished_for,
            }
            for name, one in result.engines.items()
        ],
    }


def error_fields(message: str, exit_code: int) -> dict[str, object]:
    """The --json object of a run that ended in an error."""
    return {"verdict": "error", "error": message, "exit_code": exit_code}
