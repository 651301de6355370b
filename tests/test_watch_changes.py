"""What `stallprobe watch` writes when piped: a line for each engine whose verdict or readiness changed
(and for each engine at its first poll), and one summary line a poll; with --every, --once or --json,
every engine at every poll, as before.

Which rows are told of is a pure function of the last poll's memory and this poll's rows (view.changes),
tested as a table. The watch's own polls run on a fake clock (Flights takes one) against real engines on
loopback, so that a wedge becomes suspect, not ready and stalled without anyone sleeping; the command's
own loop runs once, piped, in this process on a fake clock too (conftest.WatchOnFakeClock), for the wiring.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator

import pytest

from conftest import FakeClock, WatchOnFakeClock, refused_url
from stallprobe.watch.loop import Flights
from stallprobe.watch.poll import Row, Watch, WatchConfig
from stallprobe.watch.view import Output, changes, line, row_json
from stubengine import StubEngine

A, B, C = (f"http://10.0.0.{i}:8000/metrics" for i in (1, 2, 3))

# A row as (url, engine shown, verdict, ready); what is told of it as (url, engine shown, what it was).
Said = tuple[str, str | None, str, bool]
Told = tuple[str, str | None, str]

# (what it shows, the polls, what each poll tells of)
SCENARIOS: list[tuple[str, list[list[Said]], list[list[Told]]]] = [
    (
        "the first poll tells of every engine, with nothing before",
        [[(A, None, "baseline", True), (B, "0", "baseline", True), (B, "1", "idle", True), (C, None, "error", False)]],
        [[(A, None, ""), (B, "0", ""), (B, "1", ""), (C, None, "")]],
    ),
    (
        "a steady state tells of nothing",
        [[(A, None, "progressing", True)], [(A, None, "progressing", True)], [(A, None, "progressing", True)]],
        [[(A, None, "")], [], []],
    ),
    (
        "a verdict that changes its class is told once, with the class before",
        [
            [(A, None, "progressing", True), (B, None, "idle", True)],
            [(A, None, "suspect", True), (B, None, "idle", True)],
        ],
        [[(A, None, ""), (B, None, "")], [(A, None, "alive")]],
    ),
    (
        "traffic coming and going (idle, progressing, saturated: alive) tells of nothing, as on the probe's log",
        [[(A, None, "idle", True)], [(A, None, "progressing", True)], [(A, None, "saturated", True)]],
        [[(A, None, "")], [], []],
    ),
    (
        "readiness that changes alone is told, with the readiness before",
        [[(A, None, "suspect", True)], [(A, None, "suspect", False)], [(A, None, "suspect", True)]],
        [[(A, None, "")], [(A, None, "ready")], [(A, None, "not ready")]],
    ),
    (
        "both at once: one line",
        [[(A, None, "suspect", True)], [(A, None, "stalled", False)], [(A, None, "progressing", True)]],
        [[(A, None, "")], [(A, None, "suspect, ready")], [(A, None, "stalled, not ready")]],
    ),
    (
        "each engine of a page is its own",
        [
            [(B, "0", "progressing", True), (B, "1", "progressing", True)],
            [(B, "0", "stalled", False), (B, "1", "progressing", False)],
        ],
        [[(B, "0", ""), (B, "1", "")], [(B, "0", "alive, ready"), (B, "1", "ready")]],
    ),
    (
        "a one-engine page that cannot be read, then can, is one engine throughout",
        [[(A, None, "progressing", True)], [(A, None, "unreachable", False)], [(A, None, "progressing", True)]],
        [[(A, None, "")], [(A, None, "alive, ready")], [(A, None, "unreachable, not ready")]],
    ),
    (
        "a page of engines that cannot be read was the worst of them; read again, each was the endpoint",
        [
            [(B, "0", "stalled", False), (B, "1", "progressing", False)],
            [(B, None, "unreachable", False)],
            [(B, "0", "stalled", False), (B, "1", "progressing", False)],
        ],
        [[(B, "0", ""), (B, "1", "")], [(B, None, "stalled")], [(B, "0", "unreachable"), (B, "1", "unreachable")]],
    ),
    (
        "an engine new to a page is told of, even when it is like the others",
        [[(B, "0", "progressing", True)], [(B, "0", "progressing", True), (B, "1", "progressing", True)]],
        [[(B, "0", "")], [(B, "1", "")]],
    ),
    (
        "an engine gone from its page is not told of",
        [[(B, "0", "idle", True), (B, "1", "idle", True)], [(B, "0", "idle", True)]],
        [[(B, "0", ""), (B, "1", "")], []],
    ),
    (
        "an endpoint's verdicts change like an engine's",
        [[(C, None, "error", False)], [(C, None, "unreachable", False)], [(C, None, "unreachable", False)]],
        [[(C, None, "")], [(C, None, "error")], []],
    ),
]


def row(said: Said) -> Row:
    url, engine, verdict, ready = said
    made = Row(url, engine or "", verdict, 0, f"{verdict}: 4 running, 0 waiting", engine=engine)
    made.ready = ready
    return made


@pytest.mark.parametrize(("polls", "expected"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_what_each_poll_tells_of(polls: list[list[Said]], expected: list[list[Told]]) -> None:
    assert SCENARIOS
    seen: dict[str, dict[str | None, tuple[str, bool]]] = {}
    told = []
    for poll in polls:
        seen, said = changes(seen, [row(one) for one in poll])
        told.append([(one.url, one.engine, was) for one, was in said])
    assert told == expected


def shown(output: Output, *polls: list[Row], took: float = 0.8125) -> list[list[str]]:
    """What `output` writes for each poll, as lines."""
    stream = output.stream
    assert isinstance(stream, io.StringIO)
    written = []
    for rows in polls:
        at = stream.tell()
        output.show(rows, took)
        written.append(stream.getvalue()[at:].splitlines())
    return written


def pool_rows(b_verdict: str = "progressing", b_ready: bool = True) -> list[Row]:
    a = Row(A, "", "progressing", 0, "progressing: 4 running, 0 waiting; +0 prompt and +25 generation tokens in 5.0 s")
    b = Row(B, "", b_verdict, 1 if b_verdict == "stalled" else 0, f"{b_verdict}: 21 running, 0 waiting; ...")
    refused = f"unreachable: scrape {C}: connection refused (is the engine up on 10.0.0.3:8000?)"
    c = Row(C, "", "unreachable", 3, refused)
    a.ready, b.ready, c.ready = True, b_ready, False
    b.held_for = 5.0
    return [a, b, c]


def test_piped_a_poll_tells_what_changed_then_sums_up() -> None:
    output = Output(WatchConfig([A, B, C]), io.StringIO())
    stalled = pool_rows("stalled", b_ready=False)
    stalled[1].hook = "--on-stalled (pid 4242) running for 0.0 s"
    first, steady, wedged, again = shown(output, pool_rows(), pool_rows(), stalled, pool_rows("stalled", False))
    assert first == [
        f"{A}: progressing: 4 running, 0 waiting; +0 prompt and +25 generation tokens in 5.0 s",
        f"{B}: progressing: 21 running, 0 waiting; ...",
        f"{C}: unreachable: scrape {C}: connection refused (is the engine up on 10.0.0.3:8000?); not ready",
        "poll: 3 engines: 1 unreachable, 2 progressing; 1 not ready; 812 ms",
    ]
    assert steady == ["poll: 3 engines: 1 unreachable, 2 progressing; 1 not ready; 812 ms"]
    assert wedged == [
        f"{B}: stalled: 21 running, 0 waiting; ...; not ready; --on-stalled (pid 4242) running for 0.0 s"
        " (was alive, ready)",
        "poll: 3 engines: 1 stalled, 1 unreachable, 1 progressing; 2 not ready; 812 ms",
    ]
    assert again == ["poll: 3 engines: 1 stalled, 1 unreachable, 1 progressing; 2 not ready; 812 ms"]


def test_an_engine_of_a_page_is_named_on_its_line() -> None:
    output = Output(WatchConfig([B]), io.StringIO())
    one = Row(B, "1", "idle", 0, "idle: 0 running, 0 waiting", engine="1")
    one.ready = True
    ((said, summary),) = shown(output, [one], took=0.0004)
    assert said == f"{B} engine 1: idle: 0 running, 0 waiting"
    assert summary == "poll: 1 engines: 1 idle; 0 not ready; 0 ms"


@pytest.mark.parametrize("flag", ["every", "once"])
def test_every_and_once_write_every_engine_at_every_poll_as_before(flag: str) -> None:
    output = Output(WatchConfig([A, B, C], **{flag: True}), io.StringIO())
    polls = [pool_rows(), pool_rows(), pool_rows("suspect")]
    written = shown(output, *polls)
    assert written == [[line(one) for one in rows] for rows in polls]
    assert written[1][1] == f"{B}: progressing: 21 running, 0 waiting; ...; held 5.0 s"


def test_json_writes_an_object_per_engine_per_poll_as_before() -> None:
    output = Output(WatchConfig([A, B, C], json=True), io.StringIO())
    polls = [pool_rows(), pool_rows()]
    written = shown(output, *polls)
    assert [[json.loads(text) for text in lines] for lines in written] == [[row_json(one) for one in p] for p in polls]


# --- the watch's own polls, on a fake clock


@pytest.fixture
def engines() -> Iterator[tuple[StubEngine, StubEngine]]:
    moving, wedging = (StubEngine(running=4, generation=1000, prompt=400) for _ in range(2))
    for engine in (moving, wedging):
        engine.set(4, generation_step=5)
    yield moving, wedging
    moving.close()
    wedging.close()


def test_a_wedge_is_told_as_it_becomes_suspect_not_ready_and_stalled(engines: tuple[StubEngine, StubEngine]) -> None:
    """Polls every 5 s of the fake clock, --drain-after 10, --window 20: each change is one line, the
    steady polls between them only their summary."""
    moving, wedging = engines
    clock = FakeClock()
    config = WatchConfig([moving.url, wedging.url], window=20.0, drain_after=10.0, timeout=2.0)
    watch = Watch(config, {}, flights=Flights(clock))
    output = Output(config, io.StringIO())

    def poll() -> list[str]:
        started = clock()
        rows = watch.poll()
        (written,) = shown(output, rows, took=clock() - started)
        clock.now += 5.0
        return written

    first, judged, steady = poll(), poll(), poll()
    assert [text.split("; ")[:2] for text in first[:2]] == [
        [f"{url}: baseline: 4 running, 0 waiting", "first poll, progress is judged from the next run"]
        for url in (moving.url, wedging.url)
    ]
    assert first[2] == "poll: 2 engines: 2 baseline; 0 not ready; 0 ms"
    assert judged == ["poll: 2 engines: 2 progressing; 0 not ready; 0 ms"]  # baseline to progressing: alive both
    assert steady == judged

    wedging.set(21, generation_step=0)  # busy, and nothing moves from now on
    polls = [poll() for _ in range(6)]  # 30 s of the fake clock: past the drain window and the window
    told = [text for written in polls for text in written[:-1]]
    assert [re.sub(r"^(\S+): (\w+): .*?(; not ready)? \(was (.*)\)$", r"\1 \2\3 was \4", text) for text in told] == [
        f"{wedging.url} suspect was alive",
        f"{wedging.url} suspect; not ready was ready",
        f"{wedging.url} stalled; not ready was suspect",
    ]
    assert polls[-1] == ["poll: 2 engines: 1 stalled, 1 progressing; 1 not ready; 0 ms"]
    assert sum(len(written) == 1 for written in polls) == 3  # the polls that changed nothing: their summary only


# --- the command, piped


def test_the_command_piped_tells_changes_and_a_summary_per_poll(
    engines: tuple[StubEngine, StubEngine], fake_watch: WatchOnFakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command's loop (cli.main, in this process, on a fake clock): its stdout not a terminal."""
    moving, wedging = engines
    wedging.set(21, generation_step=0)
    dead = refused_url()
    # Twelve polls 0.2 s apart: the wedge is stalled at the sixth (--window 1), and stays so.
    code = fake_watch.run("--interval", "0.2", "--window", "1", moving.url, wedging.url, dead, polls=12)
    assert code == 0
    out = capsys.readouterr()
    assert out.err == ""
    lines = out.out.splitlines()
    summary = re.compile(r"poll: 3 engines: [a-z0-9 ,]+; \d not ready; 0 ms")
    for text in lines:
        assert summary.fullmatch(text) or text.startswith((f"{moving.url}: ", f"{wedging.url}: ", f"{dead}: "))
    assert sum(bool(summary.fullmatch(text)) for text in lines) == 12
    # The first poll tells of every endpoint; each later verdict once; a steady state nothing but its summary.
    assert [text.split(": ")[1] for text in lines[:3]] == ["baseline", "baseline", "unreachable"]
    assert [text for text in lines if text.startswith(f"{dead}: ")] == [lines[2]]
    told = [text.split(": ")[1] for text in lines if text.startswith(f"{wedging.url}: ")]
    assert told == ["baseline", "suspect", "stalled"]
    stalled_at = next(i for i, text in enumerate(lines) if text.startswith(f"{wedging.url}: stalled: "))
    assert len([text for text in lines[stalled_at + 1 :] if summary.fullmatch(text)]) >= 4
    assert all(summary.fullmatch(text) for text in lines[stalled_at + 1 :])
    assert "held" not in "\n".join(lines)
