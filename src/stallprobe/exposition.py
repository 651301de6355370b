"""Reading the Prometheus text exposition format 0.0.4, as prometheus_client writes it.

Only the lines of the wanted families are looked at: the page is searched (in C, by bytes.find) for lines
that start with a wanted name, and just those lines are parsed. A page of many megabytes of histograms
therefore costs little more than the search. The format guarantees that a raw newline never occurs inside
a line (label values and HELP texts escape it as backslash-n), so "starts a line" is exact.

A family name matches exactly: the byte after the name must open the label set or be a blank, so
`vllm:num_requests_running_x` and `vllm:prompt_tokens_created` never count as what they start with.
"""

from __future__ import annotations

from .errors import MetricsError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Iterable

__all__ = ["MAX_LINE", "Series", "counter_series", "find_series", "has_samples", "is_declared", "other_spelling"]

# A label set and the sample value: one line of a family.
Series = tuple[dict[str, str], float]

_BLANKS = b" \t"
_AFTER_NAME = frozenset(b"{ \t")
# Types under which a family's own name carries the sample value. A histogram or summary writes its
# values under _bucket, _sum and _count, so a wanted name declared as one is a mistake, not a zero.
_VALUE_TYPES = (b"counter", b"gauge", b"untyped", b"unknown")


def _line_starts(page: bytes, prefix: bytes) -> Iterable[int]:
    """Offsets of every line of `page` that starts with `prefix`."""
    if page.startswith(prefix):
        yield 0
    needle = b"\n" + prefix
    at = page.find(needle)
    while at >= 0:
        yield at + 1
        at = page.find(needle, at + 1)


# A real sample line is well under 1 KiB (the longest seen: a few hundred bytes of model and adapter
# names). A wanted line far longer is hostile or broken, and parsing its label escapes one by one could
# take seconds: refuse it.
MAX_LINE = 64 * 1024


def _line_at(page: bytes, start: int, name: str) -> bytes:
    end = page.find(b"\n", start)
    if end < 0:
        end = len(page)
    if end - start > MAX_LINE:
        raise MetricsError(f"{name}: a line of {end - start} bytes, longer than {MAX_LINE}")
    line = page[start:end]
    return line[:-1] if line.endswith(b"\r") else line


def _parse_labels(line: bytes, pos: int, name: str) -> tuple[dict[str, str], int]:
    """Parse `{a="x",b="y"}` starting at the `{` at `pos`; the labels and the offset after the `}`."""
    labels: dict[str, str] = {}
    n = len(line)
    pos += 1
    while True:
        while pos < n and line[pos] in _BLANKS:
            pos += 1
        if pos < n and line[pos] == ord("}"):
            return labels, pos + 1
        eq = line.find(b"=", pos)
        open_quote = eq + 1
        while 0 < open_quote < n and line[open_quote] in _BLANKS:
            open_quote += 1
        if eq < 0 or open_quote >= n or line[open_quote] != ord('"'):
            raise MetricsError(f"{name}: malformed label set in line {_show(line)}")
        key = line[pos:eq].strip().decode("utf-8", "replace")
        labels[key], pos = _label_value(line, open_quote, name)
        while pos < n and line[pos] in _BLANKS:
            pos += 1
        if pos < n and line[pos] == ord(","):
            pos += 1
        elif not (pos < n and line[pos] == ord("}")):
            raise MetricsError(f"{name}: malformed label set in line {_show(line)}")


_ESCAPED: list[re.Pattern[bytes]] = []  # compiled on first need: `re` stays off the usual path


def _label_value(line: bytes, open_quote: int, name: str) -> tuple[str, int]:
    """The unescaped label value whose opening quote is at `open_quote`, and the offset after it."""
    quote = line.find(b'"', open_quote + 1)
    if quote < 0:
        raise MetricsError(f"{name}: unterminated label value in line {_show(line)}")
    if line.find(b"\\", open_quote + 1, quote) < 0:  # no escapes: the usual case, one search
        return line[open_quote + 1 : quote].decode("utf-8", "replace"), quote + 1
    # Escapes: \\, \" and \n; any other is kept as written, as Prometheus does. Real pages hardly have
    # them; a hostile page can have tens of thousands a line, so both finding the end and unescaping run
    # in C: a regular expression, then splitting at the escaped backslashes, so that what is left of
    # each piece has only \" and \n to undo.
    import re

    if not _ESCAPED:
        _ESCAPED.append(re.compile(rb'"((?:[^"\\]|\\.)*)"'))
    match = _ESCAPED[0].match(line, open_quote)
    if match is None:
        raise MetricsError(f"{name}: unterminated label value in line {_show(line)}")
    raw = b"\\".join(part.replace(b'\\"', b'"').replace(b"\\n", b"\n") for part in match.group(1).split(b"\\\\"))
    return raw.decode("utf-8", "replace"), match.end()


def _show(line: bytes) -> str:
    """A line, cut short, for an error message (the kubelet keeps at most 10 KiB of probe output)."""
    text = line[:120].decode("utf-8", "replace")
    return repr(text + "..." if len(line) > 120 else text)


def _sample_starts(page: bytes, raw: bytes) -> Iterable[int]:
    """Offsets of the sample lines of exactly the family `raw` (not of longer names it begins)."""
    end = len(raw)
    for start in _line_starts(page, raw):
        after = page[start + end : start + end + 1]
        if not after or after[0] in _AFTER_NAME or after in b"\r\n":
            yield start


def has_samples(page: bytes, name: str) -> bool:
    """Whether the page has a sample line of the family `name`: the first one found ends the search,
    and no line is parsed (find_series reports a bad one)."""
    return any(True for _ in _sample_starts(page, name.encode()))


def find_series(page: bytes, name: str) -> list[Series]:
    """Every sample line of the family `name`: its labels and value. Raises MetricsError on a bad line."""
    raw = name.encode()
    found: list[Series] = []
    for start in _sample_starts(page, raw):
        line = _line_at(page, start, name)
        pos = len(raw)
        labels: dict[str, str] = {}
        if pos < len(line) and line[pos] == ord("{"):
            labels, pos = _parse_labels(line, pos, name)
        fields = line[pos:].split()
        # The value, then an optional timestamp (ignored: the probe times samples by its own clock).
        if not 1 <= len(fields) <= 2:
            raise MetricsError(f"{name}: expected a value in line {_show(line)}")
        try:
            value = float(fields[0])
        except ValueError:
            raise MetricsError(f"{name}: value is not a number in line {_show(line)}") from None
        found.append((labels, value))
    return found


def other_spelling(name: str) -> str:
    """The counter's name with its `_total` suffix taken off, or put on: the other way a page may spell it."""
    return name[: -len("_total")] if name.endswith("_total") else f"{name}_total"


def counter_series(page: bytes, name: str) -> list[Series]:
    """Every sample line of the counter `name`, spelled as named or, when it has none, the other way
    (other_spelling). Text format 0.0.4 leaves the `_total` suffix to the writer: prometheus_client adds
    it, other writers do not, so `vllm:generation_tokens 42` under `# TYPE vllm:generation_tokens counter`
    is the counter the probe knows as `vllm:generation_tokens_total`. Read under one name only, never
    summed across both: a page that wrote both would count twice."""
    return find_series(page, name) or find_series(page, other_spelling(name))


def _declared_type(page: bytes, name: bytes) -> bytes | None:
    """The type a `# TYPE name ...` line gives `name`, b"" when only `# HELP` names it, else None."""
    for start in _line_starts(page, b"# TYPE " + name + b" "):
        words = _line_at(page, start, name.decode("utf-8", "replace")).split()
        return words[3] if len(words) > 3 else b"untyped"
    for _ in _line_starts(page, b"# HELP " + name + b" "):
        return b""
    return None


def is_declared(page: bytes, name: str) -> bool:
    """Whether `# TYPE` or `# HELP` declares the family `name` (a labelled metric before its first use).

    Older writers declare a counter by its base name (`# TYPE vllm:prompt_tokens counter`) and write
    its samples as `vllm:prompt_tokens_total`; that declares `name` too. A wanted name declared as a
    histogram or summary raises MetricsError: its own name never carries a value.
    """
    raw = name.encode()
    kind = _declared_type(page, raw)
    if kind is not None:
        if kind and kind not in _VALUE_TYPES:
            raise MetricsError(f"{name} is declared as a {kind.decode('ascii', 'replace')}, not a counter or gauge")
        return True
    if raw.endswith(b"_total"):
        return _declared_type(page, raw[: -len(b"_total")]) == b"counter"
    return False
