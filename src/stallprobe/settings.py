"""A command's typed configuration, filled from the option table (options.py) by the one parser: argv,
then the environment for the commands that read it.
"""

from __future__ import annotations

from .errors import UsageError
from .readers import shown, waiting_word
from .report import num
from .switches import TRUE_WORDS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import ClassVar, TypeVar

    from .options import Option

    T = TypeVar("T", bound="Settings")

__all__ = ["EngineSettings", "LookSettings", "Settings", "given_flags", "parse", "switches"]


class Settings:
    """A command's configuration, filled from the option table: each Option's `attribute` names the
    attribute it sets, declared with its type on the command's class, so every use site reads a typed
    attribute (`config.window`) that mypy checks, and tests/test_options.py checks that every option of
    a command has its attribute, of the type its reader returns. `given`: the attributes of the options
    given (by flag or environment); `positional`: the arguments that are not options."""

    OPTIONS: ClassVar[tuple[Option, ...]] = ()

    given: frozenset[str]
    positional: tuple[str, ...]

    def __init__(self, **values: object) -> None:
        """Every option at its default, then `values` (by attribute name; a name no option has is a
        TypeError, as a wrong keyword is)."""
        for option in self.OPTIONS:
            setattr(self, option.attribute, option.default)
        self.given = frozenset()
        self.positional = ()
        attributes = {option.attribute for option in self.OPTIONS}
        for attribute, value in values.items():
            if attribute not in attributes and not hasattr(type(self), attribute):
                raise TypeError(f"{type(self).__name__} has no setting {attribute!r}")
            setattr(self, attribute, value)

    def verify(self) -> None:
        """The command's rules across its flags, checked by the parser once every flag is read: UsageError
        when two given flags contradict each other (none here; a command's class adds its own)."""


class EngineSettings(Settings):
    """How an engine's page is read and judged (ENGINE_OPTIONS): the same for the probe, watch and the
    probes inject writes."""

    window: float
    saturation: float
    thrash_window: float
    fail_thrashing_after: float | None
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
    when asked. UsageError names a bad flag or value, and carries the switches that were given (`settings`:
    --json and --report-only say how the error itself is told).

    `environ`: also read each option's environment variable (the flag wins; a list is comma-separated).
    `positional`: the metavar of the positional arguments; "" when the command takes none.
    """
    try:
        return _parse(argv, into, environ, positional)
    except UsageError as exc:
        exc.settings = switches(argv, into, environ)
        raise


def switches(argv: Sequence[str], into: type[T], environ: Mapping[str, str] | None = None) -> T:
    """A configuration of `into` with only its switches read (a word of argv that is the switch's flag, or
    its environment variable set true), every other option at its default: what a command line that does
    not parse still says of how its error is told."""
    config = into()
    for option in into.OPTIONS:
        if not option.is_switch:
            continue
        given = option.flag in argv
        if not given and environ is not None and option.env:
            given = environ.get(option.env, "").strip().lower() in TRUE_WORDS
        if given:
            setattr(config, option.attribute, True)
    return config


def _parse(argv: Sequence[str], into: type[T], environ: Mapping[str, str] | None, positional: str) -> T | str:
    options = into.OPTIONS
    by_flag = {option.flag: option for option in options}
    by_flag.update({option.short: option for option in options if option.short})
    raw: dict[str, tuple[str, list[str]]] = {}  # attribute -> (the name to blame, the texts)
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
                raise UsageError(f"unknown option {shown(arg)}")
            if not positional:
                raise UsageError(f"unexpected argument {shown(arg)}")
            rest.append(arg)
            continue
        if option.is_switch:
            if eq:
                raise UsageError(f"{flag} takes no value (got {shown(arg)})")
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
        _, texts = raw.setdefault(option.attribute, (option.flag, []))
        texts.append(text)
        if len(texts) > 1 and not option.repeats:
            raise UsageError(f"{option.flag} given {len(texts)} times")
    if environ is not None:
        for option in options:
            if option.env and option.attribute not in raw and option.env in environ:
                text = environ[option.env]
                parts = [part.strip() for part in text.split(",") if part.strip()] if option.repeats else [text]
                raw[option.attribute] = (option.env, parts)
    config = into()
    for option in options:
        if option.attribute in raw:
            name, texts = raw[option.attribute]
            read = [option.read(name, text) for text in texts]
            setattr(config, option.attribute, tuple(read) if option.repeats else read[0])
    config.given = frozenset(raw)
    config.positional = tuple(rest)
    config.verify()
    return config


def _reads(option: Option, text: str) -> bool:
    try:
        option.read(option.flag, text)
    except UsageError:
        return False
    return not text.startswith("-")


def given_flags(config: Settings, options: Sequence[Option], *, leave_out: Sequence[str] = ()) -> list[str]:
    """The options of `options` that `config` was given (by flag or environment), as a command line
    gives them to the probe, but for the flags in `leave_out`: what a printed probe command carries over."""
    args: list[str] = []
    for option in options:
        if option.attribute not in config.given or option.flag in leave_out:
            continue
        value = getattr(config, option.attribute)
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
