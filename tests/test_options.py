"""The option table fills one typed configuration per command: every option of a command sets an attribute
its configuration class declares, of the type its reader returns, so no use site reads a string key."""

from __future__ import annotations

import typing

import pytest

from stallprobe import options, readers, settings
from stallprobe.doctor import DoctorConfig
from stallprobe.errors import UsageError
from stallprobe.inject.command import InjectConfig
from stallprobe.options import Option
from stallprobe.probe import Config as ProbeConfig
from stallprobe.settings import Settings, parse
from stallprobe.watch.poll import WatchConfig

COMMANDS: list[type[Settings]] = [ProbeConfig, WatchConfig, InjectConfig, DoctorConfig]
assert COMMANDS

# What each reader returns (its value's type; a repeating option holds a tuple of them).
READS: dict[object, object] = {
    readers.read_positive: float,
    readers.read_non_negative: float,
    readers.read_count: int,
    readers.read_port: int,
    readers.read_switch: bool,
    readers.read_metric_name: str,
    readers.read_engine: str,
    readers.read_engine_label: str,
    readers.read_url: str,
    readers.read_nonempty: str,
    readers.read_variable_name: str,
    readers.read_dns_name: str,
    readers.read_address: tuple[str, int],
    readers.read_command: tuple[str, ...],
    readers.read_waiting: bool | None,
    readers.read_sha256: str,
    readers.read_output_format: str,
}
# Options whose default is not of the attribute's type because the command resolves it after parsing.
RESOLVED = {(ProbeConfig, "state_file")}


def hints(cls: type[Settings]) -> dict[str, object]:
    namespace = {**vars(typing), **vars(options), **vars(settings)}
    return typing.get_type_hints(cls, globalns=namespace)


def admits(annotation: object, value: object) -> bool:
    """Whether `value` is of the annotated type (the few shapes the configurations use)."""
    if annotation is float:
        return isinstance(value, float)
    if annotation in (int, str, bool):
        return type(value) is annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(admits(args[0], item) for item in value)
        return len(args) == len(value) and all(admits(a, v) for a, v in zip(args, value))
    if args and type(None) in args:  # X | None
        return value is None or any(admits(a, value) for a in args if a is not type(None))
    raise AssertionError(f"unexpected annotation {annotation!r}")


def sample_text(option: Option) -> str:
    """A text the option's reader accepts."""
    texts: dict[object, str] = {
        readers.read_positive: "2.5",
        readers.read_non_negative: "0",
        readers.read_count: "3",
        readers.read_port: "8000",
        readers.read_switch: "1",
        readers.read_metric_name: "vllm:x_total",
        readers.read_engine: "vllm",
        readers.read_engine_label: "rank",
        readers.read_url: "http://127.0.0.1:1/metrics",
        readers.read_nonempty: "x",
        readers.read_variable_name: "NAME",
        readers.read_dns_name: "name",
        readers.read_address: "127.0.0.1:0",
        readers.read_command: "true now",
        readers.read_waiting: "never",
        readers.read_sha256: "ab" * 32,
        readers.read_output_format: "json",
    }
    return texts[option.read]


@pytest.mark.parametrize("cls", COMMANDS, ids=lambda cls: cls.__name__)
def test_every_option_sets_a_declared_attribute_of_its_readers_type(cls: type[Settings]) -> None:
    declared = hints(cls)
    assert cls.OPTIONS
    for option in cls.OPTIONS:
        assert option.attribute in declared, f"{cls.__name__} declares no {option.attribute} for {option.flag}"
        annotation = declared[option.attribute]
        value = option.read(option.flag, sample_text(option))
        assert admits(annotation, (value,) if option.repeats else value), (option.flag, annotation, value)
        if (cls, option.attribute) not in RESOLVED:
            assert admits(annotation, option.default), (option.flag, annotation, option.default)


@pytest.mark.parametrize("cls", COMMANDS, ids=lambda cls: cls.__name__)
def test_parse_fills_every_attribute_and_says_which_were_given(cls: type[Settings]) -> None:
    option = next(o for o in cls.OPTIONS if not o.is_switch and not o.repeats and o.read is readers.read_positive)
    config = parse([option.flag, "7.5"], cls, positional="URL")
    assert isinstance(config, cls)
    assert getattr(config, option.attribute) == 7.5
    assert config.given == {option.attribute}
    for other in cls.OPTIONS:
        if other is not option:
            assert getattr(config, other.attribute) == other.default, other.flag


def test_a_setting_no_option_has_is_refused() -> None:
    with pytest.raises(TypeError, match="no setting 'windwo'"):
        WatchConfig(["http://h/metrics"], windwo=3.0)
    assert WatchConfig(["http://h/metrics"], window=3.0).window == 3.0


def test_watch_reads_no_environment_and_its_help_promises_none() -> None:
    from stallprobe.watch.command import configure, help_text

    config = configure(["http://h/metrics"], {"VLLM_API_KEY": "secret", "STALLPROBE_WINDOW": "1"})
    assert isinstance(config, WatchConfig)
    assert (config.key, config.window) == ("", 120.0)
    line = next(line for line in help_text().splitlines() if "--api-key-file" in line)
    assert line.endswith("(default none)")
    assert "VLLM_API_KEY" not in help_text()


def test_the_probe_reads_the_engines_key_variable_and_its_help_says_so() -> None:
    from stallprobe.probe import configure, help_text

    config = configure([], {"VLLM_API_KEY": "secret"})
    assert isinstance(config, ProbeConfig)
    assert config.key == "secret"
    assert "VLLM_API_KEY or LLAMA_API_KEY when set" in help_text()


def test_a_value_that_does_not_read_names_the_flag() -> None:
    with pytest.raises(UsageError, match=r"--window must be a number > 0 \(got 'soon'\)"):
        parse(["--window", "soon"], ProbeConfig)


# (argv, the usage error): flags that contradict each other, refused by the parser (Settings.verify), not
# by the command that later reads them.
CONTRADICTIONS = [
    (["--no-ready", "--drain-after", "20"], "--drain-after sets the readiness probe, which --no-ready leaves out"),
    (["--port", "8000"], "--port needs --container NAME"),
    (["--host-address", "10.0.0.1"], "--host-address needs --container NAME"),
    (["--container", "c", "--host-address", "engine.local"], "--host-address must be an IP address, localhost"),
    (["--pyz-sha256", "ab" * 32], "--pyz-sha256 checks the archive --pyz names: give --pyz FILE too"),
    (["--output", "json"], "--output says how --print-probe prints: give --print-probe too"),
    (["--print-probe", "--output", "toml"], "--output must be yaml or json (got 'toml')"),
    (["--pyz", "x.pyz", "--pyz-sha256", "abc"], "--pyz-sha256 must be a sha256: 64 hexadecimal digits"),
]


@pytest.mark.parametrize(("argv", "error"), CONTRADICTIONS)
def test_flags_that_contradict_each_other_are_the_parser_s_usage_error(argv: list[str], error: str) -> None:
    from stallprobe.inject.core import InjectConfig

    with pytest.raises(UsageError) as raised:
        parse(argv, InjectConfig)
    assert str(raised.value).startswith(error)


def test_flags_that_agree_parse() -> None:
    from stallprobe.inject.core import InjectConfig

    config = parse(
        ["--print-probe", "--output", "json", "--port", "8000", "--pyz", "x", "--pyz-sha256", "AB" * 32], InjectConfig
    )
    assert isinstance(config, InjectConfig)
    assert (config.output, config.port, config.pyz_sha256) == ("json", 8000, "ab" * 32)
