"""One stub engine for the whole test suite: a real threaded HTTP server on loopback (pytest-httpserver's,
the server the design names for the tests), with an inference engine's routes and a state the test sets.

- `GET /metrics`: the page of the engine's dialect (vLLM, SGLang or llama.cpp's server, as conftest writes
  them) for its state: running and waiting requests (vLLM: by reason, when given), the token counters,
  the KV-cache usage, vLLM's sleep state. The counters advance by their step at every scrape, so what a
  watcher sees depends on its scrapes, never on how fast the machine is; with a step of 0 (the default)
  they stay where they are.
- `/health`, `/v1/models`, `/v1/completions` and `/v1/chat/completions` answer as the engine does;
  `/is_paused` exists once the test has paused the engine (vLLM without its dev mode has no such route).
  Any route can be replaced by a `Route`: a fixed or computed body, a status, headers, a delay, or held
  until `release()`.
- With `key` set, every route but `/health` answers 401 to a request without that bearer key, as llama.cpp's
  server does when started with --api-key (its /health stays public).
- Every request is recorded (`requests`, `count(path)`): method, path, headers, body, when it arrived.
- Stuck modes, each freezing the counters whatever their step: `wedge()` (busy and frozen, completions
  accepted and never answered: an engine core that stopped), `pause()` (vLLM's /pause?mode=keep: the
  same, and /is_paused says so), `sleep()` (vLLM's sleep mode: the page says it); each undone by its pair
  (`unwedge()`, `resume()`, `wake()`), which lets the held completions through.

Every wait inside is bounded by `close()` (each fixture's teardown), so no test can hang on this server.

pytest-httpserver stages every answer here: pages, statuses, headers, delays, an answer held until
release(). One fault it cannot stage, since its handler must answer: a held request dropped unanswered at
close(); that one reaches for the raw socket (`_drop`). The faults of a server that misbehaves at the
socket (a connection dropped mid-body, accepted and never answered, a trickle, a reset) are
conftest.RawServer's, a raw socket server of its own.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from types import TracebackType
from urllib.parse import urlsplit

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from conftest import llamacpp_page, sglang_page, vllm_page

PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
# The routes a client's generation goes to: held while the engine is wedged, paused or asleep.
GENERATION = ("/v1/completions", "/v1/chat/completions")
# A held answer waits for release() or close(); this bounds it even if a test forgot both.
HOLD_LIMIT = 300.0


class Route:
    """What the engine answers on one path: a status, a body (or what makes a new one for each request),
    headers, and how long it waits first (`delay`), or whether it holds the answer until `release()`
    (`hang`). The content type follows the body unless given: JSON for `{` or `[`, else plain text."""

    def __init__(
        self,
        body: bytes | Callable[[], bytes] = b"",
        status: int = 200,
        *,
        content_type: str = "",
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
        hang: bool = False,
    ) -> None:
        fixed = b"" if callable(body) else body
        self.make: Callable[[], bytes] = body if callable(body) else (lambda: fixed)
        self.status = status
        self.content_type = content_type or ("application/json" if fixed[:1] in (b"{", b"[") else "text/plain")
        self.headers = dict(headers or {})
        self.delay = delay
        self.hang = hang


# The server logs every request it serves: a suite's thousands of lines, and none a test reads.
logging.getLogger("werkzeug").addHandler(logging.NullHandler())
logging.getLogger("werkzeug").setLevel(logging.ERROR)


class _Server(HTTPServer):
    """pytest-httpserver's server, threaded (an answer held must not hold the others), its loop looking for
    shutdown every 50 ms rather than every 500 (the suite starts and stops a thousand of them)."""

    def thread_target(self) -> None:
        assert self.server is not None
        self.server.serve_forever(poll_interval=0.05)


class Seen:
    """One request as it arrived: method, path (with its query), headers, body, and the monotonic time."""

    __slots__ = ("body", "headers", "method", "path", "t")

    def __init__(self, method: str, path: str, headers: dict[str, str], body: bytes, t: float) -> None:
        self.method = method
        self.path = path
        self.headers = headers  # names in lower case
        self.body = body
        self.t = t

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


class StubEngine:
    """An engine on 127.0.0.1:<port>, or only on `host` (::1, 127.0.0.2) (`url` is its /metrics). Use as a
    context manager, or close()."""

    def __init__(
        self,
        dialect: str = "vllm",
        *,
        running: float = 0.0,
        generation: float = 0.0,
        prompt: float = 0.0,
        waiting: float = 0.0,
        model: str = "tiny-llama",
        host: str = "127.0.0.1",
    ) -> None:
        if dialect not in ("vllm", "sglang", "llamacpp"):
            raise ValueError(f"no stub for the dialect {dialect!r}")
        self.dialect = dialect
        self.model = model
        self.running, self.waiting = running, waiting
        self.generation, self.prompt = generation, prompt
        self.generation_step = self.prompt_step = 0.0
        # vLLM's (0.20 and later) by reason, e.g. {"capacity": 3, "deferred": 0}; None: not on the page, as
        # before 0.20, so the page cannot tell which waiting requests the engine owes work.
        self.waiting_by_reason: dict[str, float] | None = None
        self.kv_cache: float | None = None  # vLLM's kv_cache_usage_perc, SGLang's num_used_tokens
        self.decodes = 0.0  # llama.cpp's n_decode_total: one per scrape that moved
        self.wedged = self.paused = self.asleep = False
        self.key = ""  # the API key every route but /health wants ("" for none)
        self.moved_at: float | None = None  # when a scrape last found the counters advanced
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._gate = threading.Event()  # set by release(): what was held goes
        self._closing = threading.Event()
        self.routes: dict[str, Route] = {
            "/metrics": Route(self.metrics_page, content_type=PROMETHEUS),
            "/health": Route(b""),
            "/v1/models": Route(self.models, content_type="application/json"),
            **{path: Route(self.completion, content_type="application/json") for path in GENERATION},
        }
        self.server = _Server(host, 0, threaded=True)
        self.server.expect_request(re.compile(".*")).respond_with_handler(self._serve)
        self.server.start()
        self.port: int = self.server.port
        self.base = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        self.url = f"{self.base}/metrics"

    # --- what the test sets

    def set(
        self,
        running: float | None = None,
        generation: float | None = None,
        prompt: float | None = None,
        waiting: float | None = None,
        *,
        generation_step: float | None = None,
        prompt_step: float | None = None,
        waiting_by_reason: dict[str, float] | None = None,
        kv_cache: float | None = None,
    ) -> None:
        """What the page says from now on (in vllm_page's order); what is not given keeps its value.
        A step is what its counter gains at each scrape."""
        with self._lock:
            for name, value in (
                ("running", running),
                ("generation", generation),
                ("prompt", prompt),
                ("waiting", waiting),
                ("generation_step", generation_step),
                ("prompt_step", prompt_step),
                ("waiting_by_reason", waiting_by_reason),
                ("kv_cache", kv_cache),
            ):
                if value is not None:
                    setattr(self, name, value)

    def route(
        self,
        path: str,
        body: bytes | Callable[[], bytes] = b"",
        status: int = 200,
        *,
        delay: float = 0.0,
        hang: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer `path` so from now on: on /metrics as a metrics page whatever the body, elsewhere as the
        body looks (JSON or plain text)."""
        content_type = PROMETHEUS if path == "/metrics" else ""
        self.routes[path] = Route(body, status, content_type=content_type, headers=headers, delay=delay, hang=hang)

    def wedge(self) -> None:
        """The engine core stops: the counters freeze and completions are accepted and never answered."""
        self._stick("wedged", True)

    def unwedge(self) -> None:
        self._stick("wedged", False)

    def pause(self) -> None:
        """vLLM's /pause?mode=keep: frozen with its requests held, and GET /is_paused says so."""
        self.routes["/is_paused"] = Route(b'{"is_paused": true}')
        self._stick("paused", True)

    def resume(self) -> None:
        self.routes["/is_paused"] = Route(b'{"is_paused": false}')
        self._stick("paused", False)

    def sleep(self) -> None:
        """vLLM's sleep mode: its page says engine_sleep_state{sleep_state="awake"} 0; frozen, held."""
        self._stick("asleep", True)

    def wake(self) -> None:
        self._stick("asleep", False)

    def release(self) -> None:
        """Let everything held so far answer (what arrives later waits for the next release)."""
        with self._lock:
            self._gate.set()
            self._gate = threading.Event()

    # --- what the test reads

    def count(self, path: str) -> int:
        """Requests received on `path` (its query not counted)."""
        with self._lock:
            return sum(1 for seen in self.requests if urlsplit(seen.path).path == path)

    def received(self, path: str) -> list[Seen]:
        with self._lock:
            return [seen for seen in self.requests if urlsplit(seen.path).path == path]

    @property
    def stuck(self) -> bool:
        return self.wedged or self.paused or self.asleep

    # --- the default answers

    def metrics_page(self) -> bytes:
        """The page for the state now, its counters first advanced by their steps (unless stuck)."""
        with self._lock:
            if not self.stuck and (self.generation_step or self.prompt_step):
                self.generation += self.generation_step
                self.prompt += self.prompt_step
                self.decodes += 1
                self.moved_at = time.monotonic()
            if self.dialect == "sglang":
                return sglang_page(self.running, self.generation, self.prompt, self.waiting, self.kv_cache or 0.0)
            if self.dialect == "llamacpp":
                return llamacpp_page(self.running, self.generation, self.prompt, self.decodes, self.waiting)
            page = vllm_page(self.running, self.generation, self.prompt, self.waiting, model=self.model)
            labels = f'engine="0",model_name="{self.model}"'
            reasons = self.waiting_by_reason or {}
            lines = [f'vllm:num_requests_waiting_by_reason{{{labels},reason="{r}"}} {n}' for r, n in reasons.items()]
            awake = {"awake": 0.0 if self.asleep else 1.0, "weights_offloaded": 1.0 if self.asleep else 0.0}
            lines += [f'vllm:engine_sleep_state{{{labels},sleep_state="{s}"}} {n}' for s, n in awake.items()]
            if self.kv_cache is not None:
                lines.append(f"vllm:kv_cache_usage_perc{{{labels}}} {self.kv_cache}")
            return page + "".join(line + "\n" for line in lines).encode()

    def models(self) -> bytes:
        return json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]}).encode()

    def completion(self) -> bytes:
        choice = {"index": 0, "text": "!", "finish_reason": "length"}
        return json.dumps(
            {"id": "cmpl-stub", "object": "text_completion", "model": self.model, "choices": [choice]}
        ).encode()

    # --- the server

    def _stick(self, mode: str, on: bool) -> None:
        with self._lock:
            setattr(self, mode, on)
            if not on:  # undone: what it held goes (and waits again if another mode still holds it)
                self._gate.set()
                self._gate = threading.Event()

    def _held(self, path: str, hang: bool) -> bool:
        """Wait while this request must be held; False when the engine is closing (drop it unanswered)."""
        while True:
            with self._lock:
                if not hang and not (path in GENERATION and self.stuck):
                    return not self._closing.is_set()
                gate = self._gate
            if not gate.wait(HOLD_LIMIT) or self._closing.is_set():
                return False
            hang = False

    def _serve(self, request: Request) -> Response:
        target = str(request.environ.get("RAW_URI") or request.full_path.rstrip("?"))  # as it came, query and all
        body = request.get_data()
        headers = {name.lower(): value for name, value in request.headers.items()}
        with self._lock:
            self.requests.append(Seen(request.method, target, headers, body, time.monotonic()))
        path = urlsplit(target).path
        route = self.routes.get(path)
        if self.key and path != "/health" and headers.get("authorization") != f"Bearer {self.key}":
            route = Route(
                b'{"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}', 401
            )
        if route is None:
            return Response(b"", _status_line(404))
        if not self._held(path, route.hang):
            return _drop(request)
        if route.delay and self._closing.wait(route.delay):
            return _drop(request)
        answer = route.make()
        response = Response(answer, _status_line(route.status), headers=route.headers)
        response.headers["Content-Type"] = route.content_type  # as given: no charset added
        return response

    def close(self) -> None:
        """Stop serving; everything held is dropped unanswered."""
        self._closing.set()
        with self._lock:
            self._gate.set()
        self.server.stop()

    def __enter__(self) -> StubEngine:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _status_line(code: int) -> str:
    """The status as the standard library's servers (and the engines') word it: `401 Unauthorized`, where
    werkzeug would write `401 UNAUTHORIZED`."""
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def _drop(request: Request) -> Response:
    """A request dropped unanswered (held until close()): pytest-httpserver's handler must answer, so this
    one fault is staged on the raw socket, shut before anything is written; what is then written fails,
    and the server lets a client that went away go."""
    conn = request.environ.get("werkzeug.socket")
    if isinstance(conn, socket.socket):
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
    return Response(b"", _status_line(503))
