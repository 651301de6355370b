"""Reading and writing manifests so that a file comes back as it went in, but for the probe.

YAML goes through ruamel.yaml's round-trip mode (comments, key order, quotes and block scalars kept), one
document at a time: the text is cut at each document's start (from the parser's own marks, never by
searching for `---`), and a document inject did not change is written back as its original text, byte
for byte, comments and comment-only documents included. A changed document is dumped by ruamel.yaml with
the indentation it had. JSON needs nothing but the standard library.
"""

from __future__ import annotations

import json

from ..errors import InjectError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

__all__ = ["Manifests", "read_documents", "write_documents"]

NEEDS = "YAML input needs ruamel.yaml: pip install 'stallprobe[kube]' (JSON input works without it)"


class Manifests:
    """The documents read, the format ("json" or "yaml"), and for YAML the text of each document and
    the indentation to write a changed one with."""

    def __init__(self, form: str, docs: list[Any], texts: list[str], indents: list[tuple[int, int, int]]) -> None:
        self.form = form
        self.docs = docs
        self.texts = texts  # "" for a document that was not in the input
        self.indents = indents


def _is_json(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def _yaml() -> Any:
    try:
        from ruamel.yaml import YAML
    except ImportError:
        raise InjectError(NEEDS) from None
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # a folded `-c` program or URL reads worse and diffs worse than a long line
    return yaml


def _cuts(text: str) -> list[int]:
    """Where each document of the stream starts (the first at 0): at its `---` when it has one."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.events import DocumentStartEvent

    try:
        starts = [e.start_mark.index for e in YAML(typ="rt").parse(text) if isinstance(e, DocumentStartEvent)]
    except YAMLError as exc:
        raise InjectError(f"the input is not valid YAML: {str(exc).splitlines()[0]}") from None
    cuts = [0]
    for start in starts[1:]:
        # Back to the start of the line the `---` is on.
        line = text.rfind("\n", 0, start) + 1
        cuts.append(line if text[line:start].strip() == "" else start)
    return cuts


def _indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, sequence dash offset) the document is written with."""
    from ruamel.yaml.util import load_yaml_guess_indent

    try:
        _, indent, offset = load_yaml_guess_indent(text)
    except Exception:  # ruamel raises a variety of errors on odd documents; the default serves
        return (2, 2, 0)
    indent = indent or 2
    offset = offset or 0
    return (indent if offset == 0 else indent - offset if indent > offset else 2, indent, offset)


def read_documents(text: str) -> Manifests:
    """The manifests of a JSON or YAML stream. InjectError when the text is neither."""
    if _is_json(text):
        decoder = json.JSONDecoder()
        docs: list[Any] = []
        pos = 0
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                return Manifests("json", docs, [], [])
            try:
                doc, pos = decoder.raw_decode(text, pos)
            except ValueError as exc:
                raise InjectError(f"the input is not valid JSON: {exc}") from None
            docs.extend(doc if isinstance(doc, list) else [doc])
    yaml = _yaml()
    from ruamel.yaml.error import YAMLError

    cuts = _cuts(text)
    texts = [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)])]
    docs = []
    indents = []
    for piece in texts:
        try:
            doc = yaml.load(piece)
        except YAMLError as exc:
            raise InjectError(f"the input is not valid YAML: {str(exc).splitlines()[0]}") from None
        docs.append(doc)
        indents.append(_indent(piece) if doc is not None else (2, 2, 0))
    return Manifests("yaml", docs, texts, indents)


def _listed(docs: list[Any]) -> list[Any]:
    out = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out.extend(doc["items"])
        elif doc is not None:
            out.append(doc)
    return out


def write_documents(manifests: Manifests, changed: set[int], out: TextIO) -> None:
    """Write the documents: unchanged YAML as its original text, changed ones dumped; JSON as one object."""
    docs = manifests.docs
    if manifests.form == "json":
        # One JSON object: the document itself when there is one, else a List that kubectl applies.
        whole = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": _listed(docs)}
        out.write(json.dumps(whole, indent=2) + "\n")
        return
    import io

    yaml = _yaml()
    for index, doc in enumerate(docs):
        text = manifests.texts[index] if index < len(manifests.texts) else ""
        if text and index not in changed:
            out.write(text)
            continue
        if not text and doc is None:
            continue
        mapping, sequence, offset = manifests.indents[index] if index < len(manifests.indents) else (2, 2, 0)
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        yaml.explicit_start = index > 0 or text.lstrip().startswith("---")
        buffer = io.StringIO()
        yaml.dump(doc, buffer)
        out.write(buffer.getvalue())
