"""No reading of ours ends in exit 1: a page from which a required value cannot be read (a family missing,
declared with no sample, without a series for one of its engines) is "cannot judge", never a frozen 0,
and a counter is read under either spelling the text format allows (with or without `_total`).

The property: an engine that keeps moving, whose page shows its families in any of those styles from
run to run (or drops one and brings it back), is never called stalled by any run of the probe, run as the
kubelet runs it in-process (cli.main) against the suite's stub engine, time made to pass by rewinding the
state file. The stall itself is still caught: the same page styles on a frozen engine end in exit 1.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import clean_env, rewind
from stallprobe.cli import main
from stallprobe.errors import ExitCode
from stubengine import StubEngine

RUNNING, PROMPT, GENERATION = "vllm:num_requests_running", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"
# How a run's page shows one family: as prometheus_client writes it, its counter's samples without the
# `_total` suffix (text format 0.0.4 allows it), declared (# HELP and # TYPE) with no sample, or not at all.
STYLES = ("total", "bare", "declared", "absent")
WINDOW = 60.0
STEP = 25.0  # seconds between two runs: the window is reached within three frozen runs


def family(name: str, kind: str, values: dict[str, float], style: str) -> bytes:
    """One family of a vLLM page: each engine's value (by its `engine` label, "" for none) in `style`."""
    base = name.removesuffix("_total")
    head = f"# HELP {base} the family\n# TYPE {base} {kind}\n".encode()
    if style == "absent":
        return b""
    if style == "declared":
        return head
    sampled = base if style == "bare" else name
    lines = [
        f'{sampled}{{engine="{engine}",model_name="m"}} {value!r}\n' if engine else f"{sampled} {value!r}\n"
        for engine, value in values.items()
    ]
    return head + "".join(lines).encode()


def page(
    running: dict[str, float], prompt: dict[str, float], generation: dict[str, float], styles: tuple[str, ...]
) -> bytes:
    return (
        family(RUNNING, "gauge", running, styles[0] if styles[0] != "bare" else "total")
        + family(PROMPT, "counter", prompt, styles[1])
        + family(GENERATION, "counter", generation, styles[2])
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[StubEngine]:
    with StubEngine() as stub:
        yield stub


def run_probe(url: str, state: Path, engine: str = "vllm") -> tuple[int, str]:
    """One run, as inject writes the probe (--engine vllm) or with the page choosing (auto)."""
    out = io.StringIO()
    argv = ["--url", url, "--state-file", str(state), "--window", str(WINDOW), "--engine", engine]
    with contextlib.redirect_stdout(out):
        code = main(argv, clean_env())
    return code, out.getvalue().strip()


# Each run: a style per family (running, prompt, generation), and whether one engine of two lacks its
# series of one required family.
runs = st.lists(
    st.tuples(st.tuples(*(st.sampled_from(STYLES) for _ in range(3))), st.booleans(), st.sampled_from((1, 2))),
    min_size=2,
    max_size=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=runs, engines=st.sampled_from((1, 2)), dialect=st.sampled_from(("vllm", "auto")))
def test_a_moving_engine_is_never_stalled_however_its_page_spells_or_drops_a_family(
    engine: StubEngine, tmp_path: Path, runs: list[tuple[tuple[str, str, str], bool, int]], engines: int, dialect: str
) -> None:
    state = tmp_path / f"state-{len(runs)}-{engines}-{hash(tuple(runs)) & 0xFFFF}"
    state.unlink(missing_ok=True)
    names = [str(i) for i in range(engines)] if engines > 1 else [""]
    seen_codes = []
    for i, (styles, lacking, which) in enumerate(runs, start=1):
        # Both counters move at every run: a healthy engine.
        prompt, generation = dict.fromkeys(names, 100.0 * i), dict.fromkeys(names, 7.0 * i)
        if lacking and engines > 1:
            (prompt if which == 1 else generation).pop(names[-1])
        engine.route("/metrics", page(dict.fromkeys(names, 3.0), prompt, generation, styles))
        code, line = run_probe(engine.url, state, dialect)
        seen_codes.append(code)
        assert code != ExitCode.STALLED, (runs, line)
        if state.exists():
            rewind(state, STEP)
    assert seen_codes


@pytest.mark.parametrize("styles", [("total", "bare", "bare"), ("total", "total", "bare"), ("total", "bare", "total")])
def test_a_frozen_engine_spelled_without_total_is_still_stalled(
    engine: StubEngine, tmp_path: Path, styles: tuple[str, str, str]
) -> None:
    state = tmp_path / "state"
    engine.route("/metrics", page({"": 3.0}, {"": 50.0}, {"": 9.0}, styles))
    codes = []
    for _ in range(4):
        code, line = run_probe(engine.url, state)
        codes.append((code, line.partition(":")[0]))
        rewind(state, STEP)
    assert codes == [(0, "baseline"), (0, "suspect"), (0, "suspect"), (1, "stalled")]


@pytest.mark.parametrize("dialect", ["vllm", "auto"])
@pytest.mark.parametrize("style", ["declared", "absent"])
def test_a_required_counter_that_cannot_be_read_is_unjudged_never_a_frozen_0(
    engine: StubEngine, tmp_path: Path, style: str, dialect: str
) -> None:
    state = tmp_path / "state"
    engine.route("/metrics", page({"": 3.0}, {"": 50.0}, {"": 9.0}, ("total", "total", style)))
    for _ in range(4):
        code, line = run_probe(engine.url, state, dialect)
        assert (code, line.split(":")[0]) == (ExitCode.OK, "unjudged"), line
        assert GENERATION in line
