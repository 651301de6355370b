"""What a probe run leaves where operators look after the fact: a line on the container's own log when its
verdict or readiness changed, and the evidence of a failing liveness run in the container's termination
message file, which the kubelet reads when the container ends (a liveness kill included) and shows as
`lastState.terminated.message` (pkg/kubelet/kuberuntime/kuberuntime_container.go: makeMounts creates and
mounts the file, getTerminationMessage reads it; docs/kubernetes.md cites both).

Neither may cost a run its verdict: a log that cannot take the line (a full or closed pipe, a descriptor
that is gone, no permission) loses the line; a termination file that cannot be written loses the
evidence. Nothing here blocks, nothing here raises.
"""

from __future__ import annotations

from .evidence import EVIDENCE_BEGIN, EVIDENCE_END

try:
    import posix as _os  # the system calls, without loading os (the probe's path avoids it)
except ImportError:  # not a POSIX system
    import os as _os  # type: ignore[no-redef]

__all__ = ["BEGIN", "END", "MAX_EVIDENCE", "clear_evidence", "tell_log", "write_evidence"]

# A pipe takes a write of up to PIPE_BUF bytes (4096 on Linux) whole or not at all: a line is never torn
# among another process's, and one that is too large for what the pipe has room for is dropped whole.
MAX_LINE = 4000
# The kubelet keeps the last 4096 bytes of the file, then the pod's status keeps the first 12288 bytes
# divided among its containers (research: kubelet's status manager): 2 KiB survives a pod of six.
MAX_EVIDENCE = 2048
# The evidence sits between two lines (evidence.py writes them), so that a run that passes again removes
# what the probe wrote, and only that: the engine may have written its own words to the same file.
BEGIN, END = EVIDENCE_BEGIN, EVIDENCE_END
_MAX_READ = 64 * 1024


def tell_log(path: str, line: str) -> bool:
    """Write `line` to the log at `path` (PID 1's stdout: /proc/1/fd/1) without ever waiting: whether it
    was written."""
    data = (line[:MAX_LINE] + "\n").encode("utf-8", "replace")
    flags = _os.O_WRONLY | getattr(_os, "O_NONBLOCK", 0) | getattr(_os, "O_NOCTTY", 0) | _os.O_APPEND
    try:
        fd = _os.open(path, flags)
    except OSError:  # nothing reads the pipe (ENXIO), no such descriptor, no permission
        return False
    try:
        return _os.write(fd, data) == len(data)
    except OSError:  # EAGAIN: the pipe is full; EPIPE: its reader went away
        return False
    finally:
        _os.close(fd)


def _read(path: str) -> str | None:
    try:
        fd = _os.open(path, _os.O_RDONLY | getattr(_os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return ""
    except OSError:
        return None
    try:
        return _os.read(fd, _MAX_READ).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        _os.close(fd)


def _theirs(text: str) -> str:
    """The file's text without the probe's evidence (everything between BEGIN and END, those included)."""
    start = text.find(BEGIN)
    if start < 0:
        return text
    end = text.find(END, start)
    after = -1 if end < 0 else text.find("\n", end)
    return text[:start] + ("" if after < 0 else text[after + 1 :])


def _replace(path: str, text: str) -> bool:
    try:
        fd = _os.open(path, _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC | getattr(_os, "O_NONBLOCK", 0), 0o644)
    except OSError:
        return False
    try:
        data = text.encode("utf-8", "replace")
        return not data or _os.write(fd, data) == len(data)
    except OSError:
        return False
    finally:
        _os.close(fd)


def write_evidence(path: str, evidence: str) -> bool:
    """Put `evidence` (cut to MAX_EVIDENCE bytes) into the termination message file at `path`, after
    whatever else the file holds, in place of what the probe wrote there before: whether it was written."""
    text = _read(path)
    if text is None:
        return False
    body = evidence.encode("utf-8", "replace")[: MAX_EVIDENCE - len(END) - 2].decode("utf-8", "ignore")
    block = f"{body.rstrip()}\n{END}\n"
    theirs = _theirs(text)
    if theirs and not theirs.endswith("\n"):
        theirs += "\n"
    return _replace(path, theirs + block)


def clear_evidence(path: str) -> bool:
    """Remove what the probe wrote into the termination message file at `path`, and only that: whether
    the file is clear of it."""
    text = _read(path)
    if text is None:
        return False
    if BEGIN not in text:
        return True
    return _replace(path, _theirs(text))
