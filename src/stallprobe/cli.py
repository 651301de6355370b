"""The `stallprobe` command: dispatch to the probe, `watch`, `inject` or `doctor`, and turn errors into exit codes.

This is the only module that exits (through `run()` and `console_main()`) and the only place where a
StallprobeError becomes what a person sees: one line (or one JSON object) and the error's exit code, never
a traceback. The commands are peers below it, loaded only when asked for: the probe, which the kubelet
runs every few seconds, pays nothing for the tools.
"""

from __future__ import annotations

import sys

from .console import emit, end, tell
from .errors import BugError, ExitCode, OutputError, StallprobeError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["console_main", "main", "run"]


def _environ() -> Mapping[str, str]:
    """os.environ, without importing os where nothing has (under `-I -S`: ~1.3 ms, a tenth of a probe run)."""
    os = sys.modules.get("os")
    if os is not None:
        environ: Mapping[str, str] = os.environ
        return environ
    import posix  # the same variables, as bytes; decoded as os decodes them

    code = sys.getfilesystemencoding()
    return {
        key.decode(code, "surrogateescape"): value.decode(code, "surrogateescape")
        for key, value in posix.environ.items()
    }


def _tool(command: str) -> Callable[[list[str], Mapping[str, str]], int]:
    """The main() of `watch`, `inject` or `doctor`; UsageError in the single-file build, which carries the
    probe alone (stallprobe.pyz, for a pod)."""
    try:
        if command == "watch":
            from .watch import main as watch_main

            return watch_main
        if command == "inject":
            from .inject import main as inject_main

            return lambda args, env: inject_main(args)
        from .doctor import main as doctor_main

        return doctor_main
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("stallprobe."):
            raise
        raise UsageError(
            f"{command} is not in this single-file build, which carries the probe alone: pip install stallprobe"
        ) from None


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run one command; its exit code. Every failure is one line, never a traceback: an expected one with
    its own code, anything else as a bug of stallprobe (exit 2, never 1, which means stalled)."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = _environ() if environ is None else environ
    command = args[0] if args and args[0] in TOOLS else "probe"
    if command != "probe":
        del args[0]
    try:
        if command != "probe":
            return _tool(command)(args, env)
        if argv is None:
            # The probe's own process lives well under a second and makes no garbage that cycles: the cycle
            # collector's passes during its imports are ~2% of its CPU, paid every few seconds in every pod.
            import gc

            gc.disable()
        from .probe import main as probe_main

        return probe_main(args, env)
    except StallprobeError as exc:
        return _fail(command, exc)
    except Exception as exc:  # the last resort: a bug of stallprobe, in any command
        return _fail(command, BugError(exc))


def _fail(command: str, exc: StallprobeError) -> int:
    """Say `exc` in one line (one JSON object when the command was asked for --json) where its command's
    errors go; its exit code, or 0 when the probe's --report-only excuses it: a usage error or a bug of
    stallprobe is the probe's own failure, never the engine's (the probe has already excused its own
    verdicts, and never excuses a server that refuses or a health route that fails)."""
    message = " ".join(str(exc).splitlines())  # one line, whatever the input it quotes holds
    if command == "inject":  # its stdout is the manifests: errors go to stderr
        tell(f"stallprobe inject: {message}")
        return exc.exit_code
    if isinstance(exc, OutputError):  # stdout is gone: stderr may still be read
        tell(f"error: {message}")
        return exc.exit_code
    settings = exc.settings
    excused = (
        command == "probe"
        and isinstance(exc, (UsageError, BugError))
        and getattr(settings, "report_only", False)
        and not getattr(settings, "ready", False)
    )
    if excused:
        from .report import report_only_note

        message = f"{message}; {report_only_note(exc.exit_code)}"
    line = f"error: {message}"
    if getattr(settings, "json", False):
        import json

        from .report import error_fields

        line = json.dumps(error_fields(message, exc.exit_code), sort_keys=True)
    if not emit(line):
        tell(f"error: {message}")
    return ExitCode.OK if excused else exc.exit_code


TOOLS = ("watch", "inject", "doctor")


def run() -> None:
    """Run the command the process was started with, and exit with its code: the pod's entry point,
    `python3 -c "from stallprobe.cli import run; run()" ARGS` (no runpy, unlike `-m`)."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in TOOLS:
        sys.exit(code)
    # The probe's process ends at once: its interpreter's finalization, collecting and freeing every
    # object the run made, is ~5% of its CPU, paid every few seconds in every pod, and nothing is left to
    # do (the state file is written and closed).
    end(code)


console_main = run  # the `stallprobe` script's entry point
