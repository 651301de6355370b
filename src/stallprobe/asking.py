"""What a look asks of an engine, and how each question went: an Ask is one exchange (what scrape.exchange
takes), an Outcome its answer or its error with when it started and ended. A look (observe.look) and the
questions of api.py are generators that yield Asks and are sent Outcomes, so that whoever drives them
performs the exchanges: one after another here (perform, drive: the probe, doctor), or many at once on one
thread (watch/loop.py).
"""

from __future__ import annotations

from .errors import ScrapeError
from .scrape import MAX_PAGE_BYTES, exchange

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Generator
    from typing import TypeVar

    from .scrape import Answer

    T = TypeVar("T")

__all__ = ["Ask", "Outcome", "drive", "perform"]


class Ask:
    """One exchange that a look needs (observe.look and api.py's questions yield these): what
    scrape.exchange() takes. Whoever drives the look performs it - blocking (perform), or among many on one
    thread (watch) - and sends back an Outcome."""

    __slots__ = ("body", "key", "max_bytes", "method", "timeout", "url", "what")

    def __init__(
        self,
        url: str,
        timeout: float,
        *,
        key: str = "",
        method: str = "GET",
        body: bytes = b"",
        max_bytes: int = MAX_PAGE_BYTES,
        what: str = "scrape",
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.key = key
        self.method = method
        self.body = body
        self.max_bytes = max_bytes
        self.what = what

    def __repr__(self) -> str:
        return f"Ask({self.method} {self.url!r}, {self.timeout:g} s)"


class Outcome:
    """How an Ask went: its answer or its error (exactly one is None), when it was started and when it
    ended (the driver's clock)."""

    __slots__ = ("answer", "ended", "error", "started")

    def __init__(self, answer: Answer | None, error: ScrapeError | None, started: float, ended: float) -> None:
        self.answer = answer
        self.error = error
        self.started = started
        self.ended = ended

    def result(self) -> Answer:
        """The answer; raises the error, as exchange() would have."""
        if self.answer is None:
            raise self.error or ScrapeError("no answer")
        return self.answer


def perform(ask: Ask, clock: Callable[[], float]) -> Outcome:
    """Perform `ask` here and now, blocking (exchange()); its Outcome. Anything but ScrapeError is raised."""
    started = clock()
    try:
        answer = exchange(
            ask.url, ask.timeout, method=ask.method, body=ask.body, max_bytes=ask.max_bytes, key=ask.key, what=ask.what
        )
    except ScrapeError as exc:
        return Outcome(None, exc, started, clock())
    return Outcome(answer, None, started, clock())


def drive(steps: Generator[Ask, Outcome, T], clock: Callable[[], float]) -> T:
    """Run a look (observe.look) or one of api.py's questions to its end, performing each exchange it
    asks for here, one after another."""
    try:
        ask = next(steps)
        while True:
            ask = steps.send(perform(ask, clock))
    except StopIteration as stop:
        result: T = stop.value
        return result
