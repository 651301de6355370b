"""`stallprobe inject`: the command. Manifests on stdin (or -f) to stdout, one line per decision on stderr.

The same command serves three callers:
- a person or a pipeline: `stallprobe inject -f deploy.yaml | kubectl apply -f -`; `--check` writes
  nothing and exits 6 when a run would change something (a CI gate);
- Helm's post-renderer: every rendered manifest on stdin, the result on stdout, non-zero on failure;
- Kustomize's KRM function (exec): a ResourceList on stdin, whose functionConfig carries the options
  (the flags' names without `--`, under `spec` or `data`), the ResourceList back on stdout.
`--print-probe` writes only what an operator embeds in the pods it renders: the container fields and the
ConfigMap.

Nothing goes to stdout until everything has succeeded: the output is made whole in memory and written at
once, so a failure leaves stdout empty (one line on stderr says why), and a reader that goes away early
(`| head -1`) is one line and exit 7, not a traceback.
"""

from __future__ import annotations

import sys

from ..buildinfo import version_line
from ..console import abandon_stdout, tell
from ..engines import ENGINE_NAMES
from ..errors import ExitCode, InjectError, OutputError, shown_path
from ..helppage import help_page
from ..options import INJECT
from ..serving import Address, address, default_address
from ..settings import parse
from .core import InjectConfig, configmap, configmap_name, container_fields, inject, plan_of, state_volume, volume
from .decide import Choice, Decision, own_window
from .manifests import MAX_BYTES, decode, dump_yaml, read_documents, write_documents

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


__all__ = ["InjectConfig", "main"]

# A ConfigMap holds at most 1 MiB (the API server's limit), and the archive rides in one.
MAX_PYZ = 1024 * 1024

DESCRIPTION = """\
usage: stallprobe inject [-f FILE] [options]
       stallprobe inject --print-probe --engine ENGINE --port PORT [--output yaml|json]

Put the stallprobe exec liveness and readiness probes (and a startup guard) into Kubernetes manifests
(YAML or JSON), with the probe's build in a ConfigMap named by its content: the manifests go to stdout,
one line per container to stderr. Works as a Helm post-renderer
(--post-renderer stallprobe --post-renderer-args inject) and as a Kustomize KRM function (a
ResourceList on stdin). The engine flags are the probe's, written into the probe it adds."""


def help_text() -> str:
    return help_page("inject", DESCRIPTION, INJECT, environment=False)


def _read(path: str, flag: str, limit: int) -> bytes:
    """A file's bytes, up to one past `limit` (a larger file, or an endless one, is read no further)."""
    try:
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise InjectError(f"{flag} {shown_path(path)}: {getattr(exc, 'strerror', None) or exc}") from None


def _input(filename: str) -> str:
    """The manifests' text, from -f FILE or stdin."""
    if filename != "-":
        return decode(_read(filename, "-f", MAX_BYTES))
    stdin = sys.stdin
    try:
        if stdin is None:
            raise InjectError("stdin is closed: give the manifests with -f FILE")
        if stdin.isatty():
            raise InjectError("no manifests on stdin, which is a terminal: pipe them in, or give -f FILE")
        binary = getattr(stdin, "buffer", None)
        data = binary.read(MAX_BYTES + 1) if binary is not None else stdin.read(MAX_BYTES + 1).encode()
    except (OSError, ValueError) as exc:  # ValueError: a closed stream
        raise InjectError(f"stdin cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    return decode(data)


def _pyz(config: InjectConfig, log: list[str]) -> bytes:
    """The archive to ship: --pyz's, or one built here, with the bytecode for --python's interpreter when
    this machine has it (else without, said in `log`: it is the image's, which the pods run)."""
    path = config.pyz
    if path is not None:
        pyz = _read(path, "--pyz", MAX_PYZ)
        if len(pyz) > MAX_PYZ:
            raise InjectError(f"--pyz {shown_path(path)} is larger than 1 MiB, more than a ConfigMap holds")
        said = _verified(path, pyz, config.pyz_sha256)
        if said:
            log.append(said)
        return pyz
    from ..pyz import PythonNotHere, build

    try:
        return build(config.python)  # UsageError when --python runs and cannot compile it
    except PythonNotHere as exc:
        log.append(
            f"{exc}: the archive ships without bytecode for it (the probe then reads its sources, ~10 ms more "
            f"CPU a run); the pods' probes run {config.python}"
        )
        return build(None)


# What a release lists its files' sha256 in, beside them (scripts/release; `sha256sum -c` reads it).
SUMS = "SHA256SUMS"


def _verified(path: str, pyz: bytes, expected: str | None) -> str:
    """Check --pyz's archive against --pyz-sha256, else against the SHA256SUMS beside it (a release's): the
    log's line saying what it matched. InjectError on a mismatch (nothing is written), and for a
    SHA256SUMS that is there but lists no such file. With neither, "": the archive ships as it is (an
    archive built by hand, as before there were releases)."""
    import hashlib
    import os

    actual = hashlib.sha256(pyz).hexdigest()
    source = "--pyz-sha256"
    if expected is None:
        sums = os.path.join(os.path.dirname(path), SUMS)
        if not os.path.exists(sums):
            return ""
        name = os.path.basename(path)
        text = decode(_read(sums, SUMS, MAX_PYZ))
        entries = (line.split() for line in text.splitlines())  # `HEX  NAME`, or `HEX *NAME` (binary mode)
        listed = [words[0].lower() for words in entries if words[1:] in ([name], [f"*{name}"])]
        if len(listed) != 1:
            listing = shown_path(sums)
            raise InjectError(f"--pyz {shown_path(path)}: {listing} lists no {name} once: give --pyz-sha256 HEX")
        expected, source = listed[0], shown_path(sums)
    if actual != expected:
        raise InjectError(
            f"--pyz {shown_path(path)}: its sha256 is {actual}, not the {expected} {source} says: nothing written"
        )
    return f"--pyz {shown_path(path)}: sha256 {actual}, as {source} says"


def _emit(text: str) -> None:
    """Write the whole output at once, as UTF-8 whatever the locale (the bytes that came in go out).
    OutputError when stdout is closed or a write to it fails."""
    try:
        if sys.stdout is None:
            raise OSError("closed")
        binary = getattr(sys.stdout, "buffer", None)
        if binary is None:  # a text stream without bytes beneath (a test's)
            sys.stdout.write(text)
        else:
            # A pipe whose reader goes away mid-write takes part of it and returns a short count, which
            # the text layer would ignore: the rest is written until it is all out or the pipe says why not.
            sys.stdout.flush()
            data = memoryview(text.encode("utf-8"))
            while data:
                written = binary.write(data)
                if not written:  # None: a non-blocking stdout that would block
                    raise OSError("stdout takes nothing more")
                data = data[written:]
        sys.stdout.flush()
    except (OSError, ValueError) as exc:  # ValueError: a closed stream
        abandon_stdout()  # what is still buffered would fail again at exit (an "Exception ignored", exit 120)
        raise OutputError(
            f"stdout was closed before the output was whole ({getattr(exc, 'strerror', None) or exc})"
        ) from None


def _say(lines: list[str]) -> None:
    """The log on stderr; when nobody reads it, the output still counts."""
    for line in lines:
        tell(f"stallprobe inject: {line}")


def _krm_args(config: Any) -> list[str]:
    """The functionConfig's options as flags: `spec` (or a ConfigMap's `data`) maps each flag's name,
    without `--`, to its value; true for a switch, a list for a flag that repeats."""
    if config is None:
        return []
    if not isinstance(config, dict):
        raise InjectError("the ResourceList's functionConfig must be a mapping")
    fields = config.get("spec", config.get("data")) or {}
    if not isinstance(fields, dict):
        raise InjectError("the functionConfig's spec (or data) must map option names to values")
    argv: list[str] = []
    for key, value in fields.items():
        flag = f"--{key}"
        if value is True or str(value).lower() == "true":
            argv.append(flag)
        elif value is False or str(value).lower() == "false":
            continue
        elif isinstance(value, list):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def _print_probe(config: InjectConfig, log: list[str]) -> str:
    engine = config.engine
    port = config.port
    if engine == "auto" or port is None:
        raise InjectError(f"--print-probe needs --engine ({', '.join(ENGINE_NAMES[1:])}) and --port")
    plan = plan_of(config)
    pyz = _pyz(config, log)
    name = configmap_name(config, pyz)
    given = config.host_address
    # Where the engine binds: --host-address's, else its default (serving.py says which).
    reached = default_address(engine) if given is None else address(given) or Address(given, "")
    readiness = "" if plan.drain_after is None else "added"
    window = own_window(engine, Choice(window_given="window" in config.given))
    decision = Decision(
        "probe",
        engine=engine,
        port=port,
        startup=True,
        address=reached,
        python=config.python or "python3",
        readiness=readiness,
        liveness="added",
        window=window,
    )
    fields = container_fields(decision, plan, None, config.state_volume)
    volumes: list[dict[str, Any]] = [volume(name)]
    if config.state_volume:
        volumes.append(state_volume())
    whole = {"container": fields, "volumes": volumes, "configMap": configmap(name, None, pyz)}
    if config.output == "json":
        import json

        return json.dumps(whole, indent=2) + "\n"
    return dump_yaml(whole)


def main(argv: Sequence[str]) -> int:
    """`stallprobe inject ...`: the manifests to stdout, the log to stderr; the exit code."""
    config = parse(argv, InjectConfig)
    if isinstance(config, str):
        _emit((help_text() if config == "help" else version_line()) + "\n")
        return ExitCode.OK
    said: list[str] = []
    if config.print_probe:
        _emit(_print_probe(config, said))
        _say(said)
        return ExitCode.OK
    manifests = read_documents(_input(config.filename or "-"))
    krm = (
        len(manifests.docs) == 1
        and isinstance(manifests.docs[0], dict)
        and manifests.docs[0].get("kind") == "ResourceList"
    )
    if krm:
        resource_list = manifests.docs[0]
        config = parse([*_krm_args(resource_list.get("functionConfig")), *argv], InjectConfig)
        assert not isinstance(config, str)
        items = resource_list.get("items")
        if not isinstance(items, list):
            raise InjectError("the ResourceList has no items list (a KRM function gets its resources there)")
        items, log, changed = inject(list(items), config, _pyz(config, said))
        resource_list["items"] = items
        out = manifests.with_docs([resource_list])
        changed = {0} if changed else set()
    else:
        docs, log, changed = inject(manifests.docs, config, _pyz(config, said))
        out = manifests.with_docs(docs)
    if config.check:
        _say([*said, *log])
        return ExitCode.CHANGES if changed else ExitCode.OK
    _emit(write_documents(out, changed))
    _say([*said, *log])
    return ExitCode.OK
