"""What `--version` prints, one spelling for every command: the version, and when the probe runs from the
single-file build, which build: the sha256 of the archive and of the launcher beside it, which is the
hash `stallprobe inject` names the build's ConfigMap by (`stallprobe-<its first 10 hex digits>`), and the
archive's own sha256 as a release's SHA256SUMS lists it. So `kubectl exec POD -- python3 -I -S
/opt/stallprobe/probe --version` says exactly which bytes a pod runs.

Only --version reads the files (hashlib is imported then and never on a probe's run).
"""

from __future__ import annotations

import os
import sys

from . import __version__

__all__ = ["build_files", "version_line"]

# The package's entry inside the archive: its spec's origin is the archive's path, then one of these
# (zipimport's, and the bundle's loader's: launcher.BOOT).
_INSIDE = ("/stallprobe/__init__.py", "/stallprobe.py")


def build_files() -> tuple[str, str | None] | None:
    """The archive this probe runs from and the launcher that ran it (None: run without one, as `python3
    stallprobe.pyz`); None when it runs from an installed package."""
    spec = getattr(sys.modules.get("stallprobe"), "__spec__", None)
    origin = getattr(spec, "origin", None) or ""
    inside = next((end for end in _INSIDE if origin.endswith(end)), None)
    if inside is None:
        return None
    archive = origin[: -len(inside)]
    if not os.path.isfile(archive):
        return None  # a folder: an installed package (or its sources)
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main or os.path.dirname(os.path.abspath(main)) != os.path.dirname(os.path.abspath(archive)):
        return archive, None
    return archive, main


def version_line() -> str:
    """`stallprobe VERSION`, and the build's hashes when it runs from the single-file build (a file that
    cannot be read is said, never a traceback)."""
    files = build_files()
    if files is None:
        return f"stallprobe {__version__}"
    import hashlib

    archive, launcher = files
    try:
        with open(archive, "rb") as f:
            data = f.read()
        extra = b""
        if launcher is not None:
            with open(launcher, "rb") as f:
                extra = f.read()
    except OSError as exc:
        return f"stallprobe {__version__} (its build cannot be read: {exc.strerror or exc})"
    own = hashlib.sha256(data).hexdigest()
    name = os.path.basename(archive)
    if launcher is None:
        return f"stallprobe {__version__} ({name} sha256 {own})"
    build = hashlib.sha256(data + extra).hexdigest()
    return (
        f"stallprobe {__version__} (build {build[:10]}: sha256 {build} of {name} and "
        f"{os.path.basename(launcher)}; {name} sha256 {own})"
    )
