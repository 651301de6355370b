"""Engine dialects: telling engines apart, reading each engine's sample, real pages of every engine."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO, fixture_page, llamacpp_page, read_sample, sglang_page, vllm_engines_page, vllm_page
from stallprobe import MetricsError, Sample
from stallprobe.engines import (
    DIALECTS,
    ENGINE_NAMES,
    LLAMACPP,
    LMDEPLOY,
    SGLANG,
    TRTLLM,
    VLLM,
    Dialect,
    Owing,
    PauseSign,
    choose,
    detect,
    health_route,
    precision_note,
    read_engines,
)
from stallprobe.engines import about as engine_about

RUN, WAIT, PROMPT, GEN = VLLM.running, VLLM.waiting, VLLM.prompt, VLLM.generation
KV = "vllm:kv_cache_usage_perc"
NO_ENGINE = (
    "no known engine's metrics on the page (looked for vllm, sglang, llamacpp, lmdeploy, trtllm): pass --engine "
    "and names"
)


# Every real page: the dialect it must be read as and each engine's (running, waiting, owed, prompt,
# generation, signals), read off the page by hand; or the start of the error reading it must give.
REAL: dict[str, tuple[str, dict[str, tuple[float, float, float, float, float, dict[str, float]]]] | str] = {
    "vllm-0.32.0-cpu-busy.prom": ("vllm", {"0": (4, 0, 0, 173, 907, {KV: 0.0019536019536019467})}),
    # --api-server-count 2 before its first request: the running and waiting gauges declared, no sample.
    "vllm-0.32.0-cpu-multiprocess-idle.prom": (
        "required metric missing from the vllm page: vllm:num_requests_running (declared, with no sample)"
    ),
    "vllm-0.32.0-cpu-paused-keep.prom": ("vllm", {"0": (4, 0, 0, 244, 2601, {KV: 0.002930045171529727})}),
    "vllm-0.32.0-cpu-asleep.prom": ("vllm", {"0": (0, 0, 0, 244, 2601, {KV: 0.0})}),
    # The admission wedge, staged on the real engine: all three waiting for capacity, owed.
    "vllm-0.32.0-cpu-wedged-capacity.prom": ("vllm", {"0": (0, 3, 3, 61, 8, {KV: 0.0})}),
    # The same wedge with a structured-output request deferred behind it: none owed while one is deferred.
    "vllm-0.32.0-cpu-wedged-sticky-deferred.prom": ("vllm", {"0": (0, 4, 3, 61, 8, {KV: 0.0})}),
    # A healthy grammar compile: deferred, not owed.
    "vllm-0.32.0-cpu-deferred-grammar.prom": ("vllm", {"0": (0, 1, 0, 305, 64, {KV: 0.0})}),
    "vllm-v1-ahasannn-hwrouter-f7a8250.prom": ("vllm", {"0": (0, 0, 0, 0, 0, {KV: 0.0})}),
    "vllm-v1-inferstack-0.29.0-651cd61.prom": ("vllm", {"0": (0, 0, 0, 530, 584, {KV: 0.0})}),
    "vllm-v1-lmswitch-f5803ce.prom": ("vllm", {"0": (0, 0, 0, 3675428, 44995, {KV: 0.0})}),
    "vllm-v0-mp-docs-usage-metrics-snippet-044a056.prom": "no known engine's metrics on the page",
    "sglang-docs-production-metrics-00b08c4.prom": (
        "sglang",
        {"": (162, 2826, 2826, 8128902, 7557572, {"sglang:num_used_tokens": 123859, "sglang:token_usage": 0.28})},
    ),
    "llamacpp-server-11434-local.prom": ("llamacpp", {"": (0, 0, 0, 41, 142, {"llamacpp:n_decode_total": 142})}),
}
# Each real page's engines' finished and preempted requests (vllm:request_success_total over every
# finished_reason, vllm:num_preemptions_total), read off the page by hand; the pages of engines whose
# dialect counts neither read None for both.
REAL_COUNTS: dict[str, dict[str, tuple[float, float]]] = {
    "vllm-0.32.0-cpu-busy.prom": {"0": (1, 0)},
    "vllm-0.32.0-cpu-paused-keep.prom": {"0": (0, 0)},
    "vllm-0.32.0-cpu-asleep.prom": {"0": (0, 0)},
    "vllm-0.32.0-cpu-wedged-capacity.prom": {"0": (0, 0)},
    "vllm-0.32.0-cpu-wedged-sticky-deferred.prom": {"0": (0, 0)},
    "vllm-0.32.0-cpu-deferred-grammar.prom": {"0": (4, 0)},
    "vllm-v1-ahasannn-hwrouter-f7a8250.prom": {"0": (0, 0)},
    "vllm-v1-inferstack-0.29.0-651cd61.prom": {"0": (10, 0)},
    "vllm-v1-lmswitch-f5803ce.prom": {"0": (26, 0)},
}
# The real pages whose engines read as paused, and why (every other engine of every page: not paused).
REAL_PAUSED: dict[str, dict[str, str]] = {
    "vllm-0.32.0-cpu-asleep.prom": {"0": "asleep (sleep mode)"},
}


def test_every_real_fixture_has_an_expectation() -> None:
    assert REAL
    assert sorted(REAL) == sorted(p.name for p in FIXTURES.glob("*.prom"))


@pytest.mark.parametrize(("name", "expected"), sorted(REAL.items()))
def test_real_page_is_read_with_its_dialect_and_numbers(name: str, expected: object) -> None:
    page = fixture_page(name)
    if isinstance(expected, str):
        with pytest.raises(MetricsError, match=f"^{re.escape(expected)}"):
            read_engines(page, 7.0, detect(page))
        return
    assert isinstance(expected, tuple)
    dialect_name, engines = expected
    dialect = detect(page)
    assert dialect.name == dialect_name
    samples = read_engines(page, 7.0, dialect)
    paused = REAL_PAUSED.get(name, {})
    counts = REAL_COUNTS.get(name, {})
    assert samples == {
        engine: Sample(
            running,
            gen,
            prompt,
            7.0,
            waiting,
            signals=signals,
            owed=owed,
            paused=paused.get(engine, ""),
            finished=counts[engine][0] if engine in counts else None,
            preemptions=counts[engine][1] if engine in counts else None,
        )
        for engine, (running, waiting, owed, prompt, gen, signals) in engines.items()
    }


# The prefix each engine puts on its families: its name and a colon, but TensorRT-LLM's `trtllm_`.
PREFIXES = {"vllm": "vllm:", "sglang": "sglang:", "llamacpp": "llamacpp:", "lmdeploy": "lmdeploy:", "trtllm": "trtllm_"}


def test_each_dialect_names_distinct_families() -> None:
    assert [d.name for d in DIALECTS] == list(PREFIXES)
    for dialect in DIALECTS:
        names = [dialect.running, dialect.waiting, dialect.prompt, dialect.generation, *dialect.signals]
        names += [name for name in (dialect.finished, dialect.preemptions) if name]
        assert len(set(names)) == len(names)
        assert all(name.startswith(PREFIXES[dialect.name]) for name in names)


def test_page_with_two_engines_families_is_ambiguous() -> None:
    page = fixture_page("vllm-0.32.0-cpu-busy.prom") + fixture_page("llamacpp-server-11434-local.prom")
    with pytest.raises(MetricsError, match=r"^the page fits vllm and llamacpp: pass --engine to choose$"):
        detect(page)
    assert detect(page, [LLAMACPP]) is LLAMACPP


def test_partly_present_dialect_names_what_it_lacks() -> None:
    page = b"".join(line + b"\n" for line in vllm_page(1, 2, 3).splitlines() if GEN.encode() not in line)
    with pytest.raises(MetricsError, match=f"^required metric missing from the vllm page: {GEN}$"):
        detect(page)


@pytest.mark.parametrize(
    ("page", "message"),
    [
        (b"  <!doctype html><html><body>vllm</body></html>", "not a metrics page: the server sent HTML"),
        (b"", NO_ENGINE),
        (b"\x00\xff\xfe garbage", NO_ENGINE),
        (b"# HELP vllm:num_requests_running_x doc\nvllm:num_requests_running_x 1\n", NO_ENGINE),
        # Only the first 4 KiB are looked at for HTML: a page is not copied to be stripped.
        (b" " * 4096 + b"<html>", NO_ENGINE),
        (b" " * 4095 + b"<html>", "not a metrics page: the server sent HTML"),
    ],
)
def test_no_dialect_fits(page: bytes, message: str) -> None:
    with pytest.raises(MetricsError) as caught:
        detect(page)
    assert str(caught.value) == message


def test_a_page_with_some_of_one_engines_families_names_every_missing_one() -> None:
    page = b"vllm:num_requests_running 1\n"
    with pytest.raises(MetricsError) as caught:
        detect(page)
    assert str(caught.value) == (
        "required metric missing from the vllm page: vllm:prompt_tokens_total, vllm:generation_tokens_total"
    )
    with pytest.raises(MetricsError) as caught:
        read_engines(page, 0.0)
    assert str(caught.value) == (
        "required metric missing from the vllm page: vllm:generation_tokens_total, vllm:prompt_tokens_total"
    )


@pytest.mark.parametrize(
    ("page", "message"),
    [
        (b"<html><body>502</body></html>", "not a metrics page: the server sent HTML"),
        (
            b"up 1\n",
            "not a vllm metrics page: none of vllm:num_requests_running, vllm:generation_tokens_total, "
            "vllm:prompt_tokens_total is on it",
        ),
    ],
)
def test_a_page_without_the_named_engines_families_says_so(page: bytes, message: str) -> None:
    with pytest.raises(MetricsError) as caught:
        read_engines(page, 0.0, VLLM)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("dialect", "port", "hints"),
    [
        (VLLM, 8000, ("vllm",)),
        (SGLANG, 30000, ("sglang",)),
        (LLAMACPP, 8080, ("llama.cpp", "llama-cpp", "llamacpp", "llama_cpp", "llama-server")),
        (LMDEPLOY, 23333, ("lmdeploy",)),
        (TRTLLM, 8000, ("tensorrt-llm", "tensorrt_llm", "trtllm")),
    ],
)
def test_each_engine_has_its_default_port_and_the_words_that_name_it(
    dialect: Dialect, port: int, hints: tuple[str, ...]
) -> None:
    # Each engine's own default (vLLM's, SGLang's, llama-server's, lmdeploy serve api_server's --server-port,
    # trtllm-serve's --port); inject reads them from here.
    assert (dialect.port, dialect.hints) == (port, hints)
    assert (dialect.with_names(running="x").port, dialect.with_names(running="x").hints) == (port, hints)
    assert ENGINE_NAMES == ("auto", "vllm", "sglang", "llamacpp", "lmdeploy", "trtllm")


def test_renamed_families_are_found_through_overrides() -> None:
    page = vllm_page(2, 10, 20).replace(b"vllm:num_requests_running", b"myfork:running_requests")
    with pytest.raises(MetricsError):
        detect(page)
    fork = VLLM.with_names(running="myfork:running_requests")
    assert detect(page, [fork, SGLANG]) is fork
    assert read_engines(page, 1.0, fork)["0"].running == 2


def test_with_names_keeps_what_is_not_overridden() -> None:
    fork = LLAMACPP.with_names(prompt="p_total", engine_label="slot")
    assert (fork.name, fork.running, fork.prompt, fork.generation, fork.waiting) == (
        "llamacpp",
        LLAMACPP.running,
        "p_total",
        LLAMACPP.generation,
        LLAMACPP.waiting,
    )
    assert (fork.signals, fork.engine_label, fork.digits) == (LLAMACPP.signals, "slot", 6)
    assert VLLM.with_names(engine_label="").engine_label is None
    assert VLLM.with_names().engine_label == "engine"


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda dialect: dialect.name)
def test_with_names_and_no_override_is_the_same_dialect(dialect: Dialect) -> None:
    same = dialect.with_names()
    assert {slot: getattr(same, slot) for slot in Dialect.__slots__} == {
        slot: getattr(dialect, slot) for slot in Dialect.__slots__
    }


@pytest.mark.parametrize(
    ("dialect", "paused"),
    [
        (VLLM, ("", "")),
        (SGLANG, ("", "")),
        (LLAMACPP, ("", "")),
        (LMDEPLOY, ("status", "sleeping")),
        (TRTLLM, ("", "")),
    ],
)
def test_only_lmdeploy_says_paused_in_its_health_answer(dialect: Dialect, paused: tuple[str, str]) -> None:
    # LMDeploy's /health answers 200 {"status": "sleeping"} asleep; no other engine's health says so.
    assert dialect.health_paused == paused
    fork = Dialect("fork", running="r", waiting="w", prompt="p", generation="g", port=1, hints=())
    assert fork.health_paused == ("", "")


# --- several engines behind one page


def data_parallel_page(engines: dict[str, tuple[float, float, float, float, float]], unlabelled: bool = False) -> bytes:
    """A vLLM V1 page with one series per engine: (running, waiting, prompt, generation, kv usage)."""
    return vllm_engines_page(engines, model="m", unlabelled=unlabelled)


def test_data_parallel_engines_are_read_one_by_one() -> None:
    page = data_parallel_page({"0": (3, 1, 100, 900, 0.5), "1": (5, 0, 40, 70, 0.25)})
    assert read_engines(page, 2.0) == {
        "0": Sample(3, 900, 100, 2.0, 1, signals={KV: 0.5}),
        "1": Sample(5, 70, 40, 2.0, 0, signals={KV: 0.25}),
    }


def test_a_series_without_the_engine_label_reads_the_page_as_one_engine() -> None:
    page = data_parallel_page({"0": (3, 1, 100, 900, 0.5), "1": (5, 0, 40, 70, 0.25)}, unlabelled=True)
    assert read_engines(page, 2.0) == {"": Sample(9, 970, 140, 2.0, 1, signals={KV: 0.75})}


def test_read_sample_sums_every_engine() -> None:
    page = data_parallel_page({"0": (3, 1, 100, 900, 0.5), "1": (5, 0, 40, 70, 0.25)})
    assert read_sample(page, 2.0) == Sample(8, 970, 140, 2.0, 1, signals={KV: 0.75})


def test_unlabelled_signal_is_evidence_for_every_engine() -> None:
    page = data_parallel_page({"0": (3, 1, 100, 900, 0.5), "1": (5, 0, 40, 70, 0.25)})
    page += b"# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.125\n"
    samples = read_engines(page, 2.0)
    assert samples["0"].signals == {KV: 0.5, "vllm:gpu_cache_usage_perc": 0.125}
    assert samples["1"].signals == {KV: 0.25, "vllm:gpu_cache_usage_perc": 0.125}


def test_extra_progress_metrics_become_signals() -> None:
    page = vllm_page(2, 10, 20) + b'vllm:num_preemptions_total{engine="0"} 7\nmy_heartbeat 41\n'
    sample = read_engines(page, 1.0, VLLM, ["vllm:num_preemptions_total", "my_heartbeat"])["0"]
    assert sample.signals == {"vllm:num_preemptions_total": 7, "my_heartbeat": 41}


def test_engine_label_none_reads_one_engine() -> None:
    page = data_parallel_page({"0": (3, 1, 100, 900, 0.5), "1": (5, 0, 40, 70, 0.25)})
    assert list(read_engines(page, 0.0, VLLM.with_names(engine_label=""))) == [""]


@pytest.mark.parametrize("family", [RUN, PROMPT, GEN])
def test_a_required_family_declared_with_no_sample_cannot_be_read(family: str) -> None:
    # Never a frozen 0: a counter read as 0 beside the one the engine moves would fake a stall.
    page = b"".join(line + b"\n" for line in vllm_page(1, 2, 3).splitlines() if not line.startswith(family.encode()))
    assert f"# TYPE {family.removesuffix('_total')}".encode() in page
    with pytest.raises(MetricsError, match=f"^required metric missing from the vllm page: {family} \\(declared"):
        read_engines(page, 0.0)
    empty = b"".join(f"# TYPE {name} gauge\n".encode() for name in (RUN, WAIT, PROMPT, GEN))
    with pytest.raises(MetricsError, match="declared, with no sample"):
        read_engines(empty, 0.0)


# A counter written as text format 0.0.4 allows: declared and sampled by its base name, without `_total`.
BARE = (
    b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    b"# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens 120\n"
    b"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens 57\n"
)


def test_a_counter_sampled_without_total_is_read_under_its_name() -> None:
    assert detect(BARE) is VLLM
    assert read_engines(BARE, 1.0) == {"": Sample(3, 57, 120, 1.0)}
    # A counter named without `_total` (a --generation-metric) reads the page's `_total` samples too.
    named = VLLM.with_names(prompt="vllm:prompt_tokens", generation="vllm:generation_tokens")
    assert read_engines(vllm_page(1, 2, 3), 1.0, named) == {"0": Sample(1, 2, 3, 1.0)}


def test_a_counter_spelled_both_ways_is_read_once_under_the_name_asked() -> None:
    page = BARE + b"vllm:generation_tokens_total 60\n"
    assert read_engines(page, 1.0)[""].generation == 60


def test_an_engine_without_a_series_of_a_required_family_cannot_be_read() -> None:
    page = data_parallel_page({"0": (3, 1, 100, 900, 0.5), "1": (5, 0, 40, 70, 0.25)})
    cut = b"".join(
        line + b"\n" for line in page.splitlines() if not (line.startswith(PROMPT.encode()) and b'engine="1"' in line)
    )
    with pytest.raises(MetricsError, match=f"^required metric {PROMPT} has no series for engine 1 on the vllm page"):
        read_engines(cut, 0.0)


@pytest.mark.parametrize("missing", [RUN, PROMPT, GEN])
def test_missing_required_family_is_named(missing: str) -> None:
    page = b"".join(line + b"\n" for line in vllm_page(1, 2, 3).splitlines() if missing.encode() not in line)
    with pytest.raises(MetricsError, match=f"required metric missing from the vllm page: {missing}$"):
        read_engines(page, 0.0)


def test_waiting_is_optional() -> None:
    assert read_engines(vllm_page(3, 10, 20, waiting=None), 1.0) == {"0": Sample(3, 10, 20, 1.0, 0)}


@pytest.mark.parametrize("family", [RUN, GEN, PROMPT, WAIT, KV])
@pytest.mark.parametrize("value", [b"NaN", b"+Inf", b"-Inf"])
def test_non_finite_value_of_a_used_family_is_an_error(family: str, value: bytes) -> None:
    values = {RUN: b"1", GEN: b"2", PROMPT: b"3", WAIT: b"0", KV: b"0.5"}
    values[family] = value
    page = b"".join(name.encode() + b" " + number + b"\n" for name, number in values.items())
    with pytest.raises(MetricsError, match=rf"{family} is .*not a finite number"):
        read_engines(page, 0.0)


# --- llama.cpp's six significant digits


@pytest.mark.parametrize(
    ("signals", "generation", "note"),
    [
        ({"llamacpp:n_decode_total": 999999}, 5e6, ""),
        (
            {"llamacpp:n_decode_total": 1e6},
            5e6,
            "llamacpp prints 6 significant digits, so an advance under 10 is invisible",
        ),
        (
            {"llamacpp:n_decode_total": 1.23457e6},
            5e6,
            "llamacpp prints 6 significant digits, so an advance under 10 is invisible",
        ),
        (
            {"llamacpp:n_decode_total": 4.5e8},
            5e6,
            "llamacpp prints 6 significant digits, so an advance under 1000 is invisible",
        ),
        ({}, 2.5e7, "llamacpp prints 6 significant digits, so an advance under 100 is invisible"),
    ],
)
def test_precision_note_when_rounding_can_hide_progress(
    signals: dict[str, float], generation: float, note: str
) -> None:
    sample = Sample(1, generation, 2e7 if not signals else 10, 0.0, signals=signals)
    assert precision_note(LLAMACPP, sample) == note


def test_no_precision_note_for_engines_that_print_every_digit() -> None:
    assert precision_note(VLLM, Sample(1, 5e12, 5e12, 0.0, signals={KV: 1e9})) == ""


def test_choose_reads_the_engine_flag_and_the_overrides() -> None:
    page = vllm_page(2, 10, 10)
    assert choose(page) is VLLM  # the table's own dialect when nothing is overridden
    assert choose(page, "llamacpp") is LLAMACPP  # as told, whatever the page
    renamed = choose(page, "auto", {"waiting": "vllm:num_requests_waiting_by_reason"})
    assert (renamed.name, renamed.waiting, renamed.running) == (
        "vllm",
        "vllm:num_requests_waiting_by_reason",
        VLLM.running,
    )
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        choose(page, "tgi")
    # "auto" reads the page: an SGLang page is SGLang's, though vLLM comes first in the table.
    assert choose(fixture_page("sglang-docs-production-metrics-00b08c4.prom"), "auto") is SGLANG


def test_signals_that_sum_past_the_largest_float_are_an_error_not_a_crash() -> None:
    # Found by scripts/fuzz: two finite series of one signal summed to inf, and Sample() raised ValueError.
    page = vllm_page(1, 2, 3) + b'vllm:kv_cache_usage_perc{engine="0",a="1"} 1.7e308\n'
    page += b'vllm:kv_cache_usage_perc{engine="0",a="2"} 1.7e308\n'
    with pytest.raises(MetricsError, match=r"^vllm:kv_cache_usage_perc is inf, not a finite number$"):
        read_engines(page, 0.0)


@pytest.mark.parametrize("family", [RUN, WAIT, PROMPT, GEN])
def test_counters_that_sum_past_the_largest_float_are_an_error_not_a_crash(family: str) -> None:
    values = {RUN: b"1", WAIT: b"0", PROMPT: b"1", GEN: b"1"}
    page = b"".join(name.encode() + b" " + value + b"\n" for name, value in values.items() if name != family)
    page += family.encode() + b'{a="1"} 1.7e308\n' + family.encode() + b'{a="2"} 1.7e308\n'
    with pytest.raises(MetricsError) as caught:
        read_engines(page, 0.0)
    assert str(caught.value) == f"{family} is inf, not a finite number"


def test_a_progress_metric_the_dialect_already_watches_counts_once() -> None:
    page = vllm_page(2, 10, 20) + b'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
    sample = read_engines(page, 1.0, VLLM, ["vllm:kv_cache_usage_perc"])["0"]
    assert sample.signals == {"vllm:kv_cache_usage_perc": 0.25}


# --- an engine its operator paused: the signs on the page


def sleep_state(engine: str, awake: float, offloaded: float) -> bytes:
    return (
        f'vllm:engine_sleep_state{{engine="{engine}",model_name="m",sleep_state="awake"}} {awake}\n'
        f'vllm:engine_sleep_state{{engine="{engine}",model_name="m",sleep_state="weights_offloaded"}} {offloaded}\n'
        f'vllm:engine_sleep_state{{engine="{engine}",model_name="m",sleep_state="discard_all"}} 0.0\n'
    ).encode()


PAUSE_PAGES: list[tuple[str, bytes, Dialect, dict[str, str]]] = [
    ("awake", vllm_page(4, 10, 10) + sleep_state("0", 1, 0), VLLM, {"0": ""}),
    ("asleep", vllm_page(4, 10, 10) + sleep_state("0", 0, 1), VLLM, {"0": "asleep (sleep mode)"}),
    # The KV cache released (vLLM records awake 0 with both others 0): the engine cannot serve either.
    ("kv_cache_released", vllm_page(0, 10, 10) + sleep_state("0", 0, 0), VLLM, {"0": "asleep (sleep mode)"}),
    ("no_sleep_family", vllm_page(4, 10, 10), VLLM, {"0": ""}),
    (
        "one_engine_of_two_asleep",
        data_parallel_page({"0": (1, 0, 5, 5, 0.1), "1": (1, 0, 5, 5, 0.1)})
        + sleep_state("0", 1, 0)
        + sleep_state("1", 0, 1),
        VLLM,
        {"0": "", "1": "asleep (sleep mode)"},
    ),
    (
        "a_weight_update_in_flight_pauses_every_engine",
        data_parallel_page({"0": (1, 0, 5, 5, 0.1), "1": (1, 0, 5, 5, 0.1)})
        + b'vllm:rl_weight_update_operations_in_flight{operation="update"} 1.0\n'
        + b'vllm:rl_weight_update_operations_in_flight{operation="start"} 0.0\n',
        VLLM,
        {"0": "a weight update in flight", "1": "a weight update in flight"},
    ),
    (
        "no_weight_update_in_flight",
        vllm_page(4, 10, 10) + b'vllm:rl_weight_update_operations_in_flight{operation="update"} 0.0\n',
        VLLM,
        {"0": ""},
    ),
    (
        "waking_up_and_a_weight_update",
        vllm_page(4, 10, 10)
        + b'vllm:sleep_mode_operations_in_flight{operation="wake"} 1.0\n'
        + b'vllm:rl_weight_update_operations_in_flight{operation="update"} 2.0\n',
        VLLM,
        {"0": "going to sleep or waking up; a weight update in flight"},
    ),
    (
        "sglang_paused_requests",
        fixture_page("sglang-docs-production-metrics-00b08c4.prom") + b'sglang:num_paused_reqs{model_name="m"} 3.0\n',
        SGLANG,
        {"": "requests paused for a weight sync"},
    ),
    (
        "sglang_no_paused_requests",
        fixture_page("sglang-docs-production-metrics-00b08c4.prom") + b'sglang:num_paused_reqs{model_name="m"} 0.0\n',
        SGLANG,
        {"": ""},
    ),
]


@pytest.mark.parametrize(("page", "dialect", "paused"), [p[1:] for p in PAUSE_PAGES], ids=[p[0] for p in PAUSE_PAGES])
def test_a_paused_engine_is_read_from_its_pages_signs(page: bytes, dialect: Dialect, paused: dict[str, str]) -> None:
    assert PAUSE_PAGES
    assert {name: sample.paused for name, sample in read_engines(page, 0.0, dialect).items()} == paused


def test_a_non_finite_pause_sign_is_an_error() -> None:
    page = vllm_page(4, 10, 10) + b'vllm:rl_weight_update_operations_in_flight{operation="update"} NaN\n'
    with pytest.raises(MetricsError, match=r"^vllm:rl_weight_update_operations_in_flight is nan, not a finite number$"):
        read_engines(page, 0.0)


def test_each_engine_says_where_it_answers_whether_it_is_paused_and_its_load() -> None:
    assert (VLLM.pause_route, VLLM.load_route) == ("/is_paused", "/load")
    assert (SGLANG.pause_route, SGLANG.load_route, LLAMACPP.pause_route, LLAMACPP.load_route) == ("", "", "", "")
    fork = VLLM.with_names(running="x")
    assert (fork.pause_signs, fork.pause_route, fork.load_route) == (VLLM.pause_signs, "/is_paused", "/load")


def test_sglang_per_pass_counters_are_its_heartbeat() -> None:
    page = fixture_page("sglang-docs-production-metrics-00b08c4.prom")
    page += b'sglang:cuda_graph_passes_total{mode="decode_cuda_graph"} 10.0\n'
    page += b'sglang:cuda_graph_passes_total{mode="prefill_none"} 3.0\n'
    page += b'sglang:realtime_tokens_total{mode="decode"} 1234.0\n'
    signals = read_engines(page, 0.0, SGLANG)[""].signals
    assert signals["sglang:cuda_graph_passes_total"] == 13
    assert signals["sglang:realtime_tokens_total"] == 1234


def test_a_pause_sign_and_a_dialect_default_to_nothing_paused() -> None:
    sign = PauseSign("f", "why")
    assert (sign.family, sign.why, sign.when_zero, sign.label, sign.value) == ("f", "why", False, "", "")
    zero = PauseSign("f", "why", when_zero=True, label="l", value="v")
    assert (zero.when_zero, zero.label, zero.value) == (True, "l", "v")
    plain = Dialect("x", running="r", waiting="w", prompt="p", generation="g", port=1, hints=("x",))
    assert (plain.pause_signs, plain.pause_route, plain.load_route, plain.health_route) == ((), "", "", "/health")
    assert [d.health_route for d in DIALECTS] == ["/health"] * 5
    assert (plain.pause_key, plain.metrics_path, plain.window, plain.caveat, plain.confirm_route) == (
        "is_paused",
        "/metrics",
        None,
        "",
        "",
    )
    other = Dialect("x", running="r", waiting="w", prompt="p", generation="g", port=1, hints=(), health_route="/ready")
    assert other.with_names(running="y").health_route == "/ready"


# --- which waiting requests an engine owes work (Sample.owed)

BUILT = REPO / "tests" / "fixtures" / "built"
# Pages built from the engines' source for situations not staged here (tests/fixtures/built/SOURCES.md):
# the dialect, and each engine's (running, waiting, owed).
BUILT_PAGES: dict[str, tuple[str, dict[str, tuple[float, float, float]]]] = {
    "vllm-0.32-capacity-nothing-running.prom": ("vllm", {"0": (0, 3, 3)}),
    "vllm-0.32-deferred-nothing-running.prom": ("vllm", {"0": (0, 2, 0)}),
    "vllm-0.32-kv-consumer-waiting-remote-kv.prom": ("vllm", {"0": (0, 2, 0)}),
    "sglang-0.5.23-decode-disagg.prom": ("sglang", {"": (0, 0, 0)}),
    "sglang-0.5.23-decode-disagg-stale-gauges.prom": ("sglang", {"": (3, 0, 0)}),
}


LMKV = "lmdeploy:gpu_cache_usage_perc"
BLOCKS = "trtllm_kv_cache_gen_alloc_blocks_total"
# The LMDeploy and TensorRT-LLM pages (tests/render_built_pages.py renders them from each engine's own
# definitions): read with `--engine auto`, each engine's (running, waiting, owed, prompt, generation,
# signals, finished requests), read off the page by hand; or the error reading it must give.
BUILT_ENGINES: dict[
    str, tuple[str, dict[str, tuple[float, float, float, float, float, dict[str, float], float | None]]] | str
] = {
    # One api_server is one dp rank: its page has one `engine` value, its own rank. No waiting request is owed
    # (its gauge counts those waiting on a peer too), and its finished count is not read (FINISH only).
    "lmdeploy-0.18.0-busy.prom": ("lmdeploy", {"0": (3, 1, 0, 7680, 3332, {LMKV: 0.025}, None)}),
    "lmdeploy-0.18.0-busy-later.prom": ("lmdeploy", {"0": (3, 0, 0, 8192, 3792, {LMKV: 0.0275}, None)}),
    "lmdeploy-0.18.0-dp-rank1-busy.prom": ("lmdeploy", {"1": (2, 0, 0, 5632, 2574, {LMKV: 22 / 1200}, None)}),
    "lmdeploy-0.18.0-idle.prom": ("lmdeploy", {"0": (0, 0, 0, 8192, 4096, {LMKV: 0.0}, None)}),
    # Asleep: nothing on the page says so (only /is_sleeping does); the gauges lag up to a 10 s tick.
    "lmdeploy-0.18.0-asleep-stale-gauges.prom": ("lmdeploy", {"0": (3, 0, 0, 8192, 3882, {LMKV: 0.0275}, None)}),
    "lmdeploy-0.18.0-asleep.prom": ("lmdeploy", {"0": (0, 0, 0, 8192, 3882, {LMKV: 0.0}, None)}),
    # No engine label: one trtllm-serve is one engine; the gauges' `pid` label is summed over like any other.
    "trtllm-iter-stats-decoding.prom": ("trtllm", {"": (4, 0, 0, 8000, 4000, {BLOCKS: 150}, 8)}),
    "trtllm-iter-stats-decoding-later.prom": ("trtllm", {"": (4, 0, 0, 8000, 4000, {BLOCKS: 158}, 8)}),
    "trtllm-iter-stats-long-generation.prom": ("trtllm", {"": (1, 0, 0, 12000, 6000, {BLOCKS: 180}, 12)}),
    # The HELP texts are not read: the page of a client that lost them reads the same.
    "trtllm-iter-stats-long-generation-help-lost.prom": (
        "trtllm",
        {"": (1, 0, 0, 12000, 6000, {BLOCKS: 180}, 12)},
    ),
    # Counters appear only once a request finishes: a value the probe cannot read is never a 0.
    "trtllm-iter-stats-fresh.prom": (
        "required metric missing from the trtllm page: trtllm_prompt_tokens_total, trtllm_generation_tokens_total"
    ),
    # Without enable_iter_perf_stats there is no running gauge: the page cannot be judged (the health route decides).
    "trtllm-request-metrics-only.prom": "required metric missing from the trtllm page: trtllm_num_requests_running",
    "trtllm-no-iter-stats-fresh.prom": NO_ENGINE,
}


def test_every_built_fixture_has_an_expectation() -> None:
    assert BUILT_PAGES
    assert BUILT_ENGINES
    assert sorted([*BUILT_PAGES, *BUILT_ENGINES]) == sorted(p.name for p in BUILT.glob("*.prom"))


@pytest.mark.parametrize(("name", "expected"), sorted(BUILT_ENGINES.items()))
def test_built_page_is_read_with_its_dialect_and_numbers(name: str, expected: object) -> None:
    page = (BUILT / name).read_bytes()
    if isinstance(expected, str):
        with pytest.raises(MetricsError) as caught:
            read_engines(page, 7.0, detect(page))
        assert str(caught.value) == expected
        return
    assert isinstance(expected, tuple)
    dialect_name, engines = expected
    dialect = detect(page)
    assert dialect.name == dialect_name
    assert read_engines(page, 7.0, dialect) == {
        engine: Sample(running, gen, prompt, 7.0, waiting, signals=signals, owed=owed, finished=done)
        for engine, (running, waiting, owed, prompt, gen, signals, done) in engines.items()
    }


@pytest.mark.parametrize(
    ("name", "engine", "message"),
    [
        ("trtllm-request-metrics-only.prom", "trtllm", "required metric missing from the trtllm page: "
         "trtllm_num_requests_running"),
        ("trtllm-no-iter-stats-fresh.prom", "trtllm", "not a trtllm metrics page: none of trtllm_num_requests_running, "
         "trtllm_generation_tokens_total, trtllm_prompt_tokens_total is on it"),
        ("trtllm-iter-stats-fresh.prom", "trtllm", "required metric missing from the trtllm page: "
         "trtllm_generation_tokens_total, trtllm_prompt_tokens_total"),
    ],
)  # fmt: skip
def test_a_trtllm_page_it_cannot_judge_says_why_with_its_engine_named(name: str, engine: str, message: str) -> None:
    page = (BUILT / name).read_bytes()
    with pytest.raises(MetricsError) as caught:
        read_engines(page, 0.0, choose(page, engine))
    assert str(caught.value) == message


def test_the_built_pages_are_what_their_script_renders() -> None:
    """tests/render_built_pages.py renders the LMDeploy and TensorRT-LLM pages from each engine's own
    definitions: the pages committed are its output, byte for byte."""
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "render_built_pages.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(("name", "expected"), sorted(BUILT_PAGES.items()))
def test_built_page_says_which_waiting_requests_are_owed(
    name: str, expected: tuple[str, dict[str, tuple[float, float, float]]]
) -> None:
    page = (BUILT / name).read_bytes()
    dialect = detect(page)
    assert dialect.name == expected[0]
    samples = read_engines(page, 0.0, dialect)
    assert {engine: (s.running, s.waiting, s.owed) for engine, s in samples.items()} == expected[1]


def by_reason(engine: str, capacity: float, deferred: float) -> bytes:
    family = "vllm:num_requests_waiting_by_reason"
    return (
        f'{family}{{engine="{engine}",model_name="m",reason="capacity"}} {capacity}\n'
        f'{family}{{engine="{engine}",model_name="m",reason="deferred"}} {deferred}\n'
    ).encode()


KV_FETCH = b'vllm:num_requests_kv_fetch_by_stage{engine="0",model_name="m",stage="%s"} %d\n'
NIXL = b'vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 0.0\n'


def kv(usage: float) -> bytes:
    return f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}\n'.encode()


# vLLM's rule without `strict`: capacity is owed whatever is deferred beside it.
VLLM_LENIENT = Dialect(
    "vllm",
    running=VLLM.running,
    waiting=VLLM.waiting,
    prompt=VLLM.prompt,
    generation=VLLM.generation,
    signals=VLLM.signals,
    engine_label="engine",
    port=8000,
    hints=(),
    owing=Owing("vllm:num_requests_waiting_by_reason", label="reason", owed=("capacity",), deferred=("deferred",)),
)

# (name, page, dialect, each engine's owed waiting requests)
OWED: list[tuple[str, bytes, Dialect, dict[str, float]]] = [
    ("capacity_is_owed", vllm_page(0, 5, 5, 3) + by_reason("0", 3, 0), VLLM, {"0": 3}),
    ("deferred_is_not", vllm_page(0, 5, 5, 2) + by_reason("0", 0, 2), VLLM, {"0": 0}),
    ("none_while_some_are_deferred", vllm_page(0, 5, 5, 3) + by_reason("0", 2, 1), VLLM, {"0": 0}),
    ("deferred_beside_a_kv_cache_in_use", vllm_page(0, 5, 5, 3) + by_reason("0", 2, 1) + kv(0.1), VLLM, {"0": 0}),
    # A deferred request that holds no KV block (a grammar compile) holds back nothing that waits for capacity.
    ("deferred_beside_an_empty_kv_cache", vllm_page(0, 5, 5, 3) + by_reason("0", 2, 1) + kv(0.0), VLLM, {"0": 2}),
    ("no_breakdown_on_the_page_none", vllm_page(0, 5, 5, 3), VLLM, {"0": 0}),
    (
        "a_breakdown_declared_without_samples_none",
        vllm_page(0, 5, 5, 3) + b"# TYPE vllm:num_requests_waiting_by_reason gauge\n",
        VLLM,
        {"0": 0},
    ),
    (
        "kv_fetches_in_progress_excuse_the_queue",
        vllm_page(0, 5, 5, 3) + by_reason("0", 3, 0) + KV_FETCH % (b"in_progress", 1),
        VLLM,
        {"0": 0},
    ),
    (
        "kv_fetches_waiting_to_start_do_not",
        vllm_page(0, 5, 5, 3) + by_reason("0", 3, 0) + KV_FETCH % (b"waiting_to_start", 3) + kv(0.0),
        VLLM,
        {"0": 3},
    ),
    (
        "blocks_held_for_a_peer_excuse_the_queue",
        vllm_page(0, 5, 5, 3) + by_reason("0", 3, 0) + NIXL + kv(0.2),
        VLLM,
        {"0": 0},
    ),
    (
        "a_connector_with_an_empty_cache_does_not",
        vllm_page(0, 5, 5, 3) + by_reason("0", 3, 0) + NIXL + kv(0.0),
        VLLM,
        {"0": 3},
    ),
    (
        "a_kv_cache_in_use_without_a_connector_does_not",
        vllm_page(0, 5, 5, 3) + by_reason("0", 3, 0) + kv(0.2),
        VLLM,
        {"0": 3},
    ),
    (
        "each_engine_its_own",
        vllm_page(0, 5, 5, 4, engines=2) + by_reason("0", 2, 0) + by_reason("1", 1, 1),
        VLLM,
        {"0": 2, "1": 0},
    ),
    (
        "kv_fetches_none_in_progress_do_not",
        vllm_page(0, 5, 5, 3) + by_reason("0", 3, 0) + KV_FETCH % (b"in_progress", 0) + kv(0.0),
        VLLM,
        {"0": 3},
    ),
    (
        "a_connector_without_the_usage_gauge_does_not",
        vllm_page(0, 5, 5, 3) + by_reason("0", 3, 0) + NIXL,
        VLLM,
        {"0": 3},
    ),
    (
        "only_capacity_series_on_the_page",
        vllm_page(0, 5, 5, 3) + b'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3\n',
        VLLM,
        {"0": 3},
    ),
    (
        "not_strict_counts_capacity_beside_deferred",
        vllm_page(0, 5, 5, 3) + by_reason("0", 2, 1),
        VLLM_LENIENT,
        {"0": 2},
    ),
    ("llamacpp_deferred_are_owed", llamacpp_page(0, 5, 5, 9, deferred=2), LLAMACPP, {"": 2}),
    ("sglang_queue_is_owed", sglang_page(0, 5, 5, waiting=4), SGLANG, {"": 4}),
]


@pytest.mark.parametrize(("page", "dialect", "owed"), [r[1:] for r in OWED], ids=[r[0] for r in OWED])
def test_owed_waiting(page: bytes, dialect: Dialect, owed: dict[str, float]) -> None:
    assert OWED
    assert {engine: s.owed for engine, s in read_engines(page, 0.0, dialect).items()} == owed


def test_sglang_adds_the_total_of_a_priority_breakdown_once() -> None:
    page = b"".join(
        f'sglang:{name}{{model_name="m",priority="{priority}"}} {value}\n'.encode()
        for name, values in (("num_running_reqs", (4, 3, 1)), ("num_queue_reqs", (5, 2, 3)))
        for priority, value in zip(("", "1", "2"), values)
    )
    page += b'sglang:prompt_tokens_total{model_name="m"} 7\nsglang:generation_tokens_total{model_name="m"} 9\n'
    sample = read_engines(page, 0.0, SGLANG)[""]
    assert (sample.running, sample.waiting, sample.owed) == (4, 5, 5)


def test_an_owing_rule_and_a_dialect_default_to_every_waiting_request_owed() -> None:
    rule = Owing()
    fields = ("family", "label", "owed", "deferred", "strict", "without", "excuses", "excuse_label", "excuse_value")
    assert [getattr(rule, name) for name in (*fields, "held_by")] == ["", "", (), (), False, False, (), "", "", ()]
    plain = Dialect("x", running="r", waiting="w", prompt="p", generation="g", port=1, hints=("x",))
    assert (plain.owing.without, plain.owing.family, plain.totals, plain.live_route) == (True, "", ("", ""), "")
    assert repr(VLLM.owing) == "Owing('vllm:num_requests_waiting_by_reason', without=False)"


def test_only_sglang_asks_its_scheduler_for_live_counts() -> None:
    assert [d.live_route for d in DIALECTS] == ["", "/v1/loads", "", "", ""]
    assert VLLM.with_names(running="x").owing is VLLM.owing
    assert SGLANG.with_names(running="x").totals == ("priority", "")
    assert SGLANG.with_names(running="x").live_route == "/v1/loads"


@pytest.mark.parametrize("folder", [FIXTURES, BUILT], ids=["real", "built"])
def test_every_page_is_the_one_its_sources_name(folder: Path) -> None:
    """Each page's sha256 is listed in its folder's SOURCES.md, and each listed page is there."""
    sources = (folder / "SOURCES.md").read_text(encoding="utf-8")
    listed = dict(line.split()[::-1] for line in sources.split("sha256:")[-1].splitlines() if "  " in line)
    assert listed == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("*.prom")}


@pytest.mark.parametrize(
    ("engine", "route"),
    [("x", "/ready"), ("vllm", "/health"), ("llamacpp", "/health"), ("auto", "/health"), (None, "/health")],
)
def test_the_health_route_of_the_engine_named(monkeypatch: pytest.MonkeyPatch, engine: str | None, route: str) -> None:
    """What the probe's fallback and inject's probes ask before any page says which engine serves: the
    named engine's own route (here an engine whose route is not /health), else /health."""
    other = Dialect("x", running="r", waiting="w", prompt="p", generation="g", port=1, hints=(), health_route="/ready")
    from stallprobe import engines

    monkeypatch.setattr(engines, "DIALECTS", (*DIALECTS, other))
    assert health_route(engine) == route


# --- the dialects' new fields, and the readers' edges (each a rule a mutant would break)


def test_each_dialect_keeps_what_it_adds_when_its_names_are_overridden() -> None:
    plain = Dialect("x", running="r", waiting="w", prompt="p", generation="g", port=1, hints=("x",))
    assert (plain.finished, plain.preemptions) == ("", "")
    assert (VLLM.finished, VLLM.preemptions) == ("vllm:request_success_total", "vllm:num_preemptions_total")
    for dialect in (VLLM, LMDEPLOY, TRTLLM):
        copy = dialect.with_names(running="other")
        for name in ("finished", "preemptions", "pause_key", "metrics_path", "window", "caveat", "confirm_route"):
            assert getattr(copy, name) == getattr(dialect, name), (dialect, name)
    assert (TRTLLM.window, TRTLLM.metrics_path, TRTLLM.confirm_route) == (
        1800.0,
        "/prometheus/metrics",
        "/health_generate",
    )
    assert (LMDEPLOY.pause_route, LMDEPLOY.pause_key) == ("/is_sleeping", "is_sleeping")
    assert VLLM.required_kinds() == ((RUN, False), (PROMPT, True), (GEN, True))


def test_a_gauge_is_never_read_under_a_counter_s_spelling() -> None:
    """Only counters may be spelled with or without _total: a running gauge written as
    vllm:num_requests_running_total is not the gauge the probe knows, nor is a KV-cache usage one."""
    page = vllm_page(3, 10, 20).replace(RUN.encode(), RUN.encode() + b"_total")
    with pytest.raises(MetricsError, match=f"^required metric missing from the vllm page: {RUN}$"):
        detect(page)
    with pytest.raises(MetricsError, match=f"^required metric missing from the vllm page: {RUN}$"):
        read_engines(page, 0.0, VLLM)
    kv = data_parallel_page({"0": (3, 1, 100, 900, 0.5)}).replace(KV.encode(), KV.encode() + b"_total")
    assert KV not in read_engines(kv, 0.0)["0"].signals


def test_a_counter_spelled_without_total_is_present_where_another_is_missing() -> None:
    page = b"vllm:num_requests_running 1\n# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens 5\n"
    with pytest.raises(MetricsError) as caught:
        detect(page)
    assert str(caught.value) == f"required metric missing from the vllm page: {GEN}"


def test_a_counter_named_without_total_is_declared_by_its_total_spelling() -> None:
    page = b"vllm:num_requests_running 1\nvllm:generation_tokens_total 3\n# TYPE my:prompt_total counter\n"
    with pytest.raises(MetricsError, match=r"my:prompt \(declared, with no sample\)$"):
        read_engines(page, 0.0, VLLM.with_names(prompt="my:prompt"))


def test_every_engine_lacking_a_series_is_named() -> None:
    page = data_parallel_page({"0": (3, 1, 100, 900, 0.5), "1": (5, 0, 40, 70, 0.25), "2": (1, 0, 1, 1, 0.1)})
    cut = b"".join(
        line + b"\n"
        for line in page.splitlines()
        if not (line.startswith(PROMPT.encode()) and (b'engine="1"' in line or b'engine="2"' in line))
    )
    with pytest.raises(MetricsError, match=f"^required metric {PROMPT} has no series for engine 1, 2 on the vllm page"):
        read_engines(cut, 0.0)


def test_a_counter_signal_is_read_under_either_spelling() -> None:
    page = sglang_page(2, 1, 100) + b'sglang:cuda_graph_passes{model_name="m",mode="decode"} 42\n'
    assert read_engines(page, 0.0, SGLANG)[""].signals["sglang:cuda_graph_passes_total"] == 42


@pytest.mark.parametrize(
    ("models", "version", "about"),
    [
        (["m"], None, "vllm, model m"),
        (["b", "a"], None, "vllm, model a, b"),
        (["a", "b", "c", "d", "e"], None, "vllm, model a, b, c, d"),
        (["x" * 130], None, "vllm, model " + "x" * 120),
        (["m"], "0.33.0", "vllm, model m, version 0.33.0"),
        ([], None, "vllm"),
    ],
)
def test_what_the_page_says_of_the_engine(models: list[str], version: str | None, about: str) -> None:
    lines = [
        f'{RUN}{{model_name="{model}"' + (f',version="{version}"' if version else "") + "} 1" for model in models
    ] or [f"{RUN} 1"]
    assert engine_about("\n".join(lines).encode() + b"\n", VLLM) == about
