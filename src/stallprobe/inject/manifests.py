"""Reading and writing manifests so that a file comes back as it went in, but for the probe.

YAML goes through ruamel.yaml's round-trip mode, the whole stream parsed once: its events are checked
against the limits below as they come, composed into one node tree per document and constructed, and the
text is cut at each document's start (from the parser's own marks, never by searching for `---`). A
document inject did not change is written back as its original text, byte for byte; a changed one as its
original text with only the changed parts rewritten (splice.py) from the nodes that one parse kept, every
other line, comment and blank line as it was. ruamel.yaml's parser is pure Python, a few ms per small
Deployment, and that parse is most of what inject costs: it is never repeated (scripts/bench-inject
measures it against LibYAML's C loader). JSON needs nothing but the standard library.

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
# resources rarely pass a few MiB, and ruamel.yaml reads about 0.5 MB/s, so 16 MiB is half a minute of
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
    """The documents read, the format ("json" or "yaml"), and for YAML the text of each document, the line
    it starts on, and what the one parse of the stream left for writing a changed document back: each
    document's composed root node (None where it must be read again from its text) and where its text starts
    in the stream (the nodes' marks count from the stream's start), and the YAML instance that composed them."""

    def __init__(
        self,
        form: str,
        docs: list[Any],
        texts: list[str],
        lines: list[int],
        *,
        nodes: list[Any] | None = None,
        starts: list[int] | None = None,
        reader: Any = None,
    ) -> None:
        self.form = form
        self.docs = docs
        self.texts = texts  # "" for a document that was not in the input
        self.lines = lines
        self.nodes = nodes or []
        self.starts = starts or []
        self.reader = reader

    def with_docs(self, docs: list[Any]) -> Manifests:
        """The same input, holding other documents: what was read of the input stays with the text it was read
        from."""
        return Manifests(
            self.form, docs, self.texts, self.lines, nodes=self.nodes, starts=self.starts, reader=self.reader
        )

    def source(self, index: int) -> tuple[Any, Any, int] | None:
        """Document `index` as it was read, for splice(): (its root node, its value as read, built again from
        the node, as inject changed the first one in place; where its text starts), or None where the node is
        unknown or was changed in the reading (a merge key's)."""
        node = self.nodes[index] if index < len(self.nodes) else None
        if node is None or self.reader is None:
            return None
        return node, self.reader.constructor.construct_document(node), self.starts[index]


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


_REPRESENTER: list[Any] = []  # the representer class, made once (ruamel.yaml imported only when needed)


def _representer() -> Any:
    """ruamel.yaml's round-trip representer, but for a plain string of several lines (the launcher inject
    ships in its ConfigMap), which it writes as a literal block (`|`), one line of YAML for each of its own,
    rather than as one quoted line of `\\n`s: a reader of the manifest reads the program that runs. A string
    read from the input keeps its own style (ruamel.yaml's types of str, each with its representer)."""
    if not _REPRESENTER:
        from ruamel.yaml.representer import RoundTripRepresenter

        class Representer(RoundTripRepresenter):
            def represent_lines(self, data: str) -> Any:
                if "\n" not in data:
                    return self.represent_str(data)
                return self.represent_scalar("tag:yaml.org,2002:str", data, style="|")

        Representer.add_representer(str, Representer.represent_lines)
        _REPRESENTER.append(Representer)
    return _REPRESENTER[0]


def _yaml() -> Any:
    try:
        from ruamel.yaml import YAML
    except ImportError:
        raise InjectError(NO_RUAMEL) from None
    yaml = YAML(typ="rt")
    yaml.Representer = _representer()
    yaml.preserve_quotes = True
    yaml.width = 4096  # a folded URL or a long word reads worse and diffs worse than a long line
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


class _Acyclic:
    """The cycle collector off while YAML is read or written: a stream's nodes and documents are a few
    hundred thousand objects, none in a cycle, that every full collection would walk again (8% of a run of
    2,000 Deployments). Put back as it was after."""

    def __enter__(self) -> None:
        import gc

        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        import gc

        if self.was:
            gc.enable()


class _Checked:
    """The parser, as the composer sees it: every event passes the limits on its way (one by one, so a
    stream that nests too deep or expands too far is stopped before anything is built from it), and where
    each document starts is noted."""

    def __init__(self, parser: Any) -> None:
        from ruamel.yaml import events

        self.events = events
        self.parser = parser
        self.check_event = parser.check_event
        self.peek_event = parser.peek_event
        self.starts: list[int] = []  # where each document's first event is
        self.merges: set[int] = set()  # the documents that may hold a merge key (`<<`), by number
        self.open: list[list[Any]] = []  # per open collection: [its anchor, its nodes so far]
        self.sizes: dict[str, int] = {}  # anchor -> how many nodes it stands for
        self.total = 0

    def get_event(self) -> Any:
        event = self.parser.get_event()
        self._check(event)
        return event

    def drain(self) -> None:
        """The rest of the stream, checked as the composer would have checked it."""
        while not self.parser.check_event(self.events.StreamEndEvent):
            self.get_event()

    def _check(self, event: Any) -> None:
        events = self.events
        if isinstance(event, events.DocumentStartEvent):
            self.starts.append(event.start_mark.index)
            return
        if isinstance(event, events.CollectionStartEvent):
            self.open.append([event.anchor, 1])
            if len(self.open) > MAX_DEPTH:
                raise InjectError(f"the input nests deeper than {MAX_DEPTH} levels, which is no manifest")
            return
        if isinstance(event, events.CollectionEndEvent):
            anchor, size = self.open.pop()
        elif isinstance(event, events.AliasEvent):
            if any(event.anchor == anchor for anchor, _ in self.open):
                raise InjectError("the input holds an alias inside its own anchor, a structure without end")
            anchor, size = None, self.sizes.get(event.anchor, 1)
        elif isinstance(event, events.NodeEvent):
            anchor, size = event.anchor, 1
            if isinstance(event, events.ScalarEvent) and (event.value in ("<<", "=") or event.tag):
                # A merge key (or a `=` key, or a tag that may make one): constructing the document
                # rewrites its nodes, so splice() reads it again from its text.
                self.merges.add(len(self.starts) - 1)
        else:
            return
        if anchor is not None:
            self.sizes[anchor] = size
        if self.open:
            self.open[-1][1] += size
        else:
            self.total += size
        if self.total > MAX_NODES or (self.open and self.open[-1][1] > MAX_NODES):
            raise InjectError(
                f"the input's aliases expand to more than {MAX_NODES} nodes (a billion laughs?), which is no manifest"
            )


def _cuts(text: str, starts: list[int]) -> list[int]:
    """Where each document's text starts: the stream's start, then each `---` line's start."""
    cuts = [0]
    for start in starts[1:]:
        # Back to the start of the line the `---` is on.
        line = text.rfind("\n", 0, start) + 1
        cuts.append(line if text[line:start].strip() == "" else start)
    return cuts


def _read_yaml(text: str) -> Manifests:
    """One parse of the whole stream: the parser's events are checked against the limits, composed into
    one node tree per document, each then constructed. The nodes are kept: a changed document is written
    back from them (splice.py), not parsed again.

    Errors come in the order reading one document at a time would give them: the stream's syntax and
    limits first (the whole stream), then each document's own (an undefined alias, a key given twice)."""
    yaml = _yaml()
    from ruamel.yaml.composer import ComposerError
    from ruamel.yaml.error import FileMark, YAMLError
    from ruamel.yaml.reader import Reader

    class Marking(Reader):
        """Marks without a reference into the text: the nodes are kept, two marks each, and a mark that
        can show its line's snippet (which no one-line error shows) is twice the size."""

        def get_mark(self) -> Any:
            return FileMark(self.name, self.index, self.line, self.column)

    yaml.Reader = Marking

    nodes: list[Any] = []
    failed: ComposerError | None = None  # a document's own error, told after those of the documents before it
    parser = None
    try:
        constructor, parser = yaml.get_constructor_parser(text)  # the reader refuses a NUL, ... here
        checked = _Checked(parser)
        yaml._parser = checked  # what the composer reads its events from
        composer = constructor.composer
        try:
            while composer.check_node():
                nodes.append(composer.get_node())
        except ComposerError as exc:  # an undefined alias
            failed = exc
            checked.drain()
    except YAMLError as exc:
        raise InjectError(f"the input is not valid YAML: {_problem(exc)}") from None
    finally:
        if parser is not None:
            parser.dispose()
    cuts = _cuts(text, checked.starts)
    texts = [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)])]
    lines = [text.count("\n", 0, cut) for cut in cuts]
    docs: list[Any] = []
    for node in nodes:
        try:
            doc = constructor.construct_document(node)
        except YAMLError as exc:  # a duplicate key, ...
            raise InjectError(f"the input is not valid YAML: {_problem(exc)}") from None
        except ValueError as exc:  # int() refuses a number of more than 4300 digits
            raise InjectError(f"the input is not valid YAML: {str(exc).split(';')[0]}") from None
        if doc is not None:
            _object(doc, len(docs) + 1)
        docs.append(doc)
    if failed is not None:
        raise InjectError(f"the input is not valid YAML: {_problem(failed)}") from None
    if not nodes:  # no document at all (nothing, or only comments): one empty document, its text the input's
        docs.append(None)
    kept = [None if number in checked.merges else node for number, node in enumerate(nodes)]
    return Manifests("yaml", docs, texts, lines, nodes=kept, starts=cuts, reader=yaml)


def read_documents(text: str) -> Manifests:
    """The manifests of a JSON or YAML stream. InjectError when the text is neither, or holds a document
    that is no Kubernetes object."""
    if _is_json(text):
        return _read_json(text)
    with _Acyclic():
        return _read_yaml(text)


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
    with _Acyclic():
        return _write_yaml(manifests, changed)


def _write_yaml(manifests: Manifests, changed: set[int]) -> str:
    import io

    from .splice import dump_style, splice

    docs = manifests.docs
    yaml = _yaml()
    out: list[str] = []
    # A document inject adds (the ConfigMap) is written as the input's first document is.
    first = next((index for index, (text, doc) in enumerate(zip(manifests.texts, docs)) if doc is not None), None)
    newline = "\r\n" if first is not None and "\r\n" in manifests.texts[first] else "\n"
    styles: dict[int | None, tuple[int, int, int]] = {}

    def style(index: int | None) -> tuple[int, int, int]:
        """The indentation document `index` uses most (the first's for a document inject adds)."""
        if index not in styles:
            node = manifests.nodes[index] if index is not None and index < len(manifests.nodes) else None
            text = manifests.texts[index] if index is not None else ""
            styles[index] = dump_style(node if node is not None else yaml.compose(text)) if text else (2, 2, 0)
        return styles[index]

    for index, doc in enumerate(docs):
        text = manifests.texts[index] if index < len(manifests.texts) else ""
        if text and index not in changed:
            out.append(text)
            continue
        if not text and doc is None:
            continue
        spliced = splice(text, doc, yaml, manifests.source(index)) if text else None
        if spliced is not None:
            out.append(spliced)
            continue
        mapping, sequence, offset = style(index if text else first)
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        yaml.explicit_start = index > 0 or text.lstrip().startswith("---")
        buffer = io.StringIO()
        yaml.dump(doc, buffer)
        if out and not out[-1].endswith("\n"):
            out.append(newline)
        out.append(buffer.getvalue().replace("\n", newline))
    return "".join(out)
