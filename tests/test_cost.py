"""The probe's cost stays low: modules taken off the hot path stay off it (checked in a fresh interpreter).

Timing is not asserted here (a shared machine makes any time a flake); scripts/bench measures it. What
cannot flake is which modules a run loads: each one below cost measurable CPU on every probe run.
"""

from __future__ import annotations

import json
import subprocess
import sys

from pytest_httpserver import HTTPServer

from conftest import REPO, vllm_page

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
}

SCRIPT = """
import sys
sys.path.insert(0, {src!r})
before = set(sys.modules)
{body}
loaded = sorted(set(sys.modules) - before)
sys.stdout.write("\\nMODULES " + " ".join(loaded) + "\\n")
"""


def loaded_by(body: str) -> tuple[str, set[str]]:
    """Run `body` in a fresh interpreter without site (-S); what it printed and the modules it loaded."""
    code = SCRIPT.format(src=str(REPO / "src"), body=body)
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert result.stderr == ""
    out, _, modules = result.stdout.rpartition("\nMODULES ")
    return out, set(modules.split())


def test_importing_the_package_loads_only_the_detector() -> None:
    _, modules = loaded_by("import stallprobe")
    assert not modules & OFF_THE_HOT_PATH
    assert "socket" not in modules
    assert "math" not in modules  # (a probe run loads it anyway: selectors, under socket, imports it)
    assert {m for m in modules if m.startswith("stallprobe")} == {
        "stallprobe",
        "stallprobe.detector",
        "stallprobe.errors",
    }


def test_a_whole_probe_run_stays_off_the_slow_modules(httpserver: HTTPServer, tmp_path: object) -> None:
    httpserver.expect_request("/metrics").respond_with_data(vllm_page(3, 10, 20), content_type="text/plain")
    state = f"{tmp_path}/probe.state"
    args = ["--url", httpserver.url_for("/metrics"), "--state-file", state]
    body = f"from stallprobe.cli import main\nmain({args!r})\nmain({args!r})"
    out, modules = loaded_by(body)
    assert out.splitlines()[0].startswith("baseline: 3 running")
    assert out.splitlines()[1].startswith("suspect: 3 running")
    assert sorted(modules & OFF_THE_HOT_PATH) == []
    assert "socket" in modules  # the run really scraped


def test_json_output_is_the_one_path_that_loads_json(httpserver: HTTPServer, tmp_path: object) -> None:
    httpserver.expect_request("/metrics").respond_with_data(vllm_page(3, 10, 20), content_type="text/plain")
    args = ["--url", httpserver.url_for("/metrics"), "--state-file", f"{tmp_path}/probe.state", "--json"]
    out, modules = loaded_by(f"from stallprobe.cli import main\nmain({args!r})")
    assert json.loads(out)["verdict"] == "baseline"
    assert "json" in modules
