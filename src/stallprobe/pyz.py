"""The single-file build, stallprobe.pyz: the probe as one file, copied into an image or mounted from a
ConfigMap without pip. Used by scripts/build-pyz and by `stallprobe inject`.

A pod runs it with `python3 -I -S /opt/stallprobe/probe --url ...`: `probe` is the launcher (launcher(),
a file of a dozen lines beside the archive in the same ConfigMap), which puts the archive on sys.path,
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

from .errors import UsageError, shown
from .serving import PYZ_KEY

__all__ = ["HOT", "SOMETIMES", "PythonNotHere", "build", "bytecode", "launcher"]

PACKAGE = Path(__file__).resolve().parent

# The kernel runs the archive directly when it is executable; `python3 -I -S FILE` ignores this line.
SHEBANG = b"#!/usr/bin/env python3\n"
# 1980-01-01 00:00:00, the earliest time a zip entry can hold: no build leaks the time it ran.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
# Regular file, rw-r--r--, recorded as made on Unix (3) whatever the build machine, for the same bytes.
FILE_ATTR = 0o100644 << 16
UNIX = 3
# Where the bundle starts, after the shebang: the magic number of the Python that compiled it (4 bytes),
# then its one marshal value.
BUNDLE_AT = len(SHEBANG)
BUNDLE_CODE_AT = BUNDLE_AT + 4

# The launcher's and __main__'s statements that load the bundle of the archive at `p` when it is this
# Python's (`b` is _frozen_importlib_external, which every interpreter has loaded before it runs a program).
# The file is read with posix's calls: open, one read, close. open() would add a file object, its buffer
# and five system calls (fstat twice, isatty's ioctl, a seek, the read that finds the end). One read of up
# to MAX_READ takes the whole of a regular file (a ConfigMap's volume is tmpfs), and the archive is far
# smaller (tests/test_build_pyz.py holds it under 384 KiB; a ConfigMap holds at most 1 MiB).
MAX_READ = 1 << 20
LOAD = (
    "f = posix.open(p, posix.O_RDONLY)\n"
    f"a = posix.read(f, {MAX_READ})\n"
    "posix.close(f)\n"
    f"a[{BUNDLE_AT}:{BUNDLE_CODE_AT}] == b.MAGIC_NUMBER and exec(*marshal.loads(memoryview(a)[{BUNDLE_CODE_AT}:]))"
)

# The launcher's hook for an exception nothing catches: one line on stderr and exit 2, with no traceback.
EXCEPTHOOK = (
    "sys.excepthook = lambda t, e, _: (\n"
    '    print("error: cannot run the probe from", p + ":", t.__name__ + ":", e, file=sys.stderr, flush=True),\n'
    "    posix._exit(2),\n"
    ")"
)

MAIN = f'''\
"""Entry point of stallprobe.pyz (`python3 stallprobe.pyz`, through runpy, which puts the archive first
on sys.path): the bundle's loader as the launcher installs it, then the probe, whose exit code becomes the
process's."""

import _frozen_importlib_external as b
import marshal
import posix
import sys

p = sys.path[0]
{LOAD}

from stallprobe.cli import run  # noqa: E402

run()
'''

# Run by the launcher, compiled by the target interpreter, with `modules` ({name: code}) as its globals'
# one name. A loader of the bundled modules, first on sys.meta_path. The archive leaves sys.path (the
# launcher and runpy both put it first): there every import of the standard library would make zipimport
# open it and parse its directory, in Python, before looking further. `stallprobe` is a package whose
# other submodules (the help page) zipimport finds in the archive, when a run asks for one.
BOOT = """\
import sys
from _frozen_importlib import ModuleSpec


class Bundle:
    archive = sys.path.pop(0)
    modules = modules

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in cls.modules:
            return None
        package = name == "stallprobe"
        spec = ModuleSpec(name, cls, origin=f"{cls.archive}/{name.replace('.', '/')}.py", is_package=package)
        if package:
            spec.submodule_search_locations = [f"{cls.archive}/stallprobe"]
        return spec

    @staticmethod
    def create_module(spec):
        return None

    @classmethod
    def exec_module(cls, module):
        exec(cls.modules[module.__spec__.name], module.__dict__)


sys.meta_path.insert(0, Bundle)
"""

REQUIRED = ("stallprobe/__init__.py", "stallprobe/cli.py")
# The archive is the probe, for a pod: the tools (doctor, inject, watch, this builder, and what only they
# read) stay out: every entry costs ~12 us of a run that reads the archive's directory (zipimport, in
# Python: another Python's run, or one that asks for the help page). `stallprobe.pyz watch` says to pip
# install instead.
TOOLS = (
    "stallprobe/__main__.py",
    "stallprobe/doctor/",
    "stallprobe/inject/",
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


def launcher() -> str:
    """The launcher's text: the file the pod's command runs (`python3 -I -S /opt/stallprobe/probe ...`),
    which runs the probe from the archive beside it (no runpy on the way: a script file goes through none).
    The cycle collector is off from the first import: a run lives well under a second and makes no garbage
    that cycles, and the collector's passes during the imports are ~2% of its CPU. It reads the archive in
    one read; when the bundle after the shebang was compiled by this Python (its magic number matches), the
    bundle's loader serves the probe's modules from that read, and zipimport (from the sources) serves
    whatever else, or everything on another Python. With -I, Python puts no folder of the script's on
    sys.path: the archive is found from the launcher's own `__file__` (the path the command names, not
    its target: a ConfigMap volume's files are links into a folder that changes with every update).

    An archive that is missing, unreadable or not the probe (a ConfigMap not mounted, a truncated copy)
    says so in one line and exits 2, the code of a deploy error (as a flag that is invalid), instead of a
    traceback and exit 1: the hook set first takes any exception nothing catches. Once the CLI runs it says
    its own errors, with their codes; only a bug of the probe would still reach the hook, and be one line
    and exit 2 as well.

    What a file costs beyond the `-c` program an earlier release wrote: Python tries a script's path as a
    zip before it runs it (pymain_get_importer: zipimport opens the file and looks for a zip's end), then
    reads it: about 30 more system calls and 0.2M more instructions a run (strace, callgrind; 3.11), of
    the probe's ~300 and ~28M, about 0.1 ms. Reading the archive with posix's calls takes 5 of those system
    calls back (LOAD), and the comment is two lines: the tokenizer reads a script a character at a time, at
    tens of instructions a character, so why each line is as it is is said here. docs/cost.md has the
    bench's rows before and after."""
    return f"""\
# stallprobe's launcher: `python3 -I -S <this file> --url ...` runs the probe from the archive beside it
# ({PYZ_KEY}), with no runpy. Why each line is as it is: launcher() in stallprobe's pyz.py.
import gc, posix, sys, marshal, _frozen_importlib_external as b
gc.disable()
p = __file__[: __file__.rfind("/") + 1] + "{PYZ_KEY}"
{EXCEPTHOOK}
sys.path.insert(0, p)
{LOAD}
from stallprobe.cli import run
run()
"""


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

    named = shown(python)
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
    named = shown(python)
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
