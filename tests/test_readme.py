"""The README's examples and tables are checked against the code, so they cannot drift."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, clean_env, rewind, vllm_page
from stallprobe.doctor import DoctorConfig
from stallprobe.errors import COMMANDS
from stallprobe.options import INJECT, PROBE, WATCH
from stallprobe.pyz import build
from stubengine import StubEngine

README = (REPO / "README.md").read_text(encoding="utf-8")
DOCTOR = DoctorConfig.OPTIONS


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README, flags=re.DOTALL)


def console_examples() -> list[tuple[str, str, int]]:
    """(command, output, exit status) for every `$ python3 -m stallprobe` in the console blocks."""
    examples = []
    for block in blocks("console"):
        for match in re.finditer(r"^\$ (python3 -m stallprobe.*)\n((?:[^$].*\n)*)\$ echo \$\?\n(\d+)\n", block, re.M):
            examples.append((match[1], match[2], int(match[3])))
    return examples


EXAMPLES = console_examples()


def test_readme_has_console_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize(("command", "output", "status"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_console_example_output_is_real(command: str, output: str, status: int) -> None:
    argv = shlex.split(command)
    env = clean_env()
    result = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, env=env, check=False)
    assert (result.stdout + result.stderr, result.returncode) == (output, status)


LINE_FORMATS = {
    "baseline": r"baseline: \d+ running, \d+ waiting; .+, progress is judged from the next run",
    "idle": r"idle: \d+ running, \d+ waiting",
    "progressing": r"progressing: \d+ running, \d+ waiting; \+\d+ prompt and \+\d+ generation tokens in [\d.]+ s",
    "saturated": r"saturated: \d+ running, \d+ waiting; \+\d+ prompt and \+\d+ generation tokens in [\d.]+ s; "
    r"busy, not stuck: do not restart",
    "suspect": r"suspect: \d+ running, \d+ waiting; no token progress for [\d.]+ s \(window [\d.]+ s\)"
    r"(; \d+ waiting for capacity, nothing running)?",
    "stalled": r"stalled: \d+ running, \d+ waiting; no token progress for [\d.]+ s \(window [\d.]+ s\)"
    r"(; \d+ waiting for capacity, nothing running)?",
}


def test_example_verdict_lines_have_the_real_format() -> None:
    (demo,) = blocks("text")
    seen = set()
    for line in demo.splitlines():
        verdict = line.split(":", 1)[0]
        assert re.fullmatch(LINE_FORMATS[verdict], line), line
        seen.add(verdict)
    assert seen == set(LINE_FORMATS)


def test_demo_prints_lines_of_the_same_format_and_ends_stalled() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    probe_lines = re.findall(r"^ +probe +\d+ +exit (\d) +(.*)$", result.stdout, re.M)
    assert len(probe_lines) == 24
    assert any(line.endswith("; 3 waiting for capacity, nothing running") for _, line in probe_lines)
    for code, line in probe_lines:
        verdict = line.split(":", 1)[0]
        assert re.fullmatch(LINE_FORMATS[verdict], line), line
        assert int(code) == (1 if verdict == "stalled" else 0)
    assert probe_lines[-1][1].startswith("stalled: ")
    # Every line the docs quote from the demo is one it prints, figure for figure; only the seconds, which
    # the machine's speed moves, are left out of the comparison. Both pages quote the one block.
    (quoted,) = blocks("text")
    decides = (REPO / "docs" / "how-it-decides.md").read_text(encoding="utf-8")
    assert f"```text\n{quoted}```" in decides

    def timeless(line: str) -> str:
        return re.sub(r"(in|for) [\d.]+ s", r"\1 N s", line)

    printed = {timeless(line) for _, line in probe_lines}
    for line in quoted.splitlines():
        assert timeless(line) in printed, line


def test_first_lines_are_the_two_newcomer_commands() -> None:
    first = README.split("\n", 8)[:7]
    assert first[3].startswith("python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/python scripts/demo")
    assert first[4].startswith(
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && scripts/install-test-tools "
        "&& .venv/bin/python -m pytest"
    )


def test_the_exit_code_table_is_the_one_in_errors_py() -> None:
    from stallprobe.helppage import exit_code_rows

    assert "\n".join(exit_code_rows()) + "\n" in README


def test_the_readme_is_read_in_five_minutes() -> None:
    """The first screen and about 250 lines; the rest is in docs/, one page a subject."""
    assert len(README.splitlines()) <= 260
    first_screen = "\n".join(README.splitlines()[:45])
    for words in ("stallprobe doctor", "stallprobe inject", "## Get started"):
        assert words in first_screen, words


def test_the_synopsis_names_every_command_and_only_real_flags() -> None:
    plain = re.findall(r"^```\n(.*?)^```$", README, flags=re.DOTALL | re.MULTILINE)
    (synopsis,) = [block for block in plain if block.startswith("stallprobe [")]
    assert [line.split()[1] if line.split()[1] in COMMANDS else "probe" for line in synopsis.splitlines()] == [
        "probe",
        "doctor",
        "watch",
        "inject",
    ]
    known = {option.flag for option in (*PROBE, *WATCH, *INJECT, *DOCTOR)} | {option.short for option in INJECT}
    for flag in re.findall(r"\[(-[-a-z]+)", synopsis):
        assert flag in known, flag


def test_every_page_of_the_docs_is_linked_and_every_link_resolves() -> None:
    linked = set(re.findall(r"\]\((docs/[a-z-]+\.md)\)", README))
    assert linked == {f"docs/{page.name}" for page in (REPO / "docs").glob("*.md")}
    assert "CONTRIBUTING.md" in README


def test_ci_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    command = README.split("\n")[4].split("   #")[0].strip()
    # .ci/run reads the command out of the README: run its own line that does so, here.
    (extract,) = [line for line in ci.splitlines() if line.startswith("test_command=")]
    done = subprocess.run(
        ["bash", "-c", f'{extract}; printf %s "$test_command"'], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout == command
    assert 'eval "$test_command"' in ci
    assert "git clone" in ci  # from a clone with nothing beside it
    assert "ruff check" in ci
    assert "mypy" in ci


def stanza_commands() -> list[list[str]]:
    """The exec command of every liveness probe stanza in the README's YAML."""
    commands = []
    for block in blocks("yaml"):
        for flow in re.findall(r"command: (\[.*?\])", block, flags=re.DOTALL):
            command = yaml.safe_load(flow)
            assert isinstance(command, list)
            commands.append([str(word) for word in command])
    return commands


def test_the_pod_stanzas_run_the_probe(served: StubEngine, tmp_path: Path) -> None:
    """Each stanza's command, run as the kubelet would (the archive where the ConfigMap would mount it):
    a baseline, then a stall once the window has passed (readiness: ready, then not ready)."""
    commands = stanza_commands()
    assert len(commands) == 2  # readiness and liveness
    (tmp_path / "pyz").mkdir()
    pyz = tmp_path / "pyz" / "stallprobe.pyz"
    pyz.write_bytes(build())
    served.route("/metrics", vllm_page(4, 100, 50))
    served.route("/health", b"")
    env = clean_env()
    for n, command in enumerate(commands):
        assert command[0] == "python3"
        assert "-m" not in command  # runpy: ~8 ms a run for nothing
        argv = [sys.executable, *(word.replace("/opt/stallprobe/stallprobe.pyz", str(pyz)) for word in command[1:])]
        argv = [word.replace("http://127.0.0.1:8000/metrics", served.url) for word in argv]
        # the kubelet's file, here in the test's own folder (never the host's /dev/termination-log)
        message = tmp_path / f"{n}.termination-log"
        argv = [word.replace("/dev/termination-log", str(message)) for word in argv]
        state = tmp_path / f"{n}.state"
        argv += ["--state-file", str(state)]
        ready = "--ready" in command
        first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)
        assert first.returncode == 0, first.stdout + first.stderr
        assert first.stdout.startswith("ready: baseline" if ready else "baseline"), first.stdout
        rewind(str(state), 121)  # past either window
        second = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)
        assert second.returncode == 1, second.stdout
        assert second.stdout.startswith("not ready: stalled" if ready else "stalled"), second.stdout
        # liveness leaves its evidence for the restarted container's last state; readiness writes none
        left = message.read_text() if message.exists() else ""
        assert (left == "") is ready, left
        assert left.startswith("--- stallprobe: liveness failed (exit 1): stalled") is not ready, left
