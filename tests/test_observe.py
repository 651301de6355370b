"""One look at an engine (observe.py), in process, against a fake exchange: which questions a look asks
for what the page shows, and what the answers make of the samples. Held as one table."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conftest import vllm_page
from stallprobe import asking
from stallprobe import observe as observe_module
from stallprobe.detector import Sample, State
from stallprobe.errors import ScrapeError, ScrapeTimeout
from stallprobe.judge import Memory
from stallprobe.observe import Observation, observe, silent
from stallprobe.probe import Config
from stallprobe.scrape import Answer
from stallprobe.settings import parse
from stallprobe.urls import origin

URL = "http://engine:8000/metrics"
BUSY = vllm_page(4, 100, 50)
IDLE = vllm_page(0, 100, 50)
PAUSED = Answer(200, "OK", {}, b'{"is_paused":true}')
NOT_PAUSED = Answer(200, "OK", {}, b'{"is_paused":false}')
MISSING = Answer(404, "Not Found", {}, b"")
OK = Answer(200, "OK", {}, b"")
UNAVAILABLE = Answer(503, "Service Unavailable", {}, b"")


def history(page: bytes, t: float) -> dict[str, State]:
    """A previous look at `page`, `t` seconds into the clock."""
    from stallprobe.engines import VLLM, read_engines

    return {name: State(sample) for name, sample in read_engines(page, t, VLLM).items()}


class Fake:
    """The engine as the exchange sees it: an answer (or an error) per route; every question asked kept."""

    def __init__(self, answers: dict[str, Answer | Exception]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def exchange(self, url: str, timeout: float, **kwargs: object) -> Answer:
        route = url.removeprefix("http://engine:8000")
        self.asked.append(route)
        answer = self.answers.get(route, MISSING)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, Answer | Exception]], Fake]:
    def make(answers: dict[str, Answer | Exception]) -> Fake:
        engine = Fake(answers)
        monkeypatch.setattr(asking, "exchange", engine.exchange)  # every exchange of a look goes through it
        return engine

    return make


def page(body: bytes) -> Answer:
    return Answer(200, "OK", {}, body)


# (name, answers by route, the history, flags, readiness, routes asked, paused, why not serving, silent)
LOOKS: list[
    tuple[
        str, dict[str, Answer | Exception], dict[str, State] | None, list[str], bool, list[str], bool, str | None, bool
    ]
] = [
    ("first_look_asks_the_page_alone", {"/metrics": page(BUSY)}, None, [], False, ["/metrics"], False, None, False),
    (
        "moving_asks_nothing_more",
        {"/metrics": page(vllm_page(4, 200, 50))},
        history(BUSY, 0),
        [],
        False,
        ["/metrics"],
        False,
        None,
        False,
    ),
    (
        "frozen_busy_asks_if_paused",
        {"/metrics": page(BUSY), "/is_paused": NOT_PAUSED},
        history(BUSY, 0),
        [],
        False,
        ["/metrics", "/is_paused"],
        False,
        None,
        False,
    ),
    (
        "paused_says_so",
        {"/metrics": page(BUSY), "/is_paused": PAUSED},
        history(BUSY, 0),
        [],
        False,
        ["/metrics", "/is_paused"],
        True,
        None,
        False,
    ),
    (
        "no_pause_route_is_not_paused",
        {"/metrics": page(BUSY)},
        history(BUSY, 0),
        [],
        False,
        ["/metrics", "/is_paused"],
        False,
        None,
        False,
    ),
    (
        "a_hung_pause_route_is_not_paused",
        {"/metrics": page(BUSY), "/is_paused": ScrapeTimeout("x")},
        history(BUSY, 0),
        [],
        False,
        ["/metrics", "/is_paused"],
        False,
        None,
        False,
    ),
    (
        "idle_asks_nothing_without_a_flag",
        {"/metrics": page(IDLE)},
        history(IDLE, 0),
        [],
        False,
        ["/metrics"],
        False,
        None,
        False,
    ),
    (
        "idle_asks_the_load_with_server_load",
        {"/metrics": page(IDLE), "/load": page(b'{"server_load":0}')},
        history(IDLE, 0),
        ["--server-load"],
        False,
        ["/metrics", "/load"],
        False,
        None,
        False,
    ),
    (
        "readiness_asks_health_once",
        {"/metrics": page(BUSY), "/health": OK},
        None,
        [],
        True,
        ["/metrics", "/health"],
        False,
        "",
        False,
    ),
    (
        "health_503_does_not_serve",
        {"/metrics": page(BUSY), "/health": UNAVAILABLE},
        None,
        [],
        True,
        ["/metrics", "/health"],
        False,
        "health http://engine:8000/health: HTTP 503 Service Unavailable",
        False,
    ),
    ("health_404_has_no_opinion", {"/metrics": page(BUSY)}, None, [], True, ["/metrics", "/health"], False, "", False),
    (
        "a_silent_page_asks_nothing_more",
        {"/metrics": ScrapeTimeout("scrape: no answer")},
        history(BUSY, 0),
        [],
        True,
        ["/metrics"],
        False,
        None,
        True,
    ),
]


@pytest.mark.parametrize(
    ("answers", "previous", "flags", "readiness", "asked", "paused", "health", "silence"),
    [row[1:] for row in LOOKS],
    ids=[row[0] for row in LOOKS],
)
def test_a_look_asks_only_what_the_page_cannot_tell(
    fake: Callable[[dict[str, Answer | Exception]], Fake],
    answers: dict[str, Answer | Exception],
    previous: dict[str, State] | None,
    flags: list[str],
    readiness: bool,
    asked: list[str],
    paused: bool,
    health: str | None,
    silence: bool,
) -> None:
    assert LOOKS
    engine = fake(answers)
    settings = parse(["--url", URL, *flags], Config, environ={})
    assert isinstance(settings, Config)
    seen = observe(URL, settings, Memory(previous), lambda: 10.0, readiness=readiness)
    assert isinstance(seen, Observation)
    assert engine.asked == asked
    assert all(bool(sample.paused) is paused for sample in seen.samples.values())
    assert seen.health == health
    assert bool(seen.unanswered) is silence
    assert all(sample.answered is not silence for sample in seen.samples.values())


def test_a_refused_page_is_raised(fake: Callable[[dict[str, Answer | Exception]], Fake]) -> None:
    fake({"/metrics": ScrapeError("scrape: connection refused")})
    settings = parse(["--url", URL], Config, environ={})
    assert isinstance(settings, Config)
    with pytest.raises(ScrapeError, match="connection refused"):
        observe(URL, settings, Memory(), lambda: 1.0)


def test_silence_keeps_every_engine_seen_before() -> None:
    seen = silent({"0": State(Sample(1, 1, 1, 0)), "1": State(Sample(1, 1, 1, 0))}, 5.0, "no answer")
    assert sorted(seen.samples) == ["0", "1"]
    assert all(not s.answered and s.t == 5.0 for s in seen.samples.values())
    assert list(silent(None, 5.0, "no answer").samples) == [""]


@pytest.mark.parametrize(
    ("url", "expected"),
    [("http://h:1/metrics", "http://h:1"), ("http://h:1", "http://h:1"), ("http://[::1]:8/a/b", "http://[::1]:8")],
)
def test_origin(url: str, expected: str) -> None:
    assert origin(url) == expected


def test_the_worst_case_of_a_look_counts_every_question() -> None:
    # The page, and the one question of a stuck engine: vLLM's /is_paused (1 s), TensorRT-LLM's one-token
    # /health_generate (5 s), either for an engine the page will name.
    assert observe_module.worst_case(3.0, engine="vllm") == 3.0 + 1.0
    assert observe_module.worst_case(3.0, 2, "vllm") == 3.0 * 3 + 1.0
    assert observe_module.kubelet_timeout(3.0, 1, "sglang") == 9  # ceil(3 * 2 + 1) + 2
    assert observe_module.worst_case(3.0, engine="trtllm") == 3.0 + 5.0
    assert observe_module.worst_case(3.0) == observe_module.worst_case(3.0, engine="auto") == 3.0 + 5.0


@pytest.mark.parametrize(
    ("answer", "health", "quiet"),
    [
        (OK, "", ""),
        (ScrapeTimeout("health http://engine:8000/health: no complete answer within 3 s"), "", "no complete answer"),
        (ScrapeError("health http://engine:8000/health: connection refused"), "connection refused", ""),
        (UNAVAILABLE, "HTTP 503", ""),
    ],
    ids=["serves", "silent", "refused", "503"],
)
def test_a_health_route_that_gives_no_answer_is_silent_not_failing(
    fake: Callable[[dict[str, Answer | Exception]], Fake], answer: Answer | Exception, health: str, quiet: str
) -> None:
    """No answer in time is ambiguous (the judge excuses it until --drain-after); a refusal or an error
    status is not."""
    fake({"/metrics": page(BUSY), "/health": answer})
    settings = parse(["--url", URL], Config, environ={})
    assert isinstance(settings, Config)
    seen = observe(URL, settings, Memory(), lambda: 10.0, readiness=True)
    assert seen.health is not None
    assert (health in seen.health, bool(seen.health)) == (True, bool(health))
    assert (quiet in seen.health_silent, bool(seen.health_silent)) == (True, bool(quiet))
