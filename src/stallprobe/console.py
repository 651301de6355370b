"""Writing a command's output to stdout, when stdout may be a pipe whose reader has gone (`| head`) or a
descriptor that was closed (`>&-`).

Python's own way is a BrokenPipeError traceback, and an exit status of 120 when the interpreter's last
flush fails. Here a failed write is told once to the caller, who decides what it means (the probe's exit
code stays its verdict's: the kubelet reads the code, not the line; inject's and doctor's output is then
incomplete, which has its own code), and stdout is pointed at /dev/null so that nothing fails again.
"""

from __future__ import annotations

import sys

from .errors import ExitCode

try:
    import posix as _system  # the system calls, without loading os (the probe's path avoids it)
except ImportError:  # not a POSIX system
    import os as _system  # type: ignore[no-redef]

__all__ = ["abandon_stdout", "emit", "end", "show", "tell"]


def emit(text: str) -> bool:
    """Write `text` and a newline to stdout and flush; False when stdout could not take it."""
    if sys.stdout is None:  # the process was started with descriptor 1 closed
        return False
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):  # a pipe with no reader, a closed descriptor; ValueError: a closed file
        abandon_stdout()
        return False
    return True


def show(text: str) -> int:
    """Print --help or --version: OK, or OUTPUT (one line on stderr) when stdout could not take it."""
    if emit(text):
        return ExitCode.OK
    tell("error: stdout was closed before the text was whole")
    return ExitCode.OUTPUT


def tell(text: str) -> None:
    """Write one line to stderr, if anything can still read it."""
    if sys.stderr is None:
        return
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def abandon_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so that the interpreter's last flush of what is still
    buffered succeeds (a failed one ends the process with status 120)."""
    try:
        fd = sys.stdout.fileno()  # a stream with no descriptor of its own (a test's) is left alone
        null = _system.open("/dev/null", _system.O_WRONLY)
        _system.dup2(null, fd)
        _system.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def end(code: int) -> None:
    """End the process at once with `code`, without the interpreter's finalization (collecting and
    freeing every object the run made): stdout and stderr are flushed first, and nothing else is left."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a reader that went away: the exit code is the answer
    _system._exit(code)
