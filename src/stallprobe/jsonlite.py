"""JSON as the engine's routes answer it, read without importing json where it can be: the one-level
objects vLLM's routes answer with (`{"is_paused":false}`, `{"server_load":3}`) are the question asked of a
busy engine that looks stuck, and json loads `re` with it, half the cost of such a run. Anything else goes
to json. Pure.
"""

from __future__ import annotations

__all__ = ["loads"]

_DIGITS = "0123456789"


def _scalar(token: str) -> object:
    """A JSON literal or a plain number (an integer, or one with a fraction), as json reads it; ValueError
    for anything else (the caller then leaves the text to json)."""
    if token in _LITERALS:
        return _LITERALS[token]
    whole, dot, fraction = token[1:] if token[:1] == "-" else token, "", ""
    if "." in whole:
        whole, dot, fraction = whole.partition(".")
    plain = whole and all(c in _DIGITS for c in whole) and (whole == "0" or whole[0] != "0")
    if plain and (not dot or (fraction and all(c in _DIGITS for c in fraction))):
        return float(token) if dot else int(token)
    raise ValueError(token)


_LITERALS: dict[str, object] = {"true": True, "false": False, "null": None}


def _flat(text: str) -> dict[str, object] | None:
    """One JSON object of plain scalars and strings without escapes (vLLM's `{"is_paused":false}`, its
    `{"server_load":3}`), read without json; None for anything else."""
    body = text.strip(" \t\n\r")
    if body[:1] != "{" or body[-1:] != "}" or any(c in body[1:-1] for c in "{}[]\\"):
        return None
    data: dict[str, object] = {}
    rest = body[1:-1].strip(" \t\n\r")
    while rest:
        if rest[0] != '"':
            return None
        end = rest.find('"', 1)
        key, rest = rest[1:end], rest[end + 1 :].lstrip(" \t\n\r")
        if end < 0 or rest[:1] != ":" or any(c < " " for c in key):  # json refuses control characters
            return None
        rest = rest[1:].lstrip(" \t\n\r")
        if rest[:1] == '"':
            end = rest.find('"', 1)
            if end < 0:
                return None
            text_value = rest[1:end]
            if any(c < " " for c in text_value):
                return None
            value: object = text_value
            rest = rest[end + 1 :]
        else:
            stop = rest.find(",")
            token, rest = (rest, "") if stop < 0 else (rest[:stop], rest[stop:])
            try:
                value = _scalar(token.strip(" \t\n\r"))
            except ValueError:
                return None
        data[key] = value
        rest = rest.lstrip(" \t\n\r")
        if rest[:1] == ",":
            rest = rest[1:].lstrip(" \t\n\r")
            if not rest:
                return None  # a trailing comma is not JSON
        elif rest:
            return None
    return data


def loads(text: str) -> object:
    """json.loads(text), a flat object without json (the module's note). Raises ValueError for text
    that is not JSON, nested too deeply included."""
    flat = _flat(text)
    if flat is not None:
        return flat
    import json

    try:
        return json.loads(text)
    except RecursionError:  # nesting deeper than the interpreter's stack: not an answer to read
        raise ValueError("JSON nested too deeply") from None
