"""`python3 -m stallprobe`: scrape, judge, remember, print one line, exit with a documented code.

This is the only module that reads the environment, the clock and the flags, and the only place where
errors become exit codes. Flags are parsed by hand, not by argparse: argparse pulls in `re` and gettext
and would be most of the probe's own start-up cost, paid every few seconds in every pod.
"""

from __future__ import annotations

import os
import sys
import time
from enum import IntEnum

from . import __version__
from .detector import DEFAULT_SATURATION, DEFAULT_WINDOW, Assessment, Sample, State, Verdict, assess
from .errors import MetricsError, ScrapeError, StallprobeError, StateFileError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["EXIT_MEANINGS", "OPTIONS", "Config", "ExitCode", "configure", "main"]

DEFAULT_URL = "http://127.0.0.1:8000/metrics"
# vLLM's /metrics (metrics server on the API process) answers in well under a second even when the
# engine is saturated; 3 s tolerates a CPU-starved container without outliving a sane timeoutSeconds.
DEFAULT_TIMEOUT = 3.0
# A vLLM page is ~50 KB; with hundreds of LoRA adapters and histograms a few MB. 32 MiB bounds memory
# against a runaway page while leaving room for an unusual one.
MAX_PAGE_BYTES = 32 * 1024 * 1024


class ExitCode(IntEnum):
    OK = 0  # alive: baseline, idle, progressing, saturated or suspect
    STALLED = 1  # busy and no token progress for the window: restart me
    USAGE = 2  # a flag or environment variable is invalid (argparse's traditional code)
    SCRAPE = 3  # /metrics could not be fetched in time
    METRICS = 4  # not a metrics page, or a required metric missing
    STATE = 5  # the state file cannot be read or written


# One source for --help and the README (a test checks that the README matches).
EXIT_MEANINGS = {
    ExitCode.OK: "alive: baseline, idle, progressing, saturated or suspect",
    ExitCode.STALLED: "stalled: busy, and no token progress for the window",
    ExitCode.USAGE: "usage error: a flag or environment variable is invalid",
    ExitCode.SCRAPE: "scrape failed: refused, reset, non-2xx, too large, or past --timeout",
    ExitCode.METRICS: "not a metrics page, or a required metric is missing or unusable",
    ExitCode.STATE: "the state file cannot be read or written (read-only or full filesystem)",
}

# (flag, environment variable, metavar, default shown in --help, meaning). --json takes no value.
OPTIONS = (
    ("--url", "STALLPROBE_URL", "URL", DEFAULT_URL, "the engine's Prometheus page"),
    ("--window", "STALLPROBE_WINDOW", "SECONDS", "120", "busy with no progress this long is stalled"),
    ("--timeout", "STALLPROBE_TIMEOUT", "SECONDS", "3", "one deadline for the scrape, connect to last byte"),
    (
        "--state-file",
        "STALLPROBE_STATE_FILE",
        "PATH",
        "$TMPDIR/stallprobe-<url>.state",
        "where the last sample is kept",
    ),
    ("--saturation", "STALLPROBE_SATURATION", "N", "1", "waiting >= N while progressing is saturated"),
    ("--json", "STALLPROBE_JSON", "", "off", "print one JSON object instead of a line"),
)

_VALUE_FLAGS = {flag for flag, _, metavar, _, _ in OPTIONS if metavar}
_USAGE = "usage: stallprobe [--url URL] [--window S] [--timeout S] [--state-file PATH] [--saturation N] [--json]"


def help_text() -> str:
    lines = [
        _USAGE,
        "",
        "Exec liveness probe for LLM inference engines (vLLM): fails only when the engine is busy",
        "(requests running) and neither prompt nor generation tokens advanced for the window.",
        "",
        "options (each flag also reads its environment variable; the flag wins):",
    ]
    for flag, env, metavar, default, meaning in OPTIONS:
        lines.append(f"  {(flag + ' ' + metavar).strip():24} {env:24} {meaning} (default {default})")
    lines.append(f"  {'-h, --help':24} {'':24} show this help and exit")
    lines.append(f"  {'--version':24} {'':24} print the version and exit")
    lines += ["", "exit codes:"]
    lines += [f"  {code.value}  {meaning}" for code, meaning in EXIT_MEANINGS.items()]
    return "\n".join(lines)


class Config:
    __slots__ = ("json", "saturation", "state_file", "timeout", "url", "window")

    def __init__(
        self, *, url: str, window: float, timeout: float, state_file: str, saturation: float, json: bool
    ) -> None:
        self.url = url
        self.window = window
        self.timeout = timeout
        self.state_file = state_file
        self.saturation = saturation
        self.json = json


def _parse_argv(argv: Sequence[str]) -> dict[str, str] | str:
    """Flag values as given, or "help"/"version" when asked; UsageError on anything else."""
    given: dict[str, str] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in ("-h", "--help"):
            return "help"
        if arg == "--version":
            return "version"
        flag, eq, value = arg.partition("=")
        if flag == "--json":
            if eq:
                raise UsageError(f"--json takes no value (got {arg!r})")
            given[flag] = "1"
        elif flag in _VALUE_FLAGS:
            if not eq:
                if i >= len(args):
                    raise UsageError(f"{flag} needs a value")
                value = args[i]
                i += 1
            given[flag] = value
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg!r}")
        else:
            raise UsageError(f"unexpected argument {arg!r}")
    return given


def _positive(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number > 0 (got {text!r})") from None
    if not (value > 0 and value != float("inf")):
        raise UsageError(f"{name} must be a number > 0 (got {text!r})")
    return value


def configure(argv: Sequence[str], environ: Mapping[str, str]) -> Config | str:
    """Validate every flag and environment variable in one place: a Config, or "help"/"version"."""
    given = _parse_argv(argv)
    if isinstance(given, str):
        return given
    raw: dict[str, tuple[str, str]] = {}  # flag -> (name to blame, text)
    for flag, env, _, _, _ in OPTIONS:
        if flag in given:
            raw[flag] = (flag, given[flag])
        elif env in environ:
            raw[flag] = (env, environ[env])

    def number(flag: str, default: float) -> float:
        return _positive(*raw[flag]) if flag in raw else default

    url = raw["--url"][1] if "--url" in raw else DEFAULT_URL
    try:
        from .scrape import parse_url

        parse_url(url)
    except ValueError as exc:
        name = raw["--url"][0] if "--url" in raw else "--url"
        raise UsageError(f"{name} {exc} (got {url!r})") from None
    use_json = False
    if "--json" in raw:
        name, text = raw["--json"]
        if text.lower() in ("1", "true", "yes", "on"):
            use_json = True
        elif text.lower() not in ("", "0", "false", "no", "off"):
            raise UsageError(f"{name} must be 1 or 0 (got {text!r})")
    if "--state-file" in raw:
        state_file = raw["--state-file"][1]
        if not state_file:
            raise UsageError(f"{raw['--state-file'][0]} must not be empty")
    else:
        from .statefile import default_path

        state_file = default_path(url, environ)
    return Config(
        url=url,
        window=number("--window", DEFAULT_WINDOW),
        timeout=number("--timeout", DEFAULT_TIMEOUT),
        state_file=state_file,
        saturation=number("--saturation", DEFAULT_SATURATION),
        json=use_json,
    )


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else f"{x:g}"


def _secs(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def describe(result: Assessment, previous: State | None, note: str, window: float) -> str:
    """The one line a person reads in `kubectl describe pod`."""
    s = result.state.last
    head = f"{result.verdict.value}: {_num(s.running)} running, {_num(s.waiting)} waiting"
    verdict = result.verdict
    if verdict is Verdict.BASELINE:
        why = note or ("first run" if result.reason == "no history" else result.reason)
        return f"{head}; {why}, progress is judged from the next run"
    if verdict is Verdict.IDLE:
        return head
    if verdict in (Verdict.PROGRESSING, Verdict.SATURATED) and previous is not None:
        p = previous.last
        moved = (
            f"{head}; +{_num(s.prompt - p.prompt)} prompt and "
            f"+{_num(s.generation - p.generation)} generation tokens in {_secs(s.t - p.t)} s"
        )
        return moved + ("; busy, not stuck: do not restart" if verdict is Verdict.SATURATED else "")
    return f"{head}; no token progress for {_secs(result.stalled_for)} s (window {_num(window)} s)"


def _emit(config_json: bool, line: str, fields: dict[str, object]) -> None:
    if config_json:
        import json  # only on this path: json pulls in re, which the plain line does not need

        print(json.dumps(fields, sort_keys=True))
    else:
        print(line)
    sys.stdout.flush()


def _run(config: Config) -> int:
    from .engines import read_sample
    from .scrape import fetch
    from .statefile import load, read_boot_id, save

    boot_id = read_boot_id()
    previous, note = load(config.state_file, boot_id)
    page = fetch(config.url, config.timeout, MAX_PAGE_BYTES)
    # CLOCK_MONOTONIC is one clock for every process since boot: a wall-clock step cannot fake a
    # stall, and the boot id in the state file catches the one case where it restarts.
    sample: Sample = read_sample(page, time.monotonic())
    result = assess(previous, sample, config.window, config.saturation)
    save(config.state_file, result.state, boot_id)
    line = describe(result, previous, note, config.window)
    fields: dict[str, object] = {
        "verdict": result.verdict.value,
        "running": sample.running,
        "waiting": sample.waiting,
        "prompt_tokens": sample.prompt,
        "generation_tokens": sample.generation,
        "stalled_for": result.stalled_for,
        "window": config.window,
        "message": line,
    }
    _emit(config.json, line, fields)
    return ExitCode.STALLED if result.verdict is Verdict.STALLED else ExitCode.OK


_ERROR_CODES = (
    (UsageError, ExitCode.USAGE),
    (ScrapeError, ExitCode.SCRAPE),
    (MetricsError, ExitCode.METRICS),
    (StateFileError, ExitCode.STATE),
)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the probe once; the exit code. Every expected failure is one line, never a traceback."""
    args = sys.argv[1:] if argv is None else argv
    env = os.environ if environ is None else environ
    use_json = "--json" in args or env.get("STALLPROBE_JSON", "").lower() in ("1", "true", "yes", "on")
    try:
        config = configure(args, env)
        if config == "help":
            print(help_text())
            return ExitCode.OK
        if config == "version":
            print(f"stallprobe {__version__}")
            return ExitCode.OK
        assert isinstance(config, Config)
        use_json = config.json
        return _run(config)
    except StallprobeError as exc:
        code = next(c for kind, c in _ERROR_CODES if isinstance(exc, kind))  # every subclass is listed
        message = str(exc)
        _emit(use_json, f"error: {message}", {"verdict": "error", "error": message, "exit_code": int(code)})
        return code


def console_main() -> None:
    """Entry point of the `stallprobe` script: like `python3 -m stallprobe`."""
    sys.exit(main())
