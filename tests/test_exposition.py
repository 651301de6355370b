"""Reading the text exposition format: exact family names, label sets, numbers, real pages."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from conftest import sum_families, vllm_page
from stallprobe import MetricsError
from stallprobe.exposition import find_series, has_samples, is_declared

RUN = "vllm:num_requests_running"
PROMPT = "vllm:prompt_tokens_total"
GEN = "vllm:generation_tokens_total"

# (name, page, wanted family, expected sum or None when absent)
PAGES: list[tuple[str, bytes, str, float | None]] = [
    ("plain", b"m 3\n", "m", 3.0),
    ("no_trailing_newline", b"a 1\nm 4", "m", 4.0),
    ("crlf_line_ends", b"a 1\r\nm 4\r\n", "m", 4.0),
    ("labels_summed", b'm{a="1"} 2\nm{a="2"} 3.5\n', "m", 5.5),
    ("empty_label_set", b"m{} 7\n", "m", 7.0),
    ("trailing_comma", b'm{a="1",} 7\n', "m", 7.0),
    ("blanks_in_label_set", b'm{ a = "1" , b="2" } 7\n', "m", 7.0),
    ("tab_separator", b"m\t7\n", "m", 7.0),
    ("comma_and_braces_in_label", b'm{a="x,}{y=\\"z\\"",b="2"} 9\n', "m", 9.0),
    ("escaped_backslash_before_quote", b'm{a="c:\\\\",b="}"} 9\n', "m", 9.0),
    ("escaped_newline_in_label", b'm{a="line\\nm 100"} 9\n', "m", 9.0),
    ("timestamp_ignored", b"m 12 1712345678000\n", "m", 12.0),
    ("exponent", b"m 1.5e+06\n", "m", 1.5e6),
    (
        "exponent_forms",
        b'm{a="1"} 3.675428e+06\nm{a="2"} 1.0777853952e+010\n',
        "m",
        3.675428e6 + 1.0777853952e10,
    ),
    ("plus_inf", b"m +Inf\n", "m", math.inf),
    ("longer_name_is_not_the_family", b"m_x 100\nm 1\nm_total 5\n", "m", 1.0),
    ("prefix_name_is_not_the_family", b"m 1\n", "mm", None),
    ("help_text_mentioning_the_name", b"# HELP other m 99 is not a sample\nother 1\n", "m", None),
    ("name_inside_a_label_value", b'other{a="m 99"} 1\n', "m", None),
    ("declared_without_samples", b"# HELP m doc\n# TYPE m gauge\n", "m", 0.0),
    ("only_help", b"# HELP m doc\n", "m", 0.0),
    ("declared_by_base_name", b"# TYPE m counter\n", "m_total", 0.0),
    ("base_name_gauge_does_not_declare_total", b"# TYPE m gauge\n", "m_total", None),
    ("declared_longer_name_is_not_the_family", b"# TYPE m_x gauge\n", "m", None),
    ("absent", b"other 1\n", "m", None),
    ("empty_page", b"", "m", None),
]


@pytest.mark.parametrize(("page", "name", "expected"), [p[1:] for p in PAGES], ids=[p[0] for p in PAGES])
def test_sum_of_a_family(page: bytes, name: str, expected: float | None) -> None:
    assert sum_families(page, [name]) == {name: expected}


def test_pages_table_is_not_empty() -> None:
    assert PAGES


def test_nan_value_is_read_as_nan() -> None:
    (_, value), *_ = find_series(b"m NaN\n", "m")
    assert math.isnan(value)


def test_labels_are_unescaped() -> None:
    page = b'm{a="q\\"uote",b="back\\\\slash",c="new\\nline",d="x,}{y",e="\xc3\xa9"} 1\n'
    assert find_series(page, "m") == [
        ({"a": 'q"uote', "b": "back\\slash", "c": "new\nline", "d": "x,}{y", "e": "\u00e9"}, 1.0)
    ]


@pytest.mark.parametrize(
    "line",
    [
        b'm{a="1" 2\n',
        b'm{a="1\n',
        b"m{a=1} 2\n",
        b'm{a="1"b="2"} 2\n',
        b"m\n",
        b"m 1 2 3\n",
        b"m one\n",
        b'm{a="1\\',
    ],
)
def test_malformed_line_of_a_wanted_family_names_it(line: bytes) -> None:
    with pytest.raises(MetricsError, match=r"^m: "):
        sum_families(b"other 1\n" + line, ["m"])


def test_malformed_lines_of_other_families_are_ignored() -> None:
    assert sum_families(b'junk{{{ "\nm 2\n<html>\n', ["m"]) == {"m": 2.0}


@pytest.mark.parametrize("kind", [b"histogram", b"summary"])
def test_wanted_family_declared_as_histogram_is_an_error(kind: bytes) -> None:
    page = b"# TYPE m " + kind + b"\nm_sum 3\nm_count 1\n"
    with pytest.raises(MetricsError, match=f"declared as a {kind.decode()}"):
        is_declared(page, "m")


def test_prometheus_client_page_with_hostile_label_values() -> None:
    registry = CollectorRegistry()
    running = Gauge(RUN, "running", ["model_name"], registry=registry)
    running.labels(model_name='a,"}{\\\nvllm:num_requests_running 1000').set(2)
    running.labels(model_name="plain").set(3)
    Histogram("vllm:request_prompt_tokens", "look-alike", registry=registry).observe(5000)
    Counter("vllm:prompt_tokens_by_source", "look-alike", ["source"], registry=registry).labels("x").inc(7)
    page = generate_latest(registry)
    assert sum_families(page, [RUN, PROMPT]) == {RUN: 5.0, PROMPT: None}


def test_created_series_never_counts() -> None:
    page = vllm_page(running=1, generation=10, prompt=20)
    assert b"vllm:prompt_tokens_created" in page
    assert sum_families(page, [PROMPT, GEN]) == {PROMPT: 20.0, GEN: 10.0}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (rb"plain", "plain"),
        (rb"a\\b", "a\\b"),
        (rb"a\"b", 'a"b'),
        (rb"a\nb", "a\nb"),
        (rb"a\\nb", "a\\nb"),
        (rb"\\\"", '\\"'),
        (rb"\\\\\n", "\\\\\n"),
        (rb"a\xb", "a\\xb"),
        (b"nul\x00" + rb"a\\b\"c\nd\\\\\q", 'nul\x00a\\b"c\nd\\\\\\q'),
        (rb"\\" * 30000, "\\" * 30000),
    ],
)
def test_label_value_escapes_with_and_without_the_placeholder(value: bytes, expected: str) -> None:
    """Both unescaping paths: the replace chain, and one escape at a time when a NUL is in the value."""
    page = b'm{a="' + value + b'",b="after"} 1\n'
    assert find_series(page, "m") == [({"a": expected, "b": "after"}, 1.0)]


def test_has_samples_matches_exact_names_without_parsing() -> None:
    page = b'm_x 1\n# TYPE m gauge\nother{a="m 1"} 2\n'
    assert not has_samples(page, "m")
    assert has_samples(page + b"m{broken 3\n", "m")  # presence only: find_series reports the bad line
    assert has_samples(b"m 1", "m")
    assert has_samples(b"a 1\nm\r\n", "m")
