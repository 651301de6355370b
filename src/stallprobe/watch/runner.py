"""Running the hooks: the thin impure part around the rules in hooks.py.

A hook runs in the background, in a thread of its own that starts it, waits for it (at most
--hook-timeout) and reaps it, so a hook that hangs never stops the watch. It gets its own session: Ctrl-C
on the watch does not reach it, and on a timeout its whole process group (a shell and what it started) is
killed together. Its output is kept only to show the last line of a failed run. What the runs did is
put into words here too, for the notes the hook rules give each row.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from ..report import duration, num
from .hooks import HOOK_FLAGS, Held, Waits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .hooks import Ran

__all__ = ["Runner", "hook_note"]

# After SIGTERM, how long a hook's process group has before SIGKILL.
KILL_GRACE = 5.0
# How long a start waits for the hook's process to exist (fork and exec take milliseconds), so that the
# poll that started it can name its pid.
_SPAWN_WAIT = 5.0
# How much of a failed run's output is read back for its last line.
_TAIL_BYTES = 4096


def hook_note(note: Ran | Waits | Held, pid: int | None, status: str | None, now: float) -> str:
    """A note of the hook rules (hooks.consider) in words. `pid` and `status` are what the runner says of
    the run the note is about (Runner.report): its pid (None if it never started) and how it ended (None
    while it runs)."""
    if isinstance(note, Held):
        return f"{HOOK_FLAGS[note.kind]} held by --cooldown, {duration(note.left)} left"
    flag = HOOK_FLAGS[note.run[0]]
    which = "" if pid is None else f" (pid {pid})"
    if isinstance(note, Waits):
        return f"{flag} waits for its previous run{which} to end"
    if status is None:
        return f"{flag}{which} running for {duration(now - note.started)}"
    return f"{flag}{which} ran {duration(now - note.started)} ago: {status}"


class _Run:
    """One run of a hook: its pid once it has one, its status (None while it runs)."""

    __slots__ = ("pid", "spawned", "status", "thread")

    def __init__(self) -> None:
        self.pid: int | None = None
        self.status: str | None = None
        self.thread: threading.Thread | None = None
        self.spawned = threading.Event()  # set once it has a pid, or could not start


class Runner:
    """Starts the hooks the rules ask for, and reports on the latest run of each hook per endpoint."""

    def __init__(self, commands: Mapping[str, Sequence[str]], timeout: float, environ: Mapping[str, str]) -> None:
        self.commands = {kind: tuple(argv) for kind, argv in commands.items() if argv}  # kind -> argv
        self.timeout = timeout
        self.environ = dict(environ)
        self.runs: dict[tuple[str, str], _Run] = {}  # (kind, url) -> the latest run

    def start(self, kind: str, url: str, engine: str, message: str) -> None:
        """Start the `kind` hook for an engine (`engine`: "" when its page has one) of `url`."""
        env = dict(self.environ)
        env.update(STALLPROBE_URL=url, STALLPROBE_ENGINE=engine, STALLPROBE_VERDICT=kind, STALLPROBE_MESSAGE=message)
        run = self.runs[(kind, url)] = _Run()
        run.thread = threading.Thread(target=self._hook, args=(run, self.commands[kind], env), daemon=True)
        run.thread.start()
        run.spawned.wait(_SPAWN_WAIT)

    def running(self) -> frozenset[tuple[str, str]]:
        """The (kind, url) whose latest run still runs."""
        return frozenset(key for key, run in self.runs.items() if run.status is None)

    def tell(self, note: Ran | Waits | Held, now: float) -> str:
        """A note of the hook rules in words, with what this runner knows of the run it is about."""
        return hook_note(note, *self.report(note.run), now)

    def report(self, key: tuple[str, str] | None) -> tuple[int | None, str | None]:
        """The latest run of a hook (kind) for an endpoint (url): its pid, and how it ended (None while it
        runs). (None, None) when there is none."""
        run = self.runs.get(key) if key is not None else None
        return (None, None) if run is None else (run.pid, run.status)

    def wait(self) -> None:
        """Wait for the runs still running, at most as long as one takes to time out and be killed."""
        deadline = time.monotonic() + self.timeout + 2 * KILL_GRACE + 1
        for run in self.runs.values():
            if run.thread is not None:
                run.thread.join(max(0.0, deadline - time.monotonic()))

    def _hook(self, run: _Run, argv: Sequence[str], env: Mapping[str, str]) -> None:
        """One hook, start to end, in the background: started, waited for (bounded), reaped."""
        try:
            self._hook_run(run, argv, env)
        except Exception as exc:  # (no room for its output file, say): never leave a run "running" forever
            run.status = run.status or f"could not run: {exc}"
        finally:
            run.spawned.set()

    def _hook_run(self, run: _Run, argv: Sequence[str], env: Mapping[str, str]) -> None:
        import tempfile  # only when a hook runs

        with tempfile.TemporaryFile() as output:
            try:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                run.status = f"could not start: {exc.strerror or exc}"
                return
            run.pid = proc.pid
            run.spawned.set()
            try:
                code = proc.wait(self.timeout)
                status = (
                    "exited 0" if code == 0 else f"failed with exit {code}" if code > 0 else f"killed by signal {-code}"
                )
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                code = -1
                status = f"killed after {num(self.timeout)} s (--hook-timeout)"
            if code != 0:
                # The last line of its output says why, as far as anything does.
                output.seek(max(0, output.seek(0, os.SEEK_END) - _TAIL_BYTES))
                lines = output.read().decode("utf-8", "replace").strip().splitlines()
                if lines:
                    status += f": {lines[-1].strip()[:200]}"
            run.status = status


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the hook's process group, a grace, then SIGKILL to whatever of the group is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already
        try:
            proc.wait(KILL_GRACE)
        except subprocess.TimeoutExpired:
            pass  # (after SIGKILL: a process stuck in the kernel; the reaper gives up on it)
