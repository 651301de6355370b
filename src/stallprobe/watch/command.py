"""`stallprobe watch ...`: its flags, its --help, and its main loop.

The flags are the option table's WATCH selection (options.py), read by the one parser every command
uses. Unlike the probe, watch reads no environment variables: a hook it starts inherits its environment
with STALLPROBE_URL set, and a watch that hook starts must not be reconfigured by it. A bad flag or URL
raises UsageError; cli.main() prints it (as JSON with --json) and exits 2.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import threading
import time

from ..console import abandon_stdout, show, tell
from ..credentials import api_key
from ..errors import ExitCode, UsageError
from ..helppage import help_page
from ..options import WATCH
from ..readers import read_url
from ..report import drain_warning
from ..settings import parse
from ..urls import hostport
from .hooks import HOOK_FLAGS
from .poll import Watch, WatchConfig
from .view import Output, once_code

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from http.server import ThreadingHTTPServer
    from types import FrameType

    from .agent import Agent
    from .poll import Row
    from .serve import Board

__all__ = ["configure", "help_text", "main"]

USAGE = "usage: stallprobe watch URL [URL ...] [--interval S] [--window S] [--once] [--json] [options]"

_DRAIN = (
    "Drain the load balancer before restarting one member of a pool: otherwise the gateway retries the\n"
    "restarted member's queue on the survivors, and the survivor absorbs the whole retried backlog."
)

DESCRIPTION = f"""\
Poll every engine of a pool and show, per engine, whether it is idle, moving, saturated or stuck:
running and waiting requests, prompt and generation tokens per second since the last poll, the
detector's verdict, and how long that verdict has held. On a terminal one table is redrawn in place
(the last row sums the pool). Piped, a line when an engine's verdict or readiness changes (and at its
first poll), `URL: <the probe's line>[; not ready] (was <its verdict or readiness before>)`, and one
line a poll, `poll: N engines: <how many of each verdict>; N not ready; N ms`; with --every (and for
--once's poll), a line per engine per poll instead; with --json, one object per engine per poll. Each
page is read as the probe reads it: --engine, --saturation, --include-waiting and the --*-metric flags
are the probe's.

Verdicts: baseline, idle, paused, progressing, saturated, suspect, stalled (the probe's; an endpoint
that gives no answer in time is suspect, then stalled once silent for the window), unreachable (the
scrape failed unambiguously) and error (not a metrics page).

Load balancers: with --listen, GET /ready?url=URL answers the probe's readiness rule for one engine
(200 ready, 503 not ready: busy with no progress or silent for --drain-after, paused, or its health
route failing), so an active health check drains a wedged engine long before --on-stalled runs;
GET /metrics exports every verdict for Prometheus. With --agent, the same rule answers HAProxy's agent
check (agent-send: the engine's host:port or URL, then a newline): `ready up`, or `drain up` with the
reason after `#`. A watch that HAProxy cannot reach changes nothing there (servers stay on their own
health check), where a /ready check that fails takes the server out.

Watchdog: --on-stalled runs a command (split like a shell would, but run without one: write
`sh -c '...'` for a shell) once per stall episode of an engine, never for a saturated or suspect one, at
most once per --cooldown per endpoint, with STALLPROBE_URL, STALLPROBE_ENGINE (empty when the page has
one engine), STALLPROBE_VERDICT and STALLPROBE_MESSAGE in its environment. It runs in the background,
its output discarded but for the last line of a failure, and is killed after --hook-timeout.
{_DRAIN}"""


def help_text() -> str:
    arguments = [f"  {'URL [URL ...]':27} an engine's Prometheus page (plain http://), one or more"]
    title = "watch reads no environment variables"
    head = f"{USAGE}\n\n{DESCRIPTION}"
    return help_page("watch", head, WATCH, environment=False, title=title, arguments=arguments)


def configure(argv: Sequence[str], environ: Mapping[str, str]) -> WatchConfig | str:
    """Every flag and URL, validated in one place: a WatchConfig, or "help"/"version".

    `environ` is the environment the hooks will get; no flag is read from it.
    """
    config = parse(argv, WatchConfig, positional="URL")
    if isinstance(config, str):
        return config
    urls = config.positional
    if not urls:
        raise UsageError("at least one URL is required")
    given: set[str] = set()
    for text in urls:
        read_url("URL", text)
        if text in given:  # (a set: counting every URL in the list took 0.27 s of CPU at 5,000 of them)
            raise UsageError(f"URL {text!r} given {urls.count(text)} times")
        given.add(text)
    config.urls = urls
    for kind, words in config.hooks.items():
        # Checked now, with the PATH the hook will get: a typo found during an incident is found too late.
        if shutil.which(words[0], path=environ.get("PATH", os.defpath)) is None:
            import shlex

            flag = HOOK_FLAGS[kind]
            raise UsageError(f"{flag}: no executable {words[0]!r} on PATH (got {shlex.join(words)!r})")
    # The key from --api-key-file only: a watch is not in the engine's container, and reads no
    # environment variables.
    config.key = api_key(config.api_key_file, {})
    return config


class _OutputGone(Exception):
    """stdout's reader went away (`| head`), or stdout was closed."""


def _show(output: Output, rows: Sequence[Row], took: float = 0.0) -> None:
    try:
        output.show(rows, took)
    except (OSError, ValueError):  # a pipe with no reader, a closed descriptor or file
        raise _OutputGone from None


def _run(watch: Watch, output: Output, board: Board | None) -> int:
    interval = watch.config.interval
    if watch.config.once:
        started = time.monotonic()
        watch.poll()
        time.sleep(max(0.0, started + interval - time.monotonic()))
        rows = watch.poll()
        watch.runner.wait()
        try:
            _show(output, rows)
        except _OutputGone:
            abandon_stdout()  # nothing left to flush at exit
        return once_code(rows)  # the verdicts make the code, whether or not anyone read them
    next_at = time.monotonic()
    while True:
        started = watch.clock()
        rows = watch.poll()
        took = watch.clock() - started
        if board is not None:
            board.update(rows)
        try:
            _show(output, rows, took)
        except _OutputGone:
            if board is None:
                raise
            # Its reader went away, but the load balancers still ask /ready: serve on, and show nothing.
            tell("stallprobe watch: stdout is closed; serving the load balancers on, without output")
            output = Output(watch.config, open(os.devnull, "w"))  # noqa: SIM115 - as long as the watch
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.monotonic()  # a round overran: poll now, and do not try to catch up


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """`stallprobe watch ...`: the exit code. Runs until Ctrl-C or SIGTERM (exit 0) unless --once.

    UsageError for a bad flag or URL (cli.main() prints it).
    """
    config = configure(argv, environ)
    if isinstance(config, str):
        from ..buildinfo import version_line

        return show(help_text() if config == "help" else version_line())
    assert isinstance(config, WatchConfig)
    # Said where a load balancer follows the readiness rule (/ready or the agent): what a drain window is for.
    routed = config.listen is not None or config.agent is not None
    warning = drain_warning(config.drain_after, config.window) if routed else ""
    if warning:
        tell(f"stallprobe watch: {warning}")
    watch = Watch(config, environ)
    # Started with stdout closed (a service that only serves --listen): nothing to show it on.
    output = Output(config, sys.stdout if sys.stdout is not None else open(os.devnull, "w"))  # noqa: SIM115
    board = server = agent = None
    try:
        if config.routing:
            from .serve import Board

            board = Board(config.urls)
            if config.listen is not None:
                server = _listen(*config.listen, board)
            if config.agent is not None:
                agent = _agent(*config.agent, board, config)
        return _serve(watch, config, output, board)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if agent is not None:
            agent.shutdown()


def _listen(host: str, port: int, board: Board) -> ThreadingHTTPServer:
    """--listen, serving; UsageError when it cannot."""
    from .serve import listen

    try:
        server = listen(host, port, board)
    except OSError as exc:
        raise UsageError(f"--listen {hostport(host, port)}: {exc.strerror or exc}") from None
    where = hostport(str(server.server_address[0]), int(server.server_address[1]))
    tell(f"stallprobe watch: serving http://{where}/metrics and /ready?url=URL")
    return server


def _agent(host: str, port: int, board: Board, config: WatchConfig) -> Agent:
    """--agent, answering; UsageError when it cannot."""
    from .agent import serve_agent

    try:
        agent = serve_agent(host, port, board, config.urls, config.drain_after)
    except OSError as exc:
        raise UsageError(f"--agent {hostport(host, port)}: {exc.strerror or exc}") from None
    tell(f"stallprobe watch: answering HAProxy's agent checks on {hostport(*agent.address)}")
    return agent


# The cycle collector's first threshold while the watch runs. A poll makes about 30 short-lived containers
# an endpoint (each page's label sets, each look's generator and exchanges) and drops them: at the default
# (700) the collector ran about 220 times a poll of 5,000 endpoints, 75 to 115 ms of CPU; at this, a few
# times, 20 to 55 ms. The young objects it lets wait are a few MB at most.
_GC_THRESHOLD = 50_000


def _serve(watch: Watch, config: WatchConfig, output: Output, board: Board | None) -> int:
    """The main loop, with SIGTERM ending it as Ctrl-C does; the exit code."""
    # SIGTERM (systemd stopping the watchdog) ends it as cleanly as Ctrl-C does.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
    thresholds = gc.get_threshold()
    gc.set_threshold(max(_GC_THRESHOLD, thresholds[0]), *thresholds[1:])
    try:
        return _run(watch, output, board)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED if config.once else ExitCode.OK
    except _OutputGone:
        # The reader went away (`| head`), or stdout was closed: nothing more to say, and nothing to flush
        # at exit.
        abandon_stdout()
        return ExitCode.OK
    finally:
        try:
            output.close()
        except OSError:
            pass
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        gc.set_threshold(*thresholds)
