"""The probe's cost stays low: modules taken off the hot path stay off it (checked in a fresh interpreter,
run as the pod runs it: `-I -S`, no runpy).

Timing is not asserted here (a shared machine makes any time a flake); scripts/bench measures it. What
cannot flake is which modules a run loads: each one below cost measurable CPU on every probe run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, vllm_page
from stallprobe.pyz import HOT, SOMETIMES
from stubengine import StubEngine

# Each pulls in at least `re` or a chain of modules: several milliseconds a run, every ~10 s, every pod.
OFF_THE_HOT_PATH = {
    "argparse",  # flags are parsed by hand
    "json",  # the state file is `key value` lines; json only for --json output
    "re",  # nothing on the path needs a regex
    "typing",  # annotations are postponed; typing-only imports sit behind TYPE_CHECKING
    "dataclasses",
    "tempfile",  # the state file's temporary is made with os.open(O_EXCL)
    "hashlib",
    "binascii",  # the state file's name uses FNV-1a
    "urllib",  # one GET on a plain socket
    "http",
    "email",
    "encodings.idna",  # ASCII hosts go to getaddrinfo as bytes
    "zlib",  # only for a server that compresses against the probe's Accept-Encoding
    "contextlib",
    "logging",
    "subprocess",
    "threading",
    "runpy",  # -m and running a zip go through it (docs/cost.md); the pod's command runs the launcher's file
    "enum",  # Verdict and ExitCode are plain classes: building Enum classes cost ~1-2 ms
    "socket",  # the C _socket is enough; socket turns its constants into enums (7-12 ms with enum)
    "selectors",
    "math",  # nothing on the path needs it (selectors, under socket, used to load it)
    "os",  # posix's system calls: os, with stat, posixpath and collections.abc, is ~1.3 ms under -S
    "stat",
    "collections",
    "functools",
    "shlex",  # watch's hook commands only
    "ruamel",  # inject's YAML (a dependency of the package, not of the probe: the pod's image has none)
}

SCRIPT = """
import sys
sys.path.insert(0, {src!r})
before = set(sys.modules)
{body}
loaded = sorted(set(sys.modules) - before)
sys.stdout.write("\\nMODULES " + " ".join(loaded) + "\\n")
"""


def loaded_by(body: str, *, site: bool = False) -> tuple[str, set[str]]:
    """Run `body` in a fresh interpreter as the pod runs the probe (-I -S); what it printed and the
    modules it loaded. `site`: with site-packages on the path (and so ruamel.yaml importable), as a
    probe run from a pip install would have them."""
    code = SCRIPT.format(src=str(REPO / "src"), body=body)
    result = subprocess.run(
        [sys.executable, "-I", *([] if site else ["-S"]), "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.stderr == ""
    out, _, modules = result.stdout.rpartition("\nMODULES ")
    return out, set(modules.split())


def test_importing_the_package_loads_only_the_detector() -> None:
    _, modules = loaded_by("import stallprobe")
    assert not modules & OFF_THE_HOT_PATH
    assert {m for m in modules if m.startswith("stallprobe")} == {
        "stallprobe",
        "stallprobe.detector",
        "stallprobe.errors",
    }


def test_a_whole_probe_run_stays_off_the_slow_modules(served: StubEngine, tmp_path: object) -> None:
    pages = iter([vllm_page(3, 10, 20), vllm_page(3, 12, 20)])
    served.route("/metrics", lambda: next(pages))
    state = f"{tmp_path}/probe.state"
    args = ["--url", served.url, "--state-file", state]
    body = f"from stallprobe.cli import main\nmain({args!r})\nmain({args!r})"
    out, modules = loaded_by(body)
    assert out.splitlines()[0].startswith("baseline: 3 running")
    assert out.splitlines()[1].startswith("progressing: 3 running")
    assert sorted(modules & OFF_THE_HOT_PATH) == []
    assert "_socket" in modules  # the run really scraped
    # The single-file build gives exactly these bytecode: what a run loads (and what only some runs load:
    # api, which a run that finds the engine looking stuck loads, the next test; pyz.SOMETIMES).
    sometimes = {f"stallprobe.{name}" for name in SOMETIMES}
    assert {m for m in modules if m.startswith("stallprobe")} | sometimes == {
        name.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for name in HOT
    }


def test_a_probe_run_never_loads_inject_or_ruamel(served: StubEngine, tmp_path: object) -> None:
    """ruamel.yaml is a dependency of the package (for inject), importable wherever stallprobe is
    pip-installed: a probe run, even one whose site-packages hold it, must not load it."""
    import ruamel.yaml  # noqa: F401 - it is installed here: the run below could load it

    served.route("/metrics", vllm_page(3, 10, 20))
    args = ["--url", served.url, "--state-file", f"{tmp_path}/probe.state"]
    out, modules = loaded_by(f"from stallprobe.cli import main\nmain({args!r})\nmain({args!r})", site=True)
    assert out.splitlines()[0].startswith("baseline: 3 running")
    assert not {m for m in modules if m.split(".")[0] == "ruamel" or m.startswith("stallprobe.inject")}


def test_a_suspect_run_asks_whether_the_engine_is_paused_and_nothing_more(served: StubEngine, tmp_path: object) -> None:
    """Only a run that would say suspect or stalled asks vLLM's /is_paused; a 404 needs no json."""
    served.route("/metrics", vllm_page(3, 10, 20))
    args = ["--url", served.url, "--state-file", f"{tmp_path}/probe.state"]
    out, modules = loaded_by(f"from stallprobe.cli import main\nmain({args!r})\nmain({args!r})")
    assert out.splitlines()[1].startswith("suspect: 3 running")
    assert "stallprobe.api" in modules
    assert sorted(modules & OFF_THE_HOT_PATH) == []


def test_without_the_c_socket_module_the_probe_uses_socket(served: StubEngine, tmp_path: object) -> None:
    """Where `_socket` cannot be imported directly, `socket` (which wraps it) still serves the probe."""
    served.route("/metrics", vllm_page(3, 10, 20))
    args = ["--url", served.url, "--state-file", f"{tmp_path}/probe.state"]
    body = (
        "import socket\nsys.modules['_socket'] = None\n"  # socket holds its own reference; a new import fails
        f"from stallprobe.cli import main\nmain({args!r})\nmain({args!r})\n"
        "import stallprobe.scrape\nprint('net', stallprobe.scrape.net.__name__)"
    )
    out, _ = loaded_by(body)
    assert out.splitlines()[0].startswith("baseline: 3 running")
    assert out.splitlines()[1].startswith("suspect: 3 running")
    assert out.splitlines()[2] == "net socket"


def test_with_the_c_socket_module_the_probe_uses_it() -> None:
    out, _ = loaded_by("import stallprobe.scrape\nprint(stallprobe.scrape.net.__name__)")
    assert out.strip() == "_socket"


def test_json_output_is_the_one_path_that_loads_json(served: StubEngine, tmp_path: object) -> None:
    served.route("/metrics", vllm_page(3, 10, 20))
    args = ["--url", served.url, "--state-file", f"{tmp_path}/probe.state", "--json"]
    out, modules = loaded_by(f"from stallprobe.cli import main\nmain({args!r})")
    assert json.loads(out)["verdict"] == "baseline"
    assert "json" in modules


def test_the_bench_runs_on_every_engine_s_page(tmp_path: object) -> None:
    """scripts/bench on SGLang's and llama.cpp's real pages (one round, no timing asserted): each probe row
    gave the verdict it claims (the bench exits 1 otherwise), and the naive probe read that engine's
    families (its line is checked against the probe's own reading of the page)."""
    real = REPO / "tests" / "fixtures" / "real"
    pages = [real / "sglang-docs-production-metrics-00b08c4.prom", real / "llamacpp-server-11434-local.prom"]
    command = [sys.executable, str(REPO / "scripts" / "bench"), "--rounds", "1", "--rss-rounds", "0", "--json"]
    command += ["--pyz", f"{tmp_path}/stallprobe.pyz"] + [arg for page in pages for arg in ("--page", str(page))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert sorted(result["pages"]) == sorted(str(page) for page in pages)
    for page in result["pages"].values():
        probe = {"pod, inject: python -I -S /opt/stallprobe/probe", "pod, inject --ready", "pod, inject, looks stuck"}
        assert probe | {"naive: python -c urllib+re"} <= set(page["rows"])


@pytest.mark.parametrize(
    ("page", "verdicts"),
    [
        # SGLang's page has a deep queue: a moving page is saturated, a frozen one suspect.
        ("sglang-docs-production-metrics-00b08c4.prom", ({"saturated": 20}, {"suspect": 20})),
        # llama.cpp's page has nothing processing or deferred: idle, moving or not.
        ("llamacpp-server-11434-local.prom", ({"idle": 20}, {"idle": 20})),
    ],
)
def test_the_watch_bench_runs_on_every_engine_s_page(page: str, verdicts: tuple[dict[str, int], ...]) -> None:
    """scripts/bench-watch --page on other engines' pages (20 endpoints, one poll, no timing asserted): the
    counter that moves is the engine's own, and each pool's verdicts are what it claims (it exits 1
    otherwise, which a bench that moved vLLM's family on another engine's page would)."""
    path = REPO / "tests" / "fixtures" / "real" / page
    command = [sys.executable, str(REPO / "scripts" / "bench-watch"), "--sizes", "20", "--polls", "1", "--json"]
    command += ["--pools", "healthy,stuck", "--page", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert tuple(row["verdicts"] for row in rows) == verdicts
    assert all(row["as_claimed"] for row in rows)
