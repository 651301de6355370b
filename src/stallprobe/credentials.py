"""The API key the engine's routes want, sent by every exchange as a bearer token: from a file, from a
variable named by --api-key-env (the engine's own `--api-key $(NAME)`), or from the engine's own variable.
Read at every run, never written into a command: a key in a manifest's probe would be in every
`kubectl describe pod`.
"""

from __future__ import annotations

from .errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["KEY_VARIABLES", "api_key", "key_source"]

# Where an engine's own container keeps its API key: vLLM reads VLLM_API_KEY, llama.cpp's server
# LLAMA_API_KEY (a comma-separated list: any one of them is accepted).
KEY_VARIABLES = ("VLLM_API_KEY", "LLAMA_API_KEY")
# A file of keys (llama.cpp's --api-key-file: one a line) is read this far: a key is well under 4 KiB.
_MAX_FILE = 64 * 1024


def key_source(path: str | None, environ: Mapping[str, str], variable: str | None = None) -> str:
    """Where api_key() takes the key from: "--api-key-file", "--api-key-env NAME", the engine's variable
    that holds one, or ""."""
    if path is not None:
        return "--api-key-file"
    if variable is not None:
        return f"--api-key-env {variable}"
    return next((name for name in KEY_VARIABLES if environ.get(name, "").strip()), "")


def api_key(path: str | None, environ: Mapping[str, str], variable: str | None = None) -> str:
    """The API key to send: the first key of the file at `path` (one a line, `#` comments skipped), else of the variable
    `variable` (comma-separated), else of the engine's own variable in `environ`; "" when there is none.
    UsageError when the file cannot be read, or the file or a variable named holds no usable key; the key
    itself is never shown."""
    name = key_source(path, environ, variable)
    if path is not None:
        try:
            with open(path, "rb") as f:
                text = f.read(_MAX_FILE).decode("utf-8", "replace")
        except OSError as exc:
            raise UsageError(f"{name} {path}: {exc.strerror}") from None
        # A file of keys as llama.cpp's --api-key-file reads it: one a line, blank lines and comments skipped.
        keys = (line.strip() for line in text.splitlines())
        key = next((line for line in keys if line and not line.startswith("#")), "")
    elif variable is not None:
        if variable not in environ:
            raise UsageError(f"{name}: {variable} is not set in the environment")
        key = environ[variable].split(",")[0].strip()
    else:
        key = environ[name].split(",")[0].strip() if name else ""
    if (name and not key) or len(key) > 4096 or not all(" " < ch < "\x7f" for ch in key):
        raise UsageError(f"{name} must hold one API key of printable ASCII characters (the key is not shown)")
    return key
