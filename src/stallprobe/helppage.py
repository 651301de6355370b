"""A command's --help page, and the option rows the generated reference shows: from the option table
(options.py) and the exit-code table (errors.py), so that neither can drift from the code.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .options import Option

__all__ = ["help_lines", "help_page"]


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
