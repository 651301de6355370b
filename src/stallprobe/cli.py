"""The `stallprobe` command: dispatch to the probe, `watch`, `inject` or `doctor`, and turn errors into exit codes.

This is the only module that exits (through `run()` and `console_main()`) and the only place where a
StallprobeError becomes what a person sees: one line (or one JSON object) and the error's exit code, never
a traceback. The commands are peers below it, loaded only when asked for: the probe, which the kubelet
runs every few seconds, pays nothing for the tools.
"""

from __future__ import annotations

import sys

from .console import emit, end, tell
from .errors import OutputError, StallprobeError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["console_main", "main", "run"]

_TRUE = ("1", "true", "yes", "on")


def _wants_json(command: str, args: Sequence[str], env: Mapping[str, str]) -> bool:
    # Read from the raw arguments, since the error may be that they do not parse. Only the probe reads
    # its flags from the environment.
    return "--json" in args or (command == "probe" and env.get("STALLPROBE_JSON", "").lower() in _TRUE)


def _report_only(command: str, args: Sequence[str], env: Mapping[str, str]) -> bool:
    # Read from the raw arguments too, so that even a run whose flags do not parse exits 0.
    return command == "probe" and ("--report-only" in args or env.get("STALLPROBE_REPORT_ONLY", "").lower() in _TRUE)


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
    """Run one command; its exit code. Every expected failure is one line, never a traceback."""
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
        message = " ".join(str(exc).splitlines())  # one line, whatever the input it quotes holds
        if command == "inject":  # its stdout is the manifests: errors go to stderr
            tell(f"stallprobe inject: {message}")
        elif isinstance(exc, OutputError):  # stdout is gone: stderr may still be read
            tell(f"error: {message}")
        else:
            report_only = _report_only(command, args, env)
            if report_only:
                from .report import report_only_note

                message = f"{message}; {report_only_note(exc.exit_code)}"
            line = f"error: {message}"
            if _wants_json(command, args, env):
                import json

                from .report import error_fields

                line = json.dumps(error_fields(message, exc.exit_code), sort_keys=True)
            if not emit(line):
                tell(f"error: {message}")
            if report_only:
                return 0  # judged and said, never acted on: the kubelet counts no failure
        return exc.exit_code


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
