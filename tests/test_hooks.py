"""The hook rules as a table of scenarios: polls in, hooks started and notes out. One row per rule or case.

A poll is written as the rows it saw ("a/1 stalled": engine 1 of endpoint a; "a stalled": the one engine of
a page without engine labels, or endpoint a itself when it is unreachable), the time, and which runs still
run. The harness stands in for the runner: the n-th run started gets pid n, and a run not said to be
running has exited 0.
"""

from __future__ import annotations

import pytest

from stallprobe.watch.hooks import HOOK_FLAGS, Held, Memory, Ran, Waits, consider
from stallprobe.watch.runner import hook_note

ST, SAT = "stalled", "saturated"
BOTH = (ST, SAT)

# What one poll must give: the runs started (written like rows) and each row's note.
Expect = tuple[list[str], list[str]]


class Poll:
    """One poll: at time `t`, the rows seen; `running`: the (hook, url) whose latest run still runs."""

    def __init__(self, t: float, rows: list[str], running: tuple[tuple[str, str], ...] = ()) -> None:
        self.t = t
        self.rows = rows
        self.running = frozenset(running)

    def seen(self) -> list[tuple[str, str, str]]:
        out = []
        for row in self.rows:
            who, verdict = row.split()
            url, _, name = who.partition("/")
            out.append((url, name, verdict))
        return out


def P(t: float, *rows: str, running: tuple[tuple[str, str], ...] = ()) -> Poll:
    return Poll(t, list(rows), running)


def E(starts: list[str], *notes: str) -> Expect:
    return (starts, list(notes))


NONE: list[str] = []

# (name, cooldown, hooks given, [(poll, what it must give)])
SCENARIOS: list[tuple[str, float, tuple[str, ...], list[tuple[Poll, Expect]]]] = [
    # --- rules 4 and 5: its own verdict, once per episode
    (
        "stalled_runs_once_per_episode_even_past_the_cooldown",
        600,
        (ST,),
        [
            (P(0, "a progressing"), E(NONE, "")),
            (P(5, "a suspect"), E(NONE, "")),
            (P(10, "a stalled"), E(["a stalled"], "--on-stalled (pid 1) running for 0.0 s")),
            (P(15, "a stalled", running=((ST, "a"),)), E(NONE, "--on-stalled (pid 1) running for 5.0 s")),
            (P(20, "a stalled"), E(NONE, "--on-stalled (pid 1) ran 10 s ago: exited 0")),
            (P(700, "a stalled"), E(NONE, "--on-stalled (pid 1) ran 11m30s ago: exited 0")),
        ],
    ),
    (
        "the_stalled_hook_never_runs_for_another_verdict",
        0,
        (ST,),
        [
            (P(0, "a saturated", "b suspect", "c idle"), E(NONE, "", "", "")),
            (P(10, "a saturated", "b suspect", "c baseline"), E(NONE, "", "", "")),
            (P(20, "a saturated", "b progressing", "c unreachable"), E(NONE, "", "", "")),
        ],
    ),
    (
        "the_saturated_hook_runs_for_saturated_only",
        0,
        (SAT,),
        [
            (P(0, "a stalled", "b suspect"), E(NONE, "", "")),
            (P(10, "a saturated", "b suspect"), E(["a saturated"], "--on-saturated (pid 1) running for 0.0 s", "")),
        ],
    ),
    (
        "only_the_hooks_given_run",
        0,
        (),
        [
            (P(0, "a stalled", "b saturated"), E(NONE, "", "")),
        ],
    ),
    # --- rule 3: another verdict ends the episode
    (
        "another_verdict_ends_the_episode",
        60,
        (ST,),
        [
            (P(0, "a stalled"), E(["a stalled"], "--on-stalled (pid 1) running for 0.0 s")),
            (P(10, "a progressing"), E(NONE, "--on-stalled (pid 1) ran 10 s ago: exited 0")),
            (P(70, "a stalled"), E(["a stalled"], "--on-stalled (pid 2) running for 0.0 s")),
        ],
    ),
    (
        "a_stall_seen_suspect_between_is_a_new_episode",
        0,
        (ST,),
        [
            (P(0, "a stalled"), E(["a stalled"], "--on-stalled (pid 1) running for 0.0 s")),
            (P(10, "a suspect"), E(NONE, "--on-stalled (pid 1) ran 10 s ago: exited 0")),
            (P(20, "a stalled"), E(["a stalled"], "--on-stalled (pid 2) running for 0.0 s")),
        ],
    ),
    (
        "each_hook_has_its_own_episodes",
        0,
        BOTH,
        [
            (P(0, "a saturated"), E(["a saturated"], "--on-saturated (pid 1) running for 0.0 s")),
            (
                P(10, "a stalled"),
                E(
                    ["a stalled"],
                    "--on-stalled (pid 2) running for 0.0 s; --on-saturated (pid 1) ran 10 s ago: exited 0",
                ),
            ),
            (
                P(20, "a saturated", running=((ST, "a"),)),
                E(["a saturated"], "--on-stalled (pid 2) running for 10 s; --on-saturated (pid 3) running for 0.0 s"),
            ),
            (
                P(30, "a saturated"),
                E(NONE, "--on-stalled (pid 2) ran 20 s ago: exited 0; --on-saturated (pid 3) ran 10 s ago: exited 0"),
            ),
        ],
    ),
    # --- rule 2: an endpoint that could not be read neither ends nor starts an episode
    (
        "a_failed_scrape_in_a_stall_does_not_run_the_hook_again",
        0,
        (ST,),
        [
            (P(0, "a stalled"), E(["a stalled"], "--on-stalled (pid 1) running for 0.0 s")),
            (P(10, "a unreachable"), E(NONE, "--on-stalled (pid 1) ran 10 s ago: exited 0")),
            (P(20, "a error"), E(NONE, "--on-stalled (pid 1) ran 20 s ago: exited 0")),
            (P(30, "a stalled"), E(NONE, "--on-stalled (pid 1) ran 30 s ago: exited 0")),
        ],
    ),
    (
        "a_failed_scrape_keeps_the_episodes_of_every_engine_of_its_page",
        0,
        (ST,),
        [
            (P(0, "a/0 stalled", "a/1 progressing"), E(["a/0 stalled"], "--on-stalled (pid 1) running for 0.0 s", "")),
            (P(10, "a unreachable"), E(NONE, "")),
            (P(20, "a/0 stalled", "a/1 progressing"), E(NONE, "--on-stalled (pid 1) ran 20 s ago: exited 0", "")),
        ],
    ),
    (
        "an_endpoint_that_cannot_be_read_never_runs_a_hook",
        0,
        BOTH,
        [
            (P(0, "a unreachable", "b error"), E(NONE, "", "")),
            (P(10, "a unreachable", "b error"), E(NONE, "", "")),
        ],
    ),
    # --- rule 1: an engine gone from a page that was read is forgotten
    (
        "an_engine_gone_from_a_page_that_was_read_comes_back_new",
        0,
        (ST,),
        [
            (P(0, "a/0 progressing", "a/1 stalled"), E(["a/1 stalled"], "", "--on-stalled (pid 1) running for 0.0 s")),
            (P(10, "a/0 progressing"), E(NONE, "")),
            (P(20, "a/0 progressing", "a/1 stalled"), E(["a/1 stalled"], "", "--on-stalled (pid 2) running for 0.0 s")),
        ],
    ),
    (
        "an_engine_gone_from_one_page_is_forgotten_there_only",
        0,
        (ST,),
        [
            (
                P(0, "a/1 stalled", "b/1 stalled"),
                E(
                    ["a/1 stalled", "b/1 stalled"],
                    *["--on-stalled (pid 1) running for 0.0 s", "--on-stalled (pid 2) running for 0.0 s"],
                ),
            ),
            (
                P(10, "a/0 idle", "b/0 idle", "b/1 stalled"),
                E(NONE, "", "", "--on-stalled (pid 2) ran 10 s ago: exited 0"),
            ),
            (
                P(20, "a/1 stalled", "b/1 stalled"),
                E(
                    ["a/1 stalled"],
                    "--on-stalled (pid 3) running for 0.0 s",
                    "--on-stalled (pid 2) ran 20 s ago: exited 0",
                ),
            ),
        ],
    ),
    # --- rule 6: never while the previous run still runs
    (
        "a_new_episode_waits_for_the_previous_run_to_end",
        0,
        (ST,),
        [
            (P(0, "a stalled"), E(["a stalled"], "--on-stalled (pid 1) running for 0.0 s")),
            (P(10, "a progressing", running=((ST, "a"),)), E(NONE, "--on-stalled (pid 1) running for 10 s")),
            (
                P(20, "a stalled", running=((ST, "a"),)),
                E(NONE, "--on-stalled waits for its previous run (pid 1) to end"),
            ),
            (
                P(30, "a stalled", running=((ST, "a"),)),
                E(NONE, "--on-stalled waits for its previous run (pid 1) to end"),
            ),
            (P(40, "a stalled"), E(["a stalled"], "--on-stalled (pid 2) running for 0.0 s")),
        ],
    ),
    (
        "a_run_of_one_hook_does_not_hold_the_other",
        600,
        BOTH,
        [
            (P(0, "a stalled"), E(["a stalled"], "--on-stalled (pid 1) running for 0.0 s")),
            (
                P(10, "a saturated", running=((ST, "a"),)),
                E(["a saturated"], "--on-stalled (pid 1) running for 10 s; --on-saturated (pid 2) running for 0.0 s"),
            ),
        ],
    ),
    (
        "two_engines_of_one_endpoint_stalled_at_once_run_it_one_after_the_other",
        600,
        (ST,),
        [
            (
                P(0, "a/0 stalled", "a/1 stalled"),
                E(
                    ["a/0 stalled"],
                    "--on-stalled (pid 1) running for 0.0 s",
                    "--on-stalled waits for its previous run (pid 1) to end",
                ),
            ),
            (
                P(10, "a/0 stalled", "a/1 stalled"),
                E(NONE, "--on-stalled (pid 1) ran 10 s ago: exited 0", "--on-stalled held by --cooldown, 9m50s left"),
            ),
            (P(600, "a/0 stalled", "a/1 stalled"), E(["a/1 stalled"], "", "--on-stalled (pid 2) running for 0.0 s")),
        ],
    ),
    # --- rule 7: at most once per cooldown per endpoint and hook
    (
        "the_cooldown_holds_a_new_episode_until_it_ends",
        600,
        (ST,),
        [
            (P(1000, "a stalled"), E(["a stalled"], "--on-stalled (pid 1) running for 0.0 s")),
            (P(1010, "a progressing"), E(NONE, "--on-stalled (pid 1) ran 10 s ago: exited 0")),
            (P(1020, "a stalled"), E(NONE, "--on-stalled held by --cooldown, 9m40s left")),
            (P(1599.5, "a stalled"), E(NONE, "--on-stalled held by --cooldown, 0.5 s left")),
            (P(1600, "a stalled"), E(["a stalled"], "--on-stalled (pid 2) running for 0.0 s")),
        ],
    ),
    (
        "a_stall_that_ends_inside_the_cooldown_runs_nothing",
        600,
        (ST,),
        [
            (P(0, "a stalled"), E(["a stalled"], "--on-stalled (pid 1) running for 0.0 s")),
            (P(10, "a idle"), E(NONE, "--on-stalled (pid 1) ran 10 s ago: exited 0")),
            (P(20, "a stalled"), E(NONE, "--on-stalled held by --cooldown, 9m40s left")),
            (P(30, "a progressing"), E(NONE, "--on-stalled (pid 1) ran 30 s ago: exited 0")),
            (P(4000, "a progressing"), E(NONE, "--on-stalled (pid 1) ran 1h06m ago: exited 0")),
        ],
    ),
    (
        "the_cooldown_is_per_endpoint_not_per_engine",
        600,
        (ST,),
        [
            (
                P(0, "a/0 stalled", "a/1 idle", "b stalled"),
                E(
                    ["a/0 stalled", "b stalled"],
                    "--on-stalled (pid 1) running for 0.0 s",
                    "",
                    "--on-stalled (pid 2) running for 0.0 s",
                ),
            ),
            (
                P(10, "a/0 progressing", "a/1 stalled", "b stalled", "c stalled"),
                E(
                    ["c stalled"],
                    "--on-stalled (pid 1) ran 10 s ago: exited 0",
                    "--on-stalled held by --cooldown, 9m50s left",
                    "--on-stalled (pid 2) ran 10 s ago: exited 0",
                    "--on-stalled (pid 3) running for 0.0 s",
                ),
            ),
        ],
    ),
    (
        "a_cooldown_of_zero_holds_nothing",
        0,
        (ST,),
        [
            (P(0, "a stalled"), E(["a stalled"], "--on-stalled (pid 1) running for 0.0 s")),
            (P(0, "a progressing"), E(NONE, "--on-stalled (pid 1) ran 0.0 s ago: exited 0")),
            (P(0, "a stalled"), E(["a stalled"], "--on-stalled (pid 2) running for 0.0 s")),
        ],
    ),
]


def report(
    run: tuple[str, str] | None, pids: dict[tuple[str, str], int], poll: Poll, new: set[tuple[str, str]]
) -> tuple[int | None, str | None]:
    """The stand-in runner's word on a run: its pid, and None while it runs, else "exited 0"."""
    if run is None:
        return (None, None)
    return pids[run], None if run in poll.running or run in new else "exited 0"


def replay(cooldown: float, kinds: tuple[str, ...], polls: list[Poll]) -> list[Expect]:
    """Fold the rules over the polls from an empty memory, with a stand-in runner; what each poll gave."""
    memory = Memory()
    pids: dict[tuple[str, str], int] = {}
    started = 0
    out = []
    for poll in polls:
        memory, starts, notes = consider(memory, poll.seen(), poll.running, poll.t, cooldown=cooldown, kinds=kinds)
        for kind, url, _ in starts:
            started += 1
            pids[(kind, url)] = started
        new = {(kind, url) for kind, url, _ in starts}
        texts = ["; ".join(hook_note(n, *report(n.run, pids, poll, new), poll.t) for n in told) for told in notes]
        runs = [f"{url}/{name} {kind}" if name else f"{url} {kind}" for kind, url, name in starts]
        out.append((runs, texts))
    return out


@pytest.mark.parametrize(("cooldown", "kinds", "polls"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_scenario(cooldown: float, kinds: tuple[str, ...], polls: list[tuple[Poll, Expect]]) -> None:
    for poll, (_, notes) in polls:
        assert len(notes) == len(poll.rows), poll.rows
    assert replay(cooldown, kinds, [poll for poll, _ in polls]) == [expect for _, expect in polls]


def test_scenarios_are_unique_and_present() -> None:
    assert SCENARIOS
    names = [s[0] for s in SCENARIOS]
    assert len(names) == len(set(names))


def test_consider_never_mutates_its_inputs() -> None:
    memory = Memory({(ST, "a", "0"), (SAT, "b", "")}, {(ST, "a"): ("0", 5.0), (SAT, "b"): ("", 1.0)})
    seen = [("a", "0", "progressing"), ("a", "1", "stalled"), ("b", "", "stalled"), ("c", "", "saturated")]
    running = frozenset({(ST, "a")})
    before = (set(memory.episodes), dict(memory.runs), list(seen), set(running))
    after, starts, _ = consider(memory, seen, running, 100.0, cooldown=0, kinds=BOTH)
    assert (set(memory.episodes), dict(memory.runs), list(seen), set(running)) == before
    assert after is not memory
    assert after.runs is not memory.runs
    assert starts == [(ST, "b", ""), (SAT, "c", "")]
    assert after.episodes == {(ST, "b", ""), (SAT, "c", "")}
    assert after.runs == {(ST, "a"): ("0", 5.0), (SAT, "b"): ("", 1.0), (ST, "b"): ("", 100.0), (SAT, "c"): ("", 100.0)}


def test_a_run_that_never_got_a_pid_is_told_without_one() -> None:
    """The runner could not start it (no such file, no room): no pid to name."""
    assert hook_note(Waits((ST, "a")), None, None, 10.0) == "--on-stalled waits for its previous run to end"
    assert hook_note(Ran((SAT, "a"), 4.0), None, "could not start: Permission denied", 10.0) == (
        "--on-saturated ran 6.0 s ago: could not start: Permission denied"
    )
    assert hook_note(Held(ST, 5.0), None, None, 10.0) == "--on-stalled held by --cooldown, 5.0 s left"
    assert Held(ST, 5.0).run is None


def test_every_hook_has_a_flag_named_for_its_verdict() -> None:
    assert HOOK_FLAGS == {"stalled": "--on-stalled", "saturated": "--on-saturated"}
