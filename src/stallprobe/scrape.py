"""Talking HTTP to the engine: one request on a plain socket, under one deadline for the whole exchange.

Why not urllib or http.client: importing them costs several times what the rest of the probe does (they
pull in email, ssl helpers and more), and the probe runs every few seconds in every pod, in a container
whose CPU the engine may be starving. Why one deadline: a server that trickles a byte at a time would
hold a per-read timeout forever; here every read gets only what is left of `timeout`.

The request is HTTP/1.0 with `Connection: close`, so a conforming server answers with a plain body ended
by Content-Length or by closing; a chunked or compressed answer is still decoded, for servers that send
one anyway. The API key the exchanges send as a bearer token is read by credentials.py.
"""

from __future__ import annotations

import time

from .errors import BadAnswer, ScrapeError, ScrapeTimeout
from .urls import hostport, parse_url

try:
    # The C module that `socket` wraps. `socket` itself turns every constant into an enum member when it
    # is imported, and loads enum, selectors and collections: 7-12 ms of CPU, a third of a probe run.
    # What the probe needs (getaddrinfo, a socket with a timeout, connect, send, recv) is all here.
    import _socket as net
except ImportError:  # an interpreter without it: the module every other Python program uses
    import socket as net  # type: ignore[no-redef]

__all__ = [
    "MAX_PAGE_BYTES",
    "Answer",
    "Reading",
    "exchange",
    "failure",
    "host_bytes",
    "page_of",
    "request_bytes",
    "status_error",
]

# A vLLM page is ~50 KB; with hundreds of LoRA adapters and histograms a few MB. 32 MiB bounds memory
# against a runaway page while leaving room for an unusual one.
MAX_PAGE_BYTES = 32 * 1024 * 1024

_HEAD_LIMIT = 64 * 1024  # status line and headers; a real server sends well under 1 KiB


def _remaining(deadline: float, what: str, timeout: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ScrapeTimeout(f"{what}: no complete answer within {timeout:g} s")
    return left


def _dechunk(body: bytes, where: str) -> bytes:
    """Decode a chunked transfer encoding; ScrapeError when it is cut short or malformed."""
    out: list[bytes] = []
    pos = 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            raise ScrapeError(f"{where}: chunked answer cut short")
        size_text = body[pos:eol].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ScrapeError(f"{where}: malformed chunked answer") from None
        if size == 0:
            return b"".join(out)
        start = eol + 2
        if size < 0 or start + size > len(body):
            raise ScrapeError(f"{where}: chunked answer cut short")
        out.append(body[start : start + size])
        pos = start + size + 2


def _decompress(body: bytes, encoding: str, max_bytes: int, where: str) -> bytes:
    import zlib  # only for servers that compress although the probe asked for identity

    # 47: gzip or zlib header, detected; -15: raw deflate, which some servers send as "deflate".
    for wbits in (47, -15):
        decoder = zlib.decompressobj(wbits)
        try:
            page = decoder.decompress(body, max_bytes + 1)
        except zlib.error:
            continue
        if len(page) > max_bytes or decoder.unconsumed_tail:
            raise BadAnswer(f"{where}: page larger than {max_bytes} bytes once decompressed")
        return page
    raise BadAnswer(f"{where}: answer claims {encoding} encoding but does not decode")


def _connect(host: bytes, port: int, deadline: float, where: str, timeout: float) -> net.socket:
    """A TCP connection to the first address of `host` that takes one (as socket.create_connection)."""
    error: OSError | None = None
    for family, kind, proto, _, address in net.getaddrinfo(host, port, 0, net.SOCK_STREAM):
        sock = net.socket(family, kind, proto)
        try:
            sock.settimeout(_remaining(deadline, where, timeout))
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error or OSError(f"{host.decode('ascii', 'replace')} has no address")


class Answer:
    """An HTTP answer: its status code and reason, header fields (lowercase names) and body (decoded
    from its transfer and content encodings when the code is 2xx)."""

    __slots__ = ("body", "code", "headers", "reason")

    def __init__(self, code: int, reason: str, headers: dict[str, str], body: bytes) -> None:
        self.code = code
        self.reason = reason
        self.headers = headers
        self.body = body


# What a status tells the person reading the probe's line, beyond its number.
_AUTH_HINT = (
    "the route needs an API key: give it with --api-key-file PATH or STALLPROBE_API_KEY_FILE "
    "(the engine's own VLLM_API_KEY or LLAMA_API_KEY is used when it is in the environment)"
)


def page_of(url: str, answer: Answer) -> bytes:
    """The body of the answer to GET `url`; BadAnswer unless it is a 2xx."""
    if not 200 <= answer.code < 300:
        raise BadAnswer(status_error(f"scrape {url}", answer))
    return answer.body


def status_error(where: str, answer: Answer) -> str:
    """The line for an answer that is not a success: its status, and what to do about it."""
    hint = ""
    if 300 <= answer.code < 400:
        hint = f" (redirect to {answer.headers.get('location', '?')[:200]} not followed)"
    elif answer.code in (401, 403):
        hint = f": {_AUTH_HINT}"
    elif answer.code == 501:  # llama.cpp's server without --metrics
        hint = ": the engine publishes no metrics (start llama-server with --metrics)"
    return f"{where}: HTTP {answer.code} {answer.reason}".rstrip() + hint


def exchange(
    url: str,
    timeout: float,
    *,
    method: str = "GET",
    body: bytes = b"",
    max_bytes: int = MAX_PAGE_BYTES,
    key: str = "",
    what: str = "scrape",
) -> Answer:
    """One HTTP/1.0 request to `url` and its whole answer, all within `timeout` seconds. ScrapeError
    when there is no HTTP answer (refused, reset, malformed, too large), ScrapeTimeout when the deadline
    passed. `key` is sent as a bearer token; `body` as JSON."""
    host, port, path = parse_url(url)
    deadline = time.monotonic() + timeout
    where = f"{what} {url}"
    request = request_bytes(host, port, path, method=method, body=body, key=key)
    reading = Reading(where, max_bytes)
    try:
        # A str host makes getaddrinfo import the idna codec (and with it `re`): ~3 ms a run. An ASCII
        # host as bytes means the same thing to the resolver and skips that.
        sock = _connect(host_bytes(host), port, deadline, where, timeout)
        try:
            sock.settimeout(_remaining(deadline, where, timeout))
            sock.sendall(request)
            while True:
                sock.settimeout(_remaining(deadline, where, timeout))
                chunk = sock.recv(262144)
                if not chunk or reading.feed(chunk):
                    break
        finally:
            sock.close()
    except ScrapeError:
        raise
    except OSError as exc:
        raise failure(exc, where, host, port, timeout) from None
    return reading.answer()


def host_bytes(host: str) -> bytes:
    """The host as getaddrinfo takes it without loading the idna codec for an ASCII name."""
    return host.encode("ascii") if host.isascii() else host.encode("idna")


def request_bytes(host: str, port: int, path: str, *, method: str = "GET", body: bytes = b"", key: str = "") -> bytes:
    """The whole HTTP/1.0 request for `path` at `host`:`port` (`key` as a bearer token, `body` as JSON)."""
    fields = [
        f"{method} {path} HTTP/1.0",
        f"Host: {hostport(host, port)}",
        "Accept: text/plain, application/json",
        "Accept-Encoding: identity",
        "User-Agent: stallprobe",
        "Connection: close",
    ]
    if key:
        fields.append(f"Authorization: Bearer {key}")
    if method != "GET":
        fields += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(fields) + "\r\n\r\n").encode("latin-1", "replace") + body


def failure(exc: OSError, where: str, host: str, port: int, timeout: float) -> ScrapeError:
    """The error of a socket call that failed while talking to `host`:`port` for `where`."""
    if isinstance(exc, ConnectionRefusedError):
        return ScrapeError(f"{where}: connection refused (is the engine up on {hostport(host, port)}?)")
    if isinstance(exc, net.timeout):
        return ScrapeTimeout(f"{where}: no complete answer within {timeout:g} s")
    if isinstance(exc, ConnectionResetError):
        return ScrapeError(f"{where}: connection reset by the server")
    return ScrapeError(f"{where}: {exc.strerror or exc}")


class Reading:
    """An answer as it arrives: `feed` each chunk read; `answer` once the server closed or `feed` said
    the whole body is here. ScrapeError for headers that never end or a body over `max_bytes`."""

    __slots__ = ("data", "expected", "head_end", "max_bytes", "where")

    def __init__(self, where: str, max_bytes: int) -> None:
        self.where = where
        self.max_bytes = max_bytes
        self.data = bytearray()
        self.head_end = -1
        self.expected = -1

    def feed(self, chunk: bytes | memoryview) -> bool:
        """Take one chunk; True when the whole body (by its Content-Length) is here."""
        data = self.data
        data += chunk
        if self.head_end < 0:
            self.head_end = data.find(b"\r\n\r\n")
            if self.head_end < 0 and len(data) > _HEAD_LIMIT:
                raise ScrapeError(f"{self.where}: no end of HTTP headers in {_HEAD_LIMIT} bytes")
            if self.head_end >= 0:
                self.expected = _content_length(_headers(bytes(data[: self.head_end])), self.where)
        if self.head_end >= 0 and len(data) - self.head_end - 4 > self.max_bytes:
            raise BadAnswer(f"{self.where}: page larger than {self.max_bytes} bytes")
        # The whole body is here: no need to wait for the close.
        return 0 <= self.expected <= len(data) - self.head_end - 4

    def answer(self) -> Answer:
        """The answer read so far, decoded; ScrapeError when it is not a whole HTTP answer."""
        return _answer(bytes(self.data), self.where, self.max_bytes)


def _headers(head: bytes) -> dict[str, str]:
    """The header fields after the status line, by lowercase name (a repeated field: the last)."""
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        headers[key.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return headers


def _content_length(headers: dict[str, str], where: str) -> int:
    """The Content-Length header's value, or -1 when absent (or when chunked overrides it)."""
    if "chunked" in headers.get("transfer-encoding", "").lower() or "content-length" not in headers:
        return -1
    text = headers["content-length"]
    if not (text.isascii() and text.isdigit()):  # str.isdigit() alone takes "\u00b2", which int() refuses
        raise ScrapeError(f"{where}: invalid Content-Length {text[:40]!r}")
    return int(text)


def _answer(data: bytes, where: str, max_bytes: int) -> Answer:
    head_end = data.find(b"\r\n\r\n")
    if not data.startswith(b"HTTP/") or head_end < 0:
        if not data:
            raise ScrapeError(f"{where}: the server closed the connection without an answer")
        raise ScrapeError(f"{where}: not an HTTP answer")
    head = data[:head_end]
    body = data[head_end + 4 :]
    status = head.split(b"\r\n", 1)[0].split(None, 2)
    if len(status) < 2 or not status[1].isdigit():
        raise ScrapeError(f"{where}: malformed HTTP status line")
    code = int(status[1])
    reason = status[2].decode("latin-1").strip()[:120] if len(status) > 2 else ""
    headers = _headers(head)
    if not 200 <= code < 300:
        return Answer(code, reason, headers, body)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(body, where)
    else:
        length = _content_length(headers, where)
        if length >= 0:
            if len(body) < length:
                raise ScrapeError(f"{where}: connection closed after {len(body)} of {length} bytes")
            body = body[:length]
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        body = _decompress(body, encoding, max_bytes, where)
    elif encoding not in ("", "identity"):
        raise BadAnswer(f"{where}: unsupported Content-Encoding {encoding[:40]!r}")
    return Answer(code, reason, headers, body)
