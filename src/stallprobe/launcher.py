"""The single-file probe as a pod runs it: the launcher (launcher(), the file `python3 -I -S
/opt/stallprobe/probe --url ...` runs, a dozen lines beside the archive in the build's ConfigMap), and
what it reads of the archive: where the bundle of bytecode starts after the shebang, the statements that
load it, the bundle's loader (BOOT) and the archive's own entry point (MAIN, for `python3 stallprobe.pyz`).
pyz.py builds the archive to this layout; this module is the one place the layout is said.
"""

from __future__ import annotations

from .serving import PYZ_KEY

__all__ = ["BOOT", "BUNDLE_AT", "BUNDLE_CODE_AT", "MAIN", "SHEBANG", "launcher"]

# The kernel runs the archive directly when it is executable; `python3 -I -S FILE` ignores this line.
SHEBANG = b"#!/usr/bin/env python3\n"
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
# ({PYZ_KEY}), with no runpy. Why each line is as it is: launcher() in stallprobe's launcher.py.
import gc, posix, sys, marshal, _frozen_importlib_external as b
gc.disable()
p = __file__[: __file__.rfind("/") + 1] + "{PYZ_KEY}"
{EXCEPTHOOK}
sys.path.insert(0, p)
{LOAD}
from stallprobe.cli import run
run()
"""
