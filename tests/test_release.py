"""A release an SRE can pin: one version said everywhere, and scripts/release's files built twice from one
commit are the same bytes, listed in a SHA256SUMS that `sha256sum -c` checks, each file what it says."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO
from stallprobe import __version__
from stallprobe.inject.core import build_digest

CHANGELOG = REPO / "CHANGELOG.md"


def newest_release() -> str:
    found = re.search(r"^## \[([^\]]+)\] - \d{4}-\d{2}-\d{2}$", CHANGELOG.read_text(encoding="utf-8"), re.MULTILINE)
    assert found, "CHANGELOG.md has no release heading"
    return found.group(1)


def test_one_version_is_said_everywhere() -> None:
    """The package's metadata, the CLI's --version, CHANGELOG.md's newest release and the label inject puts
    on its ConfigMap are all stallprobe.__version__, spelled once (pyproject reads it from there)."""
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert importlib.metadata.version("stallprobe") == __version__
    assert newest_release() == __version__
    said = subprocess.run(
        [sys.executable, "-m", "stallprobe", "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert said.stdout == f"stallprobe {__version__}\n"
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject
    assert re.findall(r"^version\s*=.*$", pyproject, re.MULTILINE) == ['version = { attr = "stallprobe.__version__" }']


def test_every_release_has_upgrade_notes_and_the_sections_keep_a_changelog_names() -> None:
    text = CHANGELOG.read_text(encoding="utf-8")
    releases = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    assert releases
    allowed = {"Upgrade", "Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    for release in releases:
        sections = re.findall(r"^### (.+)$", release, re.MULTILINE)
        assert sections, release[:40]
        assert set(sections) <= allowed, sections
        assert sections[0] == "Upgrade", "an operator reads what to act on first"


def release(output: Path) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "release"), "--dirty", "--output", str(output)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sums = (output / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    return {line.split("  ")[1]: line.split("  ")[0] for line in sums}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], dict[str, str]]:
    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    return first, release(first), release(second)


def test_two_releases_of_one_commit_are_the_same_bytes(built: tuple[Path, dict[str, str], dict[str, str]]) -> None:
    output, once, again = built
    assert sorted(once) == sorted(
        [f"stallprobe-{__version__}-py3-none-any.whl", f"stallprobe-{__version__}.tar.gz", "stallprobe.pyz", "probe"]
    )
    assert once == again
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=output, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_each_file_of_a_release_is_what_it_says(
    built: tuple[Path, dict[str, str], dict[str, str]], tmp_path: Path
) -> None:
    """The wheel installs and says its version; the archive, run through its launcher, names the build by
    the hash inject names its ConfigMap by; the sdist holds the sources and this changelog's version."""
    output, sums, _ = built
    wheel = output / f"stallprobe-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        assert archive.testzip() is None
        assert f"Version: {__version__}" in archive.read(f"stallprobe-{__version__}.dist-info/METADATA").decode()
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True, timeout=300,
    )  # fmt: skip
    program = (
        f"import sys; sys.path.insert(0, {str(target)!r}); import stallprobe as s; print(s.__file__, s.__version__)"
    )
    installed = subprocess.run(
        [sys.executable, "-I", "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    where, version = installed.stdout.split()
    assert (Path(where).is_relative_to(target), version) == (True, __version__)
    launcher = output / "probe"
    said = subprocess.run(
        [sys.executable, "-I", "-S", str(launcher), "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    whole = build_digest((output / "stallprobe.pyz").read_bytes())
    assert said.stdout.startswith(f"stallprobe {__version__} (build {whole[:10]}: sha256 {whole} ")
    assert said.stdout.rstrip().endswith(f"stallprobe.pyz sha256 {sums['stallprobe.pyz']})")
    listed = subprocess.run(
        ["tar", "tzf", str(output / f"stallprobe-{__version__}.tar.gz")], capture_output=True, text=True, check=True
    )
    names = listed.stdout.split()
    assert f"stallprobe-{__version__}/src/stallprobe/detector.py" in names
    assert f"stallprobe-{__version__}/pyproject.toml" in names
