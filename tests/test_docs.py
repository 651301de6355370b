"""The docs/ pages: generated where they are reference, linked where they are prose, true of the code and
of each other, and about this repository alone (no document a reader does not have)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NEEDS, REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
# Every page a newcomer meets, and the repository's own files they may link to.
READ = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "tests" / "README.md", *PAGES]
# Words that point at documents the reader of this repository does not have.
ELSEWHERE = re.compile(r"the incident|incident write-up|the seed|feature request|issue \d+|/work/", re.IGNORECASE)


def test_there_is_a_page_for_each_subject() -> None:
    names = {page.stem for page in PAGES}
    expected = {
        "how-it-decides", "engines", "kubernetes", "pools", "alerts", "failure-modes", "cost", "reference", "where",
    }  # fmt: skip
    assert names == expected


TESTS = REPO / "tests"


def test_the_tests_readme_names_every_file_of_the_tests() -> None:
    """tests/README.md maps each behaviour to the file that checks it: every Python file under tests/ is
    named there, and every file it names is there."""
    named = set(re.findall(r"`(\w+\.py)`", (TESTS / "README.md").read_text(encoding="utf-8")))
    files = {path.name for path in TESTS.glob("*.py")}
    assert (sorted(files - named), sorted(named - files)) == ([], [])


def test_the_tests_readme_says_which_files_need_which_tool() -> None:
    rows = [line for line in (TESTS / "README.md").read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    marks = {f"`{tool}`": f'needs\\("{re.escape(tool)}"\\)' for tool in NEEDS} | {"the `vllm` marker": r"vllm\b"}
    for said, mark in marks.items():
        (row,) = [line for line in rows if line.startswith(f"| {said}")]
        marked = re.compile(rf"^(@|pytestmark = )pytest\.mark\.{mark}", re.MULTILINE)
        # (test_needs.py marks a test it writes and runs without the tool, to see it skip)
        tests = [path for path in TESTS.glob("test_*.py") if path.name != "test_needs.py"]
        using = {path.name for path in tests if marked.search(path.read_text(encoding="utf-8"))}
        assert using
        assert set(re.findall(r"`(test_\w+\.py)`", row)) == using, said


def test_the_reference_is_what_the_code_says() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "reference"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lowercase, punctuation dropped, spaces to hyphens."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", READ, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links to {target}, which is not there"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked.read_text(encoding="utf-8")), f"{page.name}: no heading for #{anchor}"


@pytest.mark.parametrize("page", READ, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_cites_a_document_the_reader_does_not_have(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert not ELSEWHERE.findall(text), ELSEWHERE.findall(text)


def test_the_source_cites_none_either() -> None:
    for path in sorted((REPO / "src" / "stallprobe").rglob("*.py")):
        found = ELSEWHERE.findall(path.read_text(encoding="utf-8"))
        assert not found, (path.name, found)


def test_the_pools_page_shows_the_tested_haproxy_configurations() -> None:
    """Each line of HAProxy configuration the pools page shows is a line of the file it names (```haproxy
    file=...), else of deploy/haproxy/stallprobe-pool.cfg: the files the HAProxy tests run as written; and
    the lines that make each way work are there (one /ready check per server; an agent check per server
    beside the engine's own health check)."""
    text = (DOCS / "pools.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:haproxy|cfg)(?: file=(\S+))?\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, "no haproxy block in docs/pools.md"
    shown: dict[str, list[str]] = {}
    for name, block in blocks:
        path = name or "deploy/haproxy/stallprobe-pool.cfg"
        shown.setdefault(path, []).extend(line.strip() for line in block.splitlines() if line.strip())
    assert set(shown) == {"deploy/haproxy/stallprobe-pool.cfg", "deploy/haproxy/stallprobe-agent.cfg"}
    for path, lines in shown.items():
        tested = {line.strip() for line in (REPO / path).read_text().splitlines()}
        assert [line for line in lines if line not in tested] == [], path
    pool, agent = shown["deploy/haproxy/stallprobe-pool.cfg"], shown["deploy/haproxy/stallprobe-agent.cfg"]
    for needed in ("option httpchk", "http-check expect status 200"):
        assert needed in pool, needed
    assert any(line.startswith("http-check send meth GET uri-lf /ready?url=") for line in pool)
    assert any(line.startswith("default-server check addr") for line in pool)
    assert any("agent-check" in line for line in agent)
    assert any("agent-send" in line for line in agent)


def test_every_page_says_one_restart_time() -> None:
    """With the default window, period and failureThreshold, a wedged engine is restarted about 140 s after
    the last progress the probe saw (inject says so for each container): no page says another number."""
    for page in READ:
        text = page.read_text(encoding="utf-8")
        for number in re.findall(r"restart\w*[^.\n]{0,60}?about (\d+) s", text):
            assert number == "140", (page.name, number)


def test_the_state_files_name_is_the_one_the_code_makes() -> None:
    """--help, the reference and the Kubernetes page name the default state file as statefile.default_path
    makes it, and the example they give is its output."""
    from stallprobe.options import STATE_FILE
    from stallprobe.statefile import default_path

    shown = STATE_FILE.shown
    assert shown == "$TMPDIR/stallprobe-<host_port_path>-<hash>.state"
    made = default_path("http://127.0.0.1:8000/metrics", {"TMPDIR": "/tmp"})
    assert re.fullmatch(r"/tmp/stallprobe-127\.0\.0\.1_8000_metrics-[0-9a-f]{8}\.state", made)
    kubernetes = (DOCS / "kubernetes.md").read_text(encoding="utf-8")
    assert f"`{shown}`" in kubernetes
    assert f"`{made}`" in kubernetes
    assert shown in (DOCS / "reference.md").read_text(encoding="utf-8")


def test_every_page_says_one_drain_time() -> None:
    """With the default drain window and readiness period, a wedged engine leaves routing about 35 s after
    its last progress (inject says so for each container): no page says another number."""
    from stallprobe.options import DEFAULT_DRAIN_AFTER
    from stallprobe.stanza import READY_PERIOD

    expected = str(int(DEFAULT_DRAIN_AFTER + READY_PERIOD))
    for page in READ:
        text = page.read_text(encoding="utf-8")
        for number in re.findall(r"drain\w* (?:at|about|after) (?:about |~)?(\d+) s", text):
            assert number == expected, (page.name, number)


def test_the_poll_bound_the_pools_page_gives_is_the_code_s() -> None:
    """pools.md's bound on one poll of watch: the page's --timeout, the stuck engine's one question
    (api.STUCK_QUESTION_TIMEOUT), and the poll's grace for reading the pages (watch.poll._GRACE)."""
    from stallprobe.api import STUCK_QUESTION_TIMEOUT
    from stallprobe.report import num
    from stallprobe.watch import poll

    text = " ".join((DOCS / "pools.md").read_text(encoding="utf-8").split())
    said = re.search(
        r"`--timeout` for the page, (\S+) s for the one question an engine that looks stuck is asked, "
        r"`--timeout` more for each other question asked\) plus a grace of (\S+) s",
        text,
    )
    assert said, "pools.md no longer says how long a poll can take"
    assert said.groups() == (num(STUCK_QUESTION_TIMEOUT), num(poll._GRACE))


def test_cost_figures_quoted_elsewhere_are_cost_md_s_current_ones() -> None:
    """A ratio to the bare interpreter quoted outside docs/cost.md is the one this round's table gives for
    what inject writes (the liveness run, the larger of its two interpreters, to one decimal)."""
    cost = (DOCS / "cost.md").read_text(encoding="utf-8")
    current = cost[cost.index("**This round**") : cost.index("**The previous round**")]
    header = next(line for line in current.splitlines() if line.startswith("| row |")).split("|")
    row = next(line for line in current.splitlines() if line.startswith("| what `inject` writes, liveness"))
    ratios = [float(cell.strip(" *")) for cell, name in zip(row.split("|"), header) if name.strip() == "x bare"]
    assert len(ratios) == 2
    expected = f"{max(ratios):.1f}"
    quoted = []
    for page in READ:
        if page.name == "cost.md":
            continue
        text = " ".join(page.read_text(encoding="utf-8").split())
        quoted += [(page.name, found) for found in re.findall(r"about (\d\.\d+) times a bare Python", text)]
    assert quoted, "the README no longer quotes the probe's cost"
    for name, found in quoted:
        assert found == expected, (name, found, expected)


def _block_lines(text: str, prefix: tuple[str, ...]) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith(prefix)]


def test_the_agent_lines_the_pools_page_shows_are_the_code_s_own_words() -> None:
    """Each example answer of the agent in pools.md is what watch's agent writes for the same case, the
    readiness line made by the judge itself (its numbers aside): no line the code never writes."""
    from stallprobe.detector import Sample, State
    from stallprobe.engines import VLLM
    from stallprobe.judge import Memory, Observation, Rules, judge
    from stallprobe.watch.agent import agent_line
    from stallprobe.watch.serve import Readiness

    rules = Rules(window=120, drain_after=30)
    before = State(Sample(4, 100, 50, 0.0))
    cases = {
        "progressing": (before, Sample(4, 105, 50, 5.0)),
        "stalled": (State(Sample(4, 100, 50, 0.0), -26.0), Sample(4, 100, 50, 5.0)),
        "paused": (
            State(Sample(3, 100, 50, 0.0)),
            Sample(3, 100, 50, 5.0, paused="paused by its operator (/is_paused)"),
        ),
    }
    made = {}
    for verdict, (state, now) in cases.items():
        judged = judge(rules, Memory({"": state}), Observation(VLLM, {"": now}, health=""), ready=True)
        made[verdict] = agent_line("u", Readiness(judged.ready, (judged.line,), 600.0), rules.drain_after)
    shown = _block_lines((DOCS / "pools.md").read_text(encoding="utf-8"), ("ready up #", "drain up #"))
    assert len(shown) >= 3
    numbers = re.compile(r"\d+(?:\.\d+)?(?:m\d+s|s| s)?")  # a count, or a duration as secs() or duration() write it
    for line in shown:
        verdict = line.split("#", 1)[1].removeprefix("not ").removeprefix("ready: ").split(":", 1)[0]
        assert numbers.sub("N", line) == numbers.sub("N", made[verdict]), (line, made[verdict])


def test_the_pools_page_says_when_the_health_route_is_asked_as_the_code_decides() -> None:
    """Each poll asks the health route exactly when a load balancer asks the watch (--listen or --agent),
    and the pools page says so wherever it says when."""
    from stallprobe.watch.poll import WatchConfig

    asked = {
        (listen, agent): WatchConfig(["http://e/metrics"], listen=listen, agent=agent).routing
        for listen in (None, ("127.0.0.1", 1))
        for agent in (None, ("127.0.0.1", 2))
    }
    assert [key for key, routing in asked.items() if not routing] == [(None, None)]
    text = " ".join((DOCS / "pools.md").read_text(encoding="utf-8").split())
    assert "Without `--listen` or `--agent` the health route is not asked" in text
    assert "With `--listen` (or `--agent`), each poll also asks each engine's health route" in text
    assert "With `--agent`, each poll also asks each engine's health route" in text
    assert not re.search(r"health route is (asked )?only (asked )?with `--listen`", text)


def test_the_pools_page_lists_every_field_watch_json_writes() -> None:
    from stallprobe.watch.poll import Row
    from stallprobe.watch.view import row_json

    text = " ".join((DOCS / "pools.md").read_text(encoding="utf-8").split())
    said = text[text.index("`--json` writes one object per engine per poll") :]
    said = said[: said.index("- `--once`")]
    row = Row("u", "", "idle", 0, "idle")
    fields = re.findall(r"(?<![(\w])`(\w+)`", re.sub(r"\([^)]*\)", "", said))
    assert fields == list(row_json(row))


def test_the_placement_page_names_only_alerts_the_rules_define() -> None:
    """Every alert docs/where.md names is one of deploy/prometheus's rules, and it names each that pages."""
    rules = "".join(path.read_text(encoding="utf-8") for path in (REPO / "deploy" / "prometheus").glob("*rules.yaml"))
    defined = set(re.findall(r"- alert: (\w+)", rules))
    text = (DOCS / "where.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(\w+(?:Stalled|Saturated|Missing|Restart|Loop|NotReady|Down)\w*)`", text))
    assert named, "where.md names no alert"
    assert named <= defined, named - defined
    paging = {"VLLMEngineStalled", "SGLangEngineStalled", "EngineLivenessRestartLoop", "EnginePoolMostlyNotReady"}
    assert paging <= named
