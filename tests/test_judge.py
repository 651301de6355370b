"""The one judge (judge.py), as tables: what a look means for liveness and readiness, what a change of class
says on the container's log, the health route's silence, the dialect-change reset, and the decisions a look
needs before it is judged (would it be stuck, is a canary due, how two overlapping runs' memories merge,
what report-only excuses). Every rule of judge.py fails a row here when it is removed (mutmut)."""

from __future__ import annotations

import pytest

from stallprobe.detector import Sample, State, Verdict
from stallprobe.engines import LLAMACPP, SGLANG, TRTLLM, VLLM
from stallprobe.errors import ExitCode
from stallprobe.judge import (
    CANARY_AT,
    DEFAULT_CANARY_INTERVAL,
    HEALTH_SILENT_SINCE,
    PREFIX,
    Memory,
    Observation,
    Rules,
    canary_due,
    judge,
    live_class,
    merge,
    report_only_code,
    said,
    serving,
    silent,
    would_be_stalled,
    would_be_stuck,
)

RULES = Rules(window=120, drain_after=30)
BUSY = Sample(4, 100, 50, 10.0)


def seen(sample: Sample, **kwargs: object) -> Observation:
    return Observation(VLLM, {"": sample}, **kwargs)  # type: ignore[arg-type]


def remembered(sample: Sample, stall_since: float | None = None, **kwargs: object) -> Memory:
    return Memory({"": State(sample, stall_since)}, dialect="vllm", **kwargs)  # type: ignore[arg-type]


# --- liveness and readiness of one look: (name, memory, look, ready run, code, line, class said)
LOOKS: list[tuple[str, Memory, Observation, bool, int, str, str]] = [
    (
        "first_look",
        Memory(),
        seen(BUSY),
        False,
        ExitCode.OK,
        "baseline: 4 running, 0 waiting; first run, progress is judged from the next run",
        "alive",
    ),
    (
        "moving",
        remembered(Sample(4, 90, 50, 5.0)),
        seen(BUSY),
        False,
        ExitCode.OK,
        "progressing: 4 running, 0 waiting; +0 prompt and +10 generation tokens in 5.0 s",
        "alive",
    ),
    (
        "frozen_under_the_window",
        remembered(Sample(4, 100, 50, 5.0)),
        seen(BUSY),
        False,
        ExitCode.OK,
        "suspect: 4 running, 0 waiting; no token progress for 5.0 s (window 120 s)",
        "suspect",
    ),
    (
        "frozen_past_the_window",
        remembered(Sample(4, 100, 50, 5.0), stall_since=-200.0),
        seen(BUSY),
        False,
        ExitCode.STALLED,
        "stalled: 4 running, 0 waiting; no token progress for 210 s (window 120 s)",
        "stalled",
    ),
    (
        "paused",
        remembered(Sample(4, 100, 50, 5.0)),
        seen(BUSY.replace(paused="asleep (sleep mode)")),
        False,
        ExitCode.OK,
        "paused: 4 running, 0 waiting; asleep (sleep mode), paused for 0.0 s: not judged until it resumes",
        "paused",
    ),
    (
        "ready_while_moving",
        remembered(Sample(4, 90, 50, 5.0)),
        seen(BUSY, health=""),
        True,
        ExitCode.OK,
        "ready: progressing: 4 running, 0 waiting; +0 prompt and +10 generation tokens in 5.0 s",
        "ready",
    ),
    (
        "drained_past_drain_after",
        remembered(Sample(4, 100, 50, 5.0), stall_since=-25.0),
        seen(BUSY, health=""),
        True,
        ExitCode.STALLED,
        "not ready: stalled: 4 running, 0 waiting; no token progress for 35 s (window 30 s)",
        "not ready",
    ),
    (
        "a_failing_health_route_drains_at_once",
        remembered(Sample(4, 90, 50, 5.0)),
        seen(BUSY, health="health http://e/health: HTTP 503 Service Unavailable"),
        True,
        ExitCode.STALLED,
        "not ready: health http://e/health: HTTP 503 Service Unavailable",
        "not ready",
    ),
    (
        "a_silent_health_route_is_excused",
        remembered(Sample(4, 90, 50, 5.0)),
        seen(BUSY, health="", health_silent="health http://e/health: no complete answer within 3 s"),
        True,
        ExitCode.OK,
        "ready: progressing: 4 running, 0 waiting; +0 prompt and +10 generation tokens in 5.0 s; "
        "health http://e/health: no complete answer within 3 s (for 0.0 s; drained at 30 s)",
        "ready",
    ),
    (
        "a_health_route_silent_for_drain_after_drains",
        remembered(Sample(4, 90, 50, 5.0), facts={HEALTH_SILENT_SINCE: -20.0}),
        seen(BUSY, health="", health_silent="health http://e/health: no complete answer within 3 s"),
        True,
        ExitCode.STALLED,
        "not ready: health http://e/health: no complete answer within 3 s; no answer for 30 s (drain after 30 s)",
        "not ready",
    ),
    (
        "another_engine_answers_now",
        remembered(Sample(4, 90, 50, 5.0)),
        Observation(SGLANG, {"": BUSY}),
        False,
        ExitCode.OK,
        "baseline: 4 running, 0 waiting; now a sglang page, progress is judged from the next run",
        "alive",
    ),
    (
        "a_silent_page",
        remembered(Sample(4, 90, 50, 5.0)),
        silent({"": State(Sample(4, 90, 50, 5.0))}, 10.0, "scrape http://e/metrics: no complete answer within 3 s"),
        False,
        ExitCode.OK,
        "suspect: scrape http://e/metrics: no complete answer within 3 s; nothing answered for 5.0 s (window 120 s)",
        "suspect",
    ),
]


@pytest.mark.parametrize(
    ("memory", "look", "ready", "code", "line", "klass"), [row[1:] for row in LOOKS], ids=[row[0] for row in LOOKS]
)
def test_a_look_is_judged_once_for_liveness_or_readiness(
    memory: Memory, look: Observation, ready: bool, code: int, line: str, klass: str
) -> None:
    assert LOOKS
    judgment = judge(RULES, memory, look, ready=ready)
    assert (judgment.code, judgment.line) == (code, line)
    kind = "readiness" if ready else "liveness"
    assert judgment.memory.said == {kind: klass}
    assert judgment.change == f"{PREFIX}{kind}: {line}"  # nothing was said before: a change
    assert judgment.memory.dialect == (look.dialect.name if look.dialect else memory.dialect)
    assert judgment.seen is look
    # Said once: the same look, judged again where that class was said, says nothing.
    memory = Memory(memory.states, dialect=memory.dialect, facts=memory.facts, said=judgment.memory.said)
    again = judge(RULES, memory, look, ready=ready)
    assert (again.change, again.memory.said) == ("", {kind: klass})


def test_a_dialect_change_judges_against_no_history_and_keeps_the_new_dialect() -> None:
    memory = remembered(Sample(4, 90, 50, 5.0))
    judgment = judge(RULES, memory, Observation(LLAMACPP, {"": BUSY}))
    assert (judgment.previous, judgment.first, judgment.memory.dialect) == (None, "now a llamacpp page", "llamacpp")
    same = judge(RULES, memory, seen(BUSY))
    assert (same.previous, same.first) == (memory.states, "")
    # A page that gave no answer keeps the dialect remembered.
    quiet = judge(RULES, memory, silent(memory.states, 10.0, "no answer"))
    assert quiet.memory.dialect == "vllm"
    assert judge(RULES, Memory(), seen(BUSY), first="state file is from another boot").line == (
        "baseline: 4 running, 0 waiting; state file is from another boot, progress is judged from the next run"
    )


@pytest.mark.parametrize("known", [None, {}, {"": State(Sample(4, 100, 50, 5.0))}], ids=["none", "empty", "unnamed"])
def test_a_look_with_no_answer_is_every_remembered_engine_not_answering(known: dict[str, State] | None) -> None:
    """A run whose look got no answer knew no engine when it started (here: none, or the one engine of an
    unlabelled page), and the other kind of run saved engine "0" meanwhile: the silence is "0"'s, whose
    stall clock goes on, never a new engine "" in its place (the next answer would start "0" again)."""
    frozen = State(Sample(4, 100, 50, 5.0), stall_since=5.0)
    memory = Memory({"0": frozen}, dialect="vllm")
    judgment = judge(RULES, memory, silent(known, 200.0, "scrape http://e/metrics: no complete answer within 3 s"))
    assert list(judgment.memory.states or {}) == ["0"]
    assert judgment.result.engines["0"].stalled_for == 195.0
    assert judgment.result.verdict is Verdict.STALLED
    assert judgment.code == ExitCode.STALLED
    # with nothing remembered, the silence is the look's own engines'
    alone = judge(RULES, Memory(), silent(known, 200.0, "no answer"))
    assert list(alone.memory.states or {}) == (list(known) if known else [""])


def test_a_canary_sent_at_a_look_is_remembered() -> None:
    judgment = judge(RULES, remembered(Sample(0, 90, 50, 5.0)), seen(Sample(0, 90, 50, 10.0), canary_at=9.5))
    assert judgment.memory.facts == {CANARY_AT: 9.5}
    kept = judge(RULES, judgment.memory, seen(Sample(0, 90, 50, 15.0)))
    assert kept.memory.facts == {CANARY_AT: 9.5}


# --- the health route: (name, why it fails, why silent, facts before, serves, why not, note, facts after)
HEALTH: list[tuple[str, str | None, str, dict[str, float], bool, str, str, dict[str, float]]] = [
    ("not_asked", None, "", {HEALTH_SILENT_SINCE: 1.0}, True, "", "", {HEALTH_SILENT_SINCE: 1.0}),
    ("serves", "", "", {HEALTH_SILENT_SINCE: 1.0}, True, "", "", {}),
    ("fails", "HTTP 503", "", {}, False, "HTTP 503", "", {}),
    (
        "silent_first",
        "",
        "no answer",
        {},
        True,
        "",
        "no answer (for 0.0 s; drained at 30 s)",
        {HEALTH_SILENT_SINCE: 10.0},
    ),
    (
        "silent_a_while",
        "",
        "no answer",
        {HEALTH_SILENT_SINCE: -15.0},
        True,
        "",
        "no answer (for 25 s; drained at 30 s)",
        {HEALTH_SILENT_SINCE: -15.0},
    ),
    (
        "silent_for_drain_after",
        "",
        "no answer",
        {HEALTH_SILENT_SINCE: -20.0},
        False,
        "no answer; no answer for 30 s (drain after 30 s)",
        "",
        {HEALTH_SILENT_SINCE: -20.0},
    ),
]


@pytest.mark.parametrize(
    ("health", "quiet", "before", "serves", "why", "note", "after"),
    [row[1:] for row in HEALTH],
    ids=[row[0] for row in HEALTH],
)
def test_a_health_route_that_gives_no_answer_is_excused_until_drain_after(
    health: str | None,
    quiet: str,
    before: dict[str, float],
    serves: bool,
    why: str,
    note: str,
    after: dict[str, float],
) -> None:
    assert HEALTH
    facts = dict(before)
    assert serving(health, quiet, 10.0, facts, 30.0) == (serves, why, note)
    assert facts == after


# --- the class a liveness verdict is told in
@pytest.mark.parametrize(
    ("verdict", "klass"),
    [
        (Verdict.BASELINE, "alive"),
        (Verdict.IDLE, "alive"),
        (Verdict.PROGRESSING, "alive"),
        (Verdict.SATURATED, "alive"),
        (Verdict.PAUSED, "paused"),
        (Verdict.SUSPECT, "suspect"),
        (Verdict.STALLED, "stalled"),
    ],
)
def test_traffic_coming_and_going_is_one_class_alive(verdict: Verdict, klass: str) -> None:
    assert live_class(verdict) == klass


def test_said_writes_a_line_only_when_the_class_changes_and_keeps_the_other_kinds() -> None:
    memory = Memory(said={"readiness": "ready"}, facts={"x": 1.0}, dialect="vllm")
    change, after = said(memory, "liveness", "stalled", "stalled: 4 running")
    assert change == "stallprobe: liveness: stalled: 4 running"
    assert after == Memory(said={"readiness": "ready", "liveness": "stalled"}, facts={"x": 1.0}, dialect="vllm")
    assert said(after, "liveness", "stalled", "stalled: 5 running") == ("", after)
    assert said(after, "readiness", "not ready", "not ready: x")[0] == "stallprobe: readiness: not ready: x"


# --- before the judgment: would the engine be stuck (only then is it asked about its pause)
@pytest.mark.parametrize(
    ("before", "now", "stuck"),
    [
        (None, BUSY, False),  # a baseline
        ({"": State(Sample(4, 90, 50, 5.0))}, BUSY, False),  # moving
        ({"": State(Sample(4, 100, 50, 5.0))}, BUSY, True),  # frozen: suspect
        ({"": State(Sample(4, 100, 50, 5.0), -500.0)}, BUSY, True),  # frozen past the window: stalled
        ({"": State(Sample(0, 100, 50, 5.0))}, Sample(0, 100, 50, 10.0), False),  # idle
    ],
)
def test_only_an_engine_that_would_be_suspect_or_stalled_is_stuck(
    before: dict[str, State] | None, now: Sample, stuck: bool
) -> None:
    assert would_be_stuck(RULES, before, {"": now}) is stuck


@pytest.mark.parametrize(
    ("facts", "pending", "now", "due"),
    [
        ({}, 0.0, 100.0, True),  # never sent
        ({CANARY_AT: 90.0}, 0.0, 100.0, False),  # within its interval
        ({CANARY_AT: 90.0}, 1.0, 100.0, True),  # the last is owed an answer: again at once
        ({CANARY_AT: 100.0 - DEFAULT_CANARY_INTERVAL}, 0.0, 100.0, True),  # its interval has passed
        ({CANARY_AT: 100.0 - DEFAULT_CANARY_INTERVAL + 0.5}, 0.0, 100.0, False),
        ({CANARY_AT: 200.0}, 0.0, 100.0, True),  # a clock that went back
    ],
)
def test_a_canary_is_due_when_none_was_sent_its_interval_passed_or_one_is_owed(
    facts: dict[str, float], pending: float, now: float, due: bool
) -> None:
    memory = Memory({"": State(Sample(0, 1, 1, 50.0, pending=pending))}, facts=facts)
    assert canary_due(Rules(), memory, now) is due


# --- two runs that overlapped (liveness and readiness share a state file)
MINE = Memory(
    {"0": State(Sample(4, 100, 50, 10.0))}, dialect="vllm", facts={CANARY_AT: 1.0}, said={"liveness": "alive"}
)


@pytest.mark.parametrize(
    ("theirs", "samples", "against", "keep"),
    [
        (None, {"0": Sample(4, 110, 50, 20.0)}, MINE, True),  # nothing saved: a first run
        (MINE, {"0": Sample(4, 110, 50, 20.0)}, MINE, True),  # nobody saved since this run read
        (  # theirs is newer (a counter higher): judged against mine, nothing of mine saved
            Memory({"0": State(Sample(4, 120, 50, 15.0))}, said={"readiness": "ready"}),
            {"0": Sample(4, 110, 50, 20.0)},
            Memory(MINE.states, dialect="vllm", facts={CANARY_AT: 1.0}, said={"readiness": "ready"}),
            False,
        ),
        (  # theirs is older: judged against theirs, the fresher history, and saved
            Memory({"0": State(Sample(4, 105, 50, 15.0))}, facts={CANARY_AT: 3.0}, said={"readiness": "ready"}),
            {"0": Sample(4, 110, 50, 20.0)},
            Memory(
                {"0": State(Sample(4, 105, 50, 15.0))},
                dialect="vllm",
                facts={CANARY_AT: 3.0},
                said={"readiness": "ready"},
            ),
            True,
        ),
        (  # theirs equal in counters but later in time: this run's page was served first
            Memory({"0": State(Sample(4, 110, 50, 25.0))}),
            {"0": Sample(4, 110, 50, 20.0)},
            Memory(MINE.states, dialect="vllm", facts={CANARY_AT: 1.0}),
            False,
        ),
        (  # theirs has a counter lower: a restarted engine was seen by this run; this one is newer
            Memory({"0": State(Sample(4, 150, 50, 15.0))}),
            {"0": Sample(4, 10, 50, 20.0)},
            Memory(MINE.states, dialect="vllm", facts={CANARY_AT: 1.0}),
            False,
        ),
        (  # an engine theirs does not know: nothing to compare, judged against theirs
            Memory({"1": State(Sample(1, 1, 1, 15.0))}),
            {"0": Sample(4, 110, 50, 20.0)},
            Memory({"1": State(Sample(1, 1, 1, 15.0))}, dialect="vllm", facts={CANARY_AT: 1.0}),
            True,
        ),
        (  # a sample with no answer is newer by its time alone
            Memory({"0": State(Sample(4, 105, 50, 15.0))}),
            {"0": Sample(0, 0, 0, 20.0, answered=False)},
            Memory({"0": State(Sample(4, 105, 50, 15.0))}, dialect="vllm", facts={CANARY_AT: 1.0}),
            True,
        ),
        (  # ... and older when its time is earlier
            Memory({"0": State(Sample(4, 105, 50, 25.0))}),
            {"0": Sample(0, 0, 0, 20.0, answered=False)},
            Memory(MINE.states, dialect="vllm", facts={CANARY_AT: 1.0}),
            False,
        ),
        (  # newer, but earlier in time than theirs: judged against mine (never a clock going back)
            Memory({"0": State(Sample(4, 105, 50, 25.0))}, dialect="sglang"),
            {"0": Sample(4, 110, 50, 20.0)},
            Memory(MINE.states, dialect="vllm", facts={CANARY_AT: 1.0}),
            True,
        ),
    ],
    ids=[
        "none",
        "unchanged",
        "theirs_newer",
        "theirs_older",
        "theirs_later",
        "restart",
        "new_engine",
        "silent_newer",
        "silent_older",
        "earlier",
    ],
)
def test_two_overlapping_runs_never_replace_a_newer_sample_or_reset_each_others_clock(
    theirs: Memory | None, samples: dict[str, Sample], against: Memory, keep: bool
) -> None:
    assert merge(MINE, theirs, samples) == (against, keep)


def test_the_page_s_facts_keep_the_later_of_each() -> None:
    theirs = Memory(MINE.states, facts={CANARY_AT: 0.5, HEALTH_SILENT_SINCE: 7.0})
    memory, keep = merge(MINE, theirs, {"0": Sample(4, 110, 50, 20.0)})
    assert (memory.facts, keep) == ({CANARY_AT: 1.0, HEALTH_SILENT_SINCE: 7.0}, True)


@pytest.mark.parametrize(
    ("code", "health", "final"),
    [
        (ExitCode.OK, "", ExitCode.OK),
        (ExitCode.OK, "HTTP 503", ExitCode.OK),
        (ExitCode.STALLED, "", ExitCode.OK),  # its own verdict, the engine serving: excused
        (ExitCode.STALLED, "health http://e/health: HTTP 503", ExitCode.SCRAPE),  # what /health fails on
        (ExitCode.STALLED, "health http://e/health: connection refused", ExitCode.SCRAPE),
    ],
)
def test_report_only_excuses_the_probe_s_verdict_never_a_failing_health_route(
    code: int, health: str, final: int
) -> None:
    assert report_only_code(code, health) == final


def test_rules_are_read_from_a_command_s_configuration() -> None:
    class Settings:
        window = 60.0
        drain_after = 10.0
        include_waiting = True

    rules = Rules.of(Settings())
    assert (rules.window, rules.drain_after, rules.include_waiting, rules.saturation) == (60.0, 10.0, True, 1.0)
    assert rules.canary_interval == DEFAULT_CANARY_INTERVAL
    assert repr(rules).startswith("Rules(canary_interval=600.0, drain_after=10.0")


# --- each piece of the judge, as mutants would break it


def test_the_rules_defaults_and_each_one_given() -> None:
    rules = Rules()
    assert (rules.window, rules.saturation, rules.include_waiting, rules.thrash_window) == (120.0, 1.0, None, 600.0)
    assert (rules.fail_thrashing_after, rules.drain_after, rules.canary_interval, rules.window_given) == (
        None,
        30.0,
        600.0,
        True,
    )
    given = Rules(
        window=60, saturation=3, include_waiting=True, thrash_window=90, fail_thrashing_after=120, drain_after=10,
        canary_interval=20, window_given=False,
    )  # fmt: skip
    assert [getattr(given, name) for name in Rules.__slots__] == [20, 10, 120, True, 3, 90, 60, False]


def test_the_rules_know_whether_the_operator_gave_the_window() -> None:
    class Given:
        given = frozenset({"window"})
        window = 60.0

    class Default:
        given = frozenset({"saturation"})
        window = 120.0

    assert Rules.of(Given()).window_given is True
    assert Rules.of(Default()).window_given is False
    assert Rules.of(object()).window_given is False


def test_an_engine_whose_page_cannot_show_a_long_request_brings_its_window_where_none_was_given() -> None:
    default = Rules(window=120, window_given=False, thrash_window=90, drain_after=7)
    assert default.of_engine(None) is default
    assert default.of_engine(VLLM) is default  # no window of its own
    own = default.of_engine(TRTLLM)
    assert (own.window, own.thrash_window, own.drain_after, own.window_given) == (1800.0, 90, 7, False)
    assert default.window == 120  # a copy: the command's rules are left as they were
    given = Rules(window=60, window_given=True)
    assert given.of_engine(TRTLLM) is given


@pytest.mark.parametrize(
    ("rules", "samples", "verdict"),
    [
        (Rules(), [Sample(0, 5, 5, 0.0, 3), Sample(0, 5, 5, 10.0, 3)], Verdict.IDLE),
        (Rules(include_waiting=True), [Sample(0, 5, 5, 0.0, 3), Sample(0, 5, 5, 10.0, 3)], Verdict.SUSPECT),
        (Rules(), [Sample(4, 5, 5, 0.0, 3), Sample(4, 9, 5, 10.0, 3)], Verdict.SATURATED),
        (Rules(saturation=5), [Sample(4, 5, 5, 0.0, 3), Sample(4, 9, 5, 10.0, 3)], Verdict.PROGRESSING),
        (
            Rules(thrash_window=10),
            [Sample(4, 0, 0, 0.0, finished=1), Sample(4, 1, 100, 10.0, finished=1)],
            Verdict.THRASHING,
        ),
        (
            Rules(thrash_window=10, fail_thrashing_after=10),
            [Sample(4, 0, 0, 0.0, finished=1), Sample(4, 1, 100, 10.0, finished=1)],
            Verdict.STALLED,
        ),
    ],
)
def test_every_rule_reaches_the_detector(rules: Rules, samples: list[Sample], verdict: Verdict) -> None:
    first = rules.assess(None, {"": samples[0]})
    assert rules.assess(first.states, {"": samples[1]}).verdict is verdict


def test_a_look_keeps_what_it_was_given() -> None:
    look = Observation(
        VLLM, {"": BUSY}, unanswered="u", note="n", health="h", health_silent="s", canary_at=1.5, about="vllm, model m"
    )
    assert (look.unanswered, look.note, look.health, look.health_silent, look.canary_at, look.about) == (
        "u",
        "n",
        "h",
        "s",
        1.5,
        "vllm, model m",
    )
    bare = Observation(None, {"": BUSY})
    assert (bare.unanswered, bare.note, bare.health, bare.health_silent, bare.canary_at, bare.about) == (
        "",
        "",
        None,
        "",
        None,
        "",
    )
    assert repr(look) == f"Observation('vllm', {{'': {BUSY!r}}}, unanswered='u', note='n')"
    assert repr(bare).startswith("Observation(None, ")


def test_a_silent_look_has_a_sample_without_numbers_for_each_engine_seen_before() -> None:
    assert silent(None, 5.0, "why").samples == {"": Sample(0, 0, 0, 5.0, answered=False)}
    look = silent({"0": State(BUSY), "1": State(BUSY)}, 5.0, "no answer")
    assert (sorted(look.samples), look.unanswered, look.dialect) == (["0", "1"], "no answer", None)
    assert all(sample == Sample(0, 0, 0, 5.0, answered=False) for sample in look.samples.values())


def test_memories_differ_by_their_engines_too() -> None:
    assert Memory({"0": State(BUSY)}) != Memory({"0": State(Sample(4, 101, 50, 10.0))})
    assert Memory({"0": State(BUSY)}) == Memory({"0": State(BUSY)})
    assert Memory() != Memory({})
    assert (Memory() == 3) is False


def test_what_is_said_keeps_the_engines_remembered() -> None:
    memory = remembered(BUSY)
    _, after = said(memory, "liveness", "alive", "x")
    assert after.states == memory.states


def test_a_judgment_holds_the_assessment_the_routing_and_readiness() -> None:
    memory = remembered(Sample(4, 100, 50, 5.0), stall_since=-25.0)
    judgment = judge(RULES, memory, seen(BUSY, health=""), ready=False)
    assert judgment.result.verdict is Verdict.SUSPECT
    assert judgment.routing.verdict is Verdict.STALLED  # the drain window's step
    assert judgment.ready is False
    assert judgment.first == ""
    assert judgment.memory.states == judgment.result.states
    assert judgment.previous == memory.states


def test_the_words_carry_the_note_the_first_run_and_the_engine_s_caveat() -> None:
    note = seen(BUSY, note="the canary was answered in 0.2 s", health="", health_silent="no answer in 3 s")
    ready = judge(RULES, remembered(Sample(4, 90, 50, 5.0)), note, ready=True)
    assert ready.line.endswith("; the canary was answered in 0.2 s; no answer in 3 s (for 0.0 s; drained at 30 s)")
    first = judge(RULES, Memory(), seen(BUSY, health=""), ready=True, first="state file is from another boot")
    assert first.line == (
        "ready: baseline: 4 running, 0 waiting; state file is from another boot, progress is judged from the next run"
    )
    live = judge(RULES, remembered(Sample(4, 90, 50, 5.0)), seen(BUSY, note="n"))
    assert live.line.endswith("; n")
    frozen = Memory({"": State(Sample(4, 100, 50, 5.0), -200.0)}, dialect="trtllm")
    own = Observation(TRTLLM, {"": BUSY})
    rules = Rules(window_given=False)
    for ready_run in (False, True):
        words = judge(rules, frozen, own, ready=ready_run).line
        assert "(window 1800 s)" in words or "(window 30 s)" in words
        assert "trtllm counts tokens only when a request finishes" in words, words
    quiet = judge(rules, frozen, silent(frozen.states, 10.0, "no answer"))
    assert "(window 1800 s)" in quiet.line  # the engine remembered, when the page gave no answer
    silent_ready = judge(rules, frozen, silent(frozen.states, 10.0, "no answer"), ready=True)
    assert silent_ready.line == "not ready: stalled: no answer; nothing answered for 210 s (window 30 s)"


@pytest.mark.parametrize(
    ("before", "now", "ready", "stalled"),
    [
        ({"": State(Sample(4, 100, 50, 5.0), -500.0)}, BUSY, False, True),
        ({"": State(Sample(4, 100, 50, 5.0))}, BUSY, False, False),  # only suspect
        ({"": State(Sample(4, 90, 50, 5.0), -500.0)}, BUSY, False, False),  # it moved
        (None, BUSY, False, False),
        # readiness asks at its own window (drain_after 30 s): frozen for 40 s drains, 5 s does not
        ({"": State(Sample(4, 100, 50, 5.0), -30.0)}, BUSY, True, True),
        ({"": State(Sample(4, 100, 50, 5.0), -30.0)}, BUSY, False, False),
        ({"": State(Sample(4, 100, 50, 5.0))}, BUSY, True, False),
        ({"": State(Sample(4, 90, 50, 5.0), -500.0)}, BUSY, True, False),
    ],
)
def test_only_an_engine_that_would_be_stalled_is_asked_to_confirm(
    before: dict[str, State] | None, now: Sample, ready: bool, stalled: bool
) -> None:
    assert would_be_stalled(RULES, before, {"": now}, ready=ready) is stalled


def test_a_canary_sent_this_very_moment_is_not_due_again() -> None:
    memory = Memory({"": State(Sample(0, 1, 1, 50.0))}, facts={CANARY_AT: 100.0})
    assert canary_due(Rules(), memory, 100.0) is False


@pytest.mark.parametrize(
    ("samples", "theirs", "keep"),
    [
        # an engine theirs does not know, then one older than theirs: theirs is newer
        ({"0": Sample(4, 110, 50, 20.0), "1": Sample(4, 5, 5, 20.0)}, {"1": State(Sample(4, 9, 5, 15.0))}, False),
        # one engine ahead by its counters, the other behind: theirs is newer
        (
            {"0": Sample(4, 110, 50, 20.0), "1": Sample(4, 5, 5, 20.0)},
            {"0": State(Sample(4, 100, 50, 15.0)), "1": State(Sample(4, 9, 5, 15.0))},
            False,
        ),
        # equal generation, a higher prompt: this run's page is newer
        ({"0": Sample(4, 100, 60, 20.0)}, {"0": State(Sample(4, 100, 50, 25.0))}, True),
        # the very same sample: newer or not, nothing is lost
        ({"0": Sample(4, 100, 50, 20.0)}, {"0": State(Sample(4, 100, 50, 20.0))}, True),
    ],
)
def test_which_of_two_overlapping_pages_is_newer(
    samples: dict[str, Sample], theirs: dict[str, State], keep: bool
) -> None:
    mine = Memory({"9": State(Sample(1, 1, 1, 1.0))})
    assert merge(mine, Memory(theirs), samples)[1] is keep


def test_a_sample_at_theirs_time_is_judged_against_theirs() -> None:
    theirs = Memory({"0": State(Sample(4, 100, 50, 20.0))}, said={"readiness": "ready"})
    memory, keep = merge(MINE, theirs, {"0": Sample(4, 110, 50, 20.0)})
    assert (memory.states, keep) == (theirs.states, True)
