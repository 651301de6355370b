"""`watch --listen ADDR:PORT`: what the watch knows, for Prometheus and for load balancers, while it polls.

- `GET /metrics`: the Prometheus text format, one series per engine (labels `url` and `engine`): its
  verdict (a gauge per verdict, 1 for the current one), the seconds its stall clock has run, tokens per
  second since the previous poll, running and waiting requests; per endpoint, the polls that got no
  usable page (a counter). Names follow Prometheus's conventions (`promtool check metrics` is clean).
- `GET /ready?url=URL` (the URL as given to watch): the readiness rule the probe's --ready keeps
  (detector.readiness): 200 when the engine's health route answers 2xx and no engine of that endpoint is
  paused or has been busy with no progress (or silent) for --drain-after; 503 otherwise, and when the
  endpoint could not be read; 404 for a URL the watch does not poll. The body is the probe's --ready
  line. An HAProxy or nginx active health check polls it, one check per server, to take a wedged engine
  out of rotation long before --on-stalled (the liveness window) restarts it.

The server never slows the polling: it runs in threads of its own and reads a snapshot that each poll
replaces whole. It is bounded: at most MAX_CLIENTS connections at once (others get 503 and are closed),
and a client that does not send its request within CLIENT_TIMEOUT seconds is dropped.
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ..detector import Verdict
from ..report import ENDPOINT_VERDICTS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .poll import Row

    Request = socket.socket | tuple[bytes, socket.socket]
    Address = Any

__all__ = ["Board", "Readiness", "listen", "render_metrics"]

# Enough for a Prometheus server, a few load balancers' health checkers and people; far under what a
# thread each costs.
MAX_CLIENTS = 64
# A health checker sends its request at once; a client silent this long is gone or hostile.
CLIENT_TIMEOUT = 5.0
VERDICTS = (*(verdict.value for verdict in Verdict), *ENDPOINT_VERDICTS)


class Readiness:
    """The readiness rule's answer for one endpoint at the latest poll, as the rows carry it (the poll
    asked detector.readiness; nothing here judges again): whether it is ready, the probe's --ready line
    for each of its engines, and how long this watch had been reading its engines by then (seconds from
    the first poll that read one to the latest poll)."""

    __slots__ = ("judged_for", "lines", "ready")

    def __init__(self, ready: bool, lines: tuple[str, ...], judged_for: float) -> None:
        self.ready = ready
        self.lines = lines
        self.judged_for = judged_for


class Board:
    """The latest poll's rows, replaced whole after each poll, each endpoint's count of polls that got no
    usable page, and when each endpoint's engines were first read."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self.rows: tuple[Row, ...] = ()
        self.errors = dict.fromkeys(urls, 0)
        self.polls = 0
        self.first: dict[str, float] = {}  # URL -> the monotonic time of the first poll that read an engine
        self.at = 0.0  # the latest poll's monotonic time

    def update(self, rows: Sequence[Row], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            for row in rows:
                if row.verdict in ENDPOINT_VERDICTS:
                    self.errors[row.url] = self.errors.get(row.url, 0) + 1
                else:
                    self.first.setdefault(row.url, now)
            self.rows = tuple(rows)
            self.polls += 1
            self.at = now

    def readiness(self, url: str) -> Readiness | None:
        """The latest poll's readiness for the endpoint `url` (as given to the watch); None when no poll
        has ended yet, or the watch does not poll it. What /ready and the agent both answer from."""
        with self._lock:
            mine = [row for row in self.rows if row.url == url]
            first = self.first.get(url, self.at)
            at = self.at
        if not mine:
            return None
        return Readiness(all(row.ready for row in mine), tuple(row.ready_message for row in mine), at - first)

    def snapshot(self) -> tuple[tuple[Row, ...], dict[str, int], int]:
        with self._lock:
            return self.rows, dict(self.errors), self.polls


def _label(value: str) -> str:
    """A label value in the text format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(board: Board) -> bytes:
    rows, errors, polls = board.snapshot()
    lines: list[str] = []

    def family(name: str, kind: str, doc: str) -> None:
        lines.extend((f"# HELP {name} {doc}", f"# TYPE {name} {kind}"))

    def labels(row: Row, **extra: str) -> str:
        pairs = {"url": row.url, "engine": row.name, **extra}  # the name on the page, as the engine labels it
        return "{" + ",".join(f'{key}="{_label(value)}"' for key, value in pairs.items()) + "}"

    family("stallprobe_engine_verdict", "gauge", "1 for the verdict the engine has now, 0 for the others.")
    for row in rows:
        lines.extend(f"stallprobe_engine_verdict{labels(row, verdict=v)} {int(row.verdict == v)}" for v in VERDICTS)
    family("stallprobe_engine_ready", "gauge", "1 when the engine may take new requests (the readiness rule), else 0.")
    lines.extend(f"stallprobe_engine_ready{labels(row)} {int(row.ready)}" for row in rows)
    family("stallprobe_engine_stalled_seconds", "gauge", "Seconds the engine's stall clock has run (0: not running).")
    lines.extend(f"stallprobe_engine_stalled_seconds{labels(row)} {row.stalled_for:.3f}" for row in rows)
    family("stallprobe_engine_tokens_per_second", "gauge", "Tokens per second since the previous poll, by kind.")
    for row in rows:
        for kind, rate in (("prompt", row.prompt_rate), ("generation", row.generation_rate)):
            if rate is not None:
                lines.append(f"stallprobe_engine_tokens_per_second{labels(row, kind=kind)} {rate:.3f}")
    for name, field, doc in (
        ("stallprobe_engine_running_requests", "running", "Requests the engine is running."),
        ("stallprobe_engine_waiting_requests", "waiting", "Requests waiting in the engine's queue."),
        (
            "stallprobe_engine_owed_waiting_requests",
            "owed",
            "Waiting requests the engine owes work (waiting for capacity, not deferred by the engine).",
        ),
    ):
        family(name, "gauge", doc)
        for row in rows:
            value = getattr(row, field)
            if value is not None:
                lines.append(f"{name}{labels(row)} {value:g}")
    family("stallprobe_scrape_errors_total", "counter", "Polls of the endpoint that got no usable page.")
    lines.extend(f'stallprobe_scrape_errors_total{{url="{_label(url)}"}} {count}' for url, count in errors.items())
    family("stallprobe_polls_total", "counter", "Polls of the pool since the watch started.")
    lines.append(f"stallprobe_polls_total {polls}")
    return ("\n".join(lines) + "\n").encode("utf-8")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], board: Board) -> None:
        self.board = board
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        super().__init__(address, _Handler)

    def process_request(self, request: Request, client_address: Address) -> None:
        if not self.slots.acquire(blocking=False):
            if isinstance(request, socket.socket):
                try:
                    request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Request, client_address: Address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = CLIENT_TIMEOUT
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path == "/metrics":
            self._answer(200, render_metrics(self.server.board), "text/plain; version=0.0.4; charset=utf-8")
            return
        if parts.path == "/ready":
            self._ready(parse_qs(parts.query).get("url", []))
            return
        self._answer(404, b"not found: GET /metrics or /ready?url=URL\n")

    def _ready(self, urls: list[str]) -> None:
        if len(urls) != 1:
            self._answer(400, b"bad request: give one url, as watch was given it: /ready?url=URL\n")
            return
        said = self.server.board.readiness(urls[0])
        if said is None:
            self._answer(404, b"unknown endpoint: not one this watch polls (or no poll yet)\n")
            return
        body = "".join(f"{line}\n" for line in said.lines).encode("utf-8", "replace")
        self._answer(200 if said.ready else 503, body)

    def _answer(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self._answer(405, b"method not allowed: GET only\n")

    do_PUT = do_DELETE = do_PATCH = do_POST

    def log_message(self, format: str, *args: object) -> None:
        return  # the watch's own output is its rows


def listen(host: str, port: int, board: Board) -> ThreadingHTTPServer:
    """Serve `board` on host:port in a thread of its own; the server (its .server_address, .shutdown())."""
    server = _Server((host, port), board)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="listen", daemon=True).start()
    return server
