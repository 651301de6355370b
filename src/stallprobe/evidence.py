"""What a failing liveness run leaves in the container's termination message file, for whoever reads the
restarted container's last state (`kubectl describe pod`: Last State, Message): the words, from the run's
judgment or, for a run that ended in an error, from what is remembered. Pure: trace.py writes it.
"""

from __future__ import annotations

from .report import num, secs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .detector import Sample
    from .judge import Judgment, Memory

__all__ = ["EVIDENCE_BEGIN", "EVIDENCE_END", "evidence"]

# The evidence sits between these two lines in the termination message file, so that a run that passes
# again removes what the probe wrote, and only that (trace.py).
EVIDENCE_BEGIN = "--- stallprobe: liveness failed"
EVIDENCE_END = "--- stallprobe: end"


def _sample_words(sample: Sample) -> str:
    if not sample.answered:
        return "no answer"
    words = f"{num(sample.running)} running, {num(sample.waiting)} waiting, {num(sample.prompt)} prompt and "
    words += f"{num(sample.generation)} generation tokens"
    signals = ", ".join(f"{name} {value:g}" for name, value in sample.signals.items())
    return f"{words}; {signals}" if signals else words


def evidence(line: str, code: int, memory: Memory, judgment: Judgment | None, argv: tuple[str, ...] | list[str]) -> str:
    """What a failing liveness run leaves in the termination message file for whoever reads the restarted
    container's last state: the line and exit code, when progress was last seen, the last two samples (of
    the engine that speaks for the page), the requests in flight that the restart throws away, the engine,
    the flags that decided, and stallprobe's version. `judgment`: the run's (None for a run that ended in
    an error: the last sample remembered stands in)."""
    from . import __version__

    lines = [f"{EVIDENCE_BEGIN} (exit {code}): {line}"]
    if judgment is not None:
        result = judgment.result
        name = result.worst
        worst = result.engines[name]
        before = (judgment.previous or {}).get(name)
        who = f" (engine {name} of {len(result.engines)})" if len(result.engines) > 1 else ""
        if worst.stalled_for:
            since = worst.state.stall_since
            lines.append(f"no progress seen for {secs(worst.stalled_for)} s{who}, since {since or 0:.1f} s after boot")
        now = judgment.seen.samples.get(name)
        lines.append("the last two samples (seconds after boot: what the page said):")
        if before is not None:
            lines.append(f"  {before.last.t:.1f}: {_sample_words(before.last)}")
        if now is not None:
            lines.append(f"  {now.t:.1f}: {_sample_words(now)}")
        last = worst.state.last
        if last.answered:
            lines.append(f"in flight, lost to a restart: {num(last.running)} running, {num(last.waiting)} waiting")
        dialect = judgment.seen.dialect
        about = judgment.seen.about or (dialect.name if dialect is not None else "")
        if about:
            lines.append(f"engine: {about}")
    elif memory.states:
        lines.append("the last sample remembered (seconds after boot: what the page said):")
        for name, state in sorted(memory.states.items()):
            who = f" engine {name}" if name else ""
            lines.append(f"  {state.last.t:.1f}{who}: {_sample_words(state.last)}")
    lines.append("flags: " + " ".join(argv))
    lines.append(f"stallprobe {__version__}")
    return "\n".join(lines)
