"""The package's layout is its architecture: each module sits in a layer and imports only from layers
below it (README, "Development"). A new module must be given its layer here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO

SRC = REPO / "src"
# Lower numbers are lower layers. Same-layer imports are allowed only where listed in PEERS.
LAYERS = {
    # The pure core: no I/O, no clock, no environment.
    "stallprobe.errors": 0,
    "stallprobe.detector": 0,
    "stallprobe.switches": 0,  # the words a switch reads as on and off
    "stallprobe.exposition": 1,
    "stallprobe.engines": 2,
    "stallprobe.serving": 0,  # data: how each engine's server is started
    "stallprobe.watch.hooks": 1,
    # inject's pure decision per container, and the shell splitting it reads (the core floor).
    "stallprobe.inject.shell": 1,
    "stallprobe.inject.decide": 3,
    # The edges: HTTP, the state file, the single-file build.
    "stallprobe.urls": 0,  # a URL's host, port and path, and its origin
    "stallprobe.jsonlite": 0,  # JSON without json where it can be
    "stallprobe.scrape": 2,
    "stallprobe.asking": 3,  # a look's exchanges: what it asks, how each went, performed one by one
    "stallprobe.credentials": 2,  # the API key the exchanges send: its file, or a variable
    "stallprobe.statefile": 5,  # the judge's memory, between two runs
    "stallprobe.killswitch": 2,  # the report-only switch's file
    "stallprobe.trace": 6,  # the container's log and its termination message file
    "stallprobe.launcher": 1,  # the file a pod runs, and the archive's layout it reads
    "stallprobe.pyz": 2,  # the builder of the single-file probe
    "stallprobe.console": 2,  # stdout and stderr, when they may be closed
    "stallprobe.buildinfo": 1,  # what --version says: the version, and the build a single-file probe runs
    # The words of a look: its line, its exit code, its precision note (reads the dialect's printing).
    "stallprobe.report": 3,
    # The one judge of a look (what it means, what is said, what is remembered), over the detector's rules.
    "stallprobe.judge": 4,
    # The words of a failing run's evidence, from its judgment.
    "stallprobe.evidence": 5,
    "stallprobe.api": 4,  # questions beyond /metrics, over scrape's HTTP
    # The flags of every command: how a value is read, the table, the typed configuration, --help.
    "stallprobe.readers": 3,
    "stallprobe.options": 5,
    "stallprobe.settings": 6,
    "stallprobe.helppage": 6,
    # The one pipeline: what an engine said at one look, for every command.
    "stallprobe.observe": 7,
    # The probe's stanza (its command, probes and timeoutSeconds): what inject writes and doctor prints.
    "stallprobe.stanza": 8,
    # The commands: peers that never import each other.
    "stallprobe.probe": 9,
    "stallprobe.doctor": 9,
    "stallprobe.doctor.command": 9,
    "stallprobe.doctor.first": 9,
    "stallprobe.doctor.looks": 9,
    "stallprobe.doctor.probes": 9,
    "stallprobe.doctor.words": 9,
    "stallprobe.inject": 9,
    "stallprobe.inject.command": 9,
    "stallprobe.inject.core": 9,
    "stallprobe.inject.manifests": 9,
    "stallprobe.inject.splice": 9,
    "stallprobe.watch": 9,
    "stallprobe.watch.command": 9,
    "stallprobe.watch.poll": 9,
    "stallprobe.watch.loop": 9,
    "stallprobe.watch.runner": 9,
    "stallprobe.watch.view": 9,
    "stallprobe.watch.serve": 9,
    "stallprobe.watch.agent": 9,
    # The dispatcher, and what starts it.
    "stallprobe": 0,
    "stallprobe.cli": 10,
    "stallprobe.__main__": 11,
}
# Imports within one layer that are part of the design: a package and its own modules.
PEERS = {
    ("stallprobe.watch", "stallprobe.watch.command"),
    ("stallprobe.watch.command", "stallprobe.watch.poll"),
    ("stallprobe.watch.command", "stallprobe.watch.view"),
    ("stallprobe.watch.poll", "stallprobe.watch.runner"),
    ("stallprobe.watch.poll", "stallprobe.watch.loop"),
    ("stallprobe.watch.view", "stallprobe.watch.poll"),
    ("stallprobe.watch.serve", "stallprobe.watch.poll"),
    ("stallprobe.watch.command", "stallprobe.watch.serve"),
    ("stallprobe.watch.agent", "stallprobe.watch.serve"),
    ("stallprobe.watch.agent", "stallprobe.watch.view"),
    ("stallprobe.watch.command", "stallprobe.watch.agent"),
    ("stallprobe.inject", "stallprobe.inject.command"),
    ("stallprobe.inject", "stallprobe.inject.core"),
    ("stallprobe.inject", "stallprobe.inject.decide"),
    ("stallprobe.inject", "stallprobe.inject.manifests"),
    ("stallprobe.inject.command", "stallprobe.inject.core"),
    ("stallprobe.inject.command", "stallprobe.inject.decide"),
    ("stallprobe.inject.command", "stallprobe.inject.manifests"),
    ("stallprobe.inject.core", "stallprobe.inject.decide"),
    ("stallprobe.inject.decide", "stallprobe.inject.shell"),
    ("stallprobe.inject.manifests", "stallprobe.inject.splice"),
    ("stallprobe.doctor", "stallprobe.doctor.command"),
    ("stallprobe.doctor.command", "stallprobe.doctor.first"),
    ("stallprobe.doctor.command", "stallprobe.doctor.looks"),
    ("stallprobe.doctor.command", "stallprobe.doctor.probes"),
    ("stallprobe.doctor.command", "stallprobe.doctor.words"),
    ("stallprobe.doctor.looks", "stallprobe.doctor.first"),
    ("stallprobe.doctor.words", "stallprobe.doctor.first"),
    ("stallprobe.doctor.words", "stallprobe.doctor.looks"),
}


def test_peer_imports_have_no_cycle() -> None:
    order = [
        "stallprobe.watch.runner",
        "stallprobe.watch.loop",
        "stallprobe.watch.poll",
        "stallprobe.watch.view",
        "stallprobe.watch.serve",
    ]
    order += ["stallprobe.watch.agent", "stallprobe.watch.command"]
    order.append("stallprobe.watch")
    order += [f"stallprobe.inject.{name}" for name in ("shell", "decide", "core", "splice", "manifests", "command")]
    order.append("stallprobe.inject")
    order += [f"stallprobe.doctor.{name}" for name in ("first", "looks", "probes", "words", "command")]
    order.append("stallprobe.doctor")
    for importer, imported in PEERS:
        assert order.index(imported) < order.index(importer), (importer, imported)


def modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "stallprobe").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path) -> set[str]:
    """The package's modules that `name` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known = modules()
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        targets.update(n for n in names if n in known and n != name)
    return targets


def test_every_module_has_a_layer() -> None:
    assert set(modules()) == set(LAYERS)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_imports_point_down(name: str) -> None:
    path = modules()[name]
    for target in imports(name, path):
        if name == "stallprobe":  # the package re-exports its core
            assert LAYERS[target] == 0, target
            continue
        if target == "stallprobe":  # the version, from the package
            continue
        assert LAYERS[target] < LAYERS[name] or (name, target) in PEERS, f"{name} imports {target}"


def floors() -> dict[str, int]:
    """Each module's floor in CONTRIBUTING.md's table (0 the top row): a folder stands for its modules,
    but those named on a row of their own."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    head = text.index("| floor | modules | may do |")
    rows = [line for line in text[head:].split("\n\n", 1)[0].splitlines()[2:] if line.startswith("|")]
    named: dict[str, int] = {}
    folders: dict[str, int] = {}
    for number, row in enumerate(rows):
        for entry in re.findall(r"`([\w/]+(?:\.py|/))`", row.split("|")[2]):
            if entry.endswith("/"):
                folders["stallprobe." + entry.strip("/").replace("/", ".")] = number
            else:
                parts = entry.removesuffix(".py").removesuffix("__init__").strip("/").split("/")
                named[".".join(["stallprobe", *[p for p in parts if p]])] = number
    found = dict(named)
    for name in modules():
        if name not in found:
            owner = [folder for folder in folders if name == folder or name.startswith(folder + ".")]
            if owner:
                found[name] = folders[owner[0]]
    return found


def test_contributing_puts_every_module_on_one_floor() -> None:
    on_floors = floors()
    assert set(on_floors) == set(modules()), set(modules()) ^ set(on_floors)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_imports_come_from_the_same_floor_or_above(name: str) -> None:
    on_floors = floors()
    for target in imports(name, modules()[name]):
        assert on_floors[target] <= on_floors[name], f"{name} (floor {on_floors[name]}) imports {target}"
