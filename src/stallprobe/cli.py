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
from .detector import DEFAULT_SATURATION, DEFAULT_WINDOW, EnginesAssessment, State, Verdict, assess_engines
from .errors import MetricsError, ScrapeError, StallprobeError, StateFileError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .detector import Sample

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
    ExitCode.METRICS: "not a metrics page, no known engine or several, or a required metric missing or unusable",
    ExitCode.STATE: "the state file cannot be read or written (read-only or full filesystem)",
}

ENGINES = ("auto", "vllm", "sglang", "llamacpp")

# (flag, environment variable, metavar, default shown in --help, meaning). No metavar: a switch.
# A metavar ending in "..." may be given several times (the variable takes a comma-separated list).
OPTIONS = (
    ("--url", "STALLPROBE_URL", "URL", DEFAULT_URL, "the engine's Prometheus page"),
    ("--window", "STALLPROBE_WINDOW", "SECONDS", "120", "busy with no progress this long is stalled"),
    ("--timeout", "STALLPROBE_TIMEOUT", "SECONDS", "3", "one deadline for the scrape, connect to last byte"),
    ("--state-file", "STALLPROBE_STATE_FILE", "PATH", "$TMPDIR/stallprobe-<url>.state", "the last sample's file"),
    ("--saturation", "STALLPROBE_SATURATION", "N", "1", "waiting >= N while progressing is saturated"),
    ("--engine", "STALLPROBE_ENGINE", "NAME", "auto", "auto, vllm, sglang or llamacpp"),
    ("--include-waiting", "STALLPROBE_INCLUDE_WAITING", "", "off", "queued requests count as work"),
    ("--progress-metric", "STALLPROBE_PROGRESS_METRIC", "NAME...", "none", "also progress when this changes"),
    ("--running-metric", "STALLPROBE_RUNNING_METRIC", "NAME", "the engine's", "gauge of running requests"),
    ("--waiting-metric", "STALLPROBE_WAITING_METRIC", "NAME", "the engine's", "gauge of queued requests"),
    ("--prompt-metric", "STALLPROBE_PROMPT_METRIC", "NAME", "the engine's", "counter of prompt tokens"),
    ("--generation-metric", "STALLPROBE_GENERATION_METRIC", "NAME", "the engine's", "counter of generated tokens"),
    ("--engine-label", "STALLPROBE_ENGINE_LABEL", "LABEL", "the engine's", "label naming an engine; none: one"),
    ("--json", "STALLPROBE_JSON", "", "off", "print one JSON object instead of a line"),
)

_SWITCHES = {flag for flag, _, metavar, _, _ in OPTIONS if not metavar}
_LISTS = {flag for flag, _, metavar, _, _ in OPTIONS if metavar.endswith("...")}
_USAGE = """\
usage: stallprobe [--url URL] [--window S] [--timeout S] [--engine NAME] [options]
       stallprobe inject [-f FILE] [options]    put the probe into Kubernetes manifests (see inject --help)
       stallprobe watch URL [URL ...] [options]  watch a pool of engines (see watch --help)"""


def help_text() -> str:
    lines = [
        _USAGE,
        "",
        "Exec liveness probe for LLM inference engines (vLLM, SGLang, llama.cpp): fails only when an",
        "engine is busy (requests running) and none of its progress signals moved for the window.",
        "",
        "options (each flag also reads its environment variable; the flag wins):",
    ]
    for flag, env, metavar, default, meaning in OPTIONS:
        lines.append(f"  {(flag + ' ' + metavar).strip():27} {env:29} {meaning} (default {default})")
    lines.append(f"  {'-h, --help':27} {'':29} show this help and exit")
    lines.append(f"  {'--version':27} {'':29} print the version and exit")
    lines += ["", "exit codes:"]
    lines += [f"  {code.value}  {meaning}" for code, meaning in EXIT_MEANINGS.items()]
    return "\n".join(lines)


class Config:
    __slots__ = (
        "engine",
        "include_waiting",
        "json",
        "names",
        "progress",
        "saturation",
        "state_file",
        "timeout",
        "url",
        "window",
    )

    def __init__(
        self,
        *,
        url: str,
        window: float,
        timeout: float,
        state_file: str,
        saturation: float,
        engine: str = "auto",
        include_waiting: bool = False,
        progress: Sequence[str] = (),
        names: Mapping[str, str] | None = None,
        json: bool = False,
    ) -> None:
        self.url = url
        self.window = window
        self.timeout = timeout
        self.state_file = state_file
        self.saturation = saturation
        self.engine = engine
        self.include_waiting = include_waiting
        self.progress = tuple(progress)
        # Overridden family names: running, waiting, prompt, generation, engine_label.
        self.names = dict(names or {})
        self.json = json


def _parse_argv(argv: Sequence[str]) -> dict[str, list[str]] | str:
    """Flag values as given, or "help"/"version" when asked; UsageError on anything else."""
    given: dict[str, list[str]] = {}
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
        if flag in _SWITCHES:
            if eq:
                raise UsageError(f"{flag} takes no value (got {arg!r})")
            value = "1"
        elif any(flag == option[0] for option in OPTIONS):
            if not eq:
                if i >= len(args):
                    raise UsageError(f"{flag} needs a value")
                value = args[i]
                i += 1
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg!r}")
        else:
            raise UsageError(f"unexpected argument {arg!r}")
        given.setdefault(flag, []).append(value)
    return given


def _positive(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number > 0 (got {text!r})") from None
    if not (value > 0 and value != float("inf")):
        raise UsageError(f"{name} must be a number > 0 (got {text!r})")
    return value


def _switch(name: str, text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("", "0", "false", "no", "off"):
        return False
    raise UsageError(f"{name} must be 1 or 0 (got {text!r})")


def _metric_name(name: str, text: str) -> str:
    # Prometheus metric names: letters, digits, _ and :, not starting with a digit.
    ok = text and not text[0].isdigit() and all(ch.isascii() and (ch.isalnum() or ch in "_:") for ch in text)
    if not ok:
        raise UsageError(f"{name} must be a Prometheus metric name (got {text!r})")
    return text


def configure(argv: Sequence[str], environ: Mapping[str, str]) -> Config | str:
    """Validate every flag and environment variable in one place: a Config, or "help"/"version"."""
    given = _parse_argv(argv)
    if isinstance(given, str):
        return given
    raw: dict[str, tuple[str, list[str]]] = {}  # flag -> (name to blame, values)
    for flag, env, _, _, _ in OPTIONS:
        if flag in given:
            values = given[flag]
            if flag not in _LISTS and len(values) > 1:
                raise UsageError(f"{flag} given {len(values)} times")
            raw[flag] = (flag, values)
        elif env in environ:
            text = environ[env]
            raw[flag] = (env, [part.strip() for part in text.split(",") if part.strip()] if flag in _LISTS else [text])

    def one(flag: str) -> tuple[str, str] | None:
        return (raw[flag][0], raw[flag][1][0]) if flag in raw else None

    def number(flag: str, default: float) -> float:
        found = one(flag)
        return _positive(*found) if found else default

    def switch(flag: str) -> bool:
        found = one(flag)
        return _switch(*found) if found else False

    url = DEFAULT_URL
    found = one("--url")
    if found:
        url = found[1]
    try:
        from .scrape import parse_url

        parse_url(url)
    except ValueError as exc:
        raise UsageError(f"{found[0] if found else '--url'} {exc} (got {url!r})") from None
    found = one("--state-file")
    if found:
        if not found[1]:
            raise UsageError(f"{found[0]} must not be empty")
        state_file = found[1]
    else:
        from .statefile import default_path

        state_file = default_path(url, environ)
    engine = "auto"
    found = one("--engine")
    if found:
        engine = found[1].lower()
        if engine not in ENGINES:
            raise UsageError(f"{found[0]} must be one of {', '.join(ENGINES)} (got {found[1]!r})")
    names: dict[str, str] = {}
    for key in ("running", "waiting", "prompt", "generation"):
        found = one(f"--{key}-metric")
        if found:
            names[key] = _metric_name(*found)
    found = one("--engine-label")
    if found:
        # "none" (or empty) reads the page as one engine; otherwise a label name.
        names["engine_label"] = "" if found[1].lower() in ("", "none") else found[1]
    progress: list[str] = []
    if "--progress-metric" in raw:
        source, values = raw["--progress-metric"]
        progress = [_metric_name(source, value) for value in values]
    return Config(
        url=url,
        window=number("--window", DEFAULT_WINDOW),
        timeout=number("--timeout", DEFAULT_TIMEOUT),
        state_file=state_file,
        saturation=number("--saturation", DEFAULT_SATURATION),
        engine=engine,
        include_waiting=switch("--include-waiting"),
        progress=progress,
        names=names,
        json=switch("--json"),
    )


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else f"{x:g}"


def _secs(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def describe(
    result: EnginesAssessment,
    previous: Mapping[str, State] | None,
    note: str,
    window: float,
    precision: str = "",
) -> str:
    """The one line a person reads in `kubectl describe pod`: the verdict of the worst engine."""
    engines = result.engines
    worst = engines[result.worst]
    s = worst.state.last
    verdict = result.verdict
    who = ""
    if len(engines) > 1:
        alike = [name for name, one in engines.items() if one.verdict is verdict]
        if len(alike) > 1 and verdict in (Verdict.STALLED, Verdict.SUSPECT):
            who = f"engines {', '.join(alike)} of {len(engines)}: "
        else:
            who = f"engine {result.worst} of {len(engines)}: "
    head = f"{verdict.value}: {who}{_num(s.running)} running, {_num(s.waiting)} waiting"
    if verdict is Verdict.BASELINE:
        if note:
            why = note
        elif worst.reason == "no history":
            why = "engine first seen" if previous else "first run"
        else:
            why = worst.reason
        return f"{head}; {why}, progress is judged from the next run"
    if verdict is Verdict.IDLE:
        return head
    before = previous.get(result.worst) if previous else None
    if verdict in (Verdict.PROGRESSING, Verdict.SATURATED) and before is not None:
        p = before.last
        moved = (
            f"{head}; +{_num(s.prompt - p.prompt)} prompt and "
            f"+{_num(s.generation - p.generation)} generation tokens in {_secs(s.t - p.t)} s"
        )
        return moved + ("; busy, not stuck: do not restart" if verdict is Verdict.SATURATED else "")
    frozen = f"{head}; no token progress for {_secs(worst.stalled_for)} s (window {_num(window)} s)"
    return f"{frozen}; {precision}" if precision else frozen


def _emit(line: str, fields: dict[str, object] | None) -> None:
    """Print the line, or with --json (`fields` given) one JSON object instead."""
    if fields is not None:
        import json  # only on this path: json pulls in re, which the plain line does not need

        print(json.dumps(fields, sort_keys=True))
    else:
        print(line)
    sys.stdout.flush()


def _json_fields(
    result: EnginesAssessment, samples: Mapping[str, Sample], dialect: str, window: float, line: str
) -> dict[str, object]:
    worst = result.engines[result.worst]
    return {
        "verdict": result.verdict.value,
        "engine": result.worst if len(samples) > 1 else None,
        "dialect": dialect,
        # Page totals: with several engines, the sums; the worst engine's own numbers are in "engines".
        "running": sum(sample.running for sample in samples.values()),
        "waiting": sum(sample.waiting for sample in samples.values()),
        "prompt_tokens": sum(sample.prompt for sample in samples.values()),
        "generation_tokens": sum(sample.generation for sample in samples.values()),
        "stalled_for": worst.stalled_for,
        "window": window,
        "message": line,
        "engines": [
            {
                "engine": name,
                "verdict": one.verdict.value,
                "running": one.state.last.running,
                "waiting": one.state.last.waiting,
                "prompt_tokens": one.state.last.prompt,
                "generation_tokens": one.state.last.generation,
                "stalled_for": one.stalled_for,
            }
            for name, one in result.engines.items()
        ],
    }


def _run(config: Config) -> int:
    from .engines import choose, precision_note, read_engines
    from .scrape import fetch
    from .statefile import load, read_boot_id, save

    boot_id = read_boot_id()
    previous, note = load(config.state_file, boot_id)
    page = fetch(config.url, config.timeout, MAX_PAGE_BYTES)
    # CLOCK_MONOTONIC is one clock for every process since boot: a wall-clock step cannot fake a
    # stall, and the boot id in the state file catches the one case where it restarts.
    now = time.monotonic()
    dialect = choose(page, config.engine, config.names)
    samples = read_engines(page, now, dialect, config.progress)
    result = assess_engines(previous, samples, config.window, config.saturation, include_waiting=config.include_waiting)
    save(config.state_file, result.states, boot_id)
    worst = result.engines[result.worst]
    precision = ""
    if result.verdict in (Verdict.SUSPECT, Verdict.STALLED):
        precision = precision_note(dialect, worst.state.last)
    line = describe(result, previous, note, config.window, precision)
    _emit(line, _json_fields(result, samples, dialect.name, config.window, line) if config.json else None)
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
    # Subcommands are tools for people, not the probe: their modules load only when asked for.
    if args and args[0] == "inject":
        from .inject import main as inject_main

        return inject_main(args[1:])
    if args and args[0] == "watch":
        from .watch import main as watch_main

        return watch_main(args[1:], env)
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
        _emit(f"error: {message}", {"verdict": "error", "error": message, "exit_code": int(code)} if use_json else None)
        return code


def console_main() -> None:
    """Entry point of the `stallprobe` script: like `python3 -m stallprobe`."""
    sys.exit(main())
