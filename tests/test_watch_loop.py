"""watch's loop (watch/loop.py) in-process: the looks of many endpoints performed on one thread.

Real servers on loopback answer (tests/stubengine.py, conftest.RawServer); the loop's clock is fake and
moves only when the loop would wait and every socket it still has open is one whose server will never
answer (or none is open), so deadlines pass without anyone sleeping. What a look asks and concludes is
compared with the probe's blocking path (observe.observe) on the same engine.
"""

from __future__ import annotations

import re
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from conftest import FakeClock, JumpingSelector, RawServer, refused_url, vllm_page
from stallprobe.detector import Sample, State
from stallprobe.errors import ScrapeError
from stallprobe.judge import Memory
from stallprobe.observe import Observation, look, observe
from stallprobe.watch.loop import Flight, Flights
from stallprobe.watch.poll import Watch, WatchConfig
from stubengine import StubEngine

WAIT = 60.0  # the bound on any real wait for a socket to become ready

Behave = Callable[[socket.socket, threading.Event], None]


class Hung:
    """A server that reads each request and never answers; `held` counts the connections it holds."""

    def __init__(self, raw_server: Callable[[Behave], RawServer]) -> None:
        self.held = 0
        self.lock = threading.Lock()
        self.server = raw_server(self.hold)
        self.url = self.server.url

    def hold(self, conn: socket.socket, stop: threading.Event) -> None:
        with self.lock:
            self.held += 1
        stop.wait(WAIT)

    def count(self) -> int:
        with self.lock:
            return self.held


@pytest.fixture
def engines() -> Iterator[Callable[[], StubEngine]]:
    started: list[StubEngine] = []

    def start() -> StubEngine:
        engine = StubEngine(running=4, generation=1000, prompt=400)
        engine.set(generation_step=5)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.close()


def whole_answer(page: bytes) -> bytes:
    """An HTTP answer carrying `page`, its length given."""
    return b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page)


def stalls_after(part: bytes, sent: threading.Event) -> Behave:
    """A server's behaviour: send `part` of an answer, say so, and send nothing more."""

    def stall(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(part)
        sent.set()
        stop.wait(WAIT)

    return stall


def drive(steps: object, looks: Flights, until: float = 10.0) -> Observation:
    """One look through the loop, to its end."""
    one = looks.start("u", steps)  # type: ignore[arg-type]
    looks.run(looks.clock() + until)
    assert one.done
    if isinstance(one.outcome, Exception):
        raise one.outcome
    assert isinstance(one.outcome, Observation)
    return one.outcome


def test_a_hung_endpoint_costs_the_poll_its_own_deadline_and_no_more(
    engines: Callable[[], StubEngine], raw_server: Callable[[Behave], RawServer]
) -> None:
    hung = Hung(raw_server)
    moving = [engines() for _ in range(3)]
    clock = FakeClock()
    selector = JumpingSelector(clock, hung.count)
    urls = [engine.url for engine in moving] + [hung.url]
    watch = Watch(WatchConfig(urls, timeout=2.0), {}, flights=Flights(clock, selector=selector))
    for verdicts in (["baseline"] * 3 + ["suspect"], ["progressing"] * 3 + ["suspect"]):
        before = clock.now
        rows = watch.poll()
        assert [row.verdict for row in rows] == verdicts
        # The others were judged in the same poll; the poll took the hung one's deadline: --timeout.
        assert clock.now - before == pytest.approx(2.0)
        assert rows[3].message.startswith(
            f"suspect: scrape {hung.url}: no complete answer within 2 s; nothing answered"
        )


def test_an_answer_that_came_while_the_loop_was_busy_is_in_time(raw_server: Callable[[Behave], RawServer]) -> None:
    """The loop reads every socket that holds an answer before it gives one up at its deadline."""
    page = vllm_page(3, 10, 20)

    def answer(conn: socket.socket, stop: threading.Event) -> None:  # the whole answer in one write
        conn.sendall(whole_answer(page))

    url = raw_server(answer).url
    clock = FakeClock()
    selector = JumpingSelector(clock, late=2.5)  # the answer is there, but the loop looks only 2.5 s later
    watch = Watch(WatchConfig([url], timeout=2.0), {}, flights=Flights(clock, selector=selector))
    (row,) = watch.poll()
    assert selector.jumped == 2.5
    assert row.verdict == "baseline", row.message


def test_a_poll_the_watch_itself_overran_says_so_and_the_answer_counts_at_the_next(
    raw_server: Callable[[Behave], RawServer],
) -> None:
    """The loop busy past the poll's own deadline (a starved CPU): the endpoint is still waiting, with no
    word of DNS; the next poll reads the answer that came meanwhile and starts no second look."""
    page = vllm_page(3, 10, 20)

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(whole_answer(page))

    server = raw_server(answer)
    clock = FakeClock()
    selector = JumpingSelector(clock, late=10.0)  # past the exchange's deadline and the poll's (2 + 1 + 1 s)
    watch = Watch(WatchConfig([server.url], timeout=2.0), {}, flights=Flights(clock, selector=selector))
    (row,) = watch.poll()
    assert row.verdict == "suspect"
    assert "still waiting after 10 s;" in row.message
    assert "resolving" not in row.message
    (row,) = watch.poll()
    assert row.verdict == "baseline", row.message


def test_a_refused_endpoint_reads_as_the_probes_line() -> None:
    url = refused_url()
    clock = FakeClock()
    watch = Watch(WatchConfig([url], timeout=2.0), {}, flights=Flights(clock, selector=JumpingSelector(clock)))
    (row,) = watch.poll()
    config = WatchConfig([url], timeout=2.0)
    with pytest.raises(ScrapeError) as probe:
        observe(url, config, Memory(), time.monotonic)
    assert row.verdict == "unreachable"
    assert row.message == f"unreachable: {probe.value}"
    assert "connection refused (is the engine up on 127.0.0.1:" in row.message


def frozen(running: float = 4) -> dict[str, State]:
    """A history in which the engine was busy at the same counters a while ago: it would be suspect."""
    from stallprobe.detector import assess_engines

    sample = Sample(running, 1000, 400, 0.0)
    return assess_engines(None, {"": sample}, 30.0, 1.0).states


def idle_behind_a_login(engine: StubEngine) -> None:
    engine.set(running=0, generation_step=0)
    engine.route("/v1/models", b"<html>")


# (what the stub does, WatchConfig flags, the history): each asks something different beyond the page.
SITUATIONS: dict[str, tuple[Callable[[StubEngine], None], dict[str, object], Callable[[], dict[str, State] | None]]] = {
    "moving": (lambda e: None, {}, lambda: None),
    "frozen, /is_paused missing": (lambda e: e.set(generation_step=0), {}, frozen),
    "paused": (lambda e: e.pause(), {}, frozen),
    "asleep": (lambda e: e.sleep(), {}, frozen),
    "idle, canary answered": (lambda e: e.set(running=0, generation_step=0), {"canary": True}, lambda: frozen(0)),
    "idle, canary wrong": (idle_behind_a_login, {"canary": True}, lambda: frozen(0)),
    "not a metrics page": (lambda e: e.route("/metrics", b"<html>login</html>"), {}, lambda: None),
    "HTTP 500": (lambda e: e.route("/metrics", b"boom", 500), {}, lambda: None),
}


def outcome(steps: Callable[[], Observation], base: str) -> str:
    """What a look concluded, but the sample times (the two drivers' clocks differ) and the engine's port."""
    try:
        seen = steps()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".replace(base, "BASE")
    samples = {name: repr(sample).replace(f"t={sample.t!r}", "t=T") for name, sample in seen.samples.items()}
    name = seen.dialect.name if seen.dialect else None
    note = re.sub(r"answered in [0-9.]+ s", "answered in S s", seen.note)  # each driver's own clock
    return f"{name} {samples} silence={seen.unanswered!r} note={note!r} health={seen.health!r}".replace(base, "BASE")


def asked(situation: str, *, blocking: bool) -> tuple[str, list[tuple[str, str]]]:
    """What one look at a fresh engine in `situation` concluded, and what it asked the engine, in order:
    performed blocking (the probe's observe) or through the loop."""
    make, flags, history = SITUATIONS[situation]
    with StubEngine(running=4, generation=1000, prompt=400) as engine:
        make(engine)
        config = WatchConfig([engine.url], timeout=2.0, **flags)
        previous = history()
        if blocking:
            got = outcome(
                lambda: observe(engine.url, config, Memory(previous), time.monotonic, readiness=True), engine.base
            )
        else:
            clock = FakeClock()
            looks = Flights(clock, selector=JumpingSelector(clock))
            steps = look(engine.url, config, Memory(previous), readiness=True)
            got = outcome(lambda: drive(steps, looks), engine.base)
        return got, [(seen.method, seen.path) for seen in engine.requests]


@pytest.mark.parametrize("situation", sorted(SITUATIONS))
def test_a_look_through_the_loop_asks_and_concludes_as_the_probe(situation: str) -> None:
    told = [asked(situation, blocking=True), asked(situation, blocking=False)]
    assert told[0] == told[1]
    assert told[0][1]  # the stub was asked: the comparison is of something


def test_a_lookup_that_outlives_the_poll_leaves_the_endpoint_pending_with_one_lookup_at_a_time(
    engines: Callable[[], StubEngine],
) -> None:
    engine = engines()
    gate = threading.Event()
    lookups: list[bytes] = []

    def resolve(host: bytes, port: int) -> list[tuple[int, int, int, tuple[object, ...]]]:
        lookups.append(host)
        assert gate.wait(WAIT)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, ("127.0.0.1", port))]

    url = f"http://engine.invalid:{engine.port}/metrics"
    clock = FakeClock()
    looks = Flights(clock, selector=JumpingSelector(clock), resolve=resolve)
    watch = Watch(WatchConfig([url], timeout=2.0), {}, flights=looks)
    for _ in range(2):
        (row,) = watch.poll()
        assert row.verdict == "suspect"
        assert "still waiting after" in row.message
        assert "(is its host name resolving?)" in row.message
    assert lookups == [b"engine.invalid"]  # no second lookup while the first has not returned
    gate.set()
    bound = time.monotonic() + WAIT
    while not looks.resolved and time.monotonic() < bound:  # the resolver thread hands its answer over
        threading.Event().wait(0.01)
    (row,) = watch.poll()  # the lookup came back after the exchange's deadline, as exchange() would say
    assert row.message.startswith(f"suspect: scrape {url}: no complete answer within 2 s")
    (row,) = watch.poll()  # a new look, its lookup answered at once
    assert row.verdict == "baseline", row.message
    assert lookups == [b"engine.invalid"] * 2


def test_more_endpoints_than_descriptors_wait_their_turn(engines: Callable[[], StubEngine]) -> None:
    moving = [engines() for _ in range(5)]
    clock = FakeClock()
    selector = JumpingSelector(clock)
    looks = Flights(clock, selector=selector, limit=2)
    watch = Watch(WatchConfig([engine.url for engine in moving], timeout=2.0), {}, flights=looks)
    assert [row.verdict for row in watch.poll()] == ["baseline"] * 5
    assert [row.verdict for row in watch.poll()] == ["progressing"] * 5
    assert selector.most_open == 2


def test_a_host_whose_first_address_refuses_is_reached_at_the_next(engines: Callable[[], StubEngine]) -> None:
    engine = engines()
    dead = int(refused_url().split(":")[2].split("/")[0])

    def resolve(host: bytes, port: int) -> list[tuple[int, int, int, tuple[object, ...]]]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, ("127.0.0.1", dead)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, ("127.0.0.1", port)),
        ]

    clock = FakeClock()
    looks = Flights(clock, selector=JumpingSelector(clock), resolve=resolve)
    url = f"http://engine.invalid:{engine.port}/metrics"
    watch = Watch(WatchConfig([url], timeout=2.0), {}, flights=looks)
    (row,) = watch.poll()
    assert row.verdict == "baseline", row.message


# A page far larger than a waiting socket's receive buffer: its engine can hand the kernel only the first
# few KB until its answer is read (comment lines pad it, as a real page's HELP texts do).
BIG_PAGE = vllm_page(3, 10, 20) + b"".join(b"# padding line %06d of a large page\n" % n for n in range(8000))


class Readers(Flights):
    """The loop, noting how many answers it reads at once and each socket's receive buffer before and
    after it becomes a reader."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.most = 0
        self.buffers: list[tuple[int, int]] = []

    def _read(self, exchange: object) -> None:
        sock = exchange.sock  # type: ignore[attr-defined]
        before = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        super()._read(exchange)  # type: ignore[arg-type]
        self.buffers.append((before, sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)))
        self.most = max(self.most, self.reading)


class Halves(selectors.DefaultSelector):
    """Hands the loop the first answers only once `answers` are ready to read together; and whenever
    nothing is ready, lets the servers send the rest of their pages (`rest`)."""

    def __init__(self, answers: int, rest: threading.Event) -> None:
        super().__init__()
        self.answers = answers
        self.rest = rest

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        bound = time.monotonic() + WAIT
        while time.monotonic() < bound:
            events = super().select(0.01)
            reads = sum(1 for key, mask in events if mask & selectors.EVENT_READ and key.data)
            if self.answers and reads:  # requests go out at once; answers are held back until all are in
                if reads < self.answers:
                    continue
                self.answers = 0
            if events:
                return events
            self.rest.set()
        raise AssertionError("no socket became ready")


def test_at_most_readers_answers_are_read_at_once_and_every_look_ends(
    raw_server: Callable[[Behave], RawServer],
) -> None:
    """Every request goes out at once; six answers ready together are read two at a time: the others
    wait, each socket holding a few KB in the kernel until its turn, then given its full buffer. (Each
    server sends the first half of its page, and the rest only once the loop has nothing to read.)"""
    rest = threading.Event()
    answer = whole_answer(BIG_PAGE)

    def halves(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(answer[: len(answer) // 2])
        rest.wait(WAIT)
        conn.sendall(answer[len(answer) // 2 :])

    servers = [raw_server(halves) for _ in range(6)]
    clock = FakeClock()  # never moves: no deadline passes
    looks = Readers(clock, selector=Halves(6, rest), readers=2)
    config = WatchConfig([server.url for server in servers], timeout=2.0)
    started = [looks.start(server.url, look(server.url, config, Memory())) for server in servers]
    looks.run(clock.now + 10.0)
    assert all(one.done and isinstance(one.outcome, Observation) for one in started), [one.outcome for one in started]
    assert all(not one.outcome.unanswered for one in started if isinstance(one.outcome, Observation))
    assert looks.most == 2
    assert len(looks.buffers) == 6
    assert all(before <= 16384 < after for before, after in looks.buffers), looks.buffers
    assert looks.reading == 0
    assert not looks.turns


def test_an_answer_waiting_for_a_reader_is_in_time_past_its_deadline(
    raw_server: Callable[[Behave], RawServer],
) -> None:
    """One reader, held by an answer that stalls halfway; another endpoint answers whole within its 1 s
    deadline but must wait its turn. It is not given up at its deadline (it came in time): when the
    stalled one times out at its own 5 s, the waiting one is read, and its look ends with the page."""
    sent = threading.Event()

    def whole(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(whole_answer(BIG_PAGE))

    slow, fast = raw_server(stalls_after(whole_answer(BIG_PAGE)[:2000], sent)), raw_server(whole)
    clock = FakeClock()
    looks = Flights(clock, selector=JumpingSelector(clock, lambda: int(sent.is_set())), readers=1)
    stalled = looks.start(slow.url, look(slow.url, WatchConfig([slow.url], timeout=5.0), Memory()))
    looks.run(clock.now + 0.001)  # the stalled answer's first bytes are read: it holds the one reader
    assert sent.is_set()
    assert not stalled.done
    waiting = looks.start(fast.url, look(fast.url, WatchConfig([fast.url], timeout=1.0), Memory()))
    looks.run(clock.now + 10.0)
    assert isinstance(stalled.outcome, Observation)
    assert stalled.outcome.unanswered == f"scrape {slow.url}: no complete answer within 5 s"
    assert isinstance(waiting.outcome, Observation)
    assert not waiting.outcome.unanswered, waiting.outcome
    assert [sample.running for sample in waiting.outcome.samples.values()] == [3]
    assert clock.now >= stalled.started + 5.0 > waiting.started + 1.0


def test_an_answer_read_in_its_turn_has_until_its_later_deadline(raw_server: Callable[[Behave], RawServer]) -> None:
    """An answer that waited for the reader, and whose turn came 0.5 s before its own deadline, gets the
    turn's second to finish; when it stalls halfway, it is given up then (2.5 s), not at its first
    deadline (2 s)."""
    sent = threading.Event()
    stall = stalls_after(whole_answer(BIG_PAGE)[:2000], sent)
    holder, late = raw_server(stall), raw_server(stall)
    clock = FakeClock()
    begun = clock.now
    turn: list[Flight] = []

    def silent() -> int:  # the holder once it stalled; the other once its turn came and it read its half
        exchange = turn[0].exchange if turn else None
        return int(sent.is_set()) + int(exchange is not None and bool(exchange.reading.data))

    looks = Flights(clock, selector=JumpingSelector(clock, silent), readers=1)
    held = looks.start(holder.url, look(holder.url, WatchConfig([holder.url], timeout=1.5), Memory()))
    looks.run(clock.now + 0.001)  # its first bytes are read: it holds the one reader
    assert not held.done
    turn.append(looks.start(late.url, look(late.url, WatchConfig([late.url], timeout=2.0), Memory())))
    looks.run(clock.now + 10.0)
    assert isinstance(held.outcome, Observation)
    assert held.outcome.unanswered == f"scrape {holder.url}: no complete answer within 1.5 s"
    outcome = turn[0].outcome
    assert isinstance(outcome, Observation)
    assert outcome.unanswered == f"scrape {late.url}: no complete answer within 2 s"
    # Given up one second after its turn came (at 1.5 s), not at its own first deadline.
    assert [sample.t - begun for sample in outcome.samples.values()] == [pytest.approx(2.5)]
