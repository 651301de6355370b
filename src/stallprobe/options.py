"""Every flag of every command in one table: its environment variable, how its value is read, its default.

The probe, `watch`, `inject` and `doctor` each take a selection of the table, and one small parser serves
them all.
It is written by hand, not with argparse, because argparse pulls in `re` and gettext, which would be most
of the probe's own start-up cost, paid every few seconds in every pod. Each value is read and checked as
it is parsed; an invalid one is a UsageError that names the flag (or the variable) and the value.
"""

from __future__ import annotations

from .detector import DEFAULT_SATURATION, DEFAULT_WINDOW
from .engines import ENGINE_NAMES
from .errors import ExitCode, UsageError
from .report import num

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import ClassVar, TypeVar

    T = TypeVar("T", bound="Settings")

__all__ = [
    "DOCTOR",
    "ENGINE_OPTIONS",
    "INJECT",
    "PROBE",
    "WATCH",
    "EngineSettings",
    "LookSettings",
    "Option",
    "Settings",
    "api_key",
    "given_flags",
    "help_lines",
    "key_source",
    "parse",
]

DEFAULT_URL = "http://127.0.0.1:8000/metrics"
# vLLM's /metrics (metrics server on the API process) answers in well under a second even when the
# engine is saturated; 3 s tolerates a CPU-starved container without outliving a sane timeoutSeconds.
DEFAULT_TIMEOUT = 3.0
# A person reading watch's table wants it fresh; the detector needs only a few samples per window. One GET
# per engine every 5 s is nothing next to what the engine serves.
DEFAULT_INTERVAL = 5.0
# Longer than a model takes to load (the README's startupProbe allows 10 minutes): a restarted engine is
# not restarted again before it could have served a request.
DEFAULT_COOLDOWN = 600.0
# A restart command (docker restart, systemctl restart) returns within a minute; five minutes is a hang.
DEFAULT_HOOK_TIMEOUT = 300.0
# Ten minutes between two canaries to an idle engine: six a day-hour, a few requests an hour, nothing
# next to real traffic. A canary that gets no answer is sent again on every run until one is answered,
# so once one fails the restart comes about window + period x (failureThreshold - 1) later, as for any
# stall.
DEFAULT_CANARY_INTERVAL = 600.0
# Readiness takes an engine out of routing when it has been busy with no progress for this long: a quarter
# of the liveness window. A false "not ready" only moves new requests to the other members for a while
# (in-flight work goes on), so it can be quick where a restart cannot; yet 30 s is far above a decode
# step, a prefill chunk, or the gap between SGLang's metric updates.
DEFAULT_DRAIN_AFTER = 30.0
# The doctor's look: ten looks, one a second, show a busy engine's counters moving (vLLM publishes every
# step, SGLang at least every few seconds), and a person at a terminal waits that long without wondering.
DEFAULT_SECONDS = 10.0
# The kubelet's defaults for a probe's period and failureThreshold; `inject` writes them.
DEFAULT_PERIOD = 10
DEFAULT_FAILURE_THRESHOLD = 3


# --- readers: (the name to blame, the text given) -> the value, or UsageError

# The largest number a seconds or count flag takes: 10^7 s is 115 days, far past any sane window or
# timeout, and far under what the system calls take (a socket timeout or a sleep of 10^10 s overflows).
MAXIMUM = 1e7


def positive(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):  # NaN fails too
        raise UsageError(f"{name} must be a number > 0 (got {_shown(text)})")
    return _at_most(name, value, text)


def non_negative(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UsageError(f"{name} must be a number >= 0 (got {_shown(text)})")
    return _at_most(name, value, text)


def count(name: str, text: str) -> int:
    # isdigit() alone takes "²"; past 4300 digits int() itself refuses (Python's guard against slow parsing).
    if not (len(text) <= 18 and text.isascii() and text.isdigit() and int(text) >= 1):
        raise UsageError(f"{name} must be a whole number >= 1 (got {_shown(text)})")
    return int(_at_most(name, int(text), text))


def _at_most(name: str, value: float, text: str) -> float:
    if value > MAXIMUM:
        raise UsageError(f"{name} must be at most {MAXIMUM:.0f} (got {_shown(text)})")
    return value


def port(name: str, text: str) -> int:
    # A TCP port: a whole number 1-65535 as written (not 8000.5, not 0, which asks the kernel for any).
    if not (len(text) <= 5 and text.isascii() and text.isdigit() and 0 < int(text) < 65536):
        raise UsageError(f"{name} must be a port number, 1-65535 (got {_shown(text)})")
    return int(text)


def switch(name: str, text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("", "0", "false", "no", "off"):
        return False
    raise UsageError(f"{name} must be 1 or 0 (got {text!r})")


# --include-waiting: which waiting requests are work the engine owes. The words, and the switch's old
# spellings (a bare flag, 1/0 in the environment), which keep their meaning.
_WAITING = {"auto": None, "always": True, "never": False}
_WAITING_ALIASES = {"": None, "1": True, "true": True, "yes": True, "on": True}
_WAITING_ALIASES.update({"0": False, "false": False, "no": False, "off": False})


def waiting_mode(name: str, text: str) -> bool | None:
    """auto (None: those waiting for capacity while nothing runs), always (True) or never (False)."""
    key = text.strip().lower()
    if key in _WAITING:
        return _WAITING[key]
    if key in _WAITING_ALIASES:
        return _WAITING_ALIASES[key]
    raise UsageError(f"{name} must be auto, always or never (got {_shown(text)})")


def waiting_word(value: bool | None) -> str:
    """The word that --include-waiting reads back as `value`."""
    return next(word for word, mode in _WAITING.items() if mode is value)


def metric_name(name: str, text: str) -> str:
    # Prometheus metric names: letters, digits, _ and :, not starting with a digit.
    ok = text and not text[0].isdigit() and all(ch.isascii() and (ch.isalnum() or ch in "_:") for ch in text)
    if not ok:
        raise UsageError(f"{name} must be a Prometheus metric name (got {text!r})")
    return text


def engine(name: str, text: str) -> str:
    if text.lower() not in ENGINE_NAMES:
        raise UsageError(f"{name} must be one of {', '.join(ENGINE_NAMES)} (got {text!r})")
    return text.lower()


def engine_label(name: str, text: str) -> str:
    # "none" (or empty) reads the page as one engine; otherwise a label name.
    return "" if text.lower() in ("", "none") else text


def url(name: str, text: str) -> str:
    from .scrape import parse_url

    try:
        parse_url(text)
    except ValueError as exc:
        raise UsageError(f"{name} {exc} (got {text!r})") from None
    return text


def nonempty(name: str, text: str) -> str:
    if not text:
        raise UsageError(f"{name} must not be empty")
    return text


def dns_name(name: str, text: str) -> str:
    if not text or len(text) > 253 or not all(ch in "abcdefghijklmnopqrstuvwxyz0123456789-." for ch in text):
        raise UsageError(f"{name} must be a DNS subdomain name (got {text!r})")
    return text


def address(name: str, text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets), for a server to listen on; port 0 picks a free one."""
    host, _, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not (len(port) <= 5 and port.isascii() and port.isdigit() and int(port) < 65536):
        raise UsageError(f"{name} must be HOST:PORT (got {_shown(text)})")
    return host, int(port)


def command(name: str, text: str) -> tuple[str, ...]:
    """A command line, split as a shell would split it (but run without one)."""
    import shlex  # only for watch's hooks: shlex loads re

    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{name} cannot be split into words: {exc} (got {text!r})") from None
    if not argv:
        raise UsageError(f"{name} must name a command (got {text!r})")
    return tuple(argv)


class Option:
    """One flag: its metavar ("" for a switch; ending in "..." when it may repeat), how its text is read,
    its default, what it means, and the environment variable the probe also reads it from."""

    __slots__ = ("_env_shown", "_shown", "bare", "default", "env", "flag", "help", "key", "metavar", "read", "short")

    def __init__(
        self,
        flag: str,
        metavar: str,
        read: Callable[[str, str], object],
        default: object,
        help: str,
        *,
        env: str = "",
        shown: str = "",
        env_shown: str = "",
        short: str = "",
        bare: str = "",
    ) -> None:
        self.flag = flag
        self.key = flag[2:].replace("-", "_")  # the name of its value in Values
        self.metavar = metavar
        self.read = read
        self.default = default
        self.help = help
        self.env = env
        self.short = short  # a one-letter alias (-f)
        # The text a flag given without a value means, for a flag whose value is optional ("" when it is
        # not): `--flag` is `--flag=BARE`; `--flag=VALUE`, or `--flag VALUE` when VALUE reads, gives one.
        self.bare = bare
        self._shown = shown
        self._env_shown = env_shown

    # Worked out when --help or the docs ask, not when the probe imports the table (a run never asks).
    @property
    def shown(self) -> str:
        """The default as --help and the docs show it."""
        if self._shown:
            return self._shown
        default = self.default
        return "off" if not self.metavar else num(default) if isinstance(default, float) else str(default)

    @property
    def env_shown(self) -> str:
        """The default for a command that reads the environment, when the environment can supply it."""
        return self._env_shown or self.shown

    @property
    def usage(self) -> str:
        """The flag as --help and the docs write it: `-f, --filename FILE`, `--include-waiting[=WHEN]`."""
        flag = f"{self.short}, {self.flag}" if self.short else self.flag
        return f"{flag}[=WHEN]" if self.bare else f"{flag} {self.metavar}".strip()

    @property
    def is_switch(self) -> bool:
        return not self.metavar and not self.bare

    @property
    def repeats(self) -> bool:
        return self.metavar.endswith("...")


_EACH_ENGINE = "the engine's"

URL = Option("--url", "URL", url, DEFAULT_URL, "the engine's Prometheus page", env="STALLPROBE_URL")
WINDOW = Option(
    "--window",
    "SECONDS",
    positive,
    DEFAULT_WINDOW,
    "busy with no progress this long is stalled",
    env="STALLPROBE_WINDOW",
)
TIMEOUT = Option(
    "--timeout",
    "SECONDS",
    positive,
    DEFAULT_TIMEOUT,
    "one deadline per scrape, connect to last byte",
    env="STALLPROBE_TIMEOUT",
)
STATE_FILE = Option(
    "--state-file",
    "PATH",
    nonempty,
    None,
    "the last sample's file",
    env="STALLPROBE_STATE_FILE",
    shown="$TMPDIR/stallprobe-<host_port_path>-<hash>.state",
)
SATURATION = Option(
    "--saturation",
    "N",
    positive,
    DEFAULT_SATURATION,
    "waiting >= N while progressing is saturated",
    env="STALLPROBE_SATURATION",
)
ENGINE = Option("--engine", "NAME", engine, "auto", ", ".join(ENGINE_NAMES), env="STALLPROBE_ENGINE")
INCLUDE_WAITING = Option(
    "--include-waiting",
    "",
    waiting_mode,
    None,
    "which waiting requests are owed work: auto (waiting for capacity, nothing running), always (bare), never",
    env="STALLPROBE_INCLUDE_WAITING",
    shown="auto",
    bare="always",
)
PROGRESS_METRIC = Option(
    "--progress-metric",
    "NAME...",
    metric_name,
    (),
    "also progress when this changes",
    env="STALLPROBE_PROGRESS_METRIC",
    shown="none",
)
RUNNING_METRIC = Option(
    "--running-metric",
    "NAME",
    metric_name,
    None,
    "gauge of running requests",
    env="STALLPROBE_RUNNING_METRIC",
    shown=_EACH_ENGINE,
)
WAITING_METRIC = Option(
    "--waiting-metric",
    "NAME",
    metric_name,
    None,
    "gauge of queued requests",
    env="STALLPROBE_WAITING_METRIC",
    shown=_EACH_ENGINE,
)
PROMPT_METRIC = Option(
    "--prompt-metric",
    "NAME",
    metric_name,
    None,
    "counter of prompt tokens",
    env="STALLPROBE_PROMPT_METRIC",
    shown=_EACH_ENGINE,
)
GENERATION_METRIC = Option(
    "--generation-metric",
    "NAME",
    metric_name,
    None,
    "counter of generated tokens",
    env="STALLPROBE_GENERATION_METRIC",
    shown=_EACH_ENGINE,
)
ENGINE_LABEL = Option(
    "--engine-label",
    "LABEL",
    engine_label,
    None,
    "label naming an engine; none: one",
    env="STALLPROBE_ENGINE_LABEL",
    shown=_EACH_ENGINE,
)
JSON = Option("--json", "", switch, False, "print JSON objects instead of lines", env="STALLPROBE_JSON")
STRICT = Option(
    "--strict",
    "",
    switch,
    False,
    "fail (exit 3, 4 or 5) when the engine's page cannot be judged, instead of asking its health route",
    env="STALLPROBE_STRICT",
)
REPORT_ONLY = Option(
    "--report-only",
    "",
    switch,
    False,
    "judge, print and keep the state, but always exit 0 (the line says what the exit would have been)",
    env="STALLPROBE_REPORT_ONLY",
)
READY = Option(
    "--ready",
    "",
    switch,
    False,
    "readiness: exit 0 unless the engine is stalled under --drain-after or the window, paused, or its health"
    " route fails",
    env="STALLPROBE_READY",
)
DRAIN_AFTER = Option(
    "--drain-after",
    "SECONDS",
    positive,
    DEFAULT_DRAIN_AFTER,
    "readiness: busy with no progress (or silent) this long is not ready, out of routing",
    env="STALLPROBE_DRAIN_AFTER",
)
CANARY = Option(
    "--canary",
    "",
    switch,
    False,
    "when the engine looks idle and nothing moved, send one 1-token completion; no answer is a stall",
    env="STALLPROBE_CANARY",
)
CANARY_INTERVAL = Option(
    "--canary-interval",
    "SECONDS",
    positive,
    DEFAULT_CANARY_INTERVAL,
    "the least time between two canaries to a healthy idle engine",
    env="STALLPROBE_CANARY_INTERVAL",
)
SERVER_LOAD = Option(
    "--server-load",
    "",
    switch,
    False,
    "when the engine looks idle, ask its HTTP requests in flight (vLLM /load)",
    env="STALLPROBE_SERVER_LOAD",
)
API_KEY_FILE = Option(
    "--api-key-file",
    "PATH",
    nonempty,
    None,
    "a file holding the API key the routes want (Authorization: Bearer)",
    env="STALLPROBE_API_KEY_FILE",
    shown="none",
    env_shown="VLLM_API_KEY or LLAMA_API_KEY when set",
)

INTERVAL = Option("--interval", "SECONDS", positive, DEFAULT_INTERVAL, "poll every this long")
ONCE = Option("--once", "", switch, False, "poll twice, one interval apart, print and exit")
ON_STALLED = Option(
    "--on-stalled",
    "CMD",
    command,
    (),
    "run CMD once per stall episode of an engine (restart it; drain the load balancer first)",
    shown="none",
)
ON_SATURATED = Option(
    "--on-saturated", "CMD", command, (), "run CMD once per saturation episode (page; never restart)", shown="none"
)
COOLDOWN = Option(
    "--cooldown", "SECONDS", non_negative, DEFAULT_COOLDOWN, "per endpoint, the least time between two runs of a hook"
)
LISTEN = Option(
    "--listen",
    "HOST:PORT",
    address,
    None,
    "serve /metrics (Prometheus) and /ready?url=URL (load balancers) while polling",
    shown="off",
)
AGENT = Option(
    "--agent",
    "HOST:PORT",
    address,
    None,
    "answer HAProxy's agent checks (agent-send: an engine's host:port or URL) while polling",
    shown="off",
)
HOOK_TIMEOUT = Option(
    "--hook-timeout", "SECONDS", positive, DEFAULT_HOOK_TIMEOUT, "kill a hook (and its process group) after this long"
)

SECONDS = Option("--seconds", "SECONDS", positive, DEFAULT_SECONDS, "look at the engine this long, once a second")

FILENAME = Option("--filename", "FILE", nonempty, "-", "the manifests (- for stdin)", short="-f")
CONTAINER = Option("--container", "NAME", nonempty, None, "inject into the container of this name only", shown="any")
PERIOD = Option("--period", "SECONDS", count, DEFAULT_PERIOD, "the probe's periodSeconds")
FAILURE_THRESHOLD = Option("--failure-threshold", "N", count, DEFAULT_FAILURE_THRESHOLD, "the probe's failureThreshold")
FORCE = Option("--force", "", switch, False, "replace any liveness probe, not just a plain /health check")
STATE_VOLUME = Option("--state-volume", "", switch, False, "keep the state in an emptyDir always")
CONFIGMAP = Option("--configmap", "NAME", dns_name, "stallprobe", "the ConfigMap that carries the probe")
PYZ = Option("--pyz", "FILE", nonempty, None, "a stallprobe.pyz to ship", shown="built from this installation")
PYTHON = Option(
    "--python",
    "PYTHON",
    nonempty,
    None,
    "also ship bytecode for this interpreter, the image's (python3.12): ~10 ms less CPU a run",
    shown="none",
)

# Half an hour for the model to load before inject's startup guard gives up: a 405B model pulled from a
# hub (~800 GB at a few GB/s) and loaded across 16 GPUs takes tens of minutes, and the guard costs nothing
# when the engine comes up sooner (it passes at the first answer of its health route). A load that hangs
# past it is restarted, as any wedge is.
DEFAULT_STARTUP_BUDGET = 1800.0
CHECK = Option(
    "--check", "", switch, False, f"write nothing; exit {ExitCode.CHANGES} when a run would change the manifests (CI)"
)
STARTUP_BUDGET = Option(
    "--startup-budget",
    "SECONDS",
    positive,
    DEFAULT_STARTUP_BUDGET,
    "the startupProbe inject adds (where nothing guards loading) waits this long for the model",
)
PRINT_PROBE = Option(
    "--print-probe", "", switch, False, "print only the container fields and the ConfigMap (needs --engine, --port)"
)
INJECT_PORT = Option("--port", "PORT", port, None, "with --print-probe: the port the engine serves on", shown="none")
OUTPUT = Option("--output", "FORMAT", nonempty, "yaml", "with --print-probe: yaml or json")

# How an engine's page is read and judged: the same for the probe, watch, and the probes inject writes.
ENGINE_OPTIONS = (
    WINDOW,
    SATURATION,
    ENGINE,
    INCLUDE_WAITING,
    PROGRESS_METRIC,
    RUNNING_METRIC,
    WAITING_METRIC,
    PROMPT_METRIC,
    GENERATION_METRIC,
    ENGINE_LABEL,
)
PROBE = (
    URL,
    TIMEOUT,
    STATE_FILE,
    *ENGINE_OPTIONS,
    API_KEY_FILE,
    CANARY,
    CANARY_INTERVAL,
    SERVER_LOAD,
    READY,
    DRAIN_AFTER,
    JSON,
    STRICT,
    REPORT_ONLY,
)
WATCH = (
    INTERVAL,
    TIMEOUT,
    *ENGINE_OPTIONS,
    API_KEY_FILE,
    CANARY,
    CANARY_INTERVAL,
    SERVER_LOAD,
    ONCE,
    JSON,
    ON_STALLED,
    ON_SATURATED,
    COOLDOWN,
    HOOK_TIMEOUT,
    LISTEN,
    AGENT,
    DRAIN_AFTER,
)
# The doctor looks at the engine as the probe would (every look option, the readiness rule's drain window
# too), and reads the probe's environment as the probe does.
DOCTOR = (URL, SECONDS, TIMEOUT, *ENGINE_OPTIONS, API_KEY_FILE, CANARY, CANARY_INTERVAL, SERVER_LOAD, DRAIN_AFTER)
# The probe's own flags that inject writes into the probes it adds, when given.
PASSED_ON = (*ENGINE_OPTIONS, CANARY, CANARY_INTERVAL, SERVER_LOAD, API_KEY_FILE, STRICT, REPORT_ONLY)
INJECT = (
    FILENAME,
    CONTAINER,
    TIMEOUT,
    *PASSED_ON,
    PERIOD,
    FAILURE_THRESHOLD,
    FORCE,
    STATE_VOLUME,
    CONFIGMAP,
    PYZ,
    PYTHON,
    DRAIN_AFTER,
    STARTUP_BUDGET,
    CHECK,
    PRINT_PROBE,
    INJECT_PORT,
    OUTPUT,
)


class Settings:
    """A command's configuration, filled from the option table: each Option's `key` is the name of the
    attribute it sets, declared with its type on the command's class, so every use site reads a typed
    attribute (`config.window`) that mypy checks, and tests/test_options.py checks that every option of
    a command has its attribute, of the type its reader returns. `given`: the keys of the options given
    (by flag or environment); `positional`: the arguments that are not options."""

    OPTIONS: ClassVar[tuple[Option, ...]] = ()

    given: frozenset[str]
    positional: tuple[str, ...]

    def __init__(self, **values: object) -> None:
        """Every option at its default, then `values` (by attribute name; a name no option has is a
        TypeError, as a wrong keyword is)."""
        for option in self.OPTIONS:
            setattr(self, option.key, option.default)
        self.given = frozenset()
        self.positional = ()
        keys = {option.key for option in self.OPTIONS}
        for key, value in values.items():
            if key not in keys and not hasattr(type(self), key):
                raise TypeError(f"{type(self).__name__} has no setting {key!r}")
            setattr(self, key, value)


class EngineSettings(Settings):
    """How an engine's page is read and judged (ENGINE_OPTIONS): the same for the probe, watch and the
    probes inject writes."""

    window: float
    saturation: float
    engine: str
    include_waiting: bool | None
    progress_metric: tuple[str, ...]
    running_metric: str | None
    waiting_metric: str | None
    prompt_metric: str | None
    generation_metric: str | None
    engine_label: str | None

    @property
    def names(self) -> dict[str, str]:
        """The family names given to override the engine's own: running, waiting, prompt, generation,
        and engine_label ("" reads the page as one engine)."""
        given = {
            "running": self.running_metric,
            "waiting": self.waiting_metric,
            "prompt": self.prompt_metric,
            "generation": self.generation_metric,
            "engine_label": self.engine_label,
        }
        return {key: name for key, name in given.items() if name is not None}


class LookSettings(EngineSettings):
    """What looking at an engine needs beyond reading its page (observe.py): the deadline, the API key,
    the questions an idle-looking engine is asked, and the readiness rule's drain window."""

    timeout: float
    api_key_file: str | None
    canary: bool
    canary_interval: float
    server_load: bool
    drain_after: float
    # The API key to send ("" for none): from api_key_file, or (the probe only) the engine's variable.
    key: str = ""


def parse(
    argv: Sequence[str],
    into: type[T],
    *,
    environ: Mapping[str, str] | None = None,
    positional: str = "",
) -> T | str:
    """The configuration `into` filled from argv (its options are `into.OPTIONS`), or "help"/"version"
    when asked. UsageError names a bad flag or value.

    `environ`: also read each option's environment variable (the flag wins; a list is comma-separated).
    `positional`: the metavar of the positional arguments; "" when the command takes none.
    """
    options = into.OPTIONS
    by_flag = {option.flag: option for option in options}
    by_flag.update({option.short: option for option in options if option.short})
    raw: dict[str, tuple[str, list[str]]] = {}  # key -> (the name to blame, the texts)
    rest: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in ("-h", "--help"):
            return "help"
        if arg == "--version":
            return "version"
        flag, eq, text = arg.partition("=")
        option = by_flag.get(flag)
        if option is None:
            if arg.startswith("-") and arg != "-":
                raise UsageError(f"unknown option {_shown(arg)}")
            if not positional:
                raise UsageError(f"unexpected argument {_shown(arg)}")
            rest.append(arg)
            continue
        if option.is_switch:
            if eq:
                raise UsageError(f"{flag} takes no value (got {_shown(arg)})")
            text = "1"
        elif option.bare and not eq:
            text = option.bare
            if i < len(args) and _reads(option, args[i]):
                text = args[i]
                i += 1
        elif not eq:
            if i >= len(args):
                raise UsageError(f"{flag} needs a value")
            text = args[i]
            i += 1
        _, texts = raw.setdefault(option.key, (option.flag, []))
        texts.append(text)
        if len(texts) > 1 and not option.repeats:
            raise UsageError(f"{option.flag} given {len(texts)} times")
    if environ is not None:
        for option in options:
            if option.env and option.key not in raw and option.env in environ:
                text = environ[option.env]
                parts = [part.strip() for part in text.split(",") if part.strip()] if option.repeats else [text]
                raw[option.key] = (option.env, parts)
    config = into()
    for option in options:
        if option.key in raw:
            name, texts = raw[option.key]
            read = [option.read(name, text) for text in texts]
            setattr(config, option.key, tuple(read) if option.repeats else read[0])
    config.given = frozenset(raw)
    config.positional = tuple(rest)
    return config


def _reads(option: Option, text: str) -> bool:
    try:
        option.read(option.flag, text)
    except UsageError:
        return False
    return not text.startswith("-")


def _shown(text: str) -> str:
    """An argument as an error line quotes it: repr, cut to 200 characters (a line stays one line)."""
    return repr(text) if len(text) <= 200 else repr(text[:200]) + "..."


# Where an engine's own container keeps its API key: vLLM reads VLLM_API_KEY, llama.cpp's server
# LLAMA_API_KEY (a comma-separated list: any one of them is accepted).
KEY_VARIABLES = ("VLLM_API_KEY", "LLAMA_API_KEY")


def key_source(path: str | None, environ: Mapping[str, str]) -> str:
    """Where api_key() takes the key from: "--api-key-file", the engine's variable that holds one, or ""."""
    if path is not None:
        return "--api-key-file"
    return next((variable for variable in KEY_VARIABLES if environ.get(variable, "").strip()), "")


def api_key(path: str | None, environ: Mapping[str, str]) -> str:
    """The API key to send (the file at `path`, else the engine's own variable in `environ`), "" when
    there is none. UsageError when the file cannot be read or holds no usable key; the key itself is
    never shown."""
    name = key_source(path, environ)
    if path is not None:
        try:
            with open(path, "rb") as f:
                text = f.read(4097).decode("utf-8", "replace")
        except OSError as exc:
            raise UsageError(f"{name} {path}: {exc.strerror}") from None
        key = text.strip()
    else:
        key = environ[name].split(",")[0].strip() if name else ""
    if (name and not key) or len(key) > 4096 or not all(" " < ch < "\x7f" for ch in key):
        raise UsageError(f"{name} must hold one API key of printable ASCII characters (the key is not shown)")
    return key


def given_flags(config: Settings, options: Sequence[Option], *, leave_out: Sequence[str] = ()) -> list[str]:
    """The options of `options` that `config` was given (by flag or environment), as a command line
    gives them to the probe, but for the flags in `leave_out`: what a printed probe command carries over."""
    args: list[str] = []
    for option in options:
        if option.key not in config.given or option.flag in leave_out:
            continue
        value = getattr(config, option.key)
        if option.is_switch:
            args += [option.flag] if value else []
        elif option.bare:  # --include-waiting: its word, in the one form that cannot be misread
            args.append(f"{option.flag}={waiting_word(value)}")
        elif option.repeats:
            for word in value:
                args += [option.flag, word]
        else:
            args += [option.flag, num(value) if isinstance(value, float) else (str(value) or "none")]
    return args


def help_lines(options: Sequence[Option], *, environment: bool = True) -> list[str]:
    """One line per option for --help: flag and metavar, the environment variable, meaning and default."""
    lines = []
    for option in options:
        left = option.usage
        env = f"{option.env:29} " if environment else ""
        shown = option.env_shown if environment else option.shown
        lines.append(f"  {left:27} {env}{option.help} (default {shown})")
    pad = " " * 30 if environment else ""
    lines.append(f"  {'-h, --help':27} {pad}show this help and exit")
    lines.append(f"  {'--version':27} {pad}print the version and exit")
    return lines


def help_page(
    command: str,
    head: str,
    options: Sequence[Option],
    *,
    environment: bool,
    title: str = "",
    arguments: Sequence[str] = (),
) -> str:
    """A command's --help: its usage and description (`head`), its arguments, its options (with their
    environment variables when it reads them) and its exit codes, from the one table."""
    from .errors import exit_lines

    lines = [head, ""]
    if arguments:
        lines += ["arguments:", *arguments, ""]
    lines += [f"options ({title}):" if title else "options:", *help_lines(options, environment=environment)]
    lines += ["", "exit codes:", *exit_lines(command)]
    return "\n".join(lines)
