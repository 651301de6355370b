"""scripts/build-pyz: the single-file probe, built and then run the way a pod runs it (`python3 -I -S`): the
launcher beside the archive in a ConfigMap's volume (`python3 -I -S /opt/stallprobe/probe ...`, what
inject writes), and the archive as a zip (runpy and its own __main__).

`-I -S` leaves out site-packages, PYTHONPATH and the working directory (and the launcher's own folder), so
these runs prove the archive carries everything it imports, that the launcher finds it beside itself, and
that both hand the probe's exit code to the process.
"""

from __future__ import annotations

import importlib.util
import marshal
import subprocess
import sys
import types
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import configmap_volume, rewind, vllm_page
from stallprobe.launcher import BUNDLE_AT, BUNDLE_CODE_AT, launcher
from stallprobe.pyz import HOT, TOOLS
from stallprobe.serving import LAUNCHER_KEY, PYZ_KEY
from stubengine import StubEngine
from test_cost import OFF_THE_HOT_PATH

ROOT = Path(__file__).resolve().parents[1]
BUILD_PYZ = ROOT / "scripts" / "build-pyz"
REAL = ROOT / "tests" / "fixtures" / "real"
# vLLM's docs snippet shows only an iteration-tokens histogram: none of the four families the probe reads.
NO_FAMILIES = "vllm-v0-mp-docs-usage-metrics-snippet-044a056.prom"
REAL_VLLM_PAGES = sorted(path.name for path in REAL.glob("vllm-*.prom"))

# The archive is ~250-275 KB (a bundle of ~180-205 KB: the bytecode of the probe's 16 modules and its
# loader; then ~70 KB of deflated source, the tools left out): as base64 in a ConfigMap, ~370 KB of its
# 1 MiB. 384 KiB (512 KiB as base64) leaves room to grow while catching a stray payload.
MAX_PYZ_BYTES = 384 * 1024
# The probe's verdict is judged on its own monotonic clock: a window of 0.1 s against a pause of at
# least 0.6 s between two runs (made by rewinding the state file, not by sleeping) is stalled however
# slow the machine is, since a slow start only widens the gap.
WINDOW = "0.1"
PAUSE = 0.6
CONTENT_TYPE = "text/plain; version=0.0.4"


def run_as(program: list[str], url: str, state_file: Path, *extra: str) -> tuple[int, str]:
    """Run the probe as `python3 -I -S <program>`, as a pod would; its exit code and its one line."""
    result = subprocess.run(
        [sys.executable, "-I", "-S", *program, "--url", url, "--state-file", str(state_file), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    return result.returncode, lines[0]


def run_pyz(pyz: Path, url: str, state_file: Path, *extra: str) -> tuple[int, str]:
    """The archive run as a zip (runpy and its __main__)."""
    return run_as([str(pyz)], url, state_file, *extra)


def mounted(pyz: Path, folder: Path, text: str | None = None) -> Path:
    """The launcher's path in a ConfigMap's volume at `folder` holding the archive and the launcher (or
    `text` in its place), as inject ships them."""
    files: dict[str, bytes | str] = {PYZ_KEY: pyz.read_bytes(), LAUNCHER_KEY: launcher() if text is None else text}
    return configmap_volume(folder, files) / LAUNCHER_KEY


def run_launched(pyz: Path, url: str, state_file: Path, *extra: str) -> tuple[int, str]:
    """The archive run through the launcher inject writes, from a ConfigMap's volume beside the state file."""
    return run_as([str(mounted(pyz, state_file.parent / "opt-stallprobe"))], url, state_file, *extra)


def foreign_copy(pyz: Path, target: Path) -> Path:
    """The archive as if built for another Python: no Python's magic number before the bundle, and no
    marshal data at the bundle's start either (nothing there may be unmarshalled)."""
    data = bytearray(pyz.read_bytes())
    data[BUNDLE_AT:BUNDLE_CODE_AT] = b"\x00\x00\r\n"
    data[BUNDLE_CODE_AT : BUNDLE_CODE_AT + 64] = bytes(64)
    target.write_bytes(data)
    return target


Runner = Callable[..., tuple[int, str]]
HOT_MODULES = [name.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for name in HOT]


def build(output: Path, *extra: str) -> Path:
    result = subprocess.run(
        [sys.executable, str(BUILD_PYZ), "--output", str(output), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    version = "none" if "--no-bytecode" in extra else f"{sys.version_info[0]}.{sys.version_info[1]}"
    said = f"{output} {output.stat().st_size} bytes, bytecode for Python {version}\n"
    if output.name == PYZ_KEY:  # its launcher beside it, as a ConfigMap mounts the two
        probe = output.with_name(LAUNCHER_KEY)
        assert probe.read_text() == launcher()
        said += f"{probe} {probe.stat().st_size} bytes, its launcher\n"
    assert result.stdout == said
    return output


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("dist") / "stallprobe.pyz")


def frozen_busy_page() -> bytes:
    """A vLLM V1 page: 3 running, 2 waiting, token counters that never move however often it is served."""
    return vllm_page(3, 40960, 5120, 2, model="tiny-llama")


def test_archive_is_a_bundle_of_bytecode_then_a_zip_of_the_sources_and_is_small(pyz: Path) -> None:
    data = pyz.read_bytes()
    assert data[:BUNDLE_AT] == b"#!/usr/bin/env python3\n"
    # The bundle: this interpreter's magic number, then (the loader's code, {"modules": {name: code}}),
    # the code of exactly the modules a probe run loads.
    assert data[BUNDLE_AT:BUNDLE_CODE_AT] == importlib.util.MAGIC_NUMBER
    boot, names = marshal.loads(data[BUNDLE_CODE_AT:])
    assert isinstance(boot, types.CodeType)
    assert list(names) == ["modules"]
    modules = names["modules"]
    assert sorted(modules) == sorted(HOT_MODULES)
    assert all(isinstance(code, types.CodeType) for code in modules.values())
    assert modules["stallprobe.cli"].co_filename == "stallprobe/cli.py"  # tracebacks name the module
    with zipfile.ZipFile(pyz) as archive:
        infos = {info.filename: info for info in archive.infolist()}
    names = list(infos)
    assert "__main__.py" in names
    assert "stallprobe/cli.py" in names
    assert not [name for name in names if "__pycache__" in name or not name.endswith(".py")]
    assert names == sorted(names)
    sources = [name for name in names if name != "__main__.py"]
    assert set(HOT) <= set(sources)
    # The entry point runpy reads is stored (no zlib at run time); sources are deflated.
    assert infos["__main__.py"].compress_type == zipfile.ZIP_STORED
    assert {infos[n].compress_type for n in sources} == {zipfile.ZIP_DEFLATED}
    assert pyz.stat().st_size < MAX_PYZ_BYTES


def test_source_only_build(tmp_path: Path, served: StubEngine) -> None:
    plain = build(tmp_path / "plain.pyz", "--no-bytecode")
    assert plain.read_bytes()[BUNDLE_AT : BUNDLE_AT + 4] == b"PK\x03\x04"  # the zip right after the shebang
    assert plain.stat().st_size < 128 * 1024  # ~100 KB of deflated sources
    served.route("/metrics", frozen_busy_page())
    state = tmp_path / "probe.state"
    code, line = run_pyz(plain, served.url, state)
    assert (code, line[:10]) == (0, "baseline: ")
    code, line = run_launched(plain, served.url, state)
    assert (code, line[:10]) == (0, "suspect: 3")


def test_the_launcher_beside_the_archive_runs_it_from_any_working_directory(
    pyz: Path, served: StubEngine, tmp_path: Path
) -> None:
    """build-pyz writes the launcher beside the archive: run by its path, absolute or relative to the
    working directory (-I puts neither folder on sys.path), it finds the archive next to itself."""
    served.route("/metrics", frozen_busy_page())
    state = tmp_path / "probe.state"
    for program, cwd in ((str(pyz.with_name(LAUNCHER_KEY)), tmp_path), (LAUNCHER_KEY, pyz.parent)):
        done = subprocess.run(
            [sys.executable, "-I", "-S", program, "--url", served.url, "--state-file", str(state)],
            capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
        )  # fmt: skip
        assert (done.returncode, done.stderr) == (0, ""), done
        assert done.stdout.startswith(("baseline: 3 running", "suspect: 3 running")), done.stdout


@pytest.mark.parametrize("run", [run_pyz, run_launched], ids=["runpy", "launcher"])
def test_bytecode_of_another_python_falls_back_to_the_source(
    run: Runner, pyz: Path, tmp_path: Path, served: StubEngine
) -> None:
    """An archive built for another Python (another magic number) must still run, from its sources: its
    bundle is never unmarshalled (a code object of another Python's may crash this one)."""
    foreign = foreign_copy(pyz, tmp_path / "foreign.pyz")
    served.route("/metrics", frozen_busy_page())
    url = served.url
    state = tmp_path / "probe.state"
    assert run(foreign, url, state, "--window", WINDOW)[0] == 0
    rewind(state, PAUSE)
    code, line = run(foreign, url, state, "--window", WINDOW)
    assert (code, line[:9]) == (1, "stalled: ")


@pytest.mark.parametrize("bundled", [True, False], ids=["bundle", "another-python"])
def test_the_launcher_loads_the_probe_from_the_bundle_alone(
    bundled: bool, pyz: Path, tmp_path: Path, served: StubEngine
) -> None:
    """With the bundle, every module of the probe comes from it and the archive is opened once (no
    zipimport); without it (another Python's), zipimport serves the same modules from the sources."""
    archive = pyz if bundled else foreign_copy(pyz, tmp_path / "foreign.pyz")
    served.route("/metrics", frozen_busy_page())
    # Every file the run opens, from the audit hook (which sees zipimport's opens too), and who loaded
    # each of the probe's modules: the bundle's loader is a class, zipimport's an instance.
    hook = "import sys; opened = []; sys.addaudithook(lambda e, a: e == 'open' and opened.append(a[0]))\n"
    program = hook + launcher().replace(
        "import run\nrun()",
        "import main\nmain()\n"
        "print(sorted({getattr(m.__loader__, '__name__', type(m.__loader__).__name__) "
        "for n, m in sys.modules.items() if n.startswith('stallprobe')}), opened.count(p))",
    )
    probe = mounted(archive, tmp_path / "opt-stallprobe", program)
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(probe), "--url", served.url, "--state-file", str(tmp_path / "p.state")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.stderr == ""
    line, loaders = done.stdout.splitlines()
    assert line.startswith("baseline: 3 running"), line
    # With the bundle, one open (the launcher's read); without, zipimport opens it for each module too.
    assert loaders == "['Bundle'] 1" if bundled else loaders.startswith("['zipimporter'] "), loaders
    assert bundled or int(loaders.split()[-1]) > len(HOT)


BROKEN_ARCHIVES: dict[str, Callable[[bytes, Path], object]] = {
    # What a launcher can find at its path: nothing (a volume not mounted), a folder, a copy cut short in
    # its bundle (this Python's magic number, then half a marshal value), bytes that are no archive at
    # all, a zip with no probe in it.
    "missing": lambda data, path: None,
    "a folder": lambda data, path: path.mkdir(),
    "cut short": lambda data, path: path.write_bytes(data[: BUNDLE_CODE_AT + 1000]),
    "garbage": lambda data, path: path.write_bytes(bytes(range(256)) * 8),
    "another zip": lambda data, path: _zip_without_the_probe(path),
}


def _zip_without_the_probe(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("other/__init__.py", "")


@pytest.mark.parametrize("case", BROKEN_ARCHIVES)
def test_a_launcher_whose_archive_cannot_run_says_so_in_one_line_and_exits_2(
    case: str, pyz: Path, tmp_path: Path
) -> None:
    archive = tmp_path / PYZ_KEY
    BROKEN_ARCHIVES[case](pyz.read_bytes(), archive)
    (tmp_path / LAUNCHER_KEY).write_text(launcher())
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(tmp_path / LAUNCHER_KEY), "--url", "http://127.0.0.1:9/metrics",
         "--state-file", str(tmp_path / "p.state")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: cannot run the probe from {archive}: "), lines[0]


def test_two_builds_of_the_same_source_are_the_same_bytes(pyz: Path, tmp_path: Path) -> None:
    again = build(tmp_path / "again.pyz")
    assert again.read_bytes() == pyz.read_bytes()


def test_frozen_busy_engine_is_baseline_then_stalled(pyz: Path, served: StubEngine, tmp_path: Path) -> None:
    served.route("/metrics", frozen_busy_page())
    url = served.url
    state = tmp_path / "probe.state"

    code, line = run_pyz(pyz, url, state, "--window", WINDOW)
    assert code == 0, line
    assert line.startswith("baseline: 3 running, 2 waiting;"), line

    rewind(state, PAUSE)
    code, line = run_pyz(pyz, url, state, "--window", WINDOW)
    assert code == 1, line
    assert line.startswith("stalled: 3 running, 2 waiting; no token progress for"), line


def test_every_real_vllm_page_is_found() -> None:
    assert NO_FAMILIES in REAL_VLLM_PAGES
    assert len(REAL_VLLM_PAGES) >= 6, REAL_VLLM_PAGES
    # Which pages must read: exactly those that name the running gauge, in a sample or a declaration.
    without = [name for name in REAL_VLLM_PAGES if b"vllm:num_requests_running" not in (REAL / name).read_bytes()]
    assert without == [NO_FAMILIES]


# vLLM with --api-server-count 2, before its first request: its running gauge declared with no sample.
DECLARED_ONLY = "vllm-0.32.0-cpu-multiprocess-idle.prom"


# The real pages the probe cannot read (exit 4), and the start of what it says; every other is judged.
UNREADABLE = {
    NO_FAMILIES: (4, "error: no known engine"),
    # A value the probe cannot read is never a 0.
    DECLARED_ONLY: (4, "error: required metric missing from the vllm page: vllm:num_requests_running (declared"),
}


@pytest.mark.parametrize("name", sorted(path.name for path in REAL.glob("*.prom")))
def test_real_page_reads(pyz: Path, served: StubEngine, tmp_path: Path, name: str) -> None:
    page = (REAL / name).read_bytes()
    served.route("/metrics", page)
    served.route("/health", b"", 404)  # no health route to fall back on: a page that cannot be read is exit 4
    code, line = run_pyz(pyz, served.url, tmp_path / "probe.state")
    # A page caught while its engine sleeps is paused from the first run; any other is a baseline.
    expected = UNREADABLE.get(name, (0, "paused: " if "asleep" in name else "baseline: "))
    assert (code, line[: len(expected[1])]) == expected, line


def test_the_archive_is_the_probe_alone_and_its_run_pays_for_nothing_else(pyz: Path, served: StubEngine) -> None:
    """No tool rides in it (each entry is read at every run); its bytecode imports no __future__ (the flag
    is the compiler's); the launcher turns the cycle collector off before the first import; and a tool
    asked of it says where to get it, in one line."""
    with zipfile.ZipFile(pyz) as archive:
        names = archive.namelist()
    assert not [name for name in names if name.startswith(TOOLS)]
    served.route("/metrics", frozen_busy_page())
    # main() in place of run(), which ends the process at once, with no chance to look.
    program = launcher().replace("import run\nrun()", "import main\nmain()\nprint(sorted(sys.modules), gc.isenabled())")
    probe = mounted(pyz, pyz.parent / "alone", program)
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(probe), "--url", served.url, "--state-file",
         str(pyz.parent / "alone.state")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    line, modules, enabled = done.stdout.splitlines()[0], *done.stdout.splitlines()[1].rsplit(" ", 1)
    assert line.startswith("baseline: 3 running"), done.stdout + done.stderr
    assert "'__future__'" not in modules
    # What the bundle's loader and the launcher import is what the interpreter had loaded anyway.
    assert not {name for name in OFF_THE_HOT_PATH if f"'{name}'" in modules}
    assert enabled == "False"
    probe = mounted(pyz, pyz.parent / "tools")
    # (stdout, stderr) of each tool the build lacks: inject's stdout is for manifests, its errors go to stderr.
    said = "{} is not in this single-file build, which carries the probe alone: pip install stallprobe\n"
    refusals = {
        "watch": (f"error: {said.format('watch')}", ""),
        "inject": ("", f"stallprobe inject: {said.format('inject')}"),
        "doctor": (f"error: {said.format('doctor')}", ""),
    }
    for tool, (stdout, stderr) in refusals.items():
        asked = subprocess.run(
            [sys.executable, "-I", "-S", str(probe), tool, "--help"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (asked.returncode, asked.stdout, asked.stderr) == (2, stdout, stderr)


def test_the_help_page_comes_from_the_archive_beside_the_bundle(pyz: Path) -> None:
    """The help page is not bundled (no probe run reads it): zipimport finds it in the archive."""
    asked = subprocess.run(
        [sys.executable, "-I", "-S", str(mounted(pyz, pyz.parent / "help")), "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (asked.returncode, asked.stderr) == (0, "")
    assert asked.stdout.startswith("usage: stallprobe [--url URL]")
    assert "stallprobe/helppage.py" not in HOT


def test_version_says_which_build_a_pod_runs(pyz: Path, tmp_path: Path) -> None:
    """--version through the launcher in a ConfigMap's volume names the build by the hash inject names its
    ConfigMap by (the archive, then the launcher), and the archive's own sha256 (a release's SHA256SUMS);
    run as a zip, the archive's alone; installed, the version alone."""
    import hashlib

    from stallprobe import __version__
    from stallprobe.inject.core import build_digest

    data = pyz.read_bytes()
    whole = build_digest(data)
    own = hashlib.sha256(data).hexdigest()
    launched = subprocess.run(
        [sys.executable, "-I", "-S", str(mounted(pyz, tmp_path / "opt-stallprobe")), "--version"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert (launched.returncode, launched.stderr) == (0, "")
    assert launched.stdout == (
        f"stallprobe {__version__} (build {whole[:10]}: sha256 {whole} of {PYZ_KEY} and {LAUNCHER_KEY}; "
        f"{PYZ_KEY} sha256 {own})\n"
    )
    direct = subprocess.run(
        [sys.executable, "-I", "-S", str(pyz), "--version"], capture_output=True, text=True, check=False, timeout=60
    )
    assert direct.stdout == f"stallprobe {__version__} ({PYZ_KEY} sha256 {own})\n"
    installed = subprocess.run(
        [sys.executable, "-m", "stallprobe", "--version"], capture_output=True, text=True, check=False, timeout=60
    )
    assert installed.stdout == f"stallprobe {__version__}\n"
