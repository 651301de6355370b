"""`watch --agent`: HAProxy's agent check answered by the real command over stub engines, one line per
connection; what each answer is (a table over agent_line, the one function that words it); and the
agent's bounds (long lines, binary, no newline, silent clients, a flood) never blocking the polling nor
the other clients. HAProxy itself reading these answers is tests/test_haproxy.py's."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from stallprobe.watch.agent import CLIENT_TIMEOUT, MAX_CLIENTS, MAX_LINE, agent_line, identities
from stallprobe.watch.serve import Readiness
from stubengine import StubEngine

WAIT = 60.0  # the bound on any wait for an eventual state
DRAIN_AFTER = 1.5  # long enough beside --interval 0.2 that a first poll's "ready" is held for a while


class Agent:
    """`stallprobe watch --agent 127.0.0.1:0 ...` in the background, and questions to it as HAProxy asks."""

    def __init__(self, *urls: str, more: tuple[str, ...] = ()) -> None:
        command = [sys.executable, "-m", "stallprobe", "watch", "--json", "--agent", "127.0.0.1:0", *more]
        command += ["--interval", "0.2", "--window", "30", "--drain-after", str(DRAIN_AFTER), "--timeout", "1"]
        self.process = subprocess.Popen([*command, *urls], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.process.stderr is not None
        self.lines = [self.process.stderr.readline()]
        if more:
            self.lines.append(self.process.stderr.readline())
        said = "stallprobe watch: answering HAProxy's agent checks on 127.0.0.1:"
        line = next((line for line in self.lines if line.startswith(said)), "")
        assert line, self.lines
        self.port = int(line.rsplit(":", 1)[1])

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=CLIENT_TIMEOUT + WAIT)

    def ask(self, data: bytes, *, end: bool = False) -> str:
        """Send `data` (then the end of the stream, with `end`); the whole answer, up to the agent's close."""
        with self.connect() as sock:
            sock.sendall(data)
            if end:
                sock.shutdown(socket.SHUT_WR)
            return read_all(sock)

    def until(self, what: str, name: str, check: object) -> str:
        """Ask about `name` until `check(answer)` holds; the answer."""
        deadline = time.monotonic() + WAIT
        while True:
            answer = self.ask(f"{name}\n".encode())
            if callable(check) and check(answer):
                return answer
            assert time.monotonic() < deadline, f"never: {what} (last: {answer!r})"
            time.sleep(0.05)  # bounded poll of an eventual state, not time made to pass

    def close(self) -> str:
        self.process.terminate()
        _, errors = self.process.communicate(timeout=10)
        return errors


def read_all(sock: socket.socket) -> str:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data.decode()


def name(engine: StubEngine) -> str:
    return f"127.0.0.1:{engine.port}"


@pytest.fixture
def engines() -> Iterator[tuple[StubEngine, StubEngine]]:
    moving, other = StubEngine(running=2), StubEngine(running=3)
    for engine in (moving, other):
        engine.set(generation_step=5)
    try:
        yield moving, other
    finally:
        moving.close()
        other.close()


@pytest.fixture
def agent(engines: tuple[StubEngine, StubEngine]) -> Iterator[Agent]:
    watching = Agent(*(engine.url for engine in engines))
    try:
        yield watching
    finally:
        watching.close()


def test_ready_after_drain_after_then_drained_when_wedged_and_put_back(
    agent: Agent, engines: tuple[StubEngine, StubEngine]
) -> None:
    moving, other = engines
    first = agent.until("a first poll", name(moving), lambda answer: "no poll has ended yet" not in answer)
    # Read for less than --drain-after: the watch has no history yet, and says nothing HAProxy acts on.
    assert first.startswith("# ready: "), first
    assert first.endswith(f"under --drain-after {DRAIN_AFTER:g} s: the server's state is left as it is)\n"), first
    ready = agent.until("ready", name(moving), lambda answer: answer.startswith("ready up #"))
    assert ready.startswith("ready up #ready: progressing: 2 running, 0 waiting; "), ready
    assert ready.count("\n") == 1
    # The URL as given names it too.
    assert agent.ask(f"{moving.url}\r\n".encode()).startswith("ready up #ready: ")

    other.wedge()
    drained = agent.until("drained", name(other), lambda answer: answer.startswith("drain up #"))
    assert drained.startswith("drain up #not ready: stalled: 3 running, 0 waiting; no token progress for "), drained
    assert agent.ask(f"{name(moving)}\n".encode()).startswith("ready up #")  # each server its own answer
    other.unwedge()
    agent.until("put back", name(other), lambda answer: answer.startswith("ready up #"))


def test_an_engine_paused_when_the_watch_starts_is_drained_and_never_called_ready(
    engines: tuple[StubEngine, StubEngine],
) -> None:
    moving, other = engines
    other.pause()
    watching = Agent(moving.url, other.url)
    try:
        # Its first poll is a baseline, ready by the rule; the agent holds that "ready" (no history yet),
        # and the next poll, which asks /is_paused, drains it: no drain waits for a hold.
        said = watching.until("a word HAProxy acts on", name(other), lambda answer: not answer.startswith("#"))
        assert said.startswith("drain up #not ready: paused"), said
    finally:
        watching.close()


def test_what_the_watch_does_not_know_changes_nothing(agent: Agent, engines: tuple[StubEngine, StubEngine]) -> None:
    moving, _ = engines
    agent.until("ready", name(moving), lambda answer: answer.startswith("ready up #"))
    unknown = agent.ask(b"10.9.9.9:8000\n")
    assert unknown == "# unknown server '10.9.9.9:8000': not an engine this watch polls (send its host:port or URL)\n"
    # Without a newline, the end of the stream ends the line (as `printf NAME | nc` sends it).
    assert agent.ask(name(moving).encode(), end=True).startswith("ready up #")
    assert agent.ask(b"\n") == "# unknown server '': not an engine this watch polls (send its host:port or URL)\n"
    assert agent.ask(b"\xff\xfe\x00garbage\n") == "# not UTF-8: send the server's host:port or URL, then a newline\n"
    long = agent.ask(b"x" * (MAX_LINE + 1))
    assert long == f"# a line over {MAX_LINE} bytes: send the server's host:port or URL, then a newline\n"
    errors = agent.close()
    # A misnamed server is told once on stderr, however often it asks.
    assert errors.count("'10.9.9.9:8000', not an engine this watch polls") == 1, errors


def test_silent_and_flooding_clients_block_neither_the_others_nor_the_polls(
    agent: Agent, engines: tuple[StubEngine, StubEngine]
) -> None:
    moving, _ = engines
    agent.until("ready", name(moving), lambda answer: answer.startswith("ready up #"))
    half = [agent.connect() for _ in range(3)]
    for sock in half:
        sock.sendall(b"127.0.0")  # a slow client: part of a line, then nothing
    silent = [agent.connect() for _ in range(MAX_CLIENTS // 2)]
    try:
        # Beside them, a server's question is answered at once (one thread, but nobody waits on a client).
        asked = time.monotonic()
        assert agent.ask(f"{name(moving)}\n".encode()).startswith("ready up #")
        assert time.monotonic() - asked < CLIENT_TIMEOUT
        # Every place taken, and more: a client past MAX_CLIENTS is closed unanswered (HAProxy then
        # changes nothing), and the polling goes on.
        silent += [agent.connect() for _ in range(MAX_CLIENTS)]
        before = moving.count("/metrics")
        deadline = time.monotonic() + WAIT
        while moving.count("/metrics") < before + 3:
            assert time.monotonic() < deadline, "the polls stopped"
            time.sleep(0.05)  # bounded poll of an eventual state
        # The others are answered once CLIENT_TIMEOUT has passed, and their places freed.
        late = f"# no line within {CLIENT_TIMEOUT:g} s: send the server's host:port or URL, then a newline\n"
        assert {read_all(sock) for sock in half} == {late}
        assert {read_all(sock) for sock in silent} == {late, ""}
        agent.until("answered again", name(moving), lambda answer: answer.startswith("ready up #"))
    finally:
        for sock in half + silent:
            sock.close()


def test_listen_and_agent_serve_one_board(engines: tuple[StubEngine, StubEngine]) -> None:
    moving, _ = engines
    watching = Agent(moving.url, more=("--listen", "127.0.0.1:0"))
    try:
        assert any(line.startswith("stallprobe watch: serving http://127.0.0.1:") for line in watching.lines)
        watching.until("ready", name(moving), lambda answer: answer.startswith("ready up #ready: progressing"))
    finally:
        watching.close()


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("nowhere", "error: --agent must be HOST:PORT (got 'nowhere')"),
        ("127.0.0.1:99999", "error: --agent must be HOST:PORT"),
        ("10.255.255.1:0", "error: --agent 10.255.255.1:0: "),  # not an address of this machine
    ],
)
def test_an_agent_address_it_cannot_listen_on_is_a_usage_error(
    address: str, words: str, engines: tuple[StubEngine, StubEngine]
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stallprobe", "watch", "--agent", address, engines[0].url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout.count("\n"), done.stderr) == (2, 1, "")
    assert done.stdout.startswith(words), done.stdout


def test_a_port_taken_is_a_usage_error(engines: tuple[StubEngine, StubEngine]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "stallprobe", "watch", "--agent", f"127.0.0.1:{port}", engines[0].url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert (done.returncode, done.stdout.count("\n")) == (2, 1)
    assert done.stdout.startswith(f"error: --agent 127.0.0.1:{port}: "), done.stdout


URL = "http://10.0.0.11:8000/metrics"
# (what the latest poll said of the endpoint, --drain-after) -> the agent's line
SCENARIOS = [
    ("no poll yet", None, 30.0, f"# {URL}: no poll has ended yet; the server's state is left as it is"),
    ("ready", Readiness(True, ("ready: idle: 0 running",), 30.0), 30.0, "ready up #ready: idle: 0 running"),
    ("ready long since", Readiness(True, ("ready: x",), 999.0), 30.0, "ready up #ready: x"),
    (
        "ready, read for less than --drain-after",
        Readiness(True, ("ready: x",), 29.9),
        30.0,
        "# ready: x (read for 30 s, under --drain-after 30 s: the server's state is left as it is)",
    ),
    (
        "ready, read for a moment",
        Readiness(True, ("ready: x",), 0.0),
        0.5,
        "# ready: x (read for 0.0 s, under --drain-after 0.5 s: the server's state is left as it is)",
    ),
    ("not ready", Readiness(False, ("not ready: paused",), 0.0), 30.0, "drain up #not ready: paused"),
    ("not ready long since", Readiness(False, ("not ready: y",), 99.0), 30.0, "drain up #not ready: y"),
    (
        "two engines, one line",
        Readiness(False, ("not ready: stalled", "not ready: stalled"), 40.0),
        30.0,
        "drain up #not ready: stalled; not ready: stalled",
    ),
    ("a newline in the reason", Readiness(False, ("a\nb\rc\td",), 40.0), 30.0, "drain up #a b c d"),
    ("a long reason", Readiness(False, ("z" * 500,), 40.0), 30.0, "drain up #" + "z" * 197 + "..."),
    ("a reason just short enough", Readiness(True, ("z" * 200,), 40.0), 30.0, "ready up #" + "z" * 200),
]


@pytest.mark.parametrize(("said", "drain_after", "line"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_agent_line(said: Readiness | None, drain_after: float, line: str) -> None:
    assert SCENARIOS
    assert agent_line(URL, said, drain_after) == line


def test_identities_name_each_url_by_its_host_port_unless_two_share_it() -> None:
    a, b, c = "http://10.0.0.11:8000/metrics", "http://10.0.0.12:8000/a/metrics", "http://10.0.0.12:8000/b/metrics"
    assert identities([a, b, c]) == {
        a: a,
        b: b,
        c: c,
        "10.0.0.11:8000": a,
        "10.0.0.12:8000/a/metrics": b,
        "10.0.0.12:8000/b/metrics": c,
    }
