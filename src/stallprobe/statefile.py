"""The state file: the detector's memory between two probe runs.

Format: UTF-8 text, one `key value` per line, the first line `stallprobe-state 4` (a file of version 3,
which has no `dialect` and no `said` lines, reads as well), then `boot_id`, then what the probe remembers of
the page as a whole (the judge's Memory): `dialect NAME` (the engine whose page it read), `said KIND CLASS`
(what each kind of run, liveness and readiness, last said on the container's log), `fact NAME VALUE` (when
the last canary went out, since when the health route gives no answer), then for each engine an `engine
NAME` line followed by its fields (`running 4.0`, ..., `owed 0.0` (a file without it, written before it
existed, reads as 0), `stall_since none`, `paused_since none`, `answered 1`, `paused WHY` when paused,
`finished N` and `preemptions N` when the page counts them, `mark T PROMPT GENERATION FINISHED PREEMPTIONS`
since when, busy, the engine finished nothing) and its signals (`signal NAME VALUE`). A file may name no
engine (a run that could not read the page still remembers what it said). Names, classes and the pause's why
are percent-encoded outside [A-Za-z0-9_.:-]. Not JSON because the json module pulls in `re` and costs a
quarter of the interpreter's own start on every probe run; the state is a handful of numbers, and this
format is just as easy to read by eye (`cat` it).

Safety: the file lives in a shared temp folder, so it is read without following a symlink, capped in size,
and replaced atomically (a private temporary file in the same folder, then os.replace): a reader never sees
half a file, and 16 probes started at once leave one valid file. Content that does not parse is not an
error: it restarts the baseline and is overwritten. Only an I/O failure is (StateFileError).
"""

from __future__ import annotations

import errno

from .detector import State
from .judge import Memory

try:
    # The system calls themselves. `os` wraps them, but importing it (with stat, posixpath and
    # collections.abc) is ~1.3 ms of a probe run under `python3 -I -S`, where nothing else loads it.
    import posix as _os
except ImportError:  # not a POSIX system
    import os as _os  # type: ignore[no-redef]
from .errors import StateFileError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["FORMAT", "Locked", "default_path", "load", "read_boot_id", "save"]

FORMAT = "stallprobe-state 4"
_READS = (FORMAT, "stallprobe-state 3")  # version 3 is version 4 without `dialect` and `said`
_MAX_SIZE = 64 * 1024  # a valid file is ~200 bytes; anything far larger is not ours
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")
_NAME_SAFE = _SAFE | frozenset("_:")
# Numbers of an engine's last sample, then the times of its state (`none` when unset).
_NUMBERS = ("running", "generation", "prompt", "t", "waiting", "pending", "owed")
_TIMES = ("stall_since", "paused_since")
# Counts a page may not have (`none`): the engine's finished and preempted requests.
_COUNTS = ("finished", "preemptions")
# The mark (since when, busy, the engine finished nothing): one line, `mark T PROMPT GENERATION FINISHED
# PREEMPTIONS`.
_MARK = ("t", "prompt", "generation", "finished", "preemptions")
_HINT = "mount an emptyDir at /tmp or point --state-file elsewhere"
# The file type bits of st_mode (stat.S_IFMT and friends, without the stat module).
_S_IFMT, _S_IFDIR, _S_IFREG = 0o170000, 0o040000, 0o100000
_DEVICES = (0o020000, 0o060000)  # character and block devices


def read_boot_id() -> str:
    """This boot's id (Linux), or "" where the kernel does not say. Monotonic time is per boot."""
    try:
        with open(_BOOT_ID_PATH, "rb") as f:
            return f.read(100).decode("ascii", "replace").strip()
    except OSError:
        return ""


def default_path(url: str, environ: Mapping[str, str]) -> str:
    """A file in the temp folder named after the URL, so two probes of two ports never share state."""
    folder = environ.get("TMPDIR") or environ.get("TEMP") or environ.get("TMP") or "/tmp"
    readable = "".join(ch if ch in _SAFE else "_" for ch in url.partition("://")[2])[:80]
    # The hash keeps names unique where replacing characters with "_" would make two URLs collide.
    return _join(folder, f"stallprobe-{readable}-{_fnv1a(url.encode('utf-8', 'replace')):08x}.state")


def _join(folder: str, name: str) -> str:
    """os.path.join for a file name without a slash."""
    return f"{folder}/{name}" if folder and not folder.endswith("/") else f"{folder}{name}"


def _split(path: str) -> tuple[str, str]:
    """os.path.split: the folder ("" for none, "/" for the root) and the file name."""
    cut = path.rfind("/") + 1
    folder = path[:cut]
    return (folder.rstrip("/") or folder), path[cut:]


def _fnv1a(data: bytes) -> int:
    """32-bit FNV-1a: a stable short hash of the URL (binascii or hashlib would be one more import)."""
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _quote(name: str) -> str:
    return "".join(ch if ch in _NAME_SAFE else "".join(f"%{b:02X}" for b in ch.encode()) for ch in name)


def _unquote(text: str) -> str:
    if "%" not in text:
        return text
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%":
            raw += bytes.fromhex(text[i + 1 : i + 3])  # ValueError on a bad escape: the caller's corrupt
            i += 3
        else:
            raw += text[i].encode()
            i += 1
    return raw.decode("utf-8")


def _parse(text: str, boot_id: str) -> tuple[Memory, str]:
    lines = text.split("\n")
    if lines[0] not in _READS:
        if lines[0].startswith("stallprobe-state "):
            return Memory(), f"state file has unknown version {lines[0][17:27]!r}"
        return Memory(), "state file is not a stallprobe state"
    if len(lines) < 2 or not lines[1].startswith("boot_id "):
        return Memory(), "state file has no boot id"
    if lines[1][8:] != boot_id:
        return Memory(), "state file is from another boot"
    engines: dict[str, dict[str, object]] = {}
    signals: dict[str, dict[str, float]] = {}
    facts: dict[str, float] = {}
    said: dict[str, str] = {}
    dialect = ""
    name = None
    try:
        for line in lines[2:]:
            if not line:
                continue
            key, _, value = line.partition(" ")
            if key == "engine":
                name = _unquote(value)
                engines.setdefault(name, {})
                signals.setdefault(name, {})
            elif key == "fact" and name is None:
                fact, _, number = value.partition(" ")
                facts[_unquote(fact)] = float(number)
            elif key == "said" and name is None:
                kind, _, klass = value.partition(" ")
                said[_unquote(kind)] = _unquote(klass)
            elif key == "dialect" and name is None:
                dialect = _unquote(value)
            elif name is None:
                return Memory(), "state file has a field outside an engine"
            elif key == "signal":
                signal, _, number = value.partition(" ")
                signals[name][_unquote(signal)] = float(number)
            elif key in _NUMBERS:
                engines[name][key] = float(value)
            elif key in _TIMES or key in _COUNTS:
                engines[name][key] = None if value == "none" else float(value)
            elif key == "mark":
                numbers = [None if word == "none" else float(word) for word in value.split(" ")]
                if len(numbers) != len(_MARK) or None in numbers[:3]:
                    raise ValueError(value)
                engines[name][key] = {"running": 0.0, "waiting": 0.0, **dict(zip(_MARK, numbers))}
            elif key == "answered" and value in ("0", "1"):
                engines[name][key] = value == "1"
            elif key == "paused":
                engines[name][key] = _unquote(value)
            else:
                return Memory(), f"state file has an unknown field {key[:40]!r}"
    except ValueError:
        return Memory(), f"state file has a bad line {line[:60]!r}"
    try:
        states = {key: State.from_dict({**data, "signals": signals[key]}) for key, data in engines.items()}
    except ValueError as exc:
        return Memory(), f"state file is invalid ({exc})"
    return Memory(states or None, dialect=dialect, facts=facts, said=said), ""


def load(path: str, boot_id: str) -> tuple[Memory, str]:
    """What the last run remembered (an empty Memory when nothing), and why nothing is ("" for a first
    run). Bad content is not an error; a file that exists but cannot be read is (StateFileError)."""
    try:
        fd = _os.open(path, _os.O_RDONLY | getattr(_os, "O_NOFOLLOW", 0) | getattr(_os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return Memory(), ""
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Memory(), "state file is a symlink (not followed)"
        raise StateFileError(f"state file {path} cannot be read: {exc.strerror}; {_HINT}") from None
    try:
        with open(fd, "rb") as f:
            kind = _os.fstat(f.fileno()).st_mode & _S_IFMT
            if kind == _S_IFDIR:
                raise IsADirectoryError(errno.EISDIR, _os.strerror(errno.EISDIR))
            if kind != _S_IFREG:  # a FIFO or a device planted at the path: never read from it
                return Memory(), "state file is not a regular file"
            data = f.read(_MAX_SIZE + 1)
    except OSError as exc:
        raise StateFileError(f"state file {path} cannot be read: {exc.strerror}; {_HINT}") from None
    if len(data) > _MAX_SIZE:
        return Memory(), "state file is too large to be a stallprobe state"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Memory(), "state file is not text"
    return _parse(text, boot_id)


def _render(memory: Memory, boot_id: str) -> bytes:
    lines = [FORMAT, f"boot_id {boot_id}"]
    if memory.dialect:
        lines.append(f"dialect {_quote(memory.dialect)}")
    lines.extend(f"said {_quote(kind)} {_quote(klass)}" for kind, klass in memory.said.items())
    # repr() of a float reads back to the same float, so a round trip never moves a counter.
    lines.extend(f"fact {_quote(key)} {value!r}" for key, value in memory.facts.items())
    for name, state in (memory.states or {}).items():
        lines.append(f"engine {_quote(name)}")
        last = state.last
        lines.extend(f"{key} {getattr(last, key)!r}" for key in _NUMBERS)
        for key in _TIMES:
            value = getattr(state, key)
            lines.append(f"{key} {'none' if value is None else repr(value)}")
        for key in _COUNTS:
            count = getattr(last, key)
            if count is not None:
                lines.append(f"{key} {count!r}")
        if state.mark is not None:
            words = ("none" if getattr(state.mark, key) is None else repr(getattr(state.mark, key)) for key in _MARK)
            lines.append("mark " + " ".join(words))
        lines.append(f"answered {int(last.answered)}")
        if last.paused:
            lines.append(f"paused {_quote(last.paused)}")
        lines.extend(f"signal {_quote(key)} {value!r}" for key, value in last.signals.items())
    return ("\n".join(lines) + "\n").encode("utf-8")


def save(path: str, memory: Memory, boot_id: str) -> None:
    """Write what is remembered (each engine's state, the page's dialect, facts and what was said)
    atomically; StateFileError when the folder is read-only, full or missing."""
    try:
        kind = _os.lstat(path).st_mode & _S_IFMT
    except OSError:
        kind = _S_IFREG  # nothing there yet (or nothing we may look at: the write below says so)
    if kind in _DEVICES:
        # --state-file /dev/null: replacing it would replace the machine's device node itself, for every
        # process on it. (A FIFO or a socket planted in a shared /tmp is replaced, as a stale file is.)
        raise StateFileError(f"state file {path} is a device, not a file; point --state-file at a file")
    folder, name = _split(path)
    tmp = _join(folder, f".{name}.{_os.getpid()}.{_os.urandom(4).hex()}.tmp")
    flags = _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL | getattr(_os, "O_NOFOLLOW", 0)
    try:
        fd = _os.open(tmp, flags, 0o600)
        try:
            with open(fd, "wb") as f:
                f.write(_render(memory, boot_id))
            # rename() replaces a symlink planted at `path` instead of writing through it.
            _os.replace(tmp, path)
        except BaseException:
            try:
                _os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise StateFileError(f"state file {path} cannot be written: {exc.strerror}; {_HINT}") from None


class Locked:
    """`with Locked(path):` holds an exclusive lock on `path`.lock, so that two probes sharing one state
    file (liveness and readiness) never interleave a read and a write: the one that saves second sees
    what the first saved. A POSIX record lock (lockf, in posix: no fcntl import), released by the
    kernel when the process ends. Where the lock file cannot be made (a read-only folder fails the save
    anyway; a symlink planted at its path), the run goes on unlocked rather than not at all.
    """

    __slots__ = ("fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path + ".lock"
        self.fd = -1

    def __enter__(self) -> Locked:
        try:
            self.fd = _os.open(self.path, _os.O_RDWR | _os.O_CREAT | getattr(_os, "O_NOFOLLOW", 0), 0o600)
            _os.lockf(self.fd, _os.F_LOCK, 0)
        except OSError:
            self._close()
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            try:
                _os.close(self.fd)  # closing the file releases its lock
            except OSError:
                pass
            self.fd = -1
