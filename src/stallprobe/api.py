"""The engine's HTTP API beyond /metrics: whether it is paused, how many requests are in flight, and the
canary, one minimal completion. Each is asked only when the page alone cannot tell (the probe says when),
so a healthy run never loads this module, nor json (which loads re).

Each question is a generator: it yields the exchanges it needs (asking.Ask) and is sent how each went
(asking.Outcome), so that the probe performs them one after another (asking.drive) and watch performs
those of thousands of engines at once on one thread, both asking and judging alike (observe.look).

Each question has a deadline of its own. A question that goes unanswered, or that the engine does not
serve (404), changes nothing: no answer is never "paused", and never "in flight". Only the canary's
silence is evidence, and only of the kind the page cannot give: requests hung at an engine that looks idle.
"""

from __future__ import annotations

from .asking import Ask, drive
from .errors import BadAnswer, MetricsError, ScrapeError, ScrapeTimeout
from .jsonlite import loads
from .report import num, secs
from .scrape import status_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Generator, Mapping
    from typing import Protocol, TypeVar

    from .asking import Outcome
    from .detector import Sample, State
    from .engines import Dialect
    from .scrape import Answer

    T = TypeVar("T")
    Asks = Generator[Ask, Outcome, T]  # a question: the exchanges it needs, then what it learnt

    class Asking(Protocol):
        """What asking an idle-looking engine needs of a command's configuration (the probe's, watch's)."""

        key: str  # the API key, "" for none
        timeout: float  # each exchange's deadline
        canary: bool  # --canary
        server_load: bool  # --server-load


__all__ = [
    "CONFIRMED",
    "CONFIRM_TIMEOUT",
    "MAX_JSON",
    "Reply",
    "ask",
    "ask_idle",
    "ask_live",
    "ask_paused",
    "canary",
    "carried",
    "confirmed",
    "health_paused",
    "in_flight",
    "is_paused",
    "live_loads",
    "paused_answer",
    "server_load",
]

# The one question an engine that looks stuck is asked: vLLM's /is_paused, LMDeploy's /is_sleeping,
# SGLang's /v1/loads. vLLM answers /is_paused through its engine core, between two steps: within
# milliseconds when it is paused (the core is idle) or healthy; a wedged core never answers. A second is
# far above the first and keeps the probe's run short when the core is wedged.
STUCK_QUESTION_TIMEOUT = 1.0
# A one-token generation through a whole engine (TensorRT-LLM's /health_generate), asked of an engine that
# would be stalled on its page alone: a prefill of a few tokens and one decoding step, seconds even on an
# engine busy with long requests; longer is as good as none (its page then decides).
CONFIRM_TIMEOUT = 5.0
# The canary's prompt and its single token: the least work that goes through the whole engine.
_CANARY_PROMPT = "Hi"
MAX_JSON = 1024 * 1024  # a model list, a one-token completion or a route's answer is a few KB


def _json(answer: Answer, where: str) -> object:
    try:
        return loads(answer.body.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        raise MetricsError(f"{where}: the answer is not JSON") from None


class Reply:
    """What one of the engine's routes answered: its status (None: no answer), its JSON (None unless a
    200 with JSON), and what a person reads of it, after the route's name ("answers 200", "answers HTTP
    404 Not Found", "gives no answer within 1 s"): the probe reads `data`, doctor says `why`."""

    __slots__ = ("code", "data", "why")

    def __init__(self, code: int | None, data: object, why: str) -> None:
        self.code = code
        self.data = data
        self.why = why


def ask(url: str, key: str, timeout: float) -> Reply:
    """Ask one of the engine's routes within `timeout`, here and now. Never raises: a question that goes
    unanswered, or that the engine does not serve, changes nothing."""
    import time

    return drive(_ask(url, key, timeout), time.monotonic)


def _ask(url: str, key: str, timeout: float) -> Asks[Reply]:
    outcome = yield Ask(url, timeout, key=key, max_bytes=MAX_JSON, what="ask")
    try:
        answer = outcome.result()
    except ScrapeTimeout:
        return Reply(None, None, f"gives no answer within {num(timeout)} s")
    except ScrapeError as exc:
        return Reply(None, None, f"fails: {str(exc).removeprefix(f'ask {url}: ')}")
    if answer.code != 200:
        wants = ": it wants the API key" if answer.code in (401, 403) else ""
        return Reply(answer.code, None, f"answers HTTP {answer.code} {answer.reason}".rstrip() + wants)
    try:
        data = _json(answer, f"ask {url}")
    except MetricsError:
        return Reply(answer.code, None, f"answers {answer.code}, not with JSON")
    return Reply(answer.code, data, f"answers {answer.code}")


def _asked(url: str, key: str, timeout: float) -> Asks[object]:
    """The JSON a route answers with a 200 within `timeout`; None for any other answer, for none, and for
    a route the engine does not serve."""
    return (yield from _ask(url, key, timeout)).data


def paused_answer(data: object, name: str = "is_paused") -> bool | None:
    """What a pause route said (vLLM's /is_paused `{"is_paused": true}`, LMDeploy's /is_sleeping
    `{"is_sleeping": true}`: `name` is the key): True or False, None when the answer is not the engine's."""
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, bool) else None


def is_paused(
    base: str, route: str, key: str, timeout: float = STUCK_QUESTION_TIMEOUT, *, name: str = "is_paused"
) -> Asks[bool]:
    """Whether the engine says its operator paused it (its answer's `name` is true). False for any other
    answer, for none within the deadline, and for a route the engine does not serve."""
    return paused_answer((yield from _asked(base + route, key, timeout)), name) is True


def ask_paused(
    samples: Mapping[str, Sample], base: str, route: str, key: str, *, name: str = "is_paused"
) -> Asks[dict[str, Sample] | None]:
    """For an engine that would otherwise be judged suspect or stalled (and only then: a healthy run
    asks nothing): its samples marked paused when the engine says its operator paused it, else None."""
    if not (yield from is_paused(base, route, key, name=name)):
        return None
    why = f"paused by its operator ({route})"
    return {name: sample.replace(paused=sample.paused or why) for name, sample in samples.items()}


def health_paused(samples: Mapping[str, Sample], body: bytes, route: str, key: str, value: str) -> dict[str, Sample]:
    """The samples marked paused when the health route's 2xx answer (`body`) is a JSON object with `key`
    at `value` (Dialect.health_paused: LMDeploy's /health answers 200 `{"status": "sleeping"}` asleep,
    when its gauges may read idle and every generation is answered 503); else unchanged."""
    try:
        data = loads(body.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        return dict(samples)
    if not isinstance(data, dict) or data.get(key) != value:
        return dict(samples)
    why = f"paused by its operator ({route} says {key} {value})"
    return {name: sample.replace(paused=sample.paused or why) for name, sample in samples.items()}


# SGLang's /v1/loads: the queues of a disaggregated engine that wait on a peer or the network, never on
# the scheduler (its `disaggregation` section, sglang/srt/managers/load_snapshot.py).
_PEER_QUEUES = (
    "prefill_bootstrap_queue_reqs",
    "decode_prealloc_queue_reqs",
    "decode_transfer_queue_reqs",
    "decode_retracted_queue_reqs",
)


def _count(data: object, key: str) -> float | None:
    """The finite number >= 0 at `key` of a JSON object; None when there is none."""
    value = data.get(key) if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        return None
    return float(value)


def live_loads(data: object) -> list[object] | None:
    """The snapshots SGLang's /v1/loads answered (`{"loads": [...]}`, one per data-parallel rank); None
    when the answer has none."""
    loads = data.get("loads") if isinstance(data, dict) else None
    return loads if isinstance(loads, list) and loads else None


def ask_live(samples: Mapping[str, Sample], base: str, route: str, key: str) -> Asks[dict[str, Sample] | None]:
    """For an engine that would otherwise be judged suspect or stalled (and only then): its running and
    waiting requests as its scheduler last published them (SGLang's /v1/loads, one snapshot per data-
    parallel rank), in place of the page's gauges, which SGLang refreshes only after a batch or when
    fully idle, and so shows a stale batch while requests wait on something. Waiting requests are owed
    unless they wait on a peer (a disaggregated engine's bootstrap, prealloc, transfer queues). None when
    the route gives no usable answer within its deadline (the page stands)."""
    loads = live_loads((yield from _asked(base + route, key, STUCK_QUESTION_TIMEOUT)))
    if loads is None:
        return None
    live: dict[str, tuple[float, float, float]] = {}
    for load in loads:
        running, waiting = _count(load, "num_running_reqs"), _count(load, "num_waiting_reqs")
        if running is None or waiting is None or not isinstance(load, dict):
            return None
        queues, peer = load.get("queues"), load.get("disaggregation")
        owed = _count(queues, "waiting")
        if owed is None:  # without the queues section: all waiting but those waiting on a peer
            owed = max(0.0, waiting - sum(_count(peer, name) or 0.0 for name in _PEER_QUEUES))
        # The page read as one engine sums the ranks; else each rank is the engine of its name.
        rank = "" if set(samples) == {""} else str(load.get("dp_rank", 0))
        before = live.get(rank, (0.0, 0.0, 0.0))
        live[rank] = (before[0] + running, before[1] + waiting, before[2] + owed)
    if set(live) != set(samples):
        return None  # not the engines the page shows: nothing to say about them
    return {
        name: sample.replace(running=live[name][0], waiting=live[name][1], owed=live[name][2])
        for name, sample in samples.items()
    }


def confirmed(
    samples: Mapping[str, Sample], base: str, route: str, key: str, timeout: float
) -> Asks[tuple[dict[str, Sample], str]]:
    """For an engine that would be stalled on its page alone (and only then): ask `route`, a request
    through the whole engine (TensorRT-LLM's /health_generate: a one-token generation). Its 2xx answer is
    life its page could not show (a long request that finishes nothing yet): a signal that changes at each
    such answer (CONFIRMED, the time it answered) marks the samples as moving, and a note says so. Any
    other answer, or none, changes nothing: the page's verdict stands."""
    outcome = yield Ask(base + route, timeout, key=key, max_bytes=MAX_JSON, what="ask")
    try:
        answer = outcome.result()
    except ScrapeError:
        return dict(samples), ""
    if not 200 <= answer.code < 300:
        return dict(samples), ""
    moved = {
        name: sample.replace(signals={**sample.signals, CONFIRMED: outcome.ended}) for name, sample in samples.items()
    }
    return moved, f"its page held still, and {route} answered (a request through the whole engine)"


def carried(samples: Mapping[str, Sample], previous: Mapping[str, State] | None) -> dict[str, Sample]:
    """The samples with the last look's CONFIRMED kept where this look has none: the signal changes only
    when the engine answers again. (A signal that vanished would read as progress at the next look,
    a window's grace the engine never earned; one that failed to answer changes nothing.)"""
    out = dict(samples)
    for name, sample in samples.items():
        before = previous.get(name) if previous else None
        at = before.last.signals.get(CONFIRMED) if before is not None else None
        if at is not None and CONFIRMED not in sample.signals:
            out[name] = sample.replace(signals={**sample.signals, CONFIRMED: at})
    return out


# The signal a confirmed look carries: when the engine answered a request through its whole engine.
CONFIRMED = "stallprobe:confirmed_at"


def in_flight(base: str, route: str, key: str, timeout: float) -> Asks[float]:
    """How many HTTP requests the server is serving (vLLM's /load, `{"server_load": N}`, counted only
    with --enable-server-load-tracking); 0 when it does not say."""
    return server_load((yield from _asked(base + route, key, timeout))) or 0.0


def server_load(data: object) -> float | None:
    """The count vLLM's /load answered (`{"server_load": N}`); None when the answer has none."""
    return _count(data, "server_load")


def canary(base: str, key: str, timeout: float) -> Asks[float | None]:
    """Send the canary: the model named by /v1/models, a one-token completion, all within `timeout`.

    The seconds it took, or None when it got no complete answer in time (the evidence: requests hang).
    Any other failure is unambiguous and raised: ScrapeError for a refusal, BadAnswer for an HTTP error (a
    401 says how to give the key), MetricsError for an answer that is not the API's (HTML, not JSON, no
    model). The last two are answers the server gave: the probe then asks the health route.
    """
    where = f"canary {base}/v1/models"
    outcome = yield Ask(f"{base}/v1/models", timeout, key=key, max_bytes=MAX_JSON, what="canary")
    started = outcome.started
    try:
        answer = outcome.result()
        if answer.code != 200:
            raise BadAnswer(status_error(where, answer))
        data = _json(answer, where)
        models = data.get("data") if isinstance(data, dict) else None
        model = models[0].get("id") if isinstance(models, list) and models and isinstance(models[0], dict) else None
        if not isinstance(model, str) or not model:
            raise MetricsError(f"{where}: the answer names no model")
        import json

        body = json.dumps({"model": model, "prompt": _CANARY_PROMPT, "max_tokens": 1, "temperature": 0}).encode()
        left = timeout - (outcome.ended - started)
        where = f"canary {base}/v1/completions"
        if left <= 0:
            return None
        outcome = yield Ask(
            f"{base}/v1/completions", left, method="POST", body=body, key=key, max_bytes=MAX_JSON, what="canary"
        )
        answer = outcome.result()
        if answer.code != 200:
            raise BadAnswer(status_error(where, answer))
        data = _json(answer, where)
        if not (isinstance(data, dict) and isinstance(data.get("choices"), list)):
            raise MetricsError(f"{where}: the answer is not a completion")
    except ScrapeTimeout:
        return None
    return outcome.ended - started


def ask_idle(
    samples: Mapping[str, Sample],
    config: Asking,
    *,
    base: str,
    dialect: Dialect,
    now: float,
    canary_due: bool,
) -> Asks[tuple[dict[str, Sample], str, float | None]]:
    """For an engine that looks idle (detector.looks_idle): the requests its server has in flight
    (config.server_load), then the canary (config.canary) when it is due (judge.canary_due) and the
    server has none in flight. Either, when it finds requests owed, makes them pending on every engine.
    The samples, what was learnt, and when the canary went out (None: it did not)."""
    pending = 0.0
    note = ""
    sent: float | None = None
    key, timeout = config.key, config.timeout
    if config.server_load and dialect.load_route:
        pending = yield from in_flight(base, dialect.load_route, key, timeout)
        if pending:
            note = f"the server has {secs(pending).rstrip('0').rstrip('.')} requests in flight"
    if config.canary and not pending and canary_due:
        sent = now
        took = yield from canary(base, key, timeout)
        if took is None:
            pending = 1.0
            note = f"the canary got no answer within {secs(timeout)} s"
        else:
            note = f"the canary was answered in {secs(took)} s"
    if not pending:
        return dict(samples), note, sent
    return {name: sample.replace(pending=pending) for name, sample in samples.items()}, note, sent
