"""`watch --agent HOST:PORT`: HAProxy's agent check, answered from what the watch knows.

HAProxy's agent check (`agent-check` on a server line) connects to the agent every `agent-inter`, sends the
server's `agent-send` string and reads one line back. Unlike a health check, an agent that refuses the
connection, answers late or answers nothing changes nothing: the server keeps what its regular check (the
engine's own /health) and the agent's last answer made of it. So the watch may stop, be OOM-killed or
hang, and no server leaves the pool: the agent fails open where /ready, the health check itself, fails
closed (every server's check fails, and the pool is empty).

One connection, one line each way:

- In: the server's identity, ended by a newline (or by the end of the stream): an engine's URL exactly
  as given to the watch, or its host:port (the table's name for it, endpoint_name; or the URL's host:port
  when no other URL shares it).
- Out, the readiness rule's answer, which /ready gives too (Board.readiness: the poll asked
  detector.readiness, and nothing here judges again):
  - ready: `ready up #ready: <the probe's --ready line>`: READY, which ends a drain this agent set.
  - not ready: `drain up #not ready: <why>`: DRAIN, no new requests; those in flight go on.
  - `up` is there for the text after `#`: HAProxy keeps it (`show stat`'s last_agt, the stats page) only
    when the line names a health state. It does not put up a server that its own check has down, nor
    keep one up that the check takes down (HAProxy 2.6: tests/test_haproxy.py checks both ways).
  - Everything else is a comment (`# ...`), which HAProxy reads as "no status change": an identity this
    watch does not know, no poll ended yet, a line too long, not UTF-8 or not ended in time. And "ready"
    from a watch that has read the engine for less than --drain-after: a watch that has just started (or
    restarted) has no history, and under its first polls even a wedged engine is ready; HAProxy keeps the
    drain a previous watch set until this one has read the engine long enough to say otherwise.

Bounded, and never in the polling's way: one thread serves every connection (a selector over non-blocking
sockets), at most MAX_CLIENTS at once (one past it is closed unanswered: no change), each line read up to
MAX_LINE bytes within CLIENT_TIMEOUT seconds, and each answer, a few hundred bytes, written once: a client
that does not take it loses it.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from urllib.parse import urlsplit

from ..console import tell
from ..report import num, secs
from .view import endpoint_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .serve import Board, Readiness

__all__ = ["Agent", "agent_line", "identities", "serve_agent"]

# A pool's servers each connect once per agent-inter (1 s in deploy/haproxy) and are answered within
# milliseconds: a few at once. 256 leaves room for many pools and HAProxy processes, and bounds the
# descriptors a flood can hold.
MAX_CLIENTS = 256
# A URL and its newline; HAProxy sends agent-send whole at once, so anything longer is not a server's name.
MAX_LINE = 4096
# HAProxy writes agent-send as soon as it connects: a line not ended within 2 s will not come.
CLIENT_TIMEOUT = 2.0
# HAProxy keeps 127 bytes of a check's description; the rest of a long --ready line is for /ready.
MAX_REASON = 200
# Identities not known, each told once on stderr (a misnamed server), up to this many.
_TOLD = 16
_TICK = 0.2  # how often the loop looks for the stop, when no client is due


def identities(urls: Sequence[str]) -> dict[str, str]:
    """Every name a server may send for a URL the watch polls -> that URL: the URL as given, its name in
    the table (endpoint_name: host:port for a /metrics URL), and its host:port when no other URL has it."""
    names = {url: url for url in urls}
    for url in urls:
        names.setdefault(endpoint_name(url), url)
    hosts = [urlsplit(url).netloc for url in urls]
    for url, host in zip(urls, hosts):
        if hosts.count(host) == 1:
            names.setdefault(host, url)
    return names


def _clean(text: str, limit: int) -> str:
    """One line of printable text, at most `limit` characters: control characters become spaces."""
    flat = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def agent_line(url: str, said: Readiness | None, drain_after: float) -> str:
    """What the agent answers (without its newline) for the endpoint `url`, from the readiness the latest
    poll gave it (Board.readiness; None before any poll of it ended)."""
    if said is None:
        return f"# {url}: no poll has ended yet; the server's state is left as it is"
    reason = _clean("; ".join(said.lines), MAX_REASON)
    if not said.ready:
        return f"drain up #{reason}"
    if said.judged_for < drain_after:
        return (
            f"# {reason} (read for {secs(said.judged_for)} s, under --drain-after {num(drain_after)} s: "
            "the server's state is left as it is)"
        )
    return f"ready up #{reason}"


class _Client:
    __slots__ = ("data", "deadline", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.data = b""


class Agent:
    """The agent's socket and the thread that serves it; `address` is where it listens."""

    def __init__(self, host: str, port: int, board: Board, urls: Sequence[str], drain_after: float) -> None:
        family, _, _, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.sock = socket.create_server(where[:2], family=family)  # OSError: the caller's usage error
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self.board = board
        self.names: Mapping[str, str] = identities(urls)
        self.drain_after = drain_after
        self.told: set[str] = set()
        self.clients: dict[socket.socket, _Client] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="agent", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def shutdown(self) -> None:
        self.stopping.set()
        self.thread.join(5 * _TICK + 5)
        self.sock.close()

    def answer(self, data: bytes, ended: bool) -> str:
        """The line for what a client sent: `data` up to its first newline (or all of it when `ended`,
        by the end of its stream or at MAX_LINE), else a comment on what was wrong with it."""
        line, newline, _ = data.partition(b"\n")
        if not newline and not ended:
            return f"# no line within {num(CLIENT_TIMEOUT)} s: send the server's host:port or URL, then a newline"
        if len(line) > MAX_LINE:
            return f"# a line over {MAX_LINE} bytes: send the server's host:port or URL, then a newline"
        try:
            name = line.decode("utf-8").strip()
        except UnicodeDecodeError:
            return "# not UTF-8: send the server's host:port or URL, then a newline"
        url = self.names.get(name)
        if url is None:
            shown = _clean(repr(name), 80)
            if name not in self.told and len(self.told) < _TOLD:
                self.told.add(name)
                tell(f"stallprobe watch: --agent: a server sent {shown}, not an engine this watch polls")
            return f"# unknown server {shown}: not an engine this watch polls (send its host:port or URL)"
        return agent_line(url, self.board.readiness(url), self.drain_after)

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ, None)
            try:
                while not self.stopping.is_set():
                    try:
                        self._turn(selector)
                    except Exception as exc:  # never the thread: the next turn serves the next check
                        tell(f"stallprobe watch: --agent: {type(exc).__name__}: {exc}")
                        self.stopping.wait(_TICK)
            finally:
                for client in list(self.clients.values()):
                    self._close(selector, client)

    def _turn(self, selector: selectors.BaseSelector) -> None:
        """One turn of the loop: wait for a client to be due (or the next tick), serve what is ready, and
        answer those whose time is up."""
        now = time.monotonic()
        due = min((client.deadline for client in self.clients.values()), default=now + _TICK)
        for key, _ in selector.select(max(0.0, min(due - now, _TICK))):
            if key.data is None:
                self._accept(selector)
            elif key.data.sock in self.clients:
                self._read(selector, key.data)
        now = time.monotonic()
        for client in [client for client in self.clients.values() if client.deadline <= now]:
            self._reply(selector, client, ended=False)

    def _accept(self, selector: selectors.BaseSelector) -> None:
        for _ in range(MAX_CLIENTS):  # what is waiting now, but never a loop a flood keeps going
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: let the next turn try again
                self.stopping.wait(_TICK)
                return
            if len(self.clients) >= MAX_CLIENTS:
                sock.close()  # unanswered: HAProxy changes nothing
                continue
            sock.setblocking(False)
            client = self.clients[sock] = _Client(sock, time.monotonic() + CLIENT_TIMEOUT)
            try:
                selector.register(sock, selectors.EVENT_READ, client)
            except (OSError, ValueError):
                self._close(selector, client)

    def _read(self, selector: selectors.BaseSelector, client: _Client) -> None:
        try:
            chunk = client.sock.recv(MAX_LINE + 1 - len(client.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(selector, client)
            return
        client.data += chunk
        if not chunk or b"\n" in client.data or len(client.data) > MAX_LINE:
            self._reply(selector, client, ended=True)

    def _reply(self, selector: selectors.BaseSelector, client: _Client, *, ended: bool) -> None:
        try:
            line = self.answer(client.data, ended)
            client.sock.send(f"{line}\n".encode("utf-8", "replace"))
        except OSError:
            pass  # gone, or not reading: what it was told is lost, which changes nothing
        finally:
            self._close(selector, client)

    def _close(self, selector: selectors.BaseSelector, client: _Client) -> None:
        self.clients.pop(client.sock, None)
        try:
            selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()


def serve_agent(host: str, port: int, board: Board, urls: Sequence[str], drain_after: float) -> Agent:
    """Answer HAProxy's agent checks on host:port from `board`, in a thread of its own; the Agent (its
    .address, .shutdown()). OSError when it cannot listen there."""
    agent = Agent(host, port, board, urls, drain_after)
    agent.start()
    return agent
