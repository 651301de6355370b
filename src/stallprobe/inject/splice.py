"""A changed YAML document written as its original text with only the changed parts replaced.

inject changes little in a document: it replaces or adds a container's probes, appends an item to a list
(a volume mount, a volume, an argument, a variable) and adds a key or two. Dumping the whole document again
would re-indent every line ruamel.yaml writes in a style other than the one it picks for the document, and
drop the comments of what it replaces. So the nodes the one parse of the stream composed (manifests.py; they
give every node's position) are walked side by side with the document as inject left it; where the two
differ, only that part of the text is rewritten:

- a key inject added goes after the last line of its mapping, at the mapping's indentation;
- an item appended to a list goes after the list's last item, with the list's own dash and indentation
  (and, for a list of strings, the quotes of its last item);
- a value that changed is rewritten whole, key and all; the comments inside it (and after its key) are
  kept, as lines above it. A probe is always rewritten whole: it is one thing, not keys to mix.

Every other line keeps its bytes. What this cannot do (a flow mapping to change, an alias, a merge key) it
leaves to the caller, which dumps the document. A document whose nodes constructing it rewrote (a merge
key's, a tag's) is read again from its text, and the spliced text loaded again and compared with the
document before it is used. The others are not parsed again: what each edit writes is ruamel.yaml's own
dump of the value, and tests/test_inject_golden.py holds the splices to the bytes the checked ones gave.
"""

from __future__ import annotations

import io
import json
from bisect import bisect_right
from collections import Counter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["dump_style", "same", "splice"]

# Keys whose value is rewritten whole when it differs.
WHOLE = ("livenessProbe", "readinessProbe", "startupProbe")


class _Unsplittable(Exception):
    """This part cannot be rewritten in place."""


def same(a: Any, b: Any) -> bool:
    """Equal as YAML writes them: key order counts, 1 is not true, "1" is not 1."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False
    return isinstance(a, bool) == isinstance(b, bool) and isinstance(a, str) == isinstance(b, str) and a == b


# What _dump() wrote, by what it was given: inject writes the same probe, mount and volume into every workload
# of a stream, and dumping is most of what splicing costs. Bounded: a stream of distinct values only misses.
_DUMPED: dict[Any, list[str]] = {}
_DUMPED_MOST = 256
_SCALARS = (str, int, float, bool, type(None))


class _Uncached(Exception):
    """A value with a scalar of ruamel.yaml's own (a quoted string, a hex number): dumped, not remembered."""


def _frozen(value: Any) -> Any:
    """`value` (plain: dicts, lists and scalars) as a key that tells apart all that dumps differently."""
    kind = type(value)
    if kind is dict:
        return (dict, tuple((_frozen(key), _frozen(item)) for key, item in value.items()))
    if kind is list:
        return (list, tuple(_frozen(item) for item in value))
    if kind in _SCALARS:
        return (kind, value)
    raise _Uncached


def _plain(value: Any) -> Any:
    """A copy without ruamel.yaml's comments (they are kept in the text, not dumped twice); scalars keep
    their type, so a quoted string stays quoted."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def dump_style(node: Any) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) the document's own block collections use most,
    for ruamel.yaml's indent(): what inject writes looks like what is around it."""
    from ruamel.yaml.nodes import MappingNode, SequenceNode

    mappings: Counter[int] = Counter()
    sequences: Counter[tuple[int, int]] = Counter()
    stack = [node]
    seen: set[int] = set()
    while stack:
        top = stack.pop()
        if id(top) in seen or not isinstance(top, (MappingNode, SequenceNode)) or top.flow_style:
            continue
        seen.add(id(top))
        if isinstance(top, SequenceNode):
            stack.extend(top.value)
            continue
        for key, value in top.value:
            stack.append(value)
            if getattr(value, "flow_style", True) or not value.value:
                continue
            column = key.start_mark.column
            if isinstance(value, MappingNode):
                mappings[value.value[0][0].start_mark.column - column] += 1
            elif value.value[0].start_mark.line == value.start_mark.line:
                sequences[(value.start_mark.column - column, value.value[0].start_mark.column - column)] += 1
    mapping = next((indent for indent, _ in mappings.most_common() if indent > 0), 2)
    offset, sequence = next(((o, s) for (o, s), _ in sequences.most_common() if o >= 0 and s >= o + 2), (0, 2))
    return mapping, sequence, offset


class _Splicer:
    def __init__(self, text: str, yaml: Any, base: int = 0) -> None:
        self.text = text
        self.yaml = yaml
        self.base = base  # where `text` starts in the text the nodes' marks count in
        self.edits: list[tuple[int, int, int, str]] = []  # (start, end, order, new text)
        self.seen: set[int] = set()
        self.spans: list[tuple[int, int]] = []  # where scalars are: a `#` inside one is no comment
        self.newline = "\r\n" if "\r\n" in text else "\n"

    # --- positions

    def _note_scalars(self, root: Any) -> None:
        from ruamel.yaml.nodes import ScalarNode

        stack, seen = [root], set()
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ScalarNode):
                self.spans.append((node.start_mark.index - self.base, node.end_mark.index - self.base))
            else:
                for item in node.value:
                    stack.extend(item if isinstance(item, tuple) else (item,))
        self.spans.sort()

    def _in_scalar(self, index: int) -> bool:
        at = bisect_right(self.spans, (index, len(self.text) + 1)) - 1
        return at >= 0 and self.spans[at][0] <= index < self.spans[at][1]

    def _after_line(self, index: int) -> int:
        """Just past the end of the line `index` is on."""
        end = self.text.find("\n", index)
        return len(self.text) if end < 0 else end + 1

    def _line_start(self, index: int) -> int:
        return self.text.rfind("\n", 0, index) + 1

    def _end(self, node: Any) -> int:
        """Where the node's last character is, plus one (trailing blank lines and comments excluded)."""
        from ruamel.yaml.nodes import ScalarNode

        while not isinstance(node, ScalarNode) and not node.flow_style:
            last = node.value[-1]
            if isinstance(last, tuple):
                key, value = last
                empty = isinstance(value, ScalarNode) and value.value == "" and not value.style
                node = key if empty else value  # `key:` with nothing after it ends at the key
            else:
                node = last
        end: int = node.end_mark.index - self.base
        while end > node.start_mark.index - self.base and self.text[end - 1] in " \t\r\n":
            end -= 1
        return end

    def _comments(self, start: int, end: int) -> list[str]:
        """The comments between two positions, each as written from its `#` to the end of its line."""
        found = []
        at = self.text.find("#", start, end)
        while at >= 0:
            stop = self._after_line(at)
            if (at == 0 or self.text[at - 1] in " \t\n") and not self._in_scalar(at):
                found.append(self.text[at:stop].rstrip("\r\n"))
                at = self.text.find("#", stop, end)
            else:
                at = self.text.find("#", at + 1, end)
        return found

    def _visit(self, node: Any) -> None:
        if id(node) in self.seen:  # an alias: the same node in two places
            raise _Unsplittable
        self.seen.add(id(node))

    # --- text

    def _dump(self, value: dict[Any, Any] | list[Any]) -> list[str]:
        plain = _plain(value)
        yaml = self.yaml
        try:
            key = (
                yaml.map_indent,
                yaml.sequence_indent,
                yaml.sequence_dash_offset,
                yaml.explicit_start,
                _frozen(plain),
            )
        except _Uncached:
            key = None
        if key is None or key not in _DUMPED:
            buffer = io.StringIO()
            yaml.dump(plain, buffer)
            lines = buffer.getvalue().rstrip("\n").split("\n")
            if key is None:
                return lines
            if len(_DUMPED) >= _DUMPED_MOST:
                _DUMPED.clear()
            _DUMPED[key] = lines
        return list(_DUMPED[key])

    def _dump_item(self, item: Any) -> list[str]:
        """An item's lines as they follow its dash (the first) and its content column (the others)."""
        lines = self._dump([item])
        width = lines[0].index("-") + 1
        width += len(lines[0][width:]) - len(lines[0][width:].lstrip(" "))
        return [line[width:] for line in lines]

    def _block(self, lines: list[str], indent: int, first: str = "") -> str:
        """`lines` at `indent`, the first one after `first` (which stands in its indentation)."""
        out = [first + lines[0]] + [" " * indent + line if line else line for line in lines[1:]]
        return "".join(line + self.newline for line in out)

    def _edit(self, start: int, end: int, new: str) -> None:
        if end == len(self.text) and not self.text.endswith("\n"):
            new = new.removesuffix(self.newline)  # the file ended without a newline: so does the output
            if start == end:
                new = self.newline + new
        self.edits.append((start, end, len(self.edits), new))

    def _hoist(self, start: int, end: int, at: int) -> None:
        """Keep the comments written between `start` and `end` as lines above `at`'s line."""
        comments = self._comments(start, end)
        if comments:
            line = self._line_start(at)
            indent = len(self.text[line:at]) - len(self.text[line:at].lstrip(" "))
            self.edits.append((line, line, len(self.edits), "".join(" " * indent + c + self.newline for c in comments)))

    def _replace(self, start: int, last: Any, lines: list[str], indent: int) -> None:
        """Rewrite from `start` to the end of the line `last` ends on, keeping the comments in between."""
        end = self._after_line(self._end(last))
        self._hoist(start, end, start)
        self._edit(start, end, self._block(lines, indent))

    # --- the walk

    def mapping(self, node: Any, old: Any, new: Any) -> None:
        from ruamel.yaml.nodes import MappingNode

        if not isinstance(node, MappingNode) or node.flow_style or not isinstance(new, dict):
            raise _Unsplittable
        keys = list(old)
        if len(keys) != len(node.value) or [k for k in new if k in old] != [k for k in keys if k in new]:
            raise _Unsplittable  # a merge key, or keys in another order
        for (key_node, value_node), key in zip(node.value, keys):
            self._visit(key_node)
            self._visit(value_node)
            if key not in new:
                raise _Unsplittable  # inject removes no key
            if not same(old[key], new[key]):
                self._value(key_node, value_node, key, old[key], new[key])
        added = [key for key in new if key not in old]
        if added:
            column = node.value[0][0].start_mark.column
            lines = [line for key in added for line in self._dump({key: new[key]})]
            at = self._after_line(self._end(node))
            self._edit(at, at, self._block(lines, column, " " * column))

    def _value(self, key_node: Any, value_node: Any, key: Any, old: Any, new: Any) -> None:
        """A value that differs: changed in place where it can be (but for a probe), else rewritten."""
        mark = len(self.edits)
        try:
            if key in WHOLE:
                raise _Unsplittable
            if isinstance(old, dict) and isinstance(new, dict):
                self.mapping(value_node, old, new)
            elif isinstance(old, list) and isinstance(new, list):
                self._sequence(value_node, old, new)
            else:
                raise _Unsplittable
        except _Unsplittable:
            del self.edits[mark:]
            self._replace(
                key_node.start_mark.index - self.base, value_node, self._dump({key: new}), key_node.start_mark.column
            )

    def _sequence(self, node: Any, old: list[Any], new: list[Any]) -> None:
        from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

        if not isinstance(node, SequenceNode) or len(node.value) != len(old) or len(new) < len(old):
            raise _Unsplittable
        for item, was, now in zip(node.value, old, new):
            self._visit(item)
            if same(was, now):
                continue
            if node.flow_style:
                raise _Unsplittable
            mark = len(self.edits)
            if isinstance(was, dict) and isinstance(now, dict):
                try:
                    self.mapping(item, was, now)
                    continue
                except _Unsplittable:
                    del self.edits[mark:]
            self._replace(item.start_mark.index - self.base, item, self._dump_item(now), item.start_mark.column)
        more = new[len(old) :]
        if not more:
            return
        if node.flow_style:
            if not all(isinstance(item, str) for item in more) or not all(
                isinstance(item, ScalarNode) for item in node.value
            ):
                raise _Unsplittable
            like = node.value[-1] if node.value else None
            words = [self._flow_scalar(item, like) for item in more]
            at = self._end(like) if like is not None else node.end_mark.index - self.base - 1
            self._edit(at, at, ("" if like is None else ", ") + ", ".join(words))
            return
        first = node.value[0]
        dash = node.start_mark.column
        content = first.start_mark.column if first.start_mark.line == node.start_mark.line else dash + 2
        last = node.value[-1]
        text = ""
        for item in more:
            if isinstance(item, str) and isinstance(last, ScalarNode) and last.style in ('"', "'"):
                lines = [self._flow_scalar(item, last)]  # the quotes of the list's last string
            elif isinstance(item, dict) and isinstance(last, MappingNode) and last.flow_style:
                lines = [self._flow(item)]  # the list writes its items `{name: x, ...}`: so does this one
            else:
                lines = self._dump_item(item)
            text += self._block(lines, content, " " * dash + "-" + " " * (content - dash - 1))
        at = self._after_line(self._end(node))
        self._edit(at, at, text)

    def _flow_scalar(self, value: str, like: Any) -> str:
        """A string as one flow word, quoted as `like` (a scalar node) is."""
        style = like.style if like is not None else None
        if style == "'":
            return "'" + value.replace("'", "''") + "'"
        plain = self._dump_item(value)
        if style == '"' or len(plain) > 1 or any(char in plain[0] for char in ",[]{}#") or ": " in plain[0]:
            return json.dumps(value)  # a JSON string is a YAML double-quoted scalar
        return plain[0]

    def _flow(self, value: Any) -> str:
        """A value on one line, `{name: x, configMap: {name: y}}`, for a list written that way."""
        if isinstance(value, dict):
            return "{" + ", ".join(f"{self._flow(key)}: {self._flow(item)}" for key, item in value.items()) + "}"
        if isinstance(value, list):
            return "[" + ", ".join(self._flow(item) for item in value) + "]"
        return self._flow_scalar(value, None) if isinstance(value, str) else self._dump_item(value)[0]

    def result(self) -> str:
        out, at = [], 0
        for start, end, _, new in sorted(self.edits):
            if start < at:
                raise _Unsplittable  # two edits overlap
            out += [self.text[at:start], new]
            at = end
        return "".join([*out, self.text[at:]])


def splice(text: str, doc: Any, yaml: Any, source: tuple[Any, Any, int] | None = None) -> str | None:
    """`text`, one document as it was read, rewritten to hold `doc`, the same document as inject left it,
    changing only the lines that differ; None when that cannot be done (the caller dumps the document).
    `yaml` is the round-trip YAML instance the indentation of what is written is set on. `source` is what
    reading the stream left of the document (its root node, its value as read, where its text starts in the
    stream): without it, the text is read again."""
    if source is None:
        try:
            root, old, base = yaml.compose(text), yaml.load(text), 0
        except Exception:  # it was read once already: any failure here means, dump it
            return None
    else:
        root, old, base = source
    if root is None:
        return None
    splicer = _Splicer(text, yaml, base)
    splicer._note_scalars(root)
    mapping, sequence, offset = dump_style(root)
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    try:
        splicer.mapping(root, old, doc)
        spliced = splicer.result()
        # A document read again is one whose nodes constructing rewrote (a merge key's): the keys it merges
        # in are not where its text has them, and what the splice wrote is read back to be sure.
        again = yaml.load(spliced) if source is None else doc
    except Exception:  # _Unsplittable, or a splice that does not even parse: dump it
        return None
    return spliced if same(again, doc) else None
