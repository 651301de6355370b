"""The error contract of every command, held as tables.

The contract: the exit code is one the command documents (errors.EXIT_TABLE), and never 1 (which means
"stalled" and nothing else); no traceback, ever; and when the command fails, nothing on stdout and exactly
one line on stderr that says why.

COMMANDS holds one row per command: its name, the codes that are results rather than failures, the
prefix of its error line, and a Hypothesis strategy that generates its runs (arguments, stdin, whether
stdout is closed). One property checks every row's generated runs against the contract. Below it, each
command's table of bad inputs pins the exact code and message of each case.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import REPO, clean_env
from stallprobe import pyz
from stallprobe.cli import main
from stallprobe.errors import EXIT_TABLE, ExitCode, exit_lines
from stallprobe.inject.command import help_text
from stallprobe.inject.manifests import MAX_BYTES, MAX_DEPTH, MAX_NODES
from stallprobe.options import DOCTOR, INJECT, PROBE, WATCH

MANIFESTS = REPO / "tests" / "fixtures" / "manifests"
REAL = sorted(MANIFESTS.glob("*.yaml"))
FUZZ_EXAMPLES = int(os.environ.get("STALLPROBE_FUZZ_EXAMPLES") or 0)


# --- running a command in this process, its streams captured


class ClosedPipe(io.TextIOBase):
    """A stdout whose reader has gone away: every write fails as a closed pipe's does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def writable(self) -> bool:
        return True


@dataclass
class Run:
    code: int
    out: str
    err: str


class Terminal(io.TextIOWrapper):
    def isatty(self) -> bool:
        return True


def run(argv: list[str], stdin: bytes = b"", *, closed: bool = False, tty: bool = False) -> Run:
    """cli.main(argv) with stdin holding `stdin` (a terminal when `tty`), stdout and stderr captured."""
    saved = sys.stdin, sys.stdout, sys.stderr
    out, err = io.StringIO(), io.StringIO()
    sys.stdin = (Terminal if tty else io.TextIOWrapper)(io.BytesIO(stdin), encoding="utf-8")
    sys.stdout = ClosedPipe() if closed else out
    sys.stderr = err
    try:
        code = main(argv, environ={})
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return Run(code, out.getvalue(), err.getvalue())


# --- the commands, each a row


@dataclass
class Command:
    name: str
    results: frozenset[int]  # codes that answer the question asked (their output is on stdout)
    prefix: str  # how its error line starts
    runs: st.SearchStrategy[tuple[list[str], bytes, bool]]  # (arguments, stdin, stdout closed)
    # Where its error line goes: inject's stdout is the manifests, so stderr; the probe's and watch's is
    # what the kubelet (or a person) reads, so stdout, and stderr stays empty.
    errors_to: str = "err"
    # The words a result line that says "stalled" starts with (exit 1 means that and nothing else).
    stalled: tuple[str, ...] = ()

    def check(self, result: Run, *, closed: bool = False) -> None:
        assert self.name in EXIT_TABLE.get(result.code, {}), result
        assert "Traceback" not in result.out + result.err, result
        if result.code == ExitCode.STALLED:
            assert self.stalled, result  # a command that never judges an engine never says "stalled"
            assert any(line.startswith(self.stalled) or '"stalled"' in line for line in result.out.splitlines())
        if result.code not in self.results:
            # With stdout closed, a line meant for it goes to stderr: someone may still read that.
            to_err = self.errors_to == "err" or closed
            line, other = (result.err, result.out) if to_err else (result.out, result.err)
            assert other == "", result
            assert line.endswith("\n"), result
            assert line.count("\n") == 1, result
            assert line.startswith(self.prefix) or (self.errors_to == "out" and line.startswith('{"error"')), result


def _mutated(text: str, at: int, cut: int, insert: str) -> str:
    at %= len(text) + 1
    return text[:at] + insert + text[at + cut :]


def _yaml_values() -> st.SearchStrategy[object]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )


def _dumped(value: object, form: str) -> bytes:
    import yaml

    text = json.dumps(value) if form == "json" else yaml.safe_dump(value, allow_unicode=True)
    return text.encode()


def _inject_inputs() -> st.SearchStrategy[bytes]:
    texts = [path.read_text() for path in REAL]
    real = st.sampled_from(texts)
    return st.one_of(
        st.binary(max_size=300),
        st.builds(_dumped, _yaml_values(), st.sampled_from(["yaml", "json"])),
        real.map(str.encode),
        st.builds(_mutated, real, st.integers(0, 10_000), st.integers(0, 300), st.text(max_size=30)).map(str.encode),
        st.sampled_from(list(BAD_INPUTS.values())),
    )


# Values for the flags: some each flag takes, and a spread of what none takes.
BAD_VALUES = ["", "0", "-1", "99999.5", "70000", "abc", "nan", "inf", "1e999", "9" * 5000, "a\nb", "caf\u00e9"]
GOOD_VALUES = ["8000", "30", "vllm", "sglang", "auto", "yaml", "json", "probe", "vllm:num_requests_running"]
PATHS = [os.devnull, "/nonexistent", "/", "/dev/zero", "/proc/self/mem", str(MANIFESTS), *map(str, REAL[:3])]
PYTHONS = ["/nonexistent/python", "/bin/false", "/bin/true", "/bin/cat", "a\x00b"]


# Flags a run may well be given, each with a value it takes.
GOOD_TOKENS = [
    ["--window", "300"],
    ["--engine", "vllm"],
    ["--engine", "sglang"],
    ["--drain-after", "30"],
    ["--check"],
    ["--force"],
    ["--state-volume"],
    ["--configmap", "probe"],
    ["--period", "15"],
    ["--container", "vllm-leader"],
    ["--canary"],
    ["--startup-budget", "600"],
    ["--no-ready"],
    ["--report-only"],
]


def _inject_arguments() -> st.SearchStrategy[list[str]]:
    flags = [option.flag for option in INJECT if option.flag not in ("--python", "--filename", "--pyz")]
    value = st.one_of(st.sampled_from(BAD_VALUES + GOOD_VALUES), st.text(max_size=10))
    token = st.one_of(
        st.tuples(st.sampled_from(flags), value).map(list),
        st.sampled_from(flags).map(lambda flag: [flag]),
        st.tuples(st.sampled_from(["-f", "--filename", "--pyz"]), st.sampled_from(PATHS)).map(list),
        st.tuples(st.just("--python"), st.sampled_from(PYTHONS)).map(list),
        st.sampled_from([["--nope"], ["-x"], ["--check=1"], ["junk"], ["-"], ["--print-probe", "--engine", "vllm"]]),
    )
    good = st.lists(st.sampled_from(GOOD_TOKENS), max_size=3, unique_by=lambda words: words[0])
    noisy = st.lists(token, min_size=1, max_size=3)
    fast = st.sampled_from([["--pyz", os.devnull], ["--pyz", os.devnull], ["--pyz", os.devnull], []])
    return st.tuples(fast, st.one_of(good, good, noisy)).map(
        lambda both: both[0] + [word for words in both[1] for word in words]
    )


# The bad inputs of the table below, also thrown into the generated runs.
BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(9)
)
BAD_INPUTS = {
    "nested [": b"[" * 10_000,
    "nested -": b"- " * 10_000 + b"x\n",
    "nested mappings": b"".join(b"  " * i + b"a:\n" for i in range(500)),
    "billion laughs": BILLION_LAUGHS.encode(),
    "recursive alias": b"a: &r [*r]\n",
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    "latin-1": "metadata:\n  name: caf\u00e9\n".encode("latin-1"),
    "NUL": b"kind: Pod\nmetadata: {name: a\x00}\n",
    "broken JSON": b'{"kind": "Pod", "metadata": ',
    "a scalar": b"hello\n",
    "a list": b"- a\n- b\n",
    "JSON numbers": b"[1, 2]",
    "ResourceList without items": b"apiVersion: config.kubernetes.io/v1\nkind: ResourceList\n",
    "ResourceList with items not a list": b"kind: ResourceList\nitems: {a: 1}\n",
    "duplicate keys": b"kind: Pod\nmetadata: {name: a}\nkind: Service\n",
    "duplicate JSON keys": b'{"kind": "Pod", "kind": "Service"}',
    "4300 digits": b"kind: Pod\nspec: {replicas: " + b"9" * 5000 + b"}\n",
}

INJECT_ROW = Command(
    "inject",
    results=frozenset({ExitCode.OK, ExitCode.CHANGES}),
    prefix="stallprobe inject: ",
    runs=st.tuples(_inject_arguments(), _inject_inputs(), st.booleans()),
)


# --- the probe and watch: an engine on loopback that answers each path its own way

PAGE = (REPO / "tests" / "fixtures" / "real" / "vllm-0.32.0-cpu-busy.prom").read_bytes()
# path -> (status, body, seconds held first)
ANSWERS: dict[str, tuple[int, bytes, float]] = {
    "/good/metrics": (200, PAGE, 0.0),
    "/html/metrics": (200, b"<!doctype html><html><body>sign in</body></html>", 0.0),
    "/garbage/metrics": (200, bytes(range(256)) * 4, 0.0),
    "/empty/metrics": (200, b"", 0.0),
    "/half/metrics": (200, PAGE[: len(PAGE) // 2], 0.0),
    "/nan/metrics": (
        200,
        PAGE.replace(
            b'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 4.0',
            b'vllm:num_requests_running{engine="0",model_name="tiny-llama"} NaN',
        ),
        0.0,
    ),
    "/slow/metrics": (200, PAGE, 2.0),
    "/gone/metrics": (404, b"not found", 0.0),
    "/locked/metrics": (401, b'{"error": "Unauthorized"}', 0.0),
    "/broken/metrics": (500, b"boom", 0.0),
}


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """What a generated run's {placeholders} stand for: each kind of engine's URL, and state files."""
    import socket

    from stubengine import StubEngine

    server = StubEngine()  # the suite's one stub engine, each path answering its own way
    server.routes.clear()
    for path, (status, body, hold) in ANSWERS.items():
        server.route(path, body, status, delay=hold)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{free.getsockname()[1]}/metrics"
    where = tmp_path_factory.mktemp("probe-contract")
    (where / "folder").mkdir()
    os.mkfifo(where / "fifo")
    os.mknod(where / "device", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a twin of /dev/null (root, as CI)
    (where / "corrupt.state").write_bytes(CORRUPT)
    base = server.base
    found = {name.split("/")[1]: base + name for name in ANSWERS}
    found.update(
        refused=refused,
        state=str(where / "probe.state"),
        folder=str(where / "folder"),
        corrupt=str(where / "corrupt.state"),
        fifo=str(where / "fifo"),
        device=str(where / "device"),
        missing=str(where / "no" / "such" / "folder" / "probe.state"),
    )
    yield found
    server.close()


CORRUPT = b"stallprobe-state 3\nboot_id x\n\xff\xfe garbage\n"
ENGINES = ["{" + name.split("/")[1] + "}" for name in ANSWERS] + ["{refused}"]
# Never /dev/null itself: a probe that wrongly replaced it would break the machine, not just the test.
STATES = ["{state}", "{folder}", "{corrupt}", "{missing}", "{fifo}", "{device}"]


def _engine_runs(flags: list[str], *, url_flag: str) -> st.SearchStrategy[list[str]]:
    """Arguments for a command that looks at an engine: its URL and flags, good values and bad."""
    value = st.one_of(st.sampled_from(BAD_VALUES + GOOD_VALUES + ["0.3", "always", "never"]), st.text(max_size=10))
    token = st.one_of(
        st.tuples(st.sampled_from(flags), value).map(list),
        st.sampled_from(flags).map(lambda flag: [flag]),
        st.sampled_from([["--nope"], ["-x"], ["--json=1"], ["junk"], ["--include-waiting=often"], ["--help"]]),
    )
    url = st.sampled_from(ENGINES).map(lambda place: [place] if not url_flag else [url_flag, place])
    return st.tuples(url, st.lists(token, max_size=3)).map(lambda both: both[0] + [w for ws in both[1] for w in ws])


# Flags that name a file the run writes or reads are left out of the generated runs (their own tests give
# them paths under a test's folder): a generated word there would write a file wherever the suite runs.
FILE_FLAGS = ("--url", "--state-file", "--timeout", "--api-key-file", "--termination-log", "--transition-log")
PROBE_FLAGS = [o.flag for o in PROBE if o.flag not in (*FILE_FLAGS, "--report-only-file")]
PROBE_ROW = Command(
    "probe",
    results=frozenset({ExitCode.OK, ExitCode.STALLED}),
    prefix="error: ",
    runs=st.tuples(
        st.tuples(
            _engine_runs(PROBE_FLAGS, url_flag="--url"), st.sampled_from(STATES), st.sampled_from(["0.3", "1"])
        ).map(lambda parts: [*parts[0], "--state-file", parts[1], "--timeout", parts[2]]),
        st.just(b""),
        st.booleans(),
    ),
    errors_to="out",
    stalled=("stalled:", "not ready:"),
)
WATCH_FLAGS = [o.flag for o in WATCH if o.flag not in ("--listen", "--interval", "--timeout", "--on-stalled")]
WATCH_FLAGS = [flag for flag in WATCH_FLAGS if flag not in ("--on-saturated", "--hook-timeout", "--once")]
WATCH_ROW = Command(
    "watch",
    # --once answers with the worst verdict's code: alive, stalled, not scraped, not a page.
    results=frozenset({ExitCode.OK, ExitCode.STALLED, ExitCode.SCRAPE, ExitCode.METRICS}),
    prefix="error: ",
    runs=st.tuples(
        _engine_runs(WATCH_FLAGS, url_flag="").map(
            lambda words: ["--once", "--interval", "0.05", "--timeout", "0.3", *words]
        ),
        st.just(b""),
        st.booleans(),
    ),
    errors_to="out",
    stalled=("http://",),
)
DOCTOR_FLAGS = [o.flag for o in DOCTOR if o.flag not in ("--url", "--seconds", "--timeout", "--api-key-file")]
DOCTOR_ROW = Command(
    "doctor",
    # 0 fit, 1 stalled now (a report either way), 3 and 4 the engine's own failures: a report too, on
    # stdout, for the person at the terminal.
    results=frozenset({ExitCode.OK, ExitCode.STALLED, ExitCode.SCRAPE, ExitCode.METRICS}),
    prefix="error: ",
    runs=st.tuples(
        _engine_runs(DOCTOR_FLAGS, url_flag="--url").map(
            lambda words: [*words, "--seconds", "0.2", "--timeout", "0.3"]
        ),
        st.just(b""),
        st.booleans(),
    ),
    errors_to="out",
    stalled=("stallprobe doctor:", "engine:"),
)
COMMANDS = [INJECT_ROW, PROBE_ROW, WATCH_ROW, DOCTOR_ROW]


@pytest.mark.parametrize("command", COMMANDS, ids=[command.name for command in COMMANDS])
def test_every_code_a_command_can_give_is_documented(command: Command) -> None:
    codes = [code for code, meanings in EXIT_TABLE.items() if command.name in meanings]
    assert ExitCode.STALLED not in codes or command.name in ("probe", "watch", "doctor")
    assert command.results <= set(codes)


@pytest.mark.parametrize("command", COMMANDS, ids=[command.name for command in COMMANDS])
def test_the_contract_holds_for_generated_runs(command: Command, places: dict[str, str]) -> None:
    @settings(
        derandomize=not FUZZ_EXAMPLES,
        database=None,
        deadline=None,
        max_examples=max(200, FUZZ_EXAMPLES),
        print_blob=bool(FUZZ_EXAMPLES),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(command.runs)
    def holds(generated: tuple[list[str], bytes, bool]) -> None:
        argv, stdin, closed = generated
        argv = [word.format(**places) if word.startswith("{") else word for word in argv]
        result = run([command.name, *argv] if command.name != "probe" else argv, stdin, closed=closed)
        event(f"exit {result.code}")
        command.check(result, closed=closed)

    holds()


# --- inject's table: each bad input, its code and its line


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Files the table points at: a manifest, a folder, an interpreter that hangs (and leaves a child)."""
    where = tmp_path_factory.mktemp("contract")
    hang = where / "python-that-hangs"
    hang.write_text("#!/bin/sh\nsleep 30 &\nsleep 30\n")
    hang.chmod(0o755)
    return {"dir": str(where), "hang": str(hang), "manifest": str(MANIFESTS / "lws-vllm-gpu-0e2e095.yaml")}


DEPLOY = (MANIFESTS / "lws-vllm-gpu-0e2e095.yaml").read_bytes()
PRINT = ["--print-probe", "--engine", "vllm", "--port"]
PORT = "--port must be a port number, 1-65535 (got {!r})"
NOT_OBJECT = "document 1 is {}, not a Kubernetes object (a mapping with apiVersion and kind)"
BIG = f"the input is larger than {MAX_BYTES // (1024 * 1024)} MiB, which is no manifest"
DEEP = f"the input nests deeper than {MAX_DEPTH} levels, which is no manifest"
# (name, arguments (inject's; {key} names one of `files`), stdin, code, the whole error line or "")
INJECT_CASES: list[tuple[str, list[str], bytes, int, str]] = [
    ("port 99999.5", [*PRINT, "99999.5"], b"", 2, PORT.format("99999.5")),
    ("port 70000", [*PRINT, "70000"], b"", 2, PORT.format("70000")),
    ("port 0", [*PRINT, "0"], b"", 2, PORT.format("0")),
    ("port -1", [*PRINT, "-1"], b"", 2, PORT.format("-1")),
    ("port abc", [*PRINT, "abc"], b"", 2, PORT.format("abc")),
    ("port 65535", [*PRINT, "65535", "--pyz", os.devnull], b"", 0, ""),
    # The image's interpreter, which this machine need not have: the archive goes without its bytecode.
    (
        "--python missing",
        ["--python", "/nonexistent/python"],
        DEPLOY,
        0,
        "--python /nonexistent/python: No such file or directory here: the archive ships without bytecode for it "
        "(the probe then reads its sources, ~10 ms more CPU a run); the pods' probes run /nonexistent/python",
    ),
    (
        "--python fails",
        ["--python", "/bin/false"],
        DEPLOY,
        2,
        "--python /bin/false could not compile the probe: exit status 1",
    ),
    (
        "--python is no python",
        ["--python", "/bin/true"],
        DEPLOY,
        2,
        "--python /bin/true did not answer as a Python interpreter does",
    ),
    ("--python hangs", ["--python", "{hang}"], DEPLOY, 2, "--python {hang} did not compile the probe within 0.5 s"),
    ("nested 10,000 [", [], BAD_INPUTS["nested ["], 2, DEEP),
    ("nested 10,000 -", [], BAD_INPUTS["nested -"], 2, DEEP),
    ("nested 500 mappings", [], BAD_INPUTS["nested mappings"], 2, DEEP),
    ("JSON nested 100,000 deep", [], b'{"a": ' * 100_000, 2, DEEP),
    (
        "billion laughs",
        [],
        BAD_INPUTS["billion laughs"],
        2,
        f"the input's aliases expand to more than {MAX_NODES} nodes (a billion laughs?), which is no manifest",
    ),
    (
        "recursive alias",
        [],
        BAD_INPUTS["recursive alias"],
        2,
        "the input holds an alias inside its own anchor, a structure without end",
    ),
    ("binary", [], BAD_INPUTS["binary"], 2, "the input is not UTF-8 text (byte 0x89 at offset 0)"),
    ("latin-1", [], BAD_INPUTS["latin-1"], 2, "the input is not UTF-8 text (byte 0xe9 at offset 21)"),
    (
        "NUL",
        [],
        BAD_INPUTS["NUL"],
        2,
        "the input is not valid YAML: unacceptable character #x0000: special characters are not allowed",
    ),
    ("huge single line", [], b"a: " + b"x" * MAX_BYTES + b"\n", 2, BIG),
    (
        "broken JSON",
        [],
        BAD_INPUTS["broken JSON"],
        2,
        "the input is not valid JSON: Expecting value: line 1 column 29 (char 28)",
    ),
    ("a scalar", [], BAD_INPUTS["a scalar"], 2, NOT_OBJECT.format("a string")),
    ("a list", [], BAD_INPUTS["a list"], 2, NOT_OBJECT.format("a list")),
    ("JSON numbers", [], BAD_INPUTS["JSON numbers"], 2, NOT_OBJECT.format("a number")),
    (
        "ResourceList without items",
        [],
        BAD_INPUTS["ResourceList without items"],
        2,
        "the ResourceList has no items list (a KRM function gets its resources there)",
    ),
    (
        "duplicate keys",
        [],
        BAD_INPUTS["duplicate keys"],
        2,
        'the input is not valid YAML: found duplicate key "kind" with value "Service" (original value: "Pod") '
        "(line 3, column 1)",
    ),
    (
        "duplicate JSON keys",
        [],
        BAD_INPUTS["duplicate JSON keys"],
        2,
        "the input is not valid JSON: the key 'kind' is given twice in one object",
    ),
    (
        "a number of 5000 digits",
        [],
        BAD_INPUTS["4300 digits"],
        2,
        "the input is not valid YAML: Exceeds the limit (4300 digits) for integer string conversion: value has "
        "5000 digits",
    ),
    ("-f a folder", ["-f", "{dir}"], b"", 2, "-f {dir}: Is a directory"),
    ("-f unreadable", ["-f", "/proc/self/mem"], b"", 2, "-f /proc/self/mem: Input/output error"),
    ("-f missing", ["-f", "/nonexistent.yaml"], b"", 2, "-f /nonexistent.yaml: No such file or directory"),
    ("-f endless", ["-f", "/dev/zero"], b"", 2, BIG),
    (
        "--pyz endless",
        ["--pyz", "/dev/zero"],
        DEPLOY,
        2,
        "--pyz /dev/zero is larger than 1 MiB, more than a ConfigMap holds",
    ),
    (
        "--check with changes",
        ["--check"],
        DEPLOY,
        6,
        "leaderworkerset/vllm worker container vllm-worker: skipped: a LeaderWorkerSet worker: it joins the "
        "leader's engine and serves no HTTP",
    ),
    (
        "--no-ready and --drain-after",
        ["--no-ready", "--drain-after", "30"],
        DEPLOY,
        2,
        "--drain-after sets the readiness probe, which --no-ready leaves out: give one of them",
    ),
    ("unknown flag", ["--nope"], DEPLOY, 2, "unknown option '--nope'"),
    (
        "--period of 5000 digits",
        ["--period", "9" * 5000],
        DEPLOY,
        2,
        f"--period must be a whole number >= 1 (got {'9' * 200!r}...)",  # a line stays short
    ),
]


@pytest.mark.parametrize(
    ("argv", "stdin", "code", "line"), [case[1:] for case in INJECT_CASES], ids=[case[0] for case in INJECT_CASES]
)
def test_inject_answers_each_bad_input_with_its_code_and_one_line(
    argv: list[str], stdin: bytes, code: int, line: str, files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert INJECT_CASES
    monkeypatch.setattr(pyz, "COMPILE_TIMEOUT", 0.5)
    result = run(["inject", *(word.format(**files) for word in argv)], stdin)
    INJECT_ROW.check(result)
    assert result.code == code, result
    said = f"stallprobe inject: {line.format(**files)}"
    if code in INJECT_ROW.results:
        # It answered: a line of stderr is the row's (none at all for a row without one), and the
        # manifests (or the probe) went to stdout, but for --check, which writes none.
        assert (said in result.err.splitlines()) if line else (result.err == ""), result
        assert (result.out != "") is (code == ExitCode.OK), result
    else:  # an error: its one line, and nothing written
        assert (result.err, result.out) == (f"{said}\n", ""), result


# Not errors: an empty input (a chart whose every template is switched off renders nothing, and Helm still
# runs its post-renderer: failing there would fail the release) and a mapping that is no Kubernetes object
# pass through as they came, as every document inject has nothing to do with.
@pytest.mark.parametrize("stdin", [b"", b"# nothing here\n", b"a: 1\n"], ids=["empty", "only comments", "no kind"])
def test_inject_passes_through_what_it_has_nothing_to_do_with(stdin: bytes) -> None:
    result = run(["inject", "--pyz", os.devnull], stdin)
    INJECT_ROW.check(result)
    assert result == Run(
        ExitCode.OK,
        stdin.decode(),
        "stallprobe inject: no inference container found: nothing injected (--container NAME picks one)\n",
    )


def test_a_python_this_machine_lacks_is_the_pods_and_ships_no_bytecode() -> None:
    """--python names the image's interpreter: the pods' probes run it; where it cannot be run here, the
    archive is built without bytecode for it, and stderr says so first."""
    result = run(["inject", "--python", "/nonexistent/python"], DEPLOY)
    assert result.code == ExitCode.OK, result
    first = result.err.splitlines()[0]
    assert first == (
        "stallprobe inject: --python /nonexistent/python: No such file or directory here: the archive ships "
        "without bytecode for it (the probe then reads its sources, ~10 ms more CPU a run); the pods' probes run "
        "/nonexistent/python"
    )
    lws = next(doc for doc in yaml.safe_load_all(result.out) if doc["kind"] == "LeaderWorkerSet")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader["livenessProbe"]["exec"]["command"][:3] == ["/nonexistent/python", "-I", "-S"]


def test_inject_reads_no_terminal() -> None:
    result = run(["inject"], tty=True)
    assert (result.code, result.out) == (2, "")
    assert (
        result.err == "stallprobe inject: no manifests on stdin, which is a terminal: pipe them in, or give -f FILE\n"
    )


def test_a_closed_stdout_is_one_line_and_exit_7() -> None:
    result = run(["inject", "--pyz", os.devnull], DEPLOY, closed=True)
    assert (result.code, result.out) == (ExitCode.OUTPUT, "")
    assert result.err == CLOSED


def test_check_writes_nothing_and_says_what_would_change() -> None:
    result = run(["inject", "--pyz", os.devnull, "--check"], DEPLOY)
    assert (result.code, result.out) == (ExitCode.CHANGES, "")
    assert "leader container vllm-leader: added the liveness probe" in result.err


def test_inject_help_prints_its_exit_codes_from_the_table() -> None:
    result = run(["inject", "--help"])
    assert (result.code, result.out) == (0, help_text() + "\n")
    lines = exit_lines("inject")
    assert len(lines) == 4
    assert "\n".join(["exit codes:", *lines]) in result.out
    assert f"exit {ExitCode.CHANGES} when a run would change" in result.out


# --- through the real command: a reader that goes away

CLOSED = "stallprobe inject: stdout was closed before the output was whole (Broken pipe)\n"


def _closed_early(*args: str, stdin: bytes = b"") -> tuple[int, str]:
    """Run `python -m stallprobe ARGS` with its stdout a pipe whose reader has closed before it writes
    (what `| head -1` becomes once head has its line): the exit code and stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "stallprobe", *args],
            input=stdin,
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    return done.returncode, done.stderr.decode()


def test_a_reader_that_goes_away_is_exit_7_and_one_line() -> None:
    code, err = _closed_early("inject", "-f", str(MANIFESTS / "gaie-vllm-gpu-deployment-092fdaa.yaml"))
    assert (code, err) == (ExitCode.OUTPUT, CLOSED)


def test_a_reader_gone_before_the_help_is_exit_7_too() -> None:
    """Nothing is left for the interpreter's own flush at exit, which would print "Exception ignored" and
    exit 120: the output is written and flushed before main returns, and stdout then points nowhere."""
    code, err = _closed_early("inject", "--help")
    assert (code, err) == (ExitCode.OUTPUT, CLOSED)


def test_head_1_through_a_shell() -> None:
    """The pipeline as a person types it. head exits once it has its line; inject, still writing the
    ConfigMap (over 160 KB, more than a pipe holds), finds the pipe closed."""
    manifest = MANIFESTS / "gaie-vllm-gpu-deployment-092fdaa.yaml"
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f'"{sys.executable}" -m stallprobe inject -f "{manifest}" | head -1'],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout == manifest.read_text().splitlines(keepends=True)[0]
    assert (done.returncode, done.stderr) == (ExitCode.OUTPUT, CLOSED)


def test_the_table_reaches_every_code_inject_documents() -> None:
    reached = {case[3] for case in INJECT_CASES} | {ExitCode.OUTPUT}
    assert reached == {code for code, meanings in EXIT_TABLE.items() if "inject" in meanings}


# --- the probe's and watch's table: each bad input, its code and its line (on stdout, where the kubelet
# and a person read it)

# (name, the command line ({key} names one of `places`), code, the start of the one line)
ENGINE_CASES: list[tuple[str, list[str], int, str]] = [
    ("probe: --timeout past any sane bound", ["--url", "{good}", "--timeout", "1e999"], 2, "error: --timeout must be"),
    ("probe: --window of a year", ["--url", "{good}", "--window", "31536000"], 2, "error: --window must be at most"),
    ("probe: a port past 65535", ["--url", "http://127.0.0.1:70000/metrics"], 2, "error: --url has an invalid port"),
    ("probe: not http", ["--url", "ftp://127.0.0.1/metrics"], 2, "error: --url must be an http:// URL"),
    ("probe: refused", ["--url", "{refused}"], 3, "error: scrape http://127.0.0.1:"),
    ("probe: HTML", ["--url", "{html}"], 4, "error: not a metrics page: the server sent HTML"),
    ("probe: garbage", ["--url", "{garbage}"], 4, "error: "),
    ("probe: NaN", ["--url", "{nan}"], 4, "error: vllm:num_requests_running is nan, not a finite number"),
    ("probe: 401", ["--url", "{locked}"], 3, "error: scrape http://127.0.0.1:"),
    ("probe: a state folder", ["--url", "{good}", "--state-file", "{folder}"], 5, "error: state file "),
    ("probe: a state file nowhere", ["--url", "{good}", "--state-file", "{missing}"], 5, "error: state file "),
    ("probe: a corrupt state file", ["--url", "{good}", "--state-file", "{corrupt}"], 0, "baseline: 4 running"),
    ("probe: a device at the state path", ["--url", "{good}", "--state-file", "{device}"], 5, "error: state file "),
    ("probe: a slow page", ["--url", "{slow}", "--timeout", "0.3"], 0, "suspect: scrape http://127.0.0.1:"),
    ("watch: no URL", ["watch"], 2, "error: at least one URL is required"),
    ("watch: a listen port past 65535", ["watch", "--listen", "127.0.0.1:99999", "{good}"], 2, "error: --listen"),
    ("watch: a listen port of 5000 digits", ["watch", "--listen", "h:" + "9" * 5000, "{good}"], 2, "error: --listen"),
    ("watch: --interval 0", ["watch", "--interval", "0", "{good}"], 2, "error: --interval must be a number > 0"),
    ("watch: the same URL twice", ["watch", "{good}", "{good}"], 2, "error: URL "),
    ("watch: a hook not on PATH", ["watch", "--on-stalled", "no-such-command-x", "{good}"], 2, "error: --on-stalled"),
    ("watch: refused, once", ["watch", "--once", "--interval", "0.05", "{refused}"], 3, "http://127.0.0.1:"),
    ("watch: HTML, once", ["watch", "--once", "--interval", "0.05", "{html}"], 4, "http://127.0.0.1:"),
]


@pytest.mark.parametrize(
    ("argv", "code", "start"), [case[1:] for case in ENGINE_CASES], ids=[case[0] for case in ENGINE_CASES]
)
def test_probe_and_watch_answer_each_bad_input_with_its_code_and_one_line(
    argv: list[str], code: int, start: str, places: dict[str, str]
) -> None:
    assert ENGINE_CASES
    Path(places["corrupt"]).write_bytes(CORRUPT)  # the generated runs may have left a good state there
    argv = [word.format(**places) for word in argv]
    if argv[0] != "watch" and "--state-file" not in argv:
        argv += ["--state-file", places["state"] + f".{len(argv)}.{code}"]
    result = run(argv)
    (PROBE_ROW if argv[0] != "watch" else WATCH_ROW).check(result)
    assert result.code == code, result
    assert result.out.startswith(start), result
    assert result.err == ""


def test_a_probe_whose_stdout_is_closed_keeps_its_verdicts_code_and_says_so_on_stderr(
    places: dict[str, str],
) -> None:
    result = run(["--url", places["good"], "--state-file", places["state"] + ".closed"], closed=True)
    assert (result.code, result.out) == (ExitCode.OK, "")
    assert result.err.startswith("stallprobe: stdout is closed; the line was: baseline: 4 running")


def test_watch_whose_reader_goes_away_stops_quietly() -> None:
    code, err = _closed_early("watch", "--interval", "0.05", "http://127.0.0.1:1/metrics")
    assert (code, err) == (ExitCode.OK, "")


# --- no side doors: --json and --report-only are options the parser reads, and a bug of ours is one line


def test_a_flag_a_command_does_not_have_is_a_usage_error_told_plainly() -> None:
    """doctor has no --json: asking for it is a usage error, said as a line (not a JSON object)."""
    result = run(["doctor", "--json", "--url", "http://127.0.0.1:1/metrics"])
    assert (result.code, result.out) == (ExitCode.USAGE, "error: unknown option '--json'\n")
    # The probe has it: its usage error is a JSON object, even for a command line that does not parse.
    probe = run(["--json", "--window", "0"])
    assert probe.code == ExitCode.USAGE
    assert json.loads(probe.out) == {
        "verdict": "error",
        "error": "--window must be a number > 0 (got '0')",
        "exit_code": 2,
    }


@pytest.mark.parametrize("report_only", [False, True])
def test_a_bug_of_stallprobe_is_one_line_and_exit_2_never_a_traceback_or_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], report_only: bool
) -> None:
    from stallprobe import probe
    from stallprobe.cli import main

    def broken(config: object) -> int:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(probe, "_judge", broken)
    args = ["--url", "http://127.0.0.1:1/metrics", *(["--report-only"] if report_only else [])]
    code = main(args, {})
    out, err = capsys.readouterr()
    message = "error: a bug of stallprobe (please report it): ZeroDivisionError: division by zero"
    # Report-only excuses it (the probe's own failure, never the engine's); else the code of a deploy error.
    assert (code, err) == ((ExitCode.OK if report_only else ExitCode.USAGE), "")
    assert out == (f"{message}; report-only: exit 0, not 2\n" if report_only else f"{message}\n")


@pytest.mark.parametrize("command", ["watch", "inject", "doctor"])
def test_a_bug_in_any_command_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    from stallprobe import cli

    def tool(name: str) -> object:
        def broken(args: object, env: object) -> int:
            raise KeyError("surprise")

        return broken

    monkeypatch.setattr(cli, "_tool", tool)
    code = cli.main([command], {})
    out, err = capsys.readouterr()
    line = "a bug of stallprobe (please report it): KeyError: 'surprise'"
    assert code == ExitCode.USAGE
    assert (out + err).strip() in (f"error: {line}", f"stallprobe inject: {line}")


def test_the_pip_installed_entry_points_never_end_in_a_traceback(tmp_path: Path, places: dict[str, str]) -> None:
    """python3 -m stallprobe, the console script's run(), and the stanza's `-c` program, with the judge
    broken before the probe loads it (a bug of ours): one line and exit 2."""
    (tmp_path / "sitecustomize.py").write_text("import stallprobe.judge as j\nj.judge = None\n")
    env = clean_env(PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    for argv in (
        [sys.executable, "-m", "stallprobe"],
        [sys.executable, "-c", "from stallprobe.cli import run; run()"],
    ):
        result = subprocess.run(
            [*argv, "--url", places["good"], "--state-file", str(tmp_path / "s")],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert (result.returncode, result.stderr) == (ExitCode.USAGE, ""), result
        assert result.stdout == (
            "error: a bug of stallprobe (please report it): TypeError: 'NoneType' object is not callable\n"
        )
