"""A container's command lines as the kubelet and a shell would see them: pure, no I/O.

The kubelet first replaces `$(VAR)` in `command` and `args` with the value of a variable the container's
`env` sets (`$$` escapes it); a variable it does not know is left as written. When the container runs
`sh -c SCRIPT` (or bash, dash, ...), the script is split into words as a shell splits them (quotes,
backslash-newline continuations, comments), into commands at `;`, `&&`, `||`, `|`, `&` and newlines,
and `$VAR`, `${VAR}` and `${VAR:-default}` are replaced where the env gives the value. Each command is
then a list of words, with `--flag_name` spelled `--flag-name` (vLLM's and SGLang's parsers take both).
A word that still holds a `$` depends on something the manifest does not say.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "UNRESOLVED",
    "command_lines",
    "env_values",
    "flag_value",
    "has_flag",
    "k8s_expand",
    "normal",
    "shell_words",
]

SHELLS = ("sh", "bash", "dash", "ash", "zsh", "ksh")
# Words that separate one shell command from the next.
SEPARATORS = (";", "&&", "||", "|", "&", "\n", "(", ")", ";;", "{", "}")
# Shell words that start a command without being it.
PREFIXES = ("exec", "then", "do", "else", "if", "while", "until", "!", "time", "nohup", "env")
UNRESOLVED = "$"
# The characters shlex returns as tokens of their own: runs of them separate commands.
PUNCTUATION = ";&|()\n"


def env_values(container: Mapping[str, Any]) -> dict[str, str]:
    """The variables the container's `env` sets to a literal value (later entries may use earlier ones,
    as the kubelet expands them in order); valueFrom variables are unknown here."""
    values: dict[str, str] = {}
    for entry in container.get("env") or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and "value" in entry:
            values[entry["name"]] = k8s_expand(str(entry["value"]), values)
    return values


def k8s_expand(text: str, env: Mapping[str, str]) -> str:
    """`$(VAR)` replaced as the kubelet replaces it: known variables only; `$$` is a literal `$`."""
    return "$".join(_k8s_references(piece, env) for piece in text.split("$$"))


def _k8s_references(text: str, env: Mapping[str, str]) -> str:
    head, *rest = text.split("$(")
    out = [head]
    for part in rest:  # each one follows a `$(`
        name, paren, tail = part.partition(")")
        out.append(env[name] + tail if paren and name in env else "$(" + part)
    return "".join(out)


def _shell_expand(word: str, env: Mapping[str, str]) -> str:
    """$VAR, ${VAR} and ${VAR:-default} replaced where the env gives the value (or the default does)."""
    import re  # shlex, which splits the words, imports it anyway

    def value(reference: re.Match[str]) -> str:
        braced, closed, plain = reference.groups()
        if plain is not None:
            return env.get(plain, reference[0])
        name, sep, default = braced.partition(":-")
        if closed and name in env:
            return env[name]
        if closed and sep and UNRESOLVED not in default:
            return default
        return reference[0]  # unclosed (the rest of the word), or unknown: as written

    return re.sub(r"\$\{([^}]*)(\}?)|\$(\w+)", value, word)


def shell_words(script: str, env: Mapping[str, str]) -> list[list[str]]:
    """The commands of a shell script, each a list of words. A script that cannot be split (an
    unclosed quote) gives no commands: nothing is guessed from it."""
    import shlex

    lexer = shlex.shlex(script.replace("\\\n", " "), posix=True, punctuation_chars=PUNCTUATION)
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in SEPARATORS or all(char in PUNCTUATION for char in token):
                commands.append([])
            elif not commands[-1] and (token in PREFIXES or ("=" in token and token.split("=")[0].isidentifier())):
                continue  # `exec`, `then`, `VAR=value` before the command itself
            else:
                commands[-1].append(_shell_expand(token, env))
    except ValueError:
        return []
    return [command for command in commands if command]


def normal(word: str) -> str:
    """`--flag_name=v` spelled `--flag-name=v`: the parsers of vLLM and SGLang take both."""
    if not word.startswith("--"):
        return word
    flag, eq, value = word.partition("=")
    return flag.replace("_", "-") + eq + value


def command_lines(container: Mapping[str, Any], env: Mapping[str, str]) -> list[list[str]]:
    """The command lines the container runs: its command and args, or each command of its shell script."""
    words = [k8s_expand(str(word), env) for word in [*(container.get("command") or []), *(container.get("args") or [])]]
    if not words:
        return []
    if words[0].rpartition("/")[2] in SHELLS:
        # sh [-e -x ...] -c SCRIPT [$0 ARGS...]: the script is the first word after the option that has c.
        for i, word in enumerate(words[1:], 1):
            if not word.startswith("-"):
                break
            if "c" in word[1:] and not word.startswith("--") and i + 1 < len(words):
                return [[normal(w) for w in command] for command in shell_words(words[i + 1], env)]
    return [[normal(word) for word in words]]


def has_flag(words: list[str], flags: tuple[str, ...]) -> bool:
    return any(word.partition("=")[0] in flags for word in words)  # --flag or --flag=value


def flag_value(words: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the last of `flags` given (`--flag V` or `--flag=V`); None when none is given."""
    found = None
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag in flags:
            if eq:
                found = value
            elif i + 1 < len(words):
                found = words[i + 1]
    return found
