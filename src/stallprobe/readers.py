"""How each flag's text becomes its value: one reader a kind of value, each `(the name to blame, the text
given) -> the value`, or a UsageError that names the flag (or the variable) and quotes the value.
"""

from __future__ import annotations

from .engines import ENGINE_NAMES
from .errors import UsageError
from .switches import FALSE_WORDS, TRUE_WORDS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "MAXIMUM",
    "expand_url",
    "host_reference",
    "read_address",
    "read_command",
    "read_count",
    "read_dns_name",
    "read_engine",
    "read_engine_label",
    "read_metric_name",
    "read_non_negative",
    "read_nonempty",
    "read_output_format",
    "read_port",
    "read_positive",
    "read_sha256",
    "read_switch",
    "read_url",
    "read_variable_name",
    "read_waiting",
    "shown",
    "waiting_word",
]

# The largest number a seconds or count flag takes: 10^7 s is 115 days, far past any sane window or
# timeout, and far under what the system calls take (a socket timeout or a sleep of 10^10 s overflows).
MAXIMUM = 1e7


def read_positive(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):  # NaN fails too
        raise UsageError(f"{name} must be a number > 0 (got {shown(text)})")
    return _at_most(name, value, text)


def read_non_negative(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UsageError(f"{name} must be a number >= 0 (got {shown(text)})")
    return _at_most(name, value, text)


def read_count(name: str, text: str) -> int:
    # isdigit() alone takes "²"; past 4300 digits int() itself refuses (Python's guard against slow parsing).
    if not (len(text) <= 18 and text.isascii() and text.isdigit() and int(text) >= 1):
        raise UsageError(f"{name} must be a whole number >= 1 (got {shown(text)})")
    return int(_at_most(name, int(text), text))


def _at_most(name: str, value: float, text: str) -> float:
    if value > MAXIMUM:
        raise UsageError(f"{name} must be at most {MAXIMUM:.0f} (got {shown(text)})")
    return value


def read_port(name: str, text: str) -> int:
    # A TCP port: a whole number 1-65535 as written (not 8000.5, not 0, which asks the kernel for any).
    if not (len(text) <= 5 and text.isascii() and text.isdigit() and 0 < int(text) < 65536):
        raise UsageError(f"{name} must be a port number, 1-65535 (got {shown(text)})")
    return int(text)


def read_switch(name: str, text: str) -> bool:
    if text.lower() in TRUE_WORDS:
        return True
    if text.lower() in FALSE_WORDS:
        return False
    raise UsageError(f"{name} must be 1 or 0 (got {text!r})")


# --include-waiting: which waiting requests are work the engine owes. The words, and the switch's old
# spellings (a bare flag, 1/0 in the environment), which keep their meaning.
_WAITING = {"auto": None, "always": True, "never": False}
_WAITING_ALIASES: dict[str, bool | None] = {"": None, **dict.fromkeys(TRUE_WORDS, True)}
_WAITING_ALIASES.update(dict.fromkeys(FALSE_WORDS[1:], False))


def read_waiting(name: str, text: str) -> bool | None:
    """auto (None: those waiting for capacity while nothing runs), always (True) or never (False)."""
    key = text.strip().lower()
    if key in _WAITING:
        return _WAITING[key]
    if key in _WAITING_ALIASES:
        return _WAITING_ALIASES[key]
    raise UsageError(f"{name} must be auto, always or never (got {shown(text)})")


def waiting_word(value: bool | None) -> str:
    """The word that --include-waiting reads back as `value`."""
    return next(word for word, mode in _WAITING.items() if mode is value)


def read_metric_name(name: str, text: str) -> str:
    # Prometheus metric names: letters, digits, _ and :, not starting with a digit.
    ok = text and not text[0].isdigit() and all(ch.isascii() and (ch.isalnum() or ch in "_:") for ch in text)
    if not ok:
        raise UsageError(f"{name} must be a Prometheus metric name (got {text!r})")
    return text


def read_variable_name(name: str, text: str) -> str:
    # An environment variable's name as a container spec allows it: letters, digits, _ . -; no leading digit.
    ok = text and not text[0].isdigit() and all(ch.isascii() and (ch.isalnum() or ch in "_.-") for ch in text)
    if not ok:
        raise UsageError(f"{name} must be an environment variable's name (got {shown(text)})")
    return text


def read_engine(name: str, text: str) -> str:
    if text.lower() not in ENGINE_NAMES:
        raise UsageError(f"{name} must be one of {', '.join(ENGINE_NAMES)} (got {text!r})")
    return text.lower()


def read_engine_label(name: str, text: str) -> str:
    # "none" (or empty) reads the page as one engine; otherwise a label name.
    return "" if text.lower() in ("", "none") else text


def read_url(name: str, text: str) -> str:
    from .urls import parse_url

    variable = host_reference(text)
    if variable:
        read_variable_name(f"{name}'s host $(...)", variable)
    try:
        parse_url(text.replace(f"$({variable})", "host", 1) if variable else text)
    except ValueError as exc:
        hint = ""
        if text.lower().startswith(("http://:", "http:///")):
            # What a probe's command gets from the kubelet for $(POD_IP): it expands a variable set by
            # valueFrom (the pod's address) to nothing.
            hint = "; for the pod's address write $$(NAME) in the manifest: the kubelet expands $(NAME) there"
        raise UsageError(f"{name} {exc} (got {text!r}){hint}") from None
    return text


def host_reference(url: str) -> str:
    """NAME when the URL's host is `$(NAME)` (the pod's address, read at run time), else ""."""
    rest = url.partition("://")[2]
    return rest[2 : rest.find(")")] if rest.startswith("$(") and ")" in rest else ""


def expand_url(name: str, url: str, environ: Mapping[str, str]) -> str:
    """The URL with a `$(NAME)` host replaced by the variable's value in `environ` (an IPv6 address in
    brackets): how the probe reaches an engine bound to the pod's address, which the manifest can only
    name (`valueFrom: {fieldRef: {fieldPath: status.podIP}}`), and the kubelet does not expand in a
    probe's command. UsageError when the variable is unset, empty, or not an address."""
    variable = host_reference(url)
    if not variable:
        return url
    value = environ.get(variable, "").strip()
    if not value:
        raise UsageError(f"{name}'s host $({variable}) cannot be read: {variable} is not set in the environment")
    host = f"[{value}]" if ":" in value else value
    expanded = url.replace(f"$({variable})", host, 1)
    from .urls import parse_url

    try:
        parse_url(expanded)
    except ValueError:
        raise UsageError(f"{name}'s host $({variable}) is {shown(value)}, not an address") from None
    return expanded


def read_nonempty(name: str, text: str) -> str:
    if not text:
        raise UsageError(f"{name} must not be empty")
    return text


def read_output_format(name: str, text: str) -> str:
    if text not in ("yaml", "json"):
        raise UsageError(f"{name} must be yaml or json (got {shown(text)})")
    return text


def read_sha256(name: str, text: str) -> str:
    """A sha256 in hex, as sha256sum prints it (either case; kept lower)."""
    value = text.strip().lower()
    if len(value) != 64 or not all(ch in "0123456789abcdef" for ch in value):
        raise UsageError(f"{name} must be a sha256: 64 hexadecimal digits (got {shown(text)})")
    return value


def read_dns_name(name: str, text: str) -> str:
    if not text or len(text) > 253 or not all(ch in "abcdefghijklmnopqrstuvwxyz0123456789-." for ch in text):
        raise UsageError(f"{name} must be a DNS subdomain name (got {text!r})")
    return text


def read_address(name: str, text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets), for a server to listen on; port 0 picks a free one."""
    host, _, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not (len(port) <= 5 and port.isascii() and port.isdigit() and int(port) < 65536):
        raise UsageError(f"{name} must be HOST:PORT (got {shown(text)})")
    return host, int(port)


def read_command(name: str, text: str) -> tuple[str, ...]:
    """A command line, split as a shell would split it (but run without one)."""
    import shlex  # only for watch's hooks: shlex loads re

    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{name} cannot be split into words: {exc} (got {text!r})") from None
    if not argv:
        raise UsageError(f"{name} must name a command (got {text!r})")
    return tuple(argv)


def shown(text: str) -> str:
    """An argument as an error line quotes it: repr, cut to 200 characters (a line stays one line)."""
    return repr(text) if len(text) <= 200 else repr(text[:200]) + "..."
