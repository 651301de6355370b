"""One real vLLM through the fault timeline, judged by the README's liveness and readiness probes as the kubelet
runs them (tests/timeline.py: the phases, the runner, and what the probes must say, phase by phase).

The short form: every situation once, under steady load, with a 24 s window and a 12 s drain, in about four
minutes once the server is up. Marked `vllm` like tests/test_real_vllm.py: its venv is the same 3.5 GB one, made
once per machine, and the README's test command deselects it; .ci/run runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from realvllm import STARTUP_TIMEOUT, serve
from timeline import MAX_NUM_SEQS, PHASES, SHORT, problems, run_timeline, table

pytestmark = pytest.mark.vllm


def test_the_probes_judge_a_real_engine_right_through_every_situation_in_turn(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A short folder for vLLM: its ZMQ sockets live there, and a socket's path has at most 107 characters.
    vllm = tmp_path_factory.mktemp("vllm")
    with serve(vllm, STARTUP_TIMEOUT, ["--max-num-seqs", str(MAX_NUM_SEQS)], log=print) as server:
        timeline = run_timeline(server, tmp_path / "probes", SHORT, log=print)
    print(table(timeline))
    # Every phase ran, in order, and was judged on runs of both probes.
    assert [outcome.phase for outcome in timeline.outcomes] == list(PHASES), table(timeline)
    assert all(outcome.liveness_runs and outcome.readiness_runs for outcome in timeline.outcomes), table(timeline)
    # No false stall and no missed one anywhere; the stalls and drains came when due, and readiness came back.
    assert sum(outcome.false_stalls for outcome in timeline.outcomes) == 0, table(timeline)
    assert sum(outcome.missed_stalls for outcome in timeline.outcomes) == 0, table(timeline)
    assert problems(timeline) == [], table(timeline)
