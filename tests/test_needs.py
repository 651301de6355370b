"""A test that needs a tool from outside the repository says so (`@pytest.mark.needs(...)`): it skips
with one line where the tool is missing, and fails instead under STALLPROBE_NO_SKIPS=1, as in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NEEDS, NO_SKIPS, REPO

CONFTEST = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("stallprobe_tests_conftest", {str(REPO / "tests" / "conftest.py")!r})
ours = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ours)
pytest_runtest_setup = ours.pytest_runtest_setup
pytest_runtest_makereport = ours.pytest_runtest_makereport
"""
TESTS = """
import pytest

@pytest.mark.needs("haproxy")
def test_needs_haproxy():
    pass

def test_skips_on_its_own():
    pytest.skip("for no reason")

def test_plain():
    pass
"""


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_it.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = needs: a tool\n")
    clean = {k: v for k, v in os.environ.items() if k != NO_SKIPS}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rsfE", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**clean, "PATH": str(tmp_path), **env},  # no haproxy on this PATH
        timeout=120,
        check=False,
    )


def test_a_missing_tool_skips_with_one_line_that_says_what_to_do(tmp_path: Path) -> None:
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 2 skipped" in done.stdout
    assert "needs haproxy: haproxy is not on PATH: run scripts/install-test-tools" in done.stdout


def test_in_ci_every_skip_is_a_failure(tmp_path: Path) -> None:
    done = run(tmp_path, **{NO_SKIPS: "1"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed, 1 error" in done.stdout  # the need fails at setup, the skip at its call
    assert "needs haproxy: haproxy is not on PATH" in done.stdout
    assert "makes every skip a failure" in done.stdout


def test_every_need_is_known_and_checks_the_machine() -> None:
    assert set(NEEDS) == {"promtool", "kubectl", "haproxy", "llama.cpp"}
    for tool, missing in NEEDS.items():
        assert isinstance(missing(), str), tool


@pytest.mark.parametrize("path", sorted((REPO / "tests").glob("test_*.py")), ids=lambda p: p.name)
def test_a_test_that_runs_an_outside_tool_declares_it(path: Path) -> None:
    """The tools are named in the test files that run them only beside a needs() mark."""
    text = path.read_text(encoding="utf-8")
    runs = {
        "promtool": '"promtool"' in text,
        "kubectl": '"kubectl"' in text,
        "haproxy": "haproxy()" in text or '["haproxy"' in text,
        "llama.cpp": "LlamaCppServer(" in text,
    }
    for tool, used in runs.items():
        if used and path.name != "test_needs.py":
            assert f'needs("{tool}")' in text or f"needs({tool!r})" in text, f"{path.name} runs {tool}"
