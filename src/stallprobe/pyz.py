"""The single-file build, stallprobe.pyz: the probe as one file, copied into an image or mounted from a
ConfigMap without pip. Used by scripts/build-pyz and by `stallprobe inject`.

A pod runs it with `python3 -I -S /opt/stallprobe/probe --url ...`: `probe` is the launcher
(launcher.launcher(), a file of a dozen lines beside the archive in the same ConfigMap, and the archive's
layout it reads: launcher.py), which puts the archive on sys.path,
loads its bundle (below) and calls the CLI. Running a script file goes through no runpy; `python3
stallprobe.pyz` works too, but running a zip goes through runpy, which costs several ms of CPU a run
(docs/cost.md has both rows). `-I -S` keeps the image's site-packages, PYTHON* variables and working directory
out of the probe's imports (and -I the launcher's own folder: it finds the archive from its `__file__`).

Why not `zipapp.create_archive`: it stamps each entry with the file's mtime, so two builds of the same
source differ, and the `__main__` it writes for `-m stallprobe.cli:main` calls main() without passing its
return value to sys.exit, which would turn every verdict into exit 0. This module writes its own
`__main__.py`, sorted entries and fixed timestamps, so the same source gives the same bytes.

Bytecode: zipimport never writes a .pyc back, so without bytecode in the archive every probe run compiles
every module from source, about 10 ms of CPU a run. And zipimport, even with a .pyc beside each module,
opens the archive again for every module it loads (open, fstat, ioctl, two seeks, two reads, a close) and
first parses the whole directory in Python: on 3.12 a third of what a run adds to the bare interpreter.
So when a target interpreter is given, the archive starts (after the shebang) with a bundle: that
interpreter's magic number, then one marshal value, (BOOT's code, {"modules": {name: code}}), the code of
every module a probe run loads (HOT), compiled by that interpreter with optimize=2. The launcher reads the
file in one read and, when the magic number is its own, runs BOOT, which puts a loader of those modules
first on sys.meta_path. The zip after it holds every module's source (deflated), which zipimport reads on
any other Python (slower: compiled at each run, but the same probe) and for anything not bundled. The
marshal format is the interpreter's own; the magic number says which, so no other Python unmarshals it.
Zip readers ignore what comes before the first entry (as they ignore a shebang), so the archive is still a
zip: `python3 stallprobe.pyz` runs its `__main__.py`, which loads the bundle the same way.
"""

from __future__ import annotations

import io
import json
import subprocess
import zipfile
from pathlib import Path

from .errors import UsageError, shown_path
from .launcher import BOOT, MAIN, SHEBANG

__all__ = ["HOT", "SOMETIMES", "TOOLS", "PythonNotHere", "build", "bytecode"]

PACKAGE = Path(__file__).resolve().parent

# 1980-01-01 00:00:00, the earliest time a zip entry can hold: no build leaks the time it ran.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
# Regular file, rw-r--r--, recorded as made on Unix (3) whatever the build machine, for the same bytes.
FILE_ATTR = 0o100644 << 16
UNIX = 3
REQUIRED = ("stallprobe/__init__.py", "stallprobe/cli.py")
# The archive is the probe, for a pod: the tools (doctor, inject, watch, this builder, and what only they
# read) stay out: every entry costs ~12 us of a run that reads the archive's directory (zipimport, in
# Python: another Python's run, or one that asks for the help page). `stallprobe.pyz watch` says to pip
# install instead.
TOOLS = (
    "stallprobe/__main__.py",
    "stallprobe/doctor/",
    "stallprobe/inject/",
    "stallprobe/launcher.py",
    "stallprobe/pyz.py",
    "stallprobe/serving.py",
    "stallprobe/stanza.py",
    "stallprobe/watch/",
)
# The modules a probe run loads are bundled (tests/test_cost.py checks that this is exactly the set a
# run loads, with those only some runs load: api for a run that finds the engine looking stuck, compiling
# it from source would cost such a run ~3 ms; evidence for a failing run that writes it; killswitch for a
# run that reads the report-only switch).
SOMETIMES = ("api", "evidence", "jsonlite", "killswitch")
HOT = tuple(
    f"stallprobe/{name}.py"
    for name in (
        "__init__",
        "api",
        "asking",
        "cli",
        "console",
        "credentials",
        "detector",
        "engines",
        "errors",
        "evidence",
        "exposition",
        "jsonlite",
        "judge",
        "killswitch",
        "observe",
        "options",
        "probe",
        "readers",
        "report",
        "scrape",
        "settings",
        "statefile",
        "switches",
        "trace",
        "urls",
    )
)


# Compiling the dozen modules a probe run loads takes a fraction of a second; an interpreter that has not
# answered in a minute, even on a starved machine, is stuck (a wrapper waiting on something), not slow.
COMPILE_TIMEOUT = 60.0

# Run by the target interpreter: reads {"boot": BOOT, "modules": {name: source}} as JSON on stdin, writes
# its version and the bundle (hex): its magic number, then the marshal of (BOOT's code, {"modules":
# {module name: code}}). optimize=2 drops docstrings (a third of the bytecode's size) and asserts (type
# narrowing only). The names are sorted: the same sources give the same bytes.
COMPILE = """\
import _frozen_importlib_external, json, marshal, sys
job = json.load(sys.stdin)
# `from __future__ import annotations` is a flag of the compiler here, not an import: at run time the
# statement imports the __future__ module (~0.3 ms a probe run, for nothing the probe reads). The line is
# blanked (so line numbers stay) and its flag given to compile().
future = __import__("__future__").annotations.compiler_flag
line = "from __future__ import annotations\\n"
def code(name, text):
    flags = future if line in text else 0
    return compile(text.replace(line, "\\n", 1), name, "exec", flags=flags, dont_inherit=True, optimize=2)
modules = {}
for name in sorted(job["modules"]):
    module = name[:-3].replace("/", ".")
    modules[module[:-9] if module.endswith(".__init__") else module] = code(name, job["modules"][name])
value = (code("stallprobe.pyz:bundle", job["boot"]), {"modules": modules})
bundle = _frozen_importlib_external.MAGIC_NUMBER + marshal.dumps(value)
json.dump({"version": "%d.%d" % sys.version_info[:2], "bundle": bundle.hex()}, sys.stdout)
"""


class PythonNotHere(UsageError):
    """--python names an interpreter this machine does not have (the image's, python3.12 where there is
    none): the archive can still be built, without the bytecode for it."""


def _compile(python: str, job: dict[str, object]) -> tuple[int, str, str]:
    """Run COMPILE under `python` in a session of its own, killed with whatever it started when it hangs:
    (its exit status, stdout, the line of its stderr that says what went wrong)."""
    import os
    import signal

    named = shown_path(python)
    try:
        proc = subprocess.Popen(
            [python, "-I", "-S", "-c", COMPILE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError as exc:  # the image's interpreter, which this machine need not have
        raise PythonNotHere(f"--python {named}: {exc.strerror} here") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise UsageError(f"--python {named}: {getattr(exc, 'strerror', None) or exc}") from None
    with proc:
        try:
            out, err = proc.communicate(json.dumps(job).encode("utf-8"), timeout=COMPILE_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a grandchild in a session of its own keeps the pipes open
                pass
            raise UsageError(f"--python {named} did not compile the probe within {COMPILE_TIMEOUT:g} s") from None
    lines = err.decode("utf-8", "replace").strip().splitlines() or [""]
    # A Python traceback ends with what went wrong; anything else (a usage message) starts with it.
    said = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return proc.returncode, out.decode("utf-8", "replace"), said.strip()


def bytecode(python: str, entries: list[tuple[str, bytes]]) -> tuple[str, bytes]:
    """Compile the bundle with `python` from the archive's entries (the HOT ones are bundled): its
    version and the bundle's bytes. PythonNotHere when there is no `python` here to run; UsageError when
    it cannot be run, fails, hangs, or answers as no Python does."""
    sources = {name: data.decode("utf-8") for name, data in entries if name in HOT}
    status, out, last = _compile(python, {"boot": BOOT, "modules": sources})
    named = shown_path(python)
    if status != 0:
        raise UsageError(f"--python {named} could not compile the probe: {last or f'exit status {status}'}")
    try:
        result = json.loads(out)
        return str(result["version"]), bytes.fromhex(result["bundle"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"--python {named} did not answer as a Python interpreter does") from None


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
    """The archive's bytes: shebang, then, when `python` is given, the bundle of the probe's modules
    compiled by it, then a zip with __main__.py and the package's sources."""
    entries = [("__main__.py", MAIN.encode("utf-8")), *sources(package)]
    names = {name for name, _ in entries}
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise UsageError(f"the package at {package} lacks {', '.join(missing)}: it cannot be built into the probe")
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    if python is not None:
        buffer.write(bytecode(python, entries)[1])
    # Offsets are recorded from the start of the file, what comes before the zip included; zipimport
    # reads that (as it reads the archives zipapp writes with a shebang).
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            # The entry point is stored (runpy reads it at every run of the zip: no zlib for it); the
            # sources, read only by a Python the bundle is not for, are deflated (~100 KB instead of ~300).
            stored = name == "__main__.py"
            info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            info.external_attr = FILE_ATTR
            info.create_system = UNIX
            archive.writestr(info, data, compresslevel=9)
    return buffer.getvalue()
