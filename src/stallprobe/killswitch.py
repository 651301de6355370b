"""The kill switch: a file the probe reads at every liveness run (inject mounts it from its ConfigMap's
`report-only` key), so that an operator turns every probe of a release report-only in place, without a
rollout: `kubectl patch configmap NAME -p '{"data":{"report-only":"true"}}'`. A ConfigMap volume is
updated in place (the kubelet's sync, about a minute), where a changed environment variable would roll
every pod, and reload every model, at the moment of an incident.

The switch only ever holds restarts back, so it fails towards on: a file that is there but cannot be read,
or says anything but a word read as false, is on; only a file that is not there is off.
"""

from __future__ import annotations

import errno

from .switches import FALSE_WORDS

try:
    import posix as _os  # the system calls, without loading os (the probe's path avoids it)
except ImportError:  # not a POSIX system
    import os as _os  # type: ignore[no-redef]

__all__ = ["switched_on"]

_MAX = 64  # "true" and a newline; a longer file still reads by its first word


def switched_on(path: str) -> bool:
    """Whether the switch file at `path` turns report-only on (see the module's note)."""
    try:
        fd = _os.open(path, _os.O_RDONLY | getattr(_os, "O_NONBLOCK", 0))
    except OSError as exc:
        return exc.errno not in (errno.ENOENT, errno.ENOTDIR)
    try:
        data = _os.read(fd, _MAX)
    except OSError:
        return True
    finally:
        _os.close(fd)
    words = data.decode("utf-8", "replace").split()
    return (words[0].lower() if words else "") not in FALSE_WORDS
