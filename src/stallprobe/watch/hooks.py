"""Which hook runs when: a pure function of what the watch remembers and what one poll saw.

Like the detector, this module does no I/O, reads no clock, starts no process and words nothing: the time
is an argument, the memory is a value passed in and a new one handed back, and nothing passed in is
mutated. The runner (runner.py) starts what `consider` asks for, reports back which runs still run and
puts the notes into words (runner.hook_note); poll.py glues them together.

The rules, for each hook (--on-stalled for `stalled`, --on-saturated for `saturated`) and each row of a
poll, in this order:

1. An engine gone from a page that was read is forgotten: as the detector forgets it, so that one that
   comes back is a new engine, with a new episode.
2. An endpoint that could not be read (a row the detector did not judge: unreachable, error) neither
   ends nor starts an episode: a failed scrape says nothing about its engines, and a blip in the middle
   of a stall must not restart it.
3. An engine seen by the detector with another verdict ends its episode: the next time it is seen with
   the hook's verdict is a new episode.
4. A hook runs only for its own verdict: never the stalled hook for saturated (working through a queue;
   a restart throws the work away) or suspect (not yet past the window).
5. Once per episode: a stall that outlives the command it started does not start it again; a restart
   that did not take needs a person, not a restart loop.
6. Never while the endpoint's previous run of that hook still runs: two restarts of one engine at once
   fight each other. (A run started in this poll counts as running for the rest of the poll.)
7. At most once per --cooldown per endpoint and hook, counted from the previous run's start: a restarted
   engine must have time to load its model before it can be judged again. An episode held by the
   cooldown runs the hook when the cooldown ends, if it has not ended first.
8. Each row says what the hooks did: why a hook is held for it, else the endpoint's latest run of each
   hook (as of the end of the poll) when that run was for the row's engine, since a person reading the
   row wants to know whether its engine's restart is under way or how it ended.
"""

from __future__ import annotations

from ..detector import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence, Set

    # (hook kind, url, engine name): one engine's episode of one hook's verdict; also a run to start.
    Episode = tuple[str, str, str]
    # (hook kind, url): an endpoint's runs of one hook.
    Endpoint = tuple[str, str]
    # What a poll saw, per row: (url, engine name, verdict). Rows of one endpoint share its url; a row
    # that stands for an endpoint that could not be read has the name "".
    Seen = tuple[str, str, str]

__all__ = ["HOOK_FLAGS", "Held", "Memory", "Ran", "Waits", "consider"]

# Each hook's kind (the verdict it runs for) and its flag, in the order a row's notes are told.
HOOK_FLAGS = {Verdict.STALLED.value: "--on-stalled", Verdict.SATURATED.value: "--on-saturated"}
# The verdicts of a row the detector judged; any other (unreachable, error) is an endpoint not read.
_JUDGED = frozenset(verdict.value for verdict in Verdict)


class Memory:
    """What the hook rules remember between polls. Treat as immutable: `consider` returns a new one."""

    __slots__ = ("episodes", "runs")

    def __init__(
        self, episodes: Set[Episode] = frozenset(), runs: Mapping[Endpoint, tuple[str, float]] | None = None
    ) -> None:
        # The episodes whose run has started.
        self.episodes = frozenset(episodes)
        # The latest run of each hook per endpoint: the engine it ran for, and when it started.
        self.runs = dict(runs or {})


# What a row says about a hook: one of three notes, which runner.hook_note() puts into words with what the
# runner says of the run in `run` (None: nothing to ask the runner about).


class Ran:
    """The endpoint's latest run of the hook, started at `started`, was for this row's engine."""

    __slots__ = ("run", "started")

    def __init__(self, run: Endpoint, started: float) -> None:
        self.run = run
        self.started = started


class Waits:
    """The hook is held until the endpoint's previous run of it, `run`, ends."""

    __slots__ = ("run",)

    def __init__(self, run: Endpoint) -> None:
        self.run = run


class Held:
    """The hook is held by --cooldown for `left` more seconds."""

    __slots__ = ("kind", "left")
    run = None

    def __init__(self, kind: str, left: float) -> None:
        self.kind = kind
        self.left = left


def consider(
    memory: Memory,
    seen: Sequence[Seen],
    running: Set[Endpoint],
    now: float,
    *,
    cooldown: float,
    kinds: Collection[str],
) -> tuple[Memory, list[Episode], list[list[Ran | Waits | Held]]]:
    """The hook rules for one poll: the next memory, the runs to start, and the notes of each row.

    `running`: the (kind, url) whose latest run still runs; `kinds`: the hooks given.
    """
    read = {url for url, _, verdict in seen if verdict in _JUDGED}
    engines = {(url, name) for url, name, verdict in seen if verdict in _JUDGED}
    # Rule 1 (and 2: an endpoint not read keeps its engines' episodes).
    episodes = {e for e in memory.episodes if e[1] not in read or (e[1], e[2]) in engines}
    runs = dict(memory.runs)
    busy = set(running)
    given = [kind for kind in HOOK_FLAGS if kind in kinds]
    starts: list[Episode] = []
    held: dict[tuple[int, str], Waits | Held] = {}  # (row, kind) -> why the hook is held
    for row, (url, name, verdict) in enumerate(seen):
        for kind in given:
            episode = (kind, url, name)
            if verdict == kind and episode not in episodes:  # rules 4 and 5
                run = runs.get((kind, url))
                if (kind, url) in busy:  # rule 6
                    held[(row, kind)] = Waits((kind, url))
                elif run is not None and now - run[1] < cooldown:  # rule 7
                    held[(row, kind)] = Held(kind, cooldown - (now - run[1]))
                else:
                    runs[(kind, url)] = (name, now)
                    busy.add((kind, url))
                    episodes.add(episode)
                    starts.append(episode)
            elif verdict != kind and verdict in _JUDGED:  # rules 3 and 2
                episodes.discard(episode)
    # Rule 8, once every run of this poll has started: a row tells the endpoint's latest run.
    notes = []
    for row, (url, name, _) in enumerate(seen):
        told: list[Ran | Waits | Held] = []
        for kind in given:
            run = runs.get((kind, url))
            if (row, kind) in held:
                told.append(held[(row, kind)])
            elif run is not None and run[0] == name:
                told.append(Ran((kind, url), run[1]))
        notes.append(told)
    return Memory(episodes, runs), starts, notes
