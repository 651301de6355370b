"""The engine's routes beyond /metrics (api.py), in process: the JSON reader that spares a stuck-looking
engine's run the json import, and each question fed the outcome of its exchange (performed by no one)."""

from __future__ import annotations

import json
from collections.abc import Generator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallprobe import api, jsonlite
from stallprobe.asking import Ask, Outcome
from stallprobe.errors import ScrapeError, ScrapeTimeout
from stallprobe.scrape import Answer

# (text, what json.loads reads): the answers the engines give, and the edges of the fast reader.
READS: list[tuple[str, object]] = [
    ('{"is_paused":false}', {"is_paused": False}),
    ('{"is_paused": true}', {"is_paused": True}),
    ('{"server_load":3}', {"server_load": 3}),
    (' { "a" : -0.5 , "b" : null, "c": "x y" }\n', {"a": -0.5, "b": None, "c": "x y"}),
    ("{}", {}),
    ('{"a":1,"a":2}', {"a": 2}),
    ('{"a":{"b":1}}', {"a": {"b": 1}}),  # nested: json reads it
    ('{"a":[1,2]}', {"a": [1, 2]}),
    ('{"a":1e3}', {"a": 1000.0}),
    ('{"a":"\\u00e9"}', {"a": "\u00e9"}),
    ("[1]", [1]),
    ("true", True),
]
REFUSED = ['{"a":1,}', '{"a":01}', '{"a":.5}', '{"a":-}', '{"a" 1}', "{a:1}", '{"a":"x\ny"}', "{", "", '{"a":tru}']


@pytest.mark.parametrize(("text", "expected"), READS)
def test_loads_reads_as_json_does(text: str, expected: object) -> None:
    assert READS
    assert jsonlite.loads(text) == json.loads(text) == expected


@pytest.mark.parametrize("text", REFUSED)
def test_loads_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        jsonlite.loads(text)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='{}[]":,. -0123456789eEtruflsnab\\\n\t', max_size=40))
def test_the_fast_reader_never_disagrees_with_json(text: str) -> None:
    """Whatever it reads, json reads the same; what it declines (None) goes to json (the next property
    shows it declines none of the answers it is for)."""
    flat = jsonlite._flat(text)
    assert flat is None or json.loads(text) == flat


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet="abc_xyz", max_size=8),
        st.one_of(st.booleans(), st.none(), st.integers(-(10**6), 10**6), st.text(alphabet="ab c", max_size=5)),
        max_size=5,
    ),
    st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")]),
)
def test_the_fast_reader_reads_every_flat_object(data: dict[str, object], separators: tuple[str, str]) -> None:
    text = json.dumps(data, separators=separators)
    assert jsonlite._flat(text) == data


def asked(question: Generator[Ask, Outcome, bool], outcome: Outcome) -> bool:
    """What a question concludes when its one exchange goes as `outcome` (performed by no one)."""
    ask = next(question)
    assert ask.url == "http://e/is_paused"
    with pytest.raises(StopIteration) as done:
        question.send(outcome)
    result: bool = done.value.value
    return result


@pytest.mark.parametrize(
    ("code", "body", "paused"),
    [
        (200, b'{"is_paused":true}', True),
        (200, b'{"is_paused":false}', False),
        (200, b'{"is_paused":"true"}', False),  # only a JSON true is a pause
        (200, b"<html>", False),
        (200, b"[" * 100_000, False),  # nested past the interpreter's stack: not JSON, never a traceback
        (200, b"\xff\xfe", False),
        (404, b'{"is_paused":true}', False),  # a route the engine does not serve says nothing
        (500, b"", False),
    ],
)
def test_is_paused_believes_only_a_true(code: int, body: bytes, paused: bool) -> None:
    outcome = Outcome(Answer(code, "", {}, body), None, 0.0, 0.1)
    assert asked(api.is_paused("http://e", "/is_paused", ""), outcome) is paused


@pytest.mark.parametrize("error", [ScrapeError("refused"), ScrapeTimeout("no answer")])
def test_no_answer_is_never_paused(error: ScrapeError) -> None:
    assert asked(api.is_paused("http://e", "/is_paused", ""), Outcome(None, error, 0.0, 1.0)) is False


def test_a_confirmation_is_carried_until_the_engine_answers_again() -> None:
    """The last look's CONFIRMED is kept where this look has none (a vanished signal would read as
    progress), a new answer replaces it, and an engine never confirmed gets none."""
    from stallprobe.detector import Sample, State

    now = {"0": Sample(1, 10, 5, 50.0), "1": Sample(1, 10, 5, 50.0, signals={api.CONFIRMED: 49.0})}
    before = {"0": State(Sample(1, 10, 5, 40.0, signals={api.CONFIRMED: 39.0})), "1": State(Sample(1, 10, 5, 40.0))}
    kept = api.carried(now, before)
    assert kept["0"].signals == {api.CONFIRMED: 39.0}
    assert kept["1"].signals == {api.CONFIRMED: 49.0}
    assert api.carried(now, None) == now
    assert api.carried({"2": Sample(1, 10, 5, 50.0)}, before)["2"].signals == {}


@pytest.mark.parametrize(
    ("body", "paused"),
    [
        (b'{"status":"sleeping","message":"Engine is sleeping."}', True),
        (b'{"status":"healthy","message":"ok"}', False),
        (b'{"status":"Sleeping"}', False),
        (b'{"state":"sleeping"}', False),
        (b'["sleeping"]', False),
        (b"sleeping", False),
        (b"[" * 100_000, False),
        (b"\xff", False),
    ],
)
def test_only_the_health_answer_the_dialect_names_is_a_pause(body: bytes, paused: bool) -> None:
    from stallprobe.detector import Sample

    samples = {"": Sample(0, 10, 5, 50.0)}
    marked = api.health_paused(samples, body, "/health", "status", "sleeping")
    assert marked[""].paused == ("paused by its operator (/health says status sleeping)" if paused else "")
