"""Every endpoint's look at once, on one thread: observe.look's exchanges performed by a selector loop.

A look (observe.look) decides what to ask; this module only performs the exchanges it yields, many at a
time, and sends back how each went, as asking.perform does for the probe one at a time: the same request
bytes (scrape.request_bytes), the same reading of the answer (scrape.Reading) and the same error lines
(scrape.failure), so an endpoint's row reads as the probe's line for it would.

Why one thread and not one per endpoint: measured by scripts/bench-watch, a thread per look costs a thread
start, a stack and the GIL's hand-offs per endpoint per poll; at thousands of endpoints that was most of
a core. Here the cost per endpoint is its system calls and its page's parse.

- Each exchange has its own deadline, as exchange()'s (--timeout, or the question's own), from when it
  was asked. An answer that arrived while the loop was busy with other pages counts as in time: before an
  exchange is given up, whatever its socket already holds is read.
- A host name is resolved off the loop, by a few resolver threads (getaddrinfo has no deadline and no
  non-blocking form); an IP address is not looked up. A look whose name lookup outlives the poll stays
  pending into the next poll, and is not started again until the lookup returns.
- At most `limit` connections are open at once (the process's file descriptors, raised to their hard
  limit, less a reserve): the rest wait their turn, and their deadline runs from when they connect.
- At most `readers` answers are read at once. Every request goes out at the start (an endpoint that never
  answers must cost the poll its own deadline, not a place in a queue), so every answer would otherwise
  come back at once, into the kernel's receive buffers: ~45 KB a page, 200 MiB at 5,000 endpoints,
  charged to the watch's container. So each socket starts with a small receive buffer (the kernel takes
  the first few KB, and TCP holds the rest at the engine); an answer that starts while `readers` others are
  being read waits its turn, in time (its first bytes came before its deadline), and its buffer is raised
  when its turn comes. What the watch holds for a poll is then a few KB per endpoint, and `readers` pages.
"""

from __future__ import annotations

import collections
import errno
import heapq
import selectors
import socket
import threading
import time

from ..asking import Outcome
from ..errors import ScrapeError, ScrapeTimeout, StallprobeError
from ..scrape import Reading, failure, host_bytes, request_bytes
from ..urls import parse_url

TYPE_CHECKING = False
if TYPE_CHECKING:
    import queue
    from collections.abc import Callable, Generator

    from ..asking import Ask
    from ..judge import Observation
    from ..scrape import Answer

    Address = tuple[int, int, int, tuple[object, ...]]  # family, type, proto, sockaddr
    Resolve = Callable[[bytes, int], list[Address]]

__all__ = ["Flight", "Flights"]

# Descriptors kept free for the rest of the process: --listen's clients, hooks, stdout, the resolver.
_RESERVE = 256
_RESOLVERS = 8  # threads that resolve host names: a few, since lookups are rare (an IP needs none)
_CHUNK = 262144  # what one recv takes: a real page in one or two
# The receive buffer of an answer not yet being read (the kernel doubles it: 16 KiB), and of one being read:
# 4 KiB held a fifth as much at the cost of a tenth more CPU a poll (the windows TCP reopens, twice as often).
_SMALL_BUFFER = 8192
_READ_BUFFER = _CHUNK
_READERS = 64  # answers read at once: enough to keep one thread busy while the others' bytes arrive
# Once its turn comes, an answer that started in time gets at least this long to finish, whatever its
# deadline (its engine was held back by the small buffer, not slow).
_TURN_GRACE = 1.0


def _getaddrinfo(host: bytes, port: int) -> list[Address]:
    return [
        (family, kind, proto, address)
        for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    ]


def _numeric(host: str, port: int) -> list[Address] | None:
    """The address of an IP literal (no lookup: in C, at once); None for a name."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        found = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
        return [(family, kind, proto, address) for family, kind, proto, _, address in found]
    return None


class Flight:
    """One endpoint's look in flight (observe.look's steps, driven by Flights; doctor's Look is a look's
    result): `done` once `outcome` is its Observation or its error."""

    __slots__ = ("done", "exchange", "outcome", "started", "steps", "url")

    def __init__(self, url: str, steps: Generator[Ask, Outcome, Observation], now: float) -> None:
        self.url = url
        self.steps = steps
        self.started = now
        self.done = False
        self.outcome: Observation | StallprobeError | None = None
        self.exchange: _Exchange | None = None

    @property
    def resolving(self) -> bool:
        """Whether the look waits on its host name's lookup."""
        exchange = self.exchange
        return exchange is not None and exchange.sock is None and not exchange.addresses


class _Exchange:
    """One Ask on a non-blocking socket: resolving, connecting, sending, reading, then an Outcome."""

    __slots__ = (
        "addresses",
        "ask",
        "deadline",
        "host",
        "look",
        "port",
        "reader",
        "reading",
        "request",
        "sent",
        "sock",
        "started",
        "turn",
        "where",
    )

    def __init__(self, look: Flight, ask: Ask, host: str, port: int, path: str) -> None:
        self.look = look
        self.ask = ask
        self.host = host
        self.port = port
        self.where = f"{ask.what} {ask.url}"
        self.request = request_bytes(host, port, path, method=ask.method, body=ask.body, key=ask.key)
        self.reading = Reading(self.where, ask.max_bytes)
        self.addresses: list[Address] = []
        self.sock: socket.socket | None = None
        self.sent = 0
        self.started = 0.0
        self.deadline = 0.0
        self.reader = False  # its answer is being read (one of `readers`)
        self.turn = False  # its answer started and waits for a reader (its socket is off the selector)


class Flights:
    """The looks of a watch in flight, driven together: start() each, then run() until they are done or a poll's
    deadline. A look not done by then is carried into the next run()."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        selector: selectors.BaseSelector | None = None,
        resolve: Resolve = _getaddrinfo,
        limit: int | None = None,
        readers: int = _READERS,
    ) -> None:
        self.clock = clock
        self.selector = selector or selectors.DefaultSelector()
        self.resolve = resolve
        self.limit = limit if limit is not None else _descriptors() - _RESERVE
        self.open = 0  # sockets open now
        self.readers = readers
        self.reading = 0  # answers being read now
        self.turns: collections.deque[_Exchange] = collections.deque()  # answers waiting to be read, in order
        self.waiting: list[_Exchange] = []  # resolved, waiting for a free descriptor (first in, first out)
        self.deadlines: list[tuple[float, int, _Exchange]] = []  # a heap; entries of finished ones stay
        self.count = 0
        self.live: set[_Exchange] = set()  # exchanges not yet finished, resolving included
        self.resolved: list[tuple[_Exchange, list[Address] | OSError]] = []  # from the resolver threads
        self.lock = threading.Lock()
        self.lookups: queue.SimpleQueue[tuple[_Exchange, bytes]] | None = None  # for the resolver threads
        self.numeric: dict[tuple[str, int], list[Address] | None] = {}  # an IP's address never changes
        # Every read lands in this one buffer and is copied to its answer: a new 256 KiB bytes a read, shrunk
        # to the few KB that came, left the allocator's heap in pieces.
        self.buffer = bytearray(_CHUNK)
        self.view = memoryview(self.buffer)
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)

    def close(self) -> None:
        for exchange in list(self.live):
            self._close(exchange)
        self.selector.unregister(self.wake_r)
        self.wake_r.close()
        self.wake_w.close()

    def start(self, url: str, steps: Generator[Ask, Outcome, Observation]) -> Flight:
        """Begin a look: its first exchange starts now."""
        look = Flight(url, steps, self.clock())
        self._advance(look, None)
        return look

    def run(self, until: float) -> None:
        """Perform exchanges until no look is waiting on one, or until the clock reads `until`."""
        while self.live:
            now = self.clock()
            if now >= until:
                return
            self._expire(now)
            if not self.live:
                return
            wait = until - now
            if self.deadlines:
                wait = min(wait, self.deadlines[0][0] - now)
            self._handle(self.selector.select(max(0.0, wait)))

    # --- the loop's parts

    def _handle(self, events: list[tuple[selectors.SelectorKey, int]]) -> None:
        # Requests are sent before answers are read: a send is cheap, a page's parse is not, and a request
        # held back behind a batch of parses would give its engine less than its deadline to answer.
        events.sort(key=_reads_last)
        for key, _mask in events:
            exchange = key.data
            if exchange is None:
                self._take_resolved()
            elif exchange in self.live:
                self._step(exchange)

    def _expire(self, now: float) -> None:
        """Give up the exchanges past their deadline; first read what their sockets already hold."""
        heap = self.deadlines
        while heap and not self._connected(heap[0][2]):
            heapq.heappop(heap)  # finished, or connecting to its host's next address (a later entry)
        if not heap or heap[0][0] > now:
            return
        self._handle(self.selector.select(0))  # answers that came in while the loop was busy
        now = self.clock()
        while heap and heap[0][0] <= now:
            when, _, exchange = heapq.heappop(heap)
            # An answer waiting for its turn came in time: its deadline is set again when it is read (and
            # the entry of its first deadline, if that is later, is not its deadline any more).
            if self._connected(exchange) and not exchange.turn and when >= exchange.deadline:
                self._finish(exchange, _timeout(exchange))

    def _connected(self, exchange: _Exchange) -> bool:
        return exchange.sock is not None and exchange in self.live

    def _advance(self, look: Flight, reply: Outcome | None) -> None:
        """Send the look how its exchange went (None: begin it) and start the next one it asks for."""
        try:
            ask = next(look.steps) if reply is None else look.steps.send(reply)
            host, port, path = parse_url(ask.url)
            exchange = _Exchange(look, ask, host, port, path)
        except StopIteration as stop:
            self._end(look, stop.value)
            return
        except StallprobeError as exc:
            self._end(look, exc)
            return
        except Exception as exc:  # anything a hostile page or host makes the library raise stays on its row
            self._end(look, ScrapeError(f"scrape {look.url}: {exc}"))
            return
        look.exchange = exchange
        self.live.add(exchange)
        exchange.started = self.clock()
        exchange.deadline = exchange.started + ask.timeout
        try:
            addresses = self.numeric[host, port] if (host, port) in self.numeric else _numeric(host, port)
        except OSError as exc:
            self._finish(exchange, _failed(exchange, exc))
            return
        self.numeric[host, port] = addresses
        if addresses is None:
            self._lookup(exchange)
        else:
            exchange.addresses = list(addresses)  # the cached list stays whole: _connect takes from this one
            self._connect(exchange)

    def _end(self, look: Flight, outcome: Observation | StallprobeError) -> None:
        look.outcome = outcome
        look.done = True
        look.exchange = None

    def _lookup(self, exchange: _Exchange) -> None:
        try:
            name = host_bytes(exchange.host)
        except UnicodeError as exc:
            self._finish(exchange, ScrapeError(f"scrape {exchange.look.url}: {exc}"))
            return
        if self.lookups is None:
            import queue

            self.lookups = queue.SimpleQueue()
            for number in range(_RESOLVERS):
                # Daemons: a lookup that never returns must not hold the process at its exit.
                name_of = f"stallprobe-resolve-{number}"
                threading.Thread(target=self._resolver, args=(self.lookups,), name=name_of, daemon=True).start()
        self.lookups.put((exchange, name))

    def _resolver(self, lookups: queue.SimpleQueue[tuple[_Exchange, bytes]]) -> None:
        """A resolver thread: each lookup asked for, handed back to the loop (woken by a byte)."""
        while True:
            exchange, name = lookups.get()
            outcome: list[Address] | OSError
            try:
                outcome = self.resolve(name, exchange.port)
            except OSError as exc:
                outcome = exc
            except Exception as exc:  # anything the resolver raises is this endpoint's failure alone
                outcome = OSError(str(exc))
            with self.lock:
                self.resolved.append((exchange, outcome))
            try:
                self.wake_w.send(b"x")
            except OSError:  # full (the loop will read them all at once) or closed
                pass

    def _take_resolved(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except OSError:
            pass
        with self.lock:
            resolved, self.resolved = self.resolved, []
        for exchange, outcome in resolved:
            if exchange not in self.live:
                continue
            if isinstance(outcome, OSError):
                self._finish(exchange, _failed(exchange, outcome))
            elif self.clock() >= exchange.deadline:  # as exchange() does: the lookup counts against the deadline
                self._finish(exchange, _timeout(exchange))
            else:
                exchange.addresses = outcome
                self._connect(exchange)

    def _connect(self, exchange: _Exchange) -> None:
        """Connect to the next address of the exchange's host (the first that takes one, as exchange())."""
        if self.open >= self.limit:
            self.waiting.append(exchange)
            return
        error: OSError | None = None
        while exchange.addresses:
            family, kind, proto, address = exchange.addresses.pop(0)
            try:
                sock = socket.socket(family, kind, proto)
            except OSError as exc:
                error = exc
                continue
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SMALL_BUFFER)
            except OSError:  # not for every kind of socket: it is read at once then, as it comes
                pass
            code = sock.connect_ex(address)
            if code in (0, errno.EINPROGRESS):
                exchange.sock = sock
                self.open += 1
                self.selector.register(sock, selectors.EVENT_WRITE, exchange)
                heapq.heappush(self.deadlines, (exchange.deadline, self.count, exchange))
                self.count += 1
                return
            sock.close()
            error = _os_error(code)
        self._finish(exchange, _failed(exchange, error or OSError(f"{exchange.host} has no address")))

    def _step(self, exchange: _Exchange) -> None:
        """The exchange's socket is ready: send what is left of the request, or read what came."""
        sock = exchange.sock
        assert sock is not None
        try:
            if exchange.sent < len(exchange.request):
                if exchange.sent == 0:
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code:
                        self._retry(exchange, _os_error(code))
                        return
                exchange.sent += sock.send(exchange.request[exchange.sent :])
                if exchange.sent == len(exchange.request):
                    self.selector.modify(sock, selectors.EVENT_READ, exchange)
                return
            if not exchange.reader:
                if self.reading >= self.readers:  # its answer started: it waits for a reader, off the selector
                    self.selector.unregister(sock)
                    exchange.turn = True
                    self.turns.append(exchange)
                    return
                self._read(exchange)
            buffer, view = self.buffer, self.view
            while True:
                size = sock.recv_into(buffer)
                if not size or exchange.reading.feed(view[:size]):
                    break
        except (BlockingIOError, InterruptedError):
            return
        except ScrapeError as exc:
            self._finish(exchange, exc)
            return
        except OSError as exc:
            self._finish(exchange, _failed(exchange, exc))
            return
        try:
            answer = exchange.reading.answer()
        except ScrapeError as exc:
            self._finish(exchange, exc)
            return
        self._finish(exchange, answer)

    def _retry(self, exchange: _Exchange, error: OSError) -> None:
        """The connection failed: the host's next address, or the failure."""
        self._release(exchange)
        if exchange.addresses:
            self._connect(exchange)
        else:
            self._finish(exchange, _failed(exchange, error))

    def _close(self, exchange: _Exchange) -> None:
        self.live.discard(exchange)
        self._release(exchange)

    def _release(self, exchange: _Exchange) -> None:
        """Close the exchange's socket, and let the next waiting exchange have its descriptor."""
        sock = exchange.sock
        if sock is not None:
            exchange.sock = None
            if not exchange.turn:
                self.selector.unregister(sock)
            sock.close()
            self.open -= 1
            if exchange.reader:
                exchange.reader = False
                self.reading -= 1
                self._next_turn()
            while self.waiting and self.open < self.limit:
                waiting = self.waiting.pop(0)
                waiting.started = self.clock()  # its deadline runs from when it connects
                waiting.deadline = waiting.started + waiting.ask.timeout
                self._connect(waiting)

    def _read(self, exchange: _Exchange) -> None:
        """Make the exchange one of the readers: its socket's full receive buffer (TCP opens the window)."""
        exchange.reader = True
        self.reading += 1
        sock = exchange.sock
        assert sock is not None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _READ_BUFFER)
        except OSError:
            pass

    def _next_turn(self) -> None:
        """Give the freed reader to the answer that has waited longest (its socket back on the selector,
        where it is ready at once)."""
        while self.turns and self.reading < self.readers:
            exchange = self.turns.popleft()
            if exchange.sock is None or exchange not in self.live:
                continue
            exchange.turn = False
            self._read(exchange)
            exchange.deadline = max(exchange.deadline, self.clock() + min(_TURN_GRACE, exchange.ask.timeout))
            heapq.heappush(self.deadlines, (exchange.deadline, self.count, exchange))
            self.count += 1
            self.selector.register(exchange.sock, selectors.EVENT_READ, exchange)

    def _finish(self, exchange: _Exchange, outcome: Answer | ScrapeError) -> None:
        self._close(exchange)
        exchange.reading.data.clear()  # the deadline heap may hold the exchange a while: not its page
        if isinstance(outcome, ScrapeError):
            reply = Outcome(None, outcome, exchange.started, self.clock())
        else:
            reply = Outcome(outcome, None, exchange.started, self.clock())
        self._advance(exchange.look, reply)


def _reads_last(event: tuple[selectors.SelectorKey, int]) -> int:
    return event[1] & selectors.EVENT_READ


def _failed(exchange: _Exchange, error: OSError) -> ScrapeError:
    return failure(error, exchange.where, exchange.host, exchange.port, exchange.ask.timeout)


def _timeout(exchange: _Exchange) -> ScrapeTimeout:
    return ScrapeTimeout(f"{exchange.where}: no complete answer within {exchange.ask.timeout:g} s")


def _os_error(code: int) -> OSError:
    """The OSError (its subclass, as a blocking connect would raise) for an errno."""
    import os

    return OSError(code, os.strerror(code))


def _descriptors() -> int:
    """The file descriptors this process may open, its soft limit raised to the hard one first."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
