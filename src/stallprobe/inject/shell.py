"""A container's command lines as the kubelet and a shell would see them: pure, no I/O.

The container's variables are read as the kubelet sets them: each `envFrom` source in order (a later one
wins; a `prefix` goes before each key), then each `env` entry in order (it wins over `envFrom`, and a
name given twice takes the last), with `$(VAR)` in an `env` value replaced from what is set before it.
A ConfigMap is read when the input holds it (the caller passes those of the pod's namespace); a Secret,
a field of the pod, or a ConfigMap the input does not hold gives a value inject cannot know, and an
`envFrom` it cannot read may set any variable at all. Each unknown variable keeps why it is unknown.

The kubelet then replaces `$(VAR)` in `command` and `args` with the value of a variable the container
sets (`$$` escapes it); a variable it does not know is left as written. When the container runs
`sh -c SCRIPT` (or bash, dash, ...), the script is split into words as a shell splits them (quotes,
backslash-newline continuations, comments), into commands at `;`, `&&`, `||`, `|`, `&` and newlines,
and `$VAR`, `${VAR}` and `${VAR:-default}` are replaced where the env gives the value (the default only
where the variable is surely unset). Each command is
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
    "Env",
    "command_lines",
    "environment",
    "flag_value",
    "has_flag",
    "k8s_expand",
    "normal",
    "references",
    "shell_words",
    "standing",
]

SHELLS = ("sh", "bash", "dash", "ash", "zsh", "ksh")
# Words that separate one shell command from the next.
SEPARATORS = (";", "&&", "||", "|", "&", "\n", "(", ")", ";;", "{", "}")
# Shell words that start a command without being it.
PREFIXES = ("exec", "then", "do", "else", "if", "while", "until", "!", "time", "nohup", "env")
UNRESOLVED = "$"
# The characters shlex returns as tokens of their own: runs of them separate commands.
PUNCTUATION = ";&|()\n"


class Env:
    """A container's variables: `values`, those the input gives; `unknown`, those set to what it does not
    show (each with where from); `hidden`, the sources that may set any other variable; `fields`, the
    field of the pod each unknown one set by a fieldRef holds (status.podIP, ...)."""

    __slots__ = ("fields", "hidden", "unknown", "values")

    def __init__(self, values: dict[str, str] | None = None, unknown: dict[str, str] | None = None) -> None:
        self.values = values or {}
        self.unknown = unknown or {}
        self.hidden: list[str] = []  # each envFrom inject cannot read
        self.fields: dict[str, str] = {}

    def unset(self, name: str) -> bool:
        """Whether the variable is surely not set."""
        return not self.hidden and name not in self.values and name not in self.unknown

    def why(self, name: str) -> str:
        """Why the variable's value is not known."""
        if name in self.unknown:
            return f"{name} is {self.unknown[name]}"
        if self.hidden:
            return f"{name} may come from {self.hidden[-1]}"
        return f"{name} is set nowhere in the manifest"


def _refs(item: Any, key: str) -> str:
    ref = item.get(key)
    return str(ref.get("name")) if isinstance(ref, dict) else ""


def environment(container: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, str]] | None = None) -> Env:
    """The container's variables, as the kubelet sets them (the module's doc says how), from the
    ConfigMaps of its namespace that the input holds (name to data)."""
    maps = configmaps or {}
    env = Env()
    for source in container.get("envFrom") or []:
        if not isinstance(source, dict):
            continue
        name = _refs(source, "configMapRef")
        if name in maps:
            prefix = str(source.get("prefix") or "")
            for key, value in maps[name].items():
                env.values[prefix + key] = str(value)  # Helm may render a number unquoted
                env.unknown.pop(prefix + key, None)
        elif name or _refs(source, "secretRef"):
            where = (
                f"ConfigMap {name}, which is not in the input"
                if name
                else (f"Secret {_refs(source, 'secretRef')}, which inject does not read")
            )
            env.hidden.append(f"its envFrom {where}")
            # What came before may be overwritten by it.
            env.unknown.update(dict.fromkeys(env.values, f"perhaps overwritten by its envFrom {where}"))
            env.values.clear()
    for entry in container.get("env") or []:
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)):
            continue
        name = entry["name"]
        env.values.pop(name, None)
        env.unknown.pop(name, None)
        env.fields.pop(name, None)
        source = entry.get("valueFrom")
        if not isinstance(source, dict):
            env.values[name] = k8s_expand(str(entry.get("value", "")), env.values)
            continue
        ref = source.get("configMapKeyRef")
        if isinstance(ref, dict):
            configmap, key = str(ref.get("name")), str(ref.get("key"))
            if configmap not in maps:
                env.unknown[name] = f"key {key} of ConfigMap {configmap}, which is not in the input"
            elif key in maps[configmap]:
                env.values[name] = str(maps[configmap][key])
            elif ref.get("optional") is not True:  # the container does not start
                env.unknown[name] = f"key {key} of ConfigMap {configmap}, which has no such key"
        elif _refs(source, "secretKeyRef"):
            env.unknown[name] = f"from Secret {_refs(source, 'secretKeyRef')}, which inject does not read"
        else:
            env.unknown[name] = f"from its {next(iter(source), 'valueFrom')}, which the manifest does not show"
            field = source.get("fieldRef")
            if isinstance(field, dict):
                env.fields[name] = str(field.get("fieldPath"))
    return env


def standing(env: Env) -> Env:
    """Each variable the container sets standing for itself (`${NAME}`): command lines read with it keep
    every reference to one, however it is written, where the kubelet or the shell would put its value."""
    return Env({name: "${" + name + "}" for name in [*env.values, *env.unknown]})


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


def _shell_expand(word: str, env: Env) -> str:
    """$VAR, ${VAR} and ${VAR:-default} replaced where the env gives the value (or, where the variable is
    surely unset, the default does)."""
    import re  # shlex, which splits the words, imports it anyway

    def value(reference: re.Match[str]) -> str:
        braced, closed, plain = reference.groups()
        if plain is not None:
            return env.values.get(plain, reference[0])
        name, sep, default = braced.partition(":-")
        if closed and name in env.values:
            return env.values[name]
        if closed and sep and UNRESOLVED not in default and env.unset(name):
            return default
        return reference[0]  # unclosed (the rest of the word), or unknown: as written

    return re.sub(r"\$\{([^}]*)(\}?)|\$(\w+)", value, word)


def shell_words(script: str, env: Env) -> list[list[str]]:
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


def command_lines(container: Mapping[str, Any], env: Env) -> list[list[str]]:
    """The command lines the container runs: its command and args, or each command of its shell script."""
    raw = [str(word) for word in [*(container.get("command") or []), *(container.get("args") or [])]]
    words = [k8s_expand(word, env.values) for word in raw]
    if not words:
        return []
    if words[0].rpartition("/")[2] in SHELLS:
        # The kubelet puts a value the input does not show (a Secret's, the pod's IP) into the script, where
        # the shell reads the same value from the environment: `${NAME}`, which a shell splits as one word
        # (an unquoted `$(NAME)` would read as a command substitution).
        known = {**{name: "${" + name + "}" for name in env.unknown}, **env.values}
        words = [k8s_expand(word, known) for word in raw]
        # sh [-e -x ...] -c SCRIPT [$0 ARGS...]: the script is the first word after the option that has c.
        for i, word in enumerate(words[1:], 1):
            if not word.startswith("-"):
                break
            if "c" in word[1:] and not word.startswith("--") and i + 1 < len(words):
                return [[normal(w) for w in command] for command in shell_words(words[i + 1], env)]
    return [[normal(word) for word in words]]


def references(text: str) -> list[str]:
    """The variables a word still refers to: `$(VAR)`, `${VAR...}`, `$VAR`."""
    import re

    return [next(name for name in found if name) for found in re.findall(r"\$\((\w+)\)|\$\{(\w+)|\$(\w+)", text)]


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
