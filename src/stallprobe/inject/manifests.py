"""Reading and writing manifests so that a file comes back as it went in, but for the probe.

YAML goes through ruamel.yaml's round-trip mode, one document at a time: the text is cut at each
document's start (from the parser's own marks, never by searching for `---`). A document inject did not
change is written back as its original text, byte for byte; a changed one as its original text with only
the changed parts rewritten (splice.py), every other line, comment and blank line as it was. JSON needs
nothing but the standard library.

The input is checked before anything builds on it, each a clear error rather than a hang, a traceback or
a machine out of memory: UTF-8 text, at most MAX_BYTES; nested at most MAX_DEPTH deep; its aliases (YAML's
`&anchor` and `*alias`) expanding to at most MAX_NODES nodes, which stops a "billion laughs" of a few KB
that stands for billions of nodes; no key twice in a mapping; every document a mapping (a Kubernetes
object) or empty.
"""

from __future__ import annotations

import json

from ..errors import InjectError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "Manifests",
    "decode",
    "dump_yaml",
    "read_documents",
    "write_documents",
]

# Kubernetes caps one object at 1.5 MiB (etcd's request limit); a chart's render or a kustomization's
# resources rarely pass a few MiB, and ruamel.yaml reads about 0.2 MB/s, so 16 MiB is over a minute of
# work already: more is a mistake (`-f /dev/zero`, the wrong file).
MAX_BYTES = 16 * 1024 * 1024
# A Pod is about 12 levels deep, a CRD's schema 30; past 100 is no manifest, and deep enough nesting would
# exhaust the recursion of any reader (ruamel.yaml's, the json module's).
MAX_DEPTH = 100
# Every node of the documents counted as often as aliases repeat it: 16 MiB of plain YAML holds about a
# million nodes, so a million more through aliases is room for any real use of anchors.
MAX_NODES = 1_000_000
NO_RUAMEL = (
    "YAML input needs ruamel.yaml, which this stallprobe runs without (the single-file build carries none): "
    "pip install stallprobe, or give the manifests as JSON"
)


class Manifests:
    """The documents read, the format ("json" or "yaml"), and for YAML the text of each document and the
    line it starts on."""

    def __init__(self, form: str, docs: list[Any], texts: list[str], lines: list[int]) -> None:
        self.form = form
        self.docs = docs
        self.texts = texts  # "" for a document that was not in the input
        self.lines = lines


def decode(data: bytes) -> str:
    """The input as text: UTF-8 (a byte order mark is read past), at most MAX_BYTES."""
    if len(data) > MAX_BYTES:
        raise InjectError(f"the input is larger than {MAX_BYTES // (1024 * 1024)} MiB, which is no manifest")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InjectError(f"the input is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    return text.removeprefix("\ufeff")


def _is_json(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def _yaml() -> Any:
    try:
        from ruamel.yaml import YAML
    except ImportError:
        raise InjectError(NO_RUAMEL) from None
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # a folded `-c` program or URL reads worse and diffs worse than a long line
    return yaml


def dump_yaml(value: Any) -> str:
    import io

    buffer = io.StringIO()
    _yaml().dump(value, buffer)
    return buffer.getvalue()


def _problem(exc: Exception, line: int = 0) -> str:
    """A ruamel.yaml error in one line: what, and where in the whole input."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if problem and mark is not None:
        return f"{problem} (line {mark.line + 1 + line}, column {mark.column + 1})"
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _kind(value: Any) -> str:
    kinds = ((bool, "true or false"), ((int, float), "a number"), (str, "a string"), (list, "a list"))
    return next((kind for types, kind in kinds if isinstance(value, types)), "null" if value is None else "a value")


def _object(doc: Any, number: int) -> None:
    if not isinstance(doc, dict):
        raise InjectError(
            f"document {number} is {_kind(doc)}, not a Kubernetes object (a mapping with apiVersion and kind)"
        )


# --- JSON


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping: dict[str, Any] = {}
    for key, value in pairs:
        if key in mapping:
            raise InjectError(f"the input is not valid JSON: the key {key!r} is given twice in one object")
        mapping[key] = value
    return mapping


def _depth(value: Any) -> int:
    """How deep a JSON value nests (without recursion: the value may be as deep as the decoder allowed)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _read_json(text: str) -> Manifests:
    decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates)
    docs: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return Manifests("json", docs, [], [])
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except RecursionError:
            raise InjectError(f"the input nests deeper than {MAX_DEPTH} levels, which is no manifest") from None
        except ValueError as exc:  # JSONDecodeError, and int()'s refusal of a number of 4300 digits
            raise InjectError(f"the input is not valid JSON: {str(exc).split(';')[0]}") from None
        if _depth(doc) > MAX_DEPTH:
            raise InjectError(f"the input nests deeper than {MAX_DEPTH} levels, which is no manifest")
        for item in doc if isinstance(doc, list) else [doc]:
            _object(item, len(docs) + 1)
            docs.append(item)


# --- YAML


def _scan(text: str) -> list[int]:
    """Where each document of the stream starts (from the parser's events, which come one by one: a
    stream that nests too deep or expands too far is stopped before anything is built from it)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.events import (
        AliasEvent,
        CollectionEndEvent,
        CollectionStartEvent,
        DocumentStartEvent,
        NodeEvent,
    )

    starts: list[int] = []
    open_: list[list[Any]] = []  # per open collection: [its anchor, its nodes so far]
    sizes: dict[str, int] = {}  # anchor -> how many nodes it stands for
    total = 0
    try:
        for event in YAML(typ="rt").parse(text):
            if isinstance(event, DocumentStartEvent):
                starts.append(event.start_mark.index)
                continue
            if isinstance(event, CollectionStartEvent):
                open_.append([event.anchor, 1])
                if len(open_) > MAX_DEPTH:
                    raise InjectError(f"the input nests deeper than {MAX_DEPTH} levels, which is no manifest")
                continue
            if isinstance(event, CollectionEndEvent):
                anchor, size = open_.pop()
            elif isinstance(event, AliasEvent):
                if any(event.anchor == anchor for anchor, _ in open_):
                    raise InjectError("the input holds an alias inside its own anchor, a structure without end")
                anchor, size = None, sizes.get(event.anchor, 1)
            elif isinstance(event, NodeEvent):
                anchor, size = event.anchor, 1
            else:
                continue
            if anchor is not None:
                sizes[anchor] = size
            if open_:
                open_[-1][1] += size
            else:
                total += size
            if total > MAX_NODES or (open_ and open_[-1][1] > MAX_NODES):
                raise InjectError(
                    f"the input's aliases expand to more than {MAX_NODES} nodes (a billion laughs?), "
                    "which is no manifest"
                )
    except YAMLError as exc:
        raise InjectError(f"the input is not valid YAML: {_problem(exc)}") from None
    cuts = [0]
    for start in starts[1:]:
        # Back to the start of the line the `---` is on.
        line = text.rfind("\n", 0, start) + 1
        cuts.append(line if text[line:start].strip() == "" else start)
    return cuts


def _read_yaml(text: str) -> Manifests:
    yaml = _yaml()
    from ruamel.yaml.error import YAMLError

    cuts = _scan(text)
    texts = [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)])]
    lines = [text.count("\n", 0, cut) for cut in cuts]
    docs: list[Any] = []
    for piece, line in zip(texts, lines):
        try:
            doc = yaml.load(piece)
        except YAMLError as exc:  # a duplicate key, an undefined alias, ...
            raise InjectError(f"the input is not valid YAML: {_problem(exc, line)}") from None
        except ValueError as exc:  # int() refuses a number of more than 4300 digits
            raise InjectError(f"the input is not valid YAML: {str(exc).split(';')[0]}") from None
        if doc is not None:
            _object(doc, len(docs) + 1)
        docs.append(doc)
    return Manifests("yaml", docs, texts, lines)


def read_documents(text: str) -> Manifests:
    """The manifests of a JSON or YAML stream. InjectError when the text is neither, or holds a document
    that is no Kubernetes object."""
    return _read_json(text) if _is_json(text) else _read_yaml(text)


# --- writing


def _listed(docs: list[Any]) -> list[Any]:
    out = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out.extend(doc["items"])
        elif doc is not None:
            out.append(doc)
    return out


def write_documents(manifests: Manifests, changed: set[int]) -> str:
    """The documents as text: unchanged YAML as it was read, changed YAML spliced into its text (or dumped
    whole where it cannot be); JSON as one object."""
    docs = manifests.docs
    if manifests.form == "json":
        # One JSON object: the document itself when there is one, else a List that kubectl applies.
        whole = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List", "items": _listed(docs)}
        return json.dumps(whole, indent=2) + "\n"
    import io

    from .splice import dump_style, splice

    yaml = _yaml()
    out: list[str] = []
    # A document inject adds (the ConfigMap) is written as the input's first document is.
    first = next((text for text, doc in zip(manifests.texts, docs) if doc is not None), "")
    newline = "\r\n" if "\r\n" in first else "\n"
    for index, doc in enumerate(docs):
        text = manifests.texts[index] if index < len(manifests.texts) else ""
        if text and index not in changed:
            out.append(text)
            continue
        if not text and doc is None:
            continue
        spliced = splice(text, doc, yaml) if text else None
        if spliced is not None:
            out.append(spliced)
            continue
        mapping, sequence, offset = dump_style(yaml.compose(text or first)) if text or first else (2, 2, 0)
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        yaml.explicit_start = index > 0 or text.lstrip().startswith("---")
        buffer = io.StringIO()
        yaml.dump(doc, buffer)
        if out and not out[-1].endswith("\n"):
            out.append(newline)
        out.append(buffer.getvalue().replace("\n", newline))
    return "".join(out)
