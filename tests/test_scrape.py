"""The HTTP client (scrape.py), in process, against a real server on loopback that answers each way an
engine's server (or something else on its port) can: what fetch() (the page of one exchange) returns or
raises for each. Whether
the server answered at all decides what the probe can still do (BadAnswer: ask the health route), so
that line is held here as a table."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable

import pytest

from conftest import RawServer, refused_url
from stallprobe.errors import BadAnswer, ScrapeError, ScrapeTimeout
from stallprobe.scrape import MAX_PAGE_BYTES, exchange, page_of
from stallprobe.urls import parse_url

Behave = Callable[[socket.socket, threading.Event], None]
BODY = b"vllm:num_requests_running 1\n"


def fetch(url: str, timeout: float, max_bytes: int = MAX_PAGE_BYTES) -> bytes:
    """The page a GET of `url` answers, as a probe's look takes it: scrape.exchange, then scrape.page_of."""
    return page_of(url, exchange(url, timeout, max_bytes=max_bytes))


def respond(*head: bytes, body: bytes = BODY) -> Behave:
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)

    return behave


def say(data: bytes) -> Behave:
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)

    return behave


def hold(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(5)


LENGTH = b"Content-Length: %d" % len(BODY)
ZIPPED = gzip.compress(BODY)
# (name, how the server answers, what fetch returns, or the error it raises: its class and words)
ANSWERS: list[tuple[str, Behave, bytes | tuple[type[Exception], str]]] = [
    ("page_with_length", respond(b"HTTP/1.1 200 OK", LENGTH), BODY),
    ("page_until_close", respond(b"HTTP/1.0 200 OK"), BODY),
    (
        "chunked",
        respond(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)),
        BODY,
    ),
    (
        "gzip",
        respond(b"HTTP/1.1 200 OK", b"Content-Encoding: gzip", b"Content-Length: %d" % len(ZIPPED), body=ZIPPED),
        BODY,
    ),
    ("status_404", respond(b"HTTP/1.1 404 Not Found", body=b""), (BadAnswer, "HTTP 404 Not Found")),
    ("status_401", respond(b"HTTP/1.1 401 Unauthorized", body=b""), (BadAnswer, "API key")),
    ("status_501", respond(b"HTTP/1.1 501 Not Implemented", body=b""), (BadAnswer, "--metrics")),
    ("status_503", respond(b"HTTP/1.1 503 Service Unavailable", body=b""), (BadAnswer, "HTTP 503")),
    ("redirect", respond(b"HTTP/1.1 302 Found", b"Location: /elsewhere", body=b""), (BadAnswer, "not followed")),
    ("too_large", respond(b"HTTP/1.1 200 OK", body=b"x" * 2048), (BadAnswer, "larger than 1024 bytes")),
    ("odd_encoding", respond(b"HTTP/1.1 200 OK", b"Content-Encoding: br", body=b"x"), (BadAnswer, "Content-Encoding")),
    (
        "bad_gzip",
        respond(b"HTTP/1.1 200 OK", b"Content-Encoding: gzip", body=b"not gzip"),
        (BadAnswer, "does not decode"),
    ),
    ("closed_without_answer", say(b""), (ScrapeError, "closed the connection without an answer")),
    ("not_http", say(b"SSH-2.0-OpenSSH_9.2\r\n"), (ScrapeError, "not an HTTP answer")),
    ("cut_short", say(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nabc"), (ScrapeError, "closed after 3 of 99")),
    ("silent", hold, (ScrapeTimeout, "no complete answer within 0.5 s")),
]


@pytest.mark.parametrize(("behave", "expected"), [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
def test_fetch(
    raw_server: Callable[[Behave], RawServer], behave: Behave, expected: bytes | tuple[type[Exception], str]
) -> None:
    assert ANSWERS
    url = raw_server(behave).url
    if isinstance(expected, bytes):
        assert fetch(url, 0.5, max_bytes=1024) == expected
        return
    kind, words = expected
    with pytest.raises(kind, match=words) as caught:
        fetch(url, 0.5, max_bytes=1024)
    # Only an answer the server gave is a BadAnswer: a fault below HTTP never is.
    assert isinstance(caught.value, BadAnswer) is (kind is BadAnswer)


def test_a_refused_connection_is_no_answer() -> None:
    url = refused_url()
    with pytest.raises(ScrapeError, match="connection refused") as caught:
        fetch(url, 0.5)
    assert not isinstance(caught.value, BadAnswer)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000/metrics", ("127.0.0.1", 8000, "/metrics")),
        ("http://[::1]:9/x?y=1", ("::1", 9, "/x?y=1")),
        ("http://engine/metrics", ("engine", 80, "/metrics")),
    ],
)
def test_parse_url(url: str, expected: tuple[str, int, str]) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://h/metrics", "http:// URL"),
        ("http://u:p@h/metrics", "user information"),
        ("http://h:99999/metrics", "invalid port"),
        ("http:///metrics", "no host"),
        ("http://h/a b", "blanks"),
    ],
)
def test_parse_url_refuses(url: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_url(url)
