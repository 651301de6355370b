"""`stallprobe inject`'s output, byte for byte, on every manifest the inject tests read, under a few flag sets.

The golden files under tests/fixtures/inject-golden/ were written by the implementation that parsed every
changed document four times; the one that parses it once must write the same bytes (stdout, the log on
stderr and the exit code). A fixed --pyz (tests/fixtures/inject-golden/fixed.pyz) keeps the ConfigMap's
binaryData from changing with the code.

A change that is meant to change the output regenerates them, and the diff is then read in review:

    .venv/bin/python tests/test_inject_golden.py
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from conftest import REPO
from stallprobe.cli import main

GOLDEN = REPO / "tests" / "fixtures" / "inject-golden"
PYZ = GOLDEN / "fixed.pyz"
INPUTS = sorted(
    [
        *(REPO / "tests" / "fixtures" / "manifests").glob("*.yaml"),
        *(REPO / "deploy" / "examples").glob("*.yaml"),
        *(GOLDEN / "inputs").iterdir(),
    ]
)
FLAGS: dict[str, list[str]] = {
    "default": [],
    "drain-after-30": ["--drain-after", "30"],
    "state-volume": ["--state-volume"],
    "force": ["--force"],
    "all": ["--force", "--drain-after", "30", "--state-volume", "--window", "300", "--configmap", "probe-build"],
}
CASES = [(path, flags) for path in INPUTS for flags in FLAGS]


def _inject(path: Path, flags: str) -> bytes:
    """The command's whole answer as one text: stdout's bytes, then the exit code and stderr."""
    saved = sys.stdin, sys.stdout, sys.stderr
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        code = main(["inject", "-f", str(path), "--pyz", str(PYZ), *FLAGS[flags]], environ={})
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    out.flush()
    assert isinstance(out.buffer, io.BytesIO)
    return out.buffer.getvalue() + f"\n=== exit {code}, stderr:\n{err.getvalue()}".encode()


def _golden(path: Path, flags: str) -> Path:
    return GOLDEN / "out" / f"{path.name}.{flags}"


@pytest.mark.parametrize(("path", "flags"), CASES, ids=[f"{path.name}-{flags}" for path, flags in CASES])
def test_inject_writes_what_it_wrote(path: Path, flags: str) -> None:
    assert _inject(path, flags) == _golden(path, flags).read_bytes()


def test_every_golden_file_has_its_case() -> None:
    assert sorted((GOLDEN / "out").iterdir()) == sorted(_golden(path, flags) for path, flags in CASES)


def regenerate() -> None:
    (GOLDEN / "out").mkdir(exist_ok=True)
    for stale in (GOLDEN / "out").iterdir():
        stale.unlink()
    for path, flags in CASES:
        _golden(path, flags).write_bytes(_inject(path, flags))


if __name__ == "__main__":
    regenerate()
