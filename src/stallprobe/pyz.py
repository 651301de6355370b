"""The single-file build, stallprobe.pyz: the probe as one file, copied into an image or mounted from a
ConfigMap without pip. Used by scripts/build-pyz and by `stallprobe inject`.

A pod runs it with `python3 -I -S -c "<launcher(path)>" --url ...`: the launcher puts the archive on
sys.path and calls the CLI. `python3 stallprobe.pyz` works too, but running a zip goes through runpy,
which costs ~8 ms of CPU a run, a third of the whole probe. `-I -S` keeps the image's site-packages,
PYTHON* variables and working directory out of the probe's imports.

Why not `zipapp.create_archive`: it stamps each entry with the file's mtime, so two builds of the same
source differ, and the `__main__` it writes for `-m stallprobe.cli:main` calls main() without passing its
return value to sys.exit, which would turn every verdict into exit 0. This module writes its own
`__main__.py`, sorted entries and fixed timestamps, so the same source gives the same bytes.

Bytecode: zipimport never writes a .pyc back, so without one in the archive every probe run compiles
every module from source, about 10 ms of CPU a run. So beside each `stallprobe/x.py` the archive can hold
a `stallprobe/x.pyc` compiled by a target interpreter, hash-based and unchecked (PEP 552): no timestamps,
the same bytes every build. zipimport tries the .pyc first and falls back to the source when its magic
number is another Python version's, so the archive runs on any Python >= 3.9 and is fast on the one it
was built for. No __pycache__ goes in.
"""

from __future__ import annotations

import io
import json
import subprocess
import zipfile
from pathlib import Path

from .errors import UsageError

__all__ = ["HOT", "build", "bytecode", "launcher"]

PACKAGE = Path(__file__).resolve().parent

# The kernel runs the archive directly when it is executable; `python3 -I -S FILE` ignores this line.
SHEBANG = b"#!/usr/bin/env python3\n"
# 1980-01-01 00:00:00, the earliest time a zip entry can hold: no build leaks the time it ran.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
# Regular file, rw-r--r--, recorded as made on Unix (3) whatever the build machine, for the same bytes.
FILE_ATTR = 0o100644 << 16
UNIX = 3

MAIN = '''\
"""Entry point of stallprobe.pyz: the probe's exit code becomes the process's."""

from stallprobe.cli import run

run()
'''

REQUIRED = ("stallprobe/__init__.py", "stallprobe/cli.py")
# The archive is the probe, for a pod: the tools (doctor, inject, watch, this builder, and what only they
# read) stay out. Every entry costs each run ~12 us while zipimport reads the archive's directory, in
# Python; 19 entries fewer are ~0.2 ms of a probe run. `stallprobe.pyz watch` says to pip install instead.
TOOLS = (
    "stallprobe/__main__.py",
    "stallprobe/doctor/",
    "stallprobe/inject/",
    "stallprobe/pyz.py",
    "stallprobe/serving.py",
    "stallprobe/stanza.py",
    "stallprobe/watch/",
)
# The modules a probe run loads get bytecode (tests/test_cost.py checks that this is exactly the set a
# run loads, with api for a run that finds the engine looking stuck: compiling it from source would cost
# such a run ~3 ms).
HOT = tuple(
    f"stallprobe/{name}.py"
    for name in (
        "__init__",
        "api",
        "cli",
        "console",
        "detector",
        "engines",
        "errors",
        "exposition",
        "observe",
        "options",
        "probe",
        "readers",
        "report",
        "scrape",
        "settings",
        "statefile",
    )
)


def launcher(path: str) -> str:
    """The `-c` program that runs the probe from the archive at `path` (no runpy on the way). The cycle
    collector is off from the first import: a run lives well under a second and makes no garbage that
    cycles, and the collector's passes during the imports are ~2% of its CPU."""
    if '"' in path or "\\" in path:
        raise ValueError(f"the archive's path must not hold a quote or a backslash (got {path!r})")
    return f'import gc, sys; gc.disable(); sys.path.insert(0, "{path}"); from stallprobe.cli import run; run()'


# Compiling the dozen modules a probe run loads takes a fraction of a second; an interpreter that has not
# answered in a minute, even on a starved machine, is stuck (a wrapper waiting on something), not slow.
COMPILE_TIMEOUT = 60.0

# Run by the target interpreter: reads {name: source} as JSON on stdin, writes {name: pyc hex} and its
# version. The header is PEP 552's: magic, flags 0b01 (hash-based, unchecked), the source hash.
# optimize=2 drops docstrings (a third of the bytecode's size) and asserts (type narrowing only).
COMPILE = """\
import importlib.util, json, marshal, sys
sources = json.load(sys.stdin)
out = {}
# `from __future__ import annotations` is a flag of the compiler here, not an import: at run time the
# statement imports the __future__ module (~0.3 ms a probe run, for nothing the probe reads). The line is
# blanked (so line numbers stay) and its flag given to compile().
future = __import__("__future__").annotations.compiler_flag
for name, text in sources.items():
    data = text.encode("utf-8")
    code = compile(
        text.replace("from __future__ import annotations\\n", "\\n", 1), name, "exec",
        flags=future if "from __future__ import annotations\\n" in text else 0, dont_inherit=True, optimize=2,
    )
    pyc = importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little") + importlib.util.source_hash(data)
    out[name[:-3] + ".pyc"] = (pyc + marshal.dumps(code)).hex()
json.dump({"version": "%d.%d" % sys.version_info[:2], "pyc": out}, sys.stdout)
"""


def _shown(python: str) -> str:
    return python if python.isprintable() else repr(python)  # a path with a newline stays on one line


def _compile(python: str, sources: dict[str, str]) -> tuple[int, str, str]:
    """Run COMPILE under `python` in a session of its own, killed with whatever it started when it hangs:
    (its exit status, stdout, the line of its stderr that says what went wrong)."""
    import os
    import signal

    shown = _shown(python)
    try:
        proc = subprocess.Popen(
            [python, "-I", "-S", "-c", COMPILE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise UsageError(f"--python {shown}: {getattr(exc, 'strerror', None) or exc}") from None
    with proc:
        try:
            out, err = proc.communicate(json.dumps(sources).encode("utf-8"), timeout=COMPILE_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a grandchild in a session of its own keeps the pipes open
                pass
            raise UsageError(f"--python {shown} did not compile the probe within {COMPILE_TIMEOUT:g} s") from None
    lines = err.decode("utf-8", "replace").strip().splitlines() or [""]
    # A Python traceback ends with what went wrong; anything else (a usage message) starts with it.
    said = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return proc.returncode, out.decode("utf-8", "replace"), said.strip()


def bytecode(python: str, entries: list[tuple[str, bytes]]) -> tuple[str, list[tuple[str, bytes]]]:
    """Compile the package's modules with `python`: its version and the (name, .pyc bytes) entries.
    UsageError when `python` cannot be run, fails, hangs, or answers as no Python does."""
    sources = {name: data.decode("utf-8") for name, data in entries if name in HOT}
    status, out, last = _compile(python, sources)
    shown = _shown(python)
    if status != 0:
        raise UsageError(f"--python {shown} could not compile the probe: {last or f'exit status {status}'}")
    try:
        result = json.loads(out)
        return str(result["version"]), sorted((name, bytes.fromhex(value)) for name, value in result["pyc"].items())
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"--python {shown} did not answer as a Python interpreter does") from None


def sources(package: Path) -> list[tuple[str, bytes]]:
    """The probe's .py files as (name in the archive, bytes), sorted by name; no caches, bytecode or
    tools."""
    found: list[tuple[str, bytes]] = []
    for path in package.rglob("*.py"):
        rel = path.relative_to(package)
        name = f"{package.name}/{rel.as_posix()}"
        if "__pycache__" in rel.parts or not path.is_file() or name.startswith(TOOLS):
            continue
        found.append((name, path.read_bytes()))
    found.sort()
    return found


def build(python: str | None = None, package: Path = PACKAGE) -> bytes:
    """The archive's bytes: shebang, then a zip with __main__.py, the package's source and, when `python`
    is given, the package's bytecode for that interpreter."""
    entries = [("__main__.py", MAIN.encode("utf-8")), *sources(package)]
    if python is not None:
        entries = sorted(entries + bytecode(python, entries)[1])
    names = {name for name, _ in entries}
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise SystemExit(f"build-pyz: {package} lacks {', '.join(missing)}")
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    # Offsets are recorded from the start of the file, shebang included; zipimport reads that (as it
    # reads the archives zipapp writes the same way).
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            # What every run reads (the entry point and the bytecode) is stored: deflated, each run would
            # import zlib and inflate ~100 KB (~2 ms of CPU). The sources, read only by a Python whose
            # bytecode differs, are deflated: the archive is ~120 KB instead of ~70 KB.
            stored = name == "__main__.py" or name.endswith(".pyc")
            info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            info.external_attr = FILE_ATTR
            info.create_system = UNIX
            archive.writestr(info, data, compresslevel=9)
    return buffer.getvalue()
