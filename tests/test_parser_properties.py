"""Properties of the page reader and the state file over generated input (hypothesis).

Pages come from prometheus_client itself, written from generated registries, so the reader is checked
against the writer it is for: each wanted name must give exactly the samples and the sum the registry
holds. The writer prints every float with repr (floatToGoString), which reads back bit for bit, so values
are compared exactly; sums are added in page order by the same operation the reader uses (the builtin
sum() in conftest.sum_families, which is compensated from Python 3.12 on; a left fold from 0.0 in read_engines).

Garbage, truncated and mutated pages may raise MetricsError and nothing else; any bytes in a state file
give a state or a reason, never an exception; a saved state reads back exactly.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest

from conftest import FIXTURES, load_states, read_sample, save_states, sum_families
from stallprobe import MetricsError, Sample, State
from stallprobe.engines import DIALECTS, VLLM, detect, read_engines
from stallprobe.exposition import Series, find_series
from stallprobe.statefile import FORMAT

# scripts/fuzz sets this (without atheris) to run many more examples, and fresh ones on every run.
FUZZ_EXAMPLES = int(os.environ.get("STALLPROBE_FUZZ_EXAMPLES") or 0)


def _settings(examples: int) -> settings:
    # Derandomized and without a database: every run tries the same examples, so the file never flakes.
    # Building a registry and its page takes a few ms, hence no deadline and no too_slow health check.
    # When fuzzing, random examples; a failure prints the blob that replays it (@reproduce_failure).
    return settings(
        derandomize=not FUZZ_EXAMPLES,
        database=None,
        deadline=None,
        max_examples=max(examples, FUZZ_EXAMPLES),
        print_blob=bool(FUZZ_EXAMPLES),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def _same(a: float, b: float) -> bool:
    """Bit-for-bit equal as printed: tells -0.0 from 0.0, and a NaN equals a NaN."""
    return repr(a) == repr(b)


def _fold(values: list[float]) -> float:
    """A left fold from 0.0, as read_engines adds an engine's series."""
    total = 0.0
    for value in values:
        total += value
    return total


def _finite(value: float) -> bool:
    return -float("inf") < value < float("inf")


# ---------------------------------------------------------------------------------------------------------
# Text that a label value or a HELP text may hold: everything the writer must escape, what the reader
# splits on, other engines' names, and unicode (line separators included: only b"\n" ends a line).
TRICKY = [
    '"',
    "\\",
    "\n",
    "\\n",
    '\\"',
    "{",
    "}",
    ",",
    "=",
    " ",
    "\t",
    "\r",
    "#",
    "\u2028",
    "\x85",
    "é",
    "\U0001f600",
    '"} 1\nvllm:num_requests_running 99\n',
    "vllm:num_requests_running 5",
    "# TYPE vllm:prompt_tokens_total histogram",
    "sglang:num_running_reqs",
    'engine="1"',
]
label_values = st.one_of(
    st.lists(st.one_of(st.sampled_from(TRICKY), st.characters(codec="utf-8")), max_size=6).map("".join),
    st.sampled_from(TRICKY),
)
# Legal label names (not reserved "__", not the le/quantile that histograms and summaries own).
label_names = st.one_of(
    st.sampled_from(["engine", "model_name", "le_x", "_q"]),
    st.from_regex(r"[a-z_][a-z0-9_]{0,4}", fullmatch=True),
).filter(lambda name: not name.startswith("__") and name not in ("le", "quantile"))
# A small alphabet with ':' and '_', so that names often share a prefix or end in a writer's suffix.
metric_names = st.from_regex(r"[a-c:_][a-c0-9:_]{0,5}", fullmatch=True)
SUFFIXES = ["", "_total", "_created", "_sum", "_count", "_bucket", "_x", ":y", "_total_total"]
# Numbers whose sum depends on the order they are added in, so that the order is checked too.
ROUNDING = st.sampled_from([0.1, 0.2, 0.3, 1.0, 3.0, 1e16, 1e-16, 2.0**53, 1e300])
gauge_values = st.one_of(st.floats(width=64), ROUNDING, ROUNDING.map(lambda x: -x))  # NaN and infinities too
counter_steps = st.floats(min_value=0.0, allow_infinity=False, allow_nan=False)
observations = st.floats(allow_infinity=False, allow_nan=False)

KINDS = {"gauge": Gauge, "counter": Counter, "histogram": Histogram, "summary": Summary}


@st.composite
def registries(draw: st.DrawFn) -> tuple[CollectorRegistry, list[str]]:
    """A registry of look-alike families, several engines, and the names a caller might ask for."""
    registry = CollectorRegistry()
    bases = draw(st.lists(metric_names, min_size=1, max_size=3))
    engines = draw(st.lists(label_values, min_size=1, max_size=3, unique=True))
    wanted: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        name = draw(st.sampled_from(bases)) + draw(st.sampled_from(SUFFIXES))
        kind = draw(st.sampled_from(sorted(KINDS)))
        labels = draw(st.lists(label_names, max_size=2, unique=True))
        if draw(st.booleans()):
            labels = ["engine", *(label for label in labels if label != "engine")]
        doc = draw(label_values)
        try:
            metric = KINDS[kind](name, doc, labels, registry=registry)
        except ValueError:
            continue  # a name the writer forbids, or one that collides with a registered family's samples
        wanted.append(name)
        for _ in range(draw(st.integers(0, 4)) if labels else 1):
            values = {
                label: draw(st.sampled_from(engines)) if label == "engine" else draw(label_values) for label in labels
            }
            child = metric.labels(**values) if labels else metric
            if isinstance(child, Gauge):
                child.set(draw(gauge_values))
            elif isinstance(child, Counter):
                for step in draw(st.lists(counter_steps, max_size=2)):
                    child.inc(step)
            elif isinstance(child, (Histogram, Summary)):
                for value in draw(st.lists(observations, max_size=2)):
                    child.observe(value)
    for base in bases:
        wanted.extend(base + suffix for suffix in SUFFIXES)
        wanted.append(base[:-1] or "d")  # a prefix of a family's name is not that family
    return registry, sorted(set(wanted))


def registry_series(registry: CollectorRegistry, name: str) -> list[Series]:
    """The samples named `name`, in the order the writer prints them (it prints each name's in turn)."""
    return [(dict(s.labels), s.value) for family in registry.collect() for s in family.samples if s.name == name]


def declared_types(registry: CollectorRegistry) -> dict[str, str]:
    """The names prometheus_client's text writer declares with `# TYPE`, and their types.

    A counter is declared as NAME_total (its samples' name); `_created` samples are moved to a gauge
    family of their own after the family.
    """
    types: dict[str, str] = {}
    for family in registry.collect():
        types[family.name + "_total" if family.type == "counter" else family.name] = family.type
        if any(s.name == family.name + "_created" for s in family.samples):
            types[family.name + "_created"] = "gauge"
    return types


def expected_sum(registry: CollectorRegistry, name: str) -> float | type[MetricsError] | None:
    """What sum_families must give for `name`, from the registry alone (MetricsError: it must raise)."""
    series = registry_series(registry, name)
    if series:
        return sum(value for _, value in series)
    types = declared_types(registry)
    kind = types.get(name)
    if kind in ("histogram", "summary"):
        return MetricsError  # its own name carries no value: asking for it is a mistake
    if kind is not None:
        return 0.0  # declared, no label set yet
    # The reader also takes `# TYPE NAME counter` as declaring NAME_total (older writers).
    if name.endswith("_total") and types.get(name[: -len("_total")]) == "counter":
        return 0.0
    return None


@_settings(400)
@given(registries())
def test_each_family_sums_to_what_the_registry_holds(drawn: tuple[CollectorRegistry, list[str]]) -> None:
    registry, wanted = drawn
    page = generate_latest(registry)
    plain: dict[str, float | None] = {}
    for name in wanted:
        want = registry_series(registry, name)
        got = find_series(page, name)
        assert [labels for labels, _ in got] == [labels for labels, _ in want], name
        assert all(_same(g, w) for (_, g), (_, w) in zip(got, want)), (name, got, want)
        expected = expected_sum(registry, name)
        event(f"wanted name: {'MetricsError' if expected is MetricsError else type(expected).__name__}")
        if expected is MetricsError:
            with pytest.raises(MetricsError, match="is declared as a"):
                sum_families(page, [name])
            continue
        assert not isinstance(expected, type)
        result = sum_families(page, [name])[name]
        if expected is None or result is None:
            assert result is expected, name
        else:
            assert _same(result, expected), (name, result, expected)
        plain[name] = expected
    # Asking for all of them at once gives the same answers.
    together = sum_families(page, list(plain))
    assert list(together) == list(plain)
    assert all(repr(together[name]) == repr(plain[name]) for name in plain)


@_settings(150)
@given(st.lists(gauge_values, min_size=1, max_size=8))
def test_a_family_is_added_up_in_page_order(values: list[float]) -> None:
    # Many series of one family, so that the order of the additions shows (0.3 + 0.2 + 0.1 is not
    # 0.1 + 0.2 + 0.3 in floating point): the registry's own order is the page's.
    registry = CollectorRegistry()
    gauge = Gauge("m", "doc", ["engine"], registry=registry)
    for engine, value in enumerate(values):
        gauge.labels(str(engine)).set(value)
    held = [value for _, value in registry_series(registry, "m")]
    result = sum_families(generate_latest(registry), ["m"])["m"]
    assert result is not None
    assert _same(result, sum(held)), (result, held)


# ---------------------------------------------------------------------------------------------------------
VLLM_FAMILIES = [
    # (kind, family name as registered, the name its samples carry on the page)
    ("gauge", "vllm:num_requests_running", VLLM.running),
    ("gauge", "vllm:num_requests_waiting", VLLM.waiting),
    ("counter", "vllm:prompt_tokens", VLLM.prompt),
    ("counter", "vllm:generation_tokens", VLLM.generation),
]
# Mostly sizes a page really shows; sometimes anything finite, so that a sum may overflow.
vllm_numbers = st.one_of(
    st.integers(0, 10**7).map(float),
    ROUNDING,
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    st.floats(min_value=0.0, allow_infinity=False, allow_nan=False),
)


@st.composite
def vllm_registries(draw: st.DrawFn) -> tuple[bytes, dict[str, list[Series]]]:
    """A vLLM page from random engines and models, and each wanted name's samples in page order.

    A family may be left out (its name is then absent from the map), and a family may be written without
    the engine label (then the page is one engine).
    """
    registry = CollectorRegistry()
    engine_names = st.one_of(st.sampled_from(["0", "1", "2", "3"]), label_values)
    engines = draw(st.lists(engine_names, min_size=1, max_size=4, unique=True))
    models = draw(st.lists(label_values, min_size=1, max_size=2, unique=True))
    left_out = draw(st.sampled_from([None, None, None, None, *range(len(VLLM_FAMILIES))]))
    label_sets = [["model_name", "engine"], ["engine"], ["model_name"], []]
    # Mostly one label set for the whole page, as vLLM writes it; sometimes one per family.
    page_labels = draw(st.sampled_from([*label_sets[:2], *label_sets[:2], None]))
    for index, (kind, family, _) in enumerate(VLLM_FAMILIES):
        if index == left_out:
            continue
        labels = page_labels if page_labels is not None else draw(st.sampled_from(label_sets))
        metric = KINDS[kind](family, "doc", labels, registry=registry)
        pairs = [(engine, model) for engine in engines for model in models]
        chosen = draw(st.lists(st.sampled_from(pairs), max_size=8)) if labels else [(engines[0], models[0])]
        for engine, model in chosen:
            values = {"model_name": model, "engine": engine}
            child = metric.labels(**{label: values[label] for label in labels}) if labels else metric
            if isinstance(child, Gauge):
                child.set(draw(vllm_numbers))
            else:
                assert isinstance(child, Counter)
                child.inc(draw(vllm_numbers))
    held = {sample_name: registry_series(registry, sample_name) for _, _, sample_name in VLLM_FAMILIES}
    present = {name: held[name] for index, (_, _, name) in enumerate(VLLM_FAMILIES) if index != left_out}
    return generate_latest(registry), present


@_settings(300)
@given(vllm_registries(), st.floats(allow_nan=False, allow_infinity=False))
def test_vllm_engines_sum_to_what_the_registry_holds(drawn: tuple[bytes, dict[str, list[Series]]], t: float) -> None:
    page, held = drawn
    required = (VLLM.running, VLLM.prompt, VLLM.generation)
    if not all(name in held for name in required):
        event("vllm: a required family left out")
        with pytest.raises(MetricsError, match="required metric missing"):
            detect(page)
        with pytest.raises(MetricsError, match="required metric missing"):
            read_engines(page, t)
        return
    assert detect(page) is VLLM
    if not all(held[name] for name in required):
        event("vllm: a required family declared with no sample")
        with pytest.raises(MetricsError, match=r"declared, with no sample"):
            read_engines(page, t)
        return
    everything = [labels for series in held.values() for labels, _ in series]
    split = bool(everything) and all("engine" in labels for labels in everything)
    engines = sorted({labels["engine"] if split else "" for labels in everything}) or [""]
    if split and any({labels["engine"] for labels, _ in held[name]} != set(engines) for name in required):
        event("vllm: an engine without a series of a required family")
        with pytest.raises(MetricsError, match="has no series for engine"):
            read_engines(page, t)
        return
    sums = {
        engine: {
            name: _fold([value for labels, value in held.get(name, []) if not split or labels["engine"] == engine])
            for name in (VLLM.running, VLLM.waiting, VLLM.prompt, VLLM.generation)
        }
        for engine in engines
    }
    event(f"vllm: {len(engines)} engine(s), split={split}")
    if not all(_finite(total) for per_engine in sums.values() for total in per_engine.values()):
        event("vllm: an engine's sum is not finite")
        with pytest.raises(MetricsError, match="not a finite number"):
            read_engines(page, t)
        return
    got = read_engines(page, t)
    assert sorted(got) == engines
    for engine, sample in got.items():
        want = sums[engine]
        assert _same(sample.running, want[VLLM.running])
        assert _same(sample.waiting, want[VLLM.waiting])
        assert _same(sample.prompt, want[VLLM.prompt])
        assert _same(sample.generation, want[VLLM.generation])
        assert sample.t == t
        assert sample.signals == {}
    # Read as one engine, the page is every series of each family added up in page order.
    whole = {name: _fold([value for _, value in series]) for name, series in held.items()}
    if not all(_finite(total) for total in whole.values()):
        with pytest.raises(MetricsError, match="not a finite number"):
            read_sample(page, t)
        return
    one = read_sample(page, t)
    assert _same(one.running, whole[VLLM.running])
    assert _same(one.waiting, whole.get(VLLM.waiting, 0.0))
    assert _same(one.prompt, whole[VLLM.prompt])
    assert _same(one.generation, whole[VLLM.generation])


# ---------------------------------------------------------------------------------------------------------
ALL_NAMES = [name for d in DIALECTS for name in (*d.required(), d.waiting, *d.signals)]
# Pieces of the format, and of what the probe looks for, to build pages that get past the first check.
PAGE_TOKENS = [
    b"\n",
    b"\r\n",
    b" ",
    b"\t",
    b"{",
    b"}",
    b'"',
    b"\\",
    b"=",
    b",",
    b"# TYPE ",
    b"# HELP ",
    b" counter",
    b" gauge",
    b" histogram",
    b" summary",
    b"_total",
    b"_created",
    b"engine",
    b"dp_rank",
    b'engine="0"',
    b'engine="1",',
    b"NaN",
    b"+Inf",
    b"-Inf",
    b"1e309",
    b"1e308",
    b"-0.0",
    b"1",
    b"0.5",
    b"1_0",
    b"1712345678000",
    b"<html>",
    b"\xff",
    b"\xc3",
    *(name.encode() for name in ALL_NAMES),
]
GOOD_VALUES = ["0", "1", "2.5", "-1", "-0.0", "1e308", "1.7976931348623157e+308", "5e-324", "1.5e+06"]
near_label_values = st.one_of(st.sampled_from(TRICKY), st.text(max_size=4))
ODD_VALUES = ["+Inf", "-Inf", "NaN", "1e309", "1_0", "0x10", "inf", "", "x", "1 2", "1 2 3", "1 x", "\xff"]


def _sample_line(name: str, pairs: list[tuple[str, str]], braces: str, value: str, blank: str, stamp: str) -> bytes:
    escaped = [(k, v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')) for k, v in pairs]
    labels = ",".join(f'{k}="{v}"' for k, v in escaped)
    return f"{name}{braces % labels if pairs else ''}{blank}{value}{stamp}".encode()


@functools.cache
def sample_lines(name: str, engine_label: str, sloppy: bool) -> st.SearchStrategy[bytes]:
    """Sample lines of `name`: well formed, or when `sloppy` perhaps not. Built once per argument set:
    building strategies costs more than drawing from them."""
    keys = st.sampled_from([engine_label, engine_label, "model_name", "x"])
    pairs = st.lists(st.tuples(keys, st.one_of(st.sampled_from(["0", "1"]), near_label_values)), max_size=3)
    braces = st.sampled_from(["{%s}", "{%s,}", "{ %s }", *(["{%s", "%s}"] if sloppy else [])])
    values = st.one_of(st.sampled_from(GOOD_VALUES), st.floats(allow_nan=False, allow_infinity=False).map(repr))
    if sloppy:
        values = st.one_of(values, st.sampled_from(ODD_VALUES))
    blanks = st.sampled_from([" ", " ", "  ", "\t"])
    stamps = st.sampled_from(["", "", "", " 1712345678000"])
    return st.builds(_sample_line, st.just(name), pairs, braces, values, blanks, stamps)


SHAPES = st.sampled_from(["samples", "samples", "samples", "type", "help"])
NOISE = st.lists(st.one_of(st.sampled_from(PAGE_TOKENS), st.binary(max_size=3)), max_size=8).map(b"".join)


@st.composite
def near_pages(draw: st.DrawFn) -> bytes:
    """Pages that are almost what an engine prints: one dialect's names (usually all it requires, so
    the page gets past detect), label sets with and without the engine label, odd numbers, some noise."""
    dialect = draw(st.sampled_from(DIALECTS))
    own = [*dialect.required(), dialect.waiting, *dialect.signals]
    engine_label = dialect.engine_label or "engine"
    sloppy = draw(st.booleans())
    chosen = [name for name in own if draw(st.integers(0, 9)) < 9]  # each family now and then absent
    chosen += draw(st.lists(st.sampled_from(ALL_NAMES), max_size=2))
    lines: list[bytes] = []
    for name in chosen:
        shape = draw(SHAPES)
        if shape != "samples":
            family = name.removesuffix("_total") if draw(st.booleans()) else name  # older writers' style
            kinds = ["counter" if name.endswith("_total") else "gauge", "untyped", "histogram", "summary", ""]
            words = draw(st.sampled_from(kinds)) if shape == "type" else draw(near_label_values)
            lines.append(f"# {shape.upper()} {family} {words}".encode())
        lines.extend(draw(st.lists(sample_lines(name, engine_label, sloppy), min_size=1, max_size=3)))
    if sloppy:
        lines += draw(st.lists(NOISE, max_size=2))
    lines = list(draw(st.permutations(lines)))
    end = draw(st.sampled_from([b"\n", b"\n", b"\r\n"]))
    return end.join(lines) + draw(st.sampled_from([end, b""]))


garbage_pages = st.one_of(
    st.binary(max_size=512),
    st.lists(st.one_of(st.sampled_from(PAGE_TOKENS), st.binary(max_size=3)), max_size=120).map(b"".join),
)


def read_everything(page: bytes) -> None:
    """Every way the probe reads a page; MetricsError is the only exception allowed to escape."""
    try:
        event(f"detect: {detect(page).name}")
    except MetricsError:
        event("detect: MetricsError")
    for dialect in DIALECTS:
        for reader in (read_engines, read_sample):
            try:
                reader(page, 1.0, dialect)
                event(f"{dialect.name} page read")
            except MetricsError:
                pass
    for name in ALL_NAMES:  # one at a time: one bad family must not hide another's outcome
        try:
            sum_families(page, [name])
        except MetricsError:
            pass


@_settings(600)
@given(garbage_pages)
def test_garbage_pages_raise_only_metrics_errors(page: bytes) -> None:
    read_everything(page)


@_settings(600)
@given(near_pages())
def test_nearly_valid_pages_raise_only_metrics_errors(page: bytes) -> None:
    read_everything(page)


REAL_PAGES = sorted(FIXTURES.glob("*.prom"))
_page_cache: dict[Path, bytes] = {}


def test_real_pages_are_there() -> None:
    # Without them the property below would have nothing to cut: set STALLPROBE_FIXTURES.
    assert REAL_PAGES, f"no *.prom in {FIXTURES}"


@st.composite
def damaged_real_pages(draw: st.DrawFn) -> bytes:
    """A real page cut at a random offset, with a few bytes overwritten and a few tokens spliced in."""
    path = draw(st.sampled_from(REAL_PAGES))
    if path not in _page_cache:
        _page_cache[path] = path.read_bytes()
    whole = _page_cache[path]
    # Anywhere, or near the end, where a cut leaves most families on the page.
    page = bytearray(
        whole[: draw(st.one_of(st.integers(0, len(whole)), st.integers(len(whole) * 9 // 10, len(whole))))]
    )
    for _ in range(draw(st.integers(0, 6))):
        if not page:
            break
        at = draw(st.integers(0, len(page) - 1))
        if draw(st.booleans()):
            page[at] = draw(st.integers(0, 255))
        else:
            page[at:at] = draw(st.sampled_from(PAGE_TOKENS))
    return bytes(page)


@_settings(500)
@given(damaged_real_pages())
def test_damaged_real_pages_raise_only_metrics_errors(page: bytes) -> None:
    read_everything(page)


# ---------------------------------------------------------------------------------------------------------
BOOT = "6f1c2a4e-boot"
STATE_TOKENS = [
    FORMAT,
    "stallprobe-state 1",
    "stallprobe-state ",
    "boot_id ",
    BOOT,
    "\n",
    " ",
    "engine ",
    "signal ",
    *(f"{key} " for key in ("running", "generation", "prompt", "t", "waiting", "stall_since", "signals")),
    "none",
    "0",
    "1.5",
    "-0.0",
    "1e308",
    "1e309",
    "nan",
    "inf",
    "1_0",
    "%",
    "%2",
    "%zz",
    "%25",
    "%C3",
    "%C3%A9",
    "%FF",
    "%20",
    "é",
    "\r",
    "\x00",
]
STATE_FIELDS = ["running", "generation", "prompt", "t", "waiting"]
# Keys out of place, unknown ones, and "signals" (the key a signal map once shared with the fields).
ODD_KEYS = [*STATE_FIELDS, "stall_since", "signal", "signals", "x", ""]
GOOD_STATE_VALUES = ["0", "1.5", "-0.0", "1e308", "-1e308", "5e-324", "0.30000000000000004"]
ODD_STATE_VALUES = ["1e309", "-1e309", "nan", "inf", "1_0", " 2 ", "None", "", "0x1", "1 2"]
GOOD_NAMES = ["0", "", "%25", "%C3%A9", "a%20b", "vllm:kv_cache_usage_perc", "x_y.z-1"]
ODD_NAMES = ["%", "%2", "%zz", "%C3", "%FF", "%%", "a b", "%20%"]


STATE_NUMBERS = st.one_of(
    st.sampled_from(GOOD_STATE_VALUES), st.floats(allow_nan=False, allow_infinity=False).map(repr)
)
ODD_STATE_NUMBERS = st.one_of(st.sampled_from(ODD_STATE_VALUES), st.text(max_size=3))
STATE_NAMES = st.sampled_from(GOOD_NAMES)
ODD_STATE_NAMES = st.one_of(st.sampled_from(ODD_NAMES), st.text(max_size=4))
DEFECTS = st.sampled_from(["key", "key", "value", "name", "drop", "copy"])


@st.composite
def near_states(draw: st.DrawFn) -> bytes:
    """A state file as save_states() writes it (engines, their fields in any order, signals); when sloppy, with
    an odd header, or a few defects per engine: a key out of place or unknown, an odd number or name, a
    line missing or repeated."""
    sloppy = draw(st.booleans())
    lines = [FORMAT, f"boot_id {BOOT}"]
    if sloppy:
        lines[0] = draw(st.sampled_from([FORMAT] * 6 + ["stallprobe-state 1", "stallprobe-state", ""]))
        lines[1] = draw(st.sampled_from([f"boot_id {BOOT}"] * 6 + [f"boot_id {BOOT} ", "boot_id", ""]))
    for _ in range(draw(st.integers(1, 3))):
        block = [f"{key} {draw(STATE_NUMBERS)}" for key in STATE_FIELDS]
        block.append(f"stall_since {draw(st.sampled_from(['none', 'none', '-1e308', '-0.0', *GOOD_STATE_VALUES]))}")
        block += [f"signal {draw(STATE_NAMES)} {draw(STATE_NUMBERS)}" for _ in range(draw(st.integers(0, 2)))]
        name = draw(STATE_NAMES)
        for _ in range(draw(st.integers(1, 3)) if sloppy else 0):
            defect = draw(DEFECTS)
            at = draw(st.integers(0, len(block)))
            if defect == "key":
                block.insert(at, f"{draw(st.sampled_from(ODD_KEYS))} {draw(st.one_of(STATE_NUMBERS, st.just('none')))}")
            elif defect == "name":
                name = draw(ODD_STATE_NAMES) if draw(st.booleans()) else name
                block.insert(at, f"signal {draw(ODD_STATE_NAMES)} {draw(STATE_NUMBERS)}")
            elif block and defect == "value":
                at = min(at, len(block) - 1)
                block[at] = f"{block[at].rpartition(' ')[0]} {draw(ODD_STATE_NUMBERS)}"
            elif block and defect == "drop":
                del block[min(at, len(block) - 1)]
            elif block:
                block.insert(at, draw(st.sampled_from(block)))
        lines += [f"engine {name}", *draw(st.permutations(block))]
    text = "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n", "\r\n"] if sloppy else ["\n"]))
    return text.encode("utf-8", "surrogatepass")


garbage_states = st.one_of(
    st.binary(max_size=256),
    st.lists(st.one_of(st.sampled_from(STATE_TOKENS), st.text(max_size=3)), max_size=60).map(
        lambda parts: "".join(parts).encode("utf-8", "surrogatepass")
    ),
)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("states")


def _valid(state: State) -> bool:
    last = state.last
    numbers = [last.running, last.generation, last.prompt, last.t, last.waiting, *last.signals.values()]
    since = state.stall_since
    return all(_finite(v) for v in numbers) and (since is None or (_finite(since) and since <= last.t))


def check_state_file(state_dir: Path, content: bytes) -> None:
    """Bad content is a reason to start over, never an exception; good content is a valid state."""
    path = state_dir / "garbage.state"
    path.write_bytes(content)
    states, reason = load_states(str(path), BOOT)
    event("state file: " + (reason.split(" (")[0].split(" '")[0] if states is None else "read"))
    if states is None:
        assert isinstance(reason, str)
        assert reason  # only a missing file gives no reason
    else:
        assert reason == ""
        assert states
        assert all(isinstance(name, str) and isinstance(s, State) and _valid(s) for name, s in states.items())


@_settings(600)
@given(garbage_states)
def test_any_state_file_content_gives_a_state_or_a_reason(state_dir: Path, content: bytes) -> None:
    check_state_file(state_dir, content)


@_settings(600)
@given(near_states())
def test_nearly_valid_state_files_give_a_state_or_a_reason(state_dir: Path, content: bytes) -> None:
    check_state_file(state_dir, content)


finite = st.floats(allow_nan=False, allow_infinity=False)
interesting = st.one_of(finite, st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 1.7976931348623157e308, 0.1 + 0.2]))


@st.composite
def states(draw: st.DrawFn) -> State:
    t = draw(interesting)
    signals = draw(st.dictionaries(st.text(max_size=8), interesting, max_size=3))
    sample = Sample(draw(interesting), draw(interesting), draw(interesting), t, draw(interesting), signals=signals)
    since = draw(st.one_of(st.none(), st.floats(max_value=t, allow_nan=False, allow_infinity=False)))
    return State(sample, since)


@_settings(300)
@given(
    st.dictionaries(st.text(max_size=8), states(), min_size=1, max_size=3),
    st.text(max_size=40).filter(lambda boot: "\n" not in boot),
)
def test_saved_states_read_back_exactly(state_dir: Path, saved: dict[str, State], boot: str) -> None:
    path = str(state_dir / "round-trip.state")
    save_states(path, saved, boot)
    loaded, reason = load_states(path, boot)
    assert reason == ""
    assert loaded == saved
    for name, state in saved.items():
        back = loaded[name]
        assert [repr(getattr(back.last, f)) for f in ("running", "generation", "prompt", "t", "waiting")] == [
            repr(getattr(state.last, f)) for f in ("running", "generation", "prompt", "t", "waiting")
        ]
        assert repr(back.stall_since) == repr(state.stall_since)
        assert {k: repr(v) for k, v in back.last.signals.items()} == {k: repr(v) for k, v in state.last.signals.items()}
    for other in (boot + "-other", boot + " ", " " + boot):
        assert load_states(path, other) == (None, "state file is from another boot")
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")]


def test_dialect_table_is_not_empty() -> None:
    # read_everything() walks DIALECTS; an empty table would make the page properties check nothing.
    assert DIALECTS


# Found by these properties (and scripts/fuzz): each signal value was checked, but not an engine's sum of
# them, so two large finite values overflowed to inf and Sample() raised ValueError, which escaped as a
# traceback with exit status 1, "stalled". The smallest page that showed it:
OVERFLOWING_SIGNALS = (
    b"vllm:num_requests_running 1\n"
    b"vllm:prompt_tokens_total 0\n"
    b"vllm:generation_tokens_total 0\n"
    b"vllm:kv_cache_usage_perc 1e308\n"
    b"vllm:kv_cache_usage_perc 1e308\n"
)


def test_signals_that_add_up_to_infinity_are_a_metrics_error() -> None:
    with pytest.raises(MetricsError, match="not a finite number"):
        read_engines(OVERFLOWING_SIGNALS, 1.0)
