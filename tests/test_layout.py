"""The package's layout is its architecture: each module sits in a layer and imports only from layers
below it (README, "Development"). A new module must be given its layer here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

SRC = REPO / "src"
# Lower numbers are lower layers. Same-layer imports are allowed only where listed in PEERS.
LAYERS = {
    # The pure core: no I/O, no clock, no environment.
    "stallprobe.errors": 0,
    "stallprobe.detector": 0,
    "stallprobe.exposition": 1,
    "stallprobe.engines": 2,
    "stallprobe.serving": 0,  # data: how each engine's server is started
    "stallprobe.watch.hooks": 1,
    # The edges: HTTP, the state file, the single-file build.
    "stallprobe.scrape": 2,
    "stallprobe.statefile": 2,
    "stallprobe.pyz": 2,
    "stallprobe.console": 2,  # stdout and stderr, when they may be closed
    # The words of a look: its line, its exit code, its precision note (reads the dialect's printing).
    "stallprobe.report": 3,
    "stallprobe.api": 4,  # questions beyond /metrics, over scrape's HTTP
    # The flags of every command.
    "stallprobe.options": 4,
    # The one pipeline: what an engine said at one look, for every command.
    "stallprobe.observe": 5,
    # The probe's stanza (its command, probes and timeoutSeconds): what inject writes and doctor prints.
    "stallprobe.stanza": 6,
    # The commands: peers that never import each other.
    "stallprobe.probe": 7,
    "stallprobe.doctor": 7,
    "stallprobe.doctor.command": 7,
    "stallprobe.doctor.first": 7,
    "stallprobe.doctor.looks": 7,
    "stallprobe.doctor.probes": 7,
    "stallprobe.doctor.words": 7,
    "stallprobe.inject": 7,
    "stallprobe.inject.command": 7,
    "stallprobe.inject.core": 7,
    "stallprobe.inject.decide": 7,
    "stallprobe.inject.manifests": 7,
    "stallprobe.inject.shell": 7,
    "stallprobe.inject.splice": 7,
    "stallprobe.watch": 7,
    "stallprobe.watch.command": 7,
    "stallprobe.watch.poll": 7,
    "stallprobe.watch.runner": 7,
    "stallprobe.watch.view": 7,
    "stallprobe.watch.serve": 7,
    "stallprobe.watch.agent": 7,
    # The dispatcher, and what starts it.
    "stallprobe": 0,
    "stallprobe.cli": 8,
    "stallprobe.__main__": 9,
}
# Imports within one layer that are part of the design: a package and its own modules.
PEERS = {
    ("stallprobe.watch", "stallprobe.watch.command"),
    ("stallprobe.watch.command", "stallprobe.watch.poll"),
    ("stallprobe.watch.command", "stallprobe.watch.view"),
    ("stallprobe.watch.poll", "stallprobe.watch.runner"),
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
    order = ["stallprobe.watch.runner", "stallprobe.watch.poll", "stallprobe.watch.view", "stallprobe.watch.serve"]
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
