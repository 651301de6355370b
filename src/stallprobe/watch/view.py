"""What a person (or a program) sees of the rows: a table redrawn in place on a terminal; piped, a line
for each engine whose verdict or readiness changed and one summary line a poll (with --every, or for
--once's one poll, a line per engine); one JSON object per engine per poll with --json; and --once's
exit code.

Piped, a watch of thousands of engines that wrote every engine at every poll wrote a thousand lines a
second that said nothing new; what changed is what an operator reads, and the summary line shows that
the watch is polling, and how long a poll takes."""

from __future__ import annotations

import json
import shutil
import time

from ..errors import ExitCode
from ..judge import class_of
from ..report import WORST_LAST, duration, num

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TextIO

    from .poll import Row, WatchConfig

    # Each endpoint (URL) of the last poll: each of its rows' verdict and readiness, by the engine shown.
    Seen = dict[str, dict[str | None, tuple[str, bool]]]

__all__ = ["Output", "change_line", "changes", "endpoint_name", "line", "once_code", "row_json", "summary", "table"]

# The verdict comes right after the endpoint, so that a narrow terminal cuts the numbers, never the verdict.
# READY is the readiness rule's (what /ready answers): "out" once a load balancer should drain the engine.
_HEADINGS = ("ENDPOINT", "ENGINE", "VERDICT", "READY", "HELD", "RUNNING", "WAITING", "PROMPT/S", "GEN/S", "NOTE")
_RIGHT = frozenset((4, 5, 6, 7, 8))
# Each verdict's rank, the worst last (an engine whose page could no longer be read is said to have been
# the worst of its page's engines).
_RANK = {verdict: rank for rank, verdict in enumerate(WORST_LAST)}


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


def _count(value: float | None) -> str:
    return "-" if value is None else num(value)


def _sum(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def endpoint_name(url: str) -> str:
    """The URL as the table shows it: without `http://`, and without the path when it is `/metrics`."""
    rest = url[len("http://") :] if url.lower().startswith("http://") else url
    return rest[: -len("/metrics")] if rest.endswith("/metrics") and rest.count("/") == 1 else rest


def table(rows: Sequence[Row], config: WatchConfig, width: int = 0, height: int = 0) -> list[str]:
    """The terminal view: a title, one row per engine and the pool's totals, cut to width x height if given
    (the size of the terminal it is redrawn on)."""
    cells = [
        [
            endpoint_name(row.url),
            row.engine if row.engine is not None else "-",
            row.verdict,
            "yes" if row.ready else "out",
            duration(row.held_for),
            _count(row.running),
            _count(row.waiting),
            _rate(row.prompt_rate),
            _rate(row.generation_rate),
            "; ".join(part for part in (row.note, row.hook) if part),
        ]
        for row in rows
    ]
    counts = {verdict: sum(row.verdict == verdict for row in rows) for verdict in WORST_LAST}
    cells.append(
        [
            "total",
            "",
            max((row.verdict for row in rows), key=WORST_LAST.index),
            f"{sum(row.ready for row in rows)}/{len(rows)}",
            "",
            _count(_sum([row.running for row in rows])),
            _count(_sum([row.waiting for row in rows])),
            _rate(_sum([row.prompt_rate for row in rows])),
            _rate(_sum([row.generation_rate for row in rows])),
            ", ".join(f"{counts[v]} {v}" for v in reversed(WORST_LAST) if counts[v]),
        ]
    )
    widths = [max(len(cell[i]) for cell in [list(_HEADINGS), *cells]) for i in range(len(_HEADINGS))]

    def aligned(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if i in _RIGHT else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(parts).rstrip()

    title = (
        f"stallprobe watch  {len(config.urls)} endpoints  every {num(config.interval)} s  "
        f"window {num(config.window)} s  {time.strftime('%H:%M:%S')}"
    ) + ("  Ctrl-C quits" if width else "")
    body = [aligned(values) for values in cells]
    room = height - 3  # the title, the headings, and the line the cursor rests on
    if height and len(body) > room:
        kept = max(0, room - 2)
        body = [*body[:kept], f"... {len(body) - 1 - kept} more rows: enlarge the terminal", body[-1]]
    lines = [title, aligned(_HEADINGS), *body]
    # One column short of the width: a full line leaves some terminals in a pending wrap.
    return [text[: max(1, width - 1)] for text in lines] if width else lines


def _who(row: Row) -> str:
    return row.url if row.engine is None else f"{row.url} engine {row.engine}"


def line(row: Row) -> str:
    """A row as one line, for a pipe (--every, --once): the URL (and the engine), the probe's line, how
    long it has held, and what a hook did."""
    text = f"{_who(row)}: {row.message}; held {duration(row.held_for)}" + ("" if row.ready else "; not ready")
    return f"{text}; {row.hook}" if row.hook else text


def changes(seen: Seen, rows: Sequence[Row]) -> tuple[Seen, list[tuple[Row, str]]]:
    """The rows to tell of, each with what it was, and what to remember for the next poll (`seen`: the
    last poll's, {} before the first).

    An engine is known from poll to poll by its URL and the engine shown (none when its page has one
    engine, nor when its page could not be read). A row is told of when the class of its verdict
    (judge.class_of: baseline, idle, progressing and saturated are all "alive", as on the probe's log)
    or its readiness differs from its own at the last poll (what it was: the class, or "ready"/"not
    ready", or both), and at
    its first poll: with nothing said of what it was at its endpoint's first, else (an engine new to a
    page seen before, or an endpoint whose page could not be read and now can, or the other way round)
    with what differs from the worst of the endpoint's last rows (ready if they all were).
    """
    after: Seen = {}
    told: list[tuple[Row, str]] = []
    for row in rows:
        now = (row.verdict, row.ready)
        mine = after.get(row.url)
        if mine is None:
            mine = after[row.url] = {}
        mine[row.engine] = now
        before = seen.get(row.url)
        if before is None:
            told.append((row, ""))
            continue
        was = before.get(row.engine)
        new = was is None
        if was is None:
            worst = max((verdict for verdict, _ in before.values()), key=lambda v: _RANK.get(v, len(_RANK)))
            was = (worst, all(ready for _, ready in before.values()))
        was_class, now_class = class_of(was[0]), class_of(now[0])
        if new or was_class != now_class or was[1] != now[1]:
            parts = [was_class] if was_class != now_class else []
            if was[1] != now[1]:
                parts.append("ready" if was[1] else "not ready")
            told.append((row, ", ".join(parts)))
    return after, told


def change_line(row: Row, was: str) -> str:
    """The line of a row whose verdict or readiness changed: the URL (and the engine), the probe's line,
    `not ready` when it is not, what a hook did, and what it was (nothing said on its first poll)."""
    text = f"{_who(row)}: {row.message}" + ("" if row.ready else "; not ready")
    text = f"{text}; {row.hook}" if row.hook else text
    return f"{text} (was {was})" if was else text


def summary(rows: Sequence[Row], took: float) -> str:
    """The line that ends each poll, piped: how many engines (an endpoint that could not be read counts
    once), how many of each verdict (the worst first), how many not ready, and how long the poll took."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    said = ", ".join(f"{counts[v]} {v}" for v in sorted(counts, key=lambda v: -_RANK.get(v, len(_RANK))))
    not_ready = sum(not row.ready for row in rows)
    return f"poll: {len(rows)} engines: {said}; {not_ready} not ready; {took * 1000:.0f} ms"


def row_json(row: Row) -> dict[str, object]:
    """A row as --json writes it (docs/pools.md lists the fields; a test holds them equal)."""
    return {
        "time": round(row.time, 3),
        "url": row.url,
        "engine": row.engine,
        "dialect": row.dialect,
        "verdict": row.verdict,
        "ready": row.ready,
        "running": row.running,
        "waiting": row.waiting,
        "owed_waiting": row.owed,
        "prompt_tokens_per_s": _round(row.prompt_rate),
        "generation_tokens_per_s": _round(row.generation_rate),
        "held_for": round(row.held_for, 3),
        "stalled_for": round(row.stalled_for, 3),
        "exit_code": row.code,
        "message": row.message,
        "error": row.error,
        "hook": row.hook or None,
    }


class Output:
    """Where the rows go: a table redrawn in place on a terminal; else, piped, what changed and a summary
    line a poll, or one line (or object) per row with --every, --json or --once."""

    def __init__(self, config: WatchConfig, stream: TextIO) -> None:
        self.config = config
        self.stream = stream
        self.terminal = not config.json and stream.isatty()
        self.live = self.terminal and not config.once  # redraw in place
        self.drawn = False
        self.changes = not (self.terminal or config.json or config.every or config.once)
        self.seen: Seen = {}  # with `changes`: the last poll's verdicts and readiness

    def show(self, rows: Sequence[Row], took: float = 0.0) -> None:
        """Show one poll's rows; `took` is how long the poll took (seconds), for the summary line."""
        if self.terminal:
            size = shutil.get_terminal_size()
            # Cut to the terminal only when redrawing: a line that wraps would break the redraw.
            lines = table(rows, self.config, size.columns, size.lines) if self.live else table(rows, self.config)
            if self.live:
                # Home, each line then erase its rest, erase below: no flicker, no curses.
                start = "\x1b[?25l\x1b[H\x1b[2J" if not self.drawn else "\x1b[H"
                self.stream.write(start + "".join(f"{text}\x1b[K\n" for text in lines) + "\x1b[J")
            else:
                self.stream.write("".join(f"{text}\n" for text in lines))
        elif self.changes:
            self.seen, told = changes(self.seen, rows)
            said = "".join(f"{change_line(row, was)}\n" for row, was in told)
            self.stream.write(f"{said}{summary(rows, took)}\n")
        elif self.config.json:
            self.stream.write("".join(json.dumps(row_json(row)) + "\n" for row in rows))
        else:
            self.stream.write("".join(line(row) + "\n" for row in rows))
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.live and self.drawn:
            self.stream.write("\x1b[?25h")  # the cursor back
            self.stream.flush()


def once_code(rows: Sequence[Row]) -> int:
    """1 when an engine is stalled, else the highest of the rows' codes (3 unreachable, 4 not a page)."""
    codes = {row.code for row in rows}
    return int(ExitCode.STALLED) if ExitCode.STALLED in codes else max(codes, default=0)
