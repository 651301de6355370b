"""`stallprobe inject`'s output, byte for byte, on every manifest the inject tests read, under a few flag sets;
and the stream parsed once, however many documents change.

The golden files under tests/fixtures/inject-golden/ were written by the implementation that parsed every
changed document five times, and checked each splice by loading it again; the one that parses it once must
write the same bytes (stdout, the log on stderr and the exit code), and, in whatever style a manifest is
written, the same documents. A fixed --pyz (tests/fixtures/inject-golden/fixed.pyz) keeps the ConfigMap's
binaryData from changing with the code.

A change that is meant to change the output regenerates them, and the diff is then read in review:

    .venv/bin/python tests/test_inject_golden.py
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from conftest import REPO
from stallprobe.cli import main
from stallprobe.errors import InjectError
from stallprobe.inject import read_documents
from stallprobe.inject.manifests import MAX_DEPTH
from stallprobe.inject.splice import same

GOLDEN = REPO / "tests" / "fixtures" / "inject-golden"
PYZ = GOLDEN / "fixed.pyz"
INPUTS = sorted(
    [
        *(REPO / "tests" / "fixtures" / "manifests").glob("*.yaml"),
        *(REPO / "deploy" / "examples").glob("*.yaml"),
        *(GOLDEN / "inputs").iterdir(),
    ]
)
FLAGS: dict[str, list[str]] = {
    "default": [],
    "drain-after-30": ["--drain-after", "30"],
    "state-volume": ["--state-volume"],
    "force": ["--force"],
    "all": ["--force", "--drain-after", "30", "--state-volume", "--window", "300", "--configmap", "probe-build"],
}
CASES = [(path, flags) for path in INPUTS for flags in FLAGS]


def _inject(path: Path, flags: str) -> bytes:
    """The command's whole answer as one text: stdout's bytes, then the exit code and stderr."""
    saved = sys.stdin, sys.stdout, sys.stderr
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        code = main(["inject", "-f", str(path), "--pyz", str(PYZ), *FLAGS[flags]], environ={})
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    out.flush()
    assert isinstance(out.buffer, io.BytesIO)
    return out.buffer.getvalue() + f"\n=== exit {code}, stderr:\n{err.getvalue()}".encode()


def _golden(path: Path, flags: str) -> Path:
    return GOLDEN / "out" / f"{path.name}.{flags}"


@pytest.mark.parametrize(("path", "flags"), CASES, ids=[f"{path.name}-{flags}" for path, flags in CASES])
def test_inject_writes_what_it_wrote(path: Path, flags: str) -> None:
    made = _inject(path, flags)
    assert made == _golden(path, flags).read_bytes()
    out, _, rest = made.rpartition(b"\n=== exit ")
    if rest.startswith(b"0,") and path.suffix == ".yaml":
        assert all(doc is None or "kind" in doc for doc in YAML(typ="rt").load_all(out))  # a splice that parses


def test_every_golden_file_has_its_case() -> None:
    assert sorted((GOLDEN / "out").iterdir()) == sorted(_golden(path, flags) for path, flags in CASES)


# The same documents in the styles a person, a dumper or a chart writes: indentations, and flow collections.
STYLES: dict[str, tuple[int, int, int, bool | None]] = {
    "indent-4-dash-2": (4, 4, 2, False),
    "indent-2-dash-0": (2, 2, 0, False),
    "indent-3-dash-0": (3, 3, 0, False),
    "flow": (2, 2, 0, True),
    "flow-leaves": (2, 2, 0, None),
}
RESTYLED = [
    (path, style)
    for path in INPUTS
    for style in STYLES
    if path.suffix == ".yaml" and b"exit 0," in _golden(path, "all").read_bytes()
]


def _documents(made: bytes) -> tuple[list[object], str]:
    """The documents of an answer and its log."""
    out, _, rest = made.decode().rpartition("\n=== exit ")
    return list(YAML(typ="rt").load_all(out)), rest


@pytest.mark.parametrize(("path", "style"), RESTYLED, ids=[f"{path.name}-{style}" for path, style in RESTYLED])
def test_the_splice_writes_the_same_documents_in_every_style(path: Path, style: str, tmp_path: Path) -> None:
    """What a splice writes is no longer loaded again and compared at run time: here it is, for every
    manifest rewritten in other styles (the comments kept, where they fall), against the golden output."""
    mapping, sequence, offset, flow = STYLES[style]
    writer = YAML(typ="rt")
    writer.indent(mapping=mapping, sequence=sequence, offset=offset)
    writer.default_flow_style = flow
    writer.width = 4096
    documents = list(YAML(typ="rt").load_all(path.read_text()))
    restyled = tmp_path / path.name
    with restyled.open("w") as f:
        writer.dump_all(documents, f)
    (made, log), (golden, golden_log) = (
        _documents(_inject(restyled, "all")),
        _documents(_golden(path, "all").read_bytes()),
    )
    assert same(made, golden)  # order of keys, types of scalars and all
    assert log == golden_log


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: llm-{i}  # the {i}th
spec:
  selector: {{matchLabels: {{app: llm}}}}
  template:
    metadata: {{labels: {{app: llm}}}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.11.0
          args: ["--port", "8000"]
"""


def test_the_stream_is_parsed_once_however_many_documents_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Inject into 20 Deployments and a Service: ruamel.yaml's reader is set up once for the whole run
    (every parse, compose and load goes through get_constructor_parser), not once per changed document."""
    calls: list[object] = []
    real = YAML.get_constructor_parser

    def counted(self: YAML, stream: object) -> object:
        calls.append(stream)
        return real(self, stream)

    monkeypatch.setattr(YAML, "get_constructor_parser", counted)
    service = "apiVersion: v1\nkind: Service\nmetadata:\n  name: llm  # kept as it is\n"
    path = tmp_path / "stream.yaml"
    path.write_text("---\n".join([service, *(DEPLOYMENT.format(i=i) for i in range(20))]))
    made = _inject(path, "default")
    assert len(calls) == 1
    out = made.decode().split("\n=== exit 0, stderr:\n")[0]
    assert out.startswith(service + "---\n" + DEPLOYMENT.format(i=0).split("    spec:")[0])
    assert out.count("livenessProbe:") == 20
    assert out.count("kind: ConfigMap") == 1


TWICE = "apiVersion: v1\nkind: Pod\nkind: Service\n"  # a key given twice
TWICE_ERROR = 'found duplicate key "kind" with value "Service" (original value: "Pod") (line 3, column 1)'
ALIAS_ERROR = "found undefined alias 'nowhere' (line {}, column 4)"
SYNTAX_ERROR = "expected the node content, but found '<stream end>'"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("a: 1\n---\na: *nowhere\n", ALIAS_ERROR.format(3)),
        # A document's own errors (a key twice, an undefined alias) in the order of the documents,
        (TWICE + "---\na: *nowhere\n", TWICE_ERROR),
        ("a: *nowhere\n---\n" + TWICE, ALIAS_ERROR.format(1)),
        # after the errors of the whole stream: its syntax, its limits.
        (TWICE + "---\nb: [\n", SYNTAX_ERROR),
        ("a: *nowhere\n---\nb: [\n", SYNTAX_ERROR),
        ("a: *nowhere\n---\n" + "[" * 200, f"the input nests deeper than {MAX_DEPTH} levels"),
    ],
)
def test_errors_come_in_the_order_reading_one_document_at_a_time_gave(text: str, error: str) -> None:
    with pytest.raises(InjectError) as raised:
        read_documents(text)
    assert str(raised.value).removeprefix("the input is not valid YAML: ").startswith(error)


def regenerate() -> None:
    (GOLDEN / "out").mkdir(exist_ok=True)
    for stale in (GOLDEN / "out").iterdir():
        stale.unlink()
    for path, flags in CASES:
        _golden(path, flags).write_bytes(_inject(path, flags))


if __name__ == "__main__":
    regenerate()
