"""Every flag of every command in one table: its environment variable, how its value is read (readers.py),
its default, what it means. The probe, `watch`, `inject` and `doctor` each take a selection of the table;
settings.py fills a command's typed configuration from it, helppage.py writes its --help.

The parsing is written by hand, not with argparse, because argparse pulls in `re` and gettext, which would
be most of the probe's own start-up cost, paid every few seconds in every pod.
"""

from __future__ import annotations

from .detector import DEFAULT_DRAIN_AFTER, DEFAULT_SATURATION, DEFAULT_THRASH_WINDOW, DEFAULT_WINDOW
from .engines import ENGINE_NAMES
from .errors import ExitCode
from .judge import DEFAULT_CANARY_INTERVAL
from .readers import (
    read_address,
    read_command,
    read_count,
    read_dns_name,
    read_engine,
    read_engine_label,
    read_metric_name,
    read_non_negative,
    read_nonempty,
    read_output_format,
    read_port,
    read_positive,
    read_sha256,
    read_switch,
    read_url,
    read_variable_name,
    read_waiting,
)
from .report import num

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "API_KEY_ENV",
    "API_KEY_FILE",
    "CANARY",
    "CANARY_INTERVAL",
    "CHECK",
    "CONFIGMAP",
    "CONTAINER",
    "COOLDOWN",
    "DEFAULT_CANARY_INTERVAL",
    "DEFAULT_COOLDOWN",
    "DEFAULT_DRAIN_AFTER",
    "DEFAULT_FAILURE_THRESHOLD",
    "DEFAULT_HOOK_TIMEOUT",
    "DEFAULT_INTERVAL",
    "DEFAULT_PERIOD",
    "DEFAULT_SECONDS",
    "DEFAULT_STARTUP_BUDGET",
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "DOCTOR",
    "DRAIN_AFTER",
    "ENGINE",
    "ENGINE_LABEL",
    "ENGINE_OPTIONS",
    "EVERY",
    "FAILURE_THRESHOLD",
    "FAIL_THRASHING_AFTER",
    "FILENAME",
    "FORCE",
    "GENERATION_METRIC",
    "HOOK_TIMEOUT",
    "INCLUDE_WAITING",
    "INJECT",
    "INJECT_PORT",
    "INTERVAL",
    "JSON",
    "LISTEN",
    "NO_READY",
    "ONCE",
    "ON_SATURATED",
    "ON_STALLED",
    "OUTPUT",
    "PASSED_ON",
    "PERIOD",
    "PRINT_PROBE",
    "PROBE",
    "PROGRESS_METRIC",
    "PROMPT_METRIC",
    "PYTHON",
    "PYZ",
    "PYZ_SHA256",
    "READY",
    "REPORT_ONLY",
    "REPORT_ONLY_FILE",
    "RUNNING_METRIC",
    "SATURATION",
    "SECONDS",
    "SERVER_LOAD",
    "STARTUP_BUDGET",
    "STATE_FILE",
    "STATE_VOLUME",
    "STRICT",
    "TERMINATION_LOG",
    "THRASH_WINDOW",
    "TIMEOUT",
    "TRANSITION_LOG",
    "URL",
    "WAITING_METRIC",
    "WATCH",
    "WINDOW",
    "Option",
]

DEFAULT_URL = "http://127.0.0.1:8000/metrics"
# vLLM's /metrics (metrics server on the API process) answers in well under a second even when the
# engine is saturated; 3 s tolerates a CPU-starved container without outliving a sane timeoutSeconds.
DEFAULT_TIMEOUT = 3.0
# A person reading watch's table wants it fresh; the detector needs only a few samples per window. One GET
# per engine every 5 s is nothing next to what the engine serves.
DEFAULT_INTERVAL = 5.0
# Longer than a model takes to load (the README's startupProbe allows 10 minutes): a restarted engine is
# not restarted again before it could have served a request.
DEFAULT_COOLDOWN = 600.0
# A restart command (docker restart, systemctl restart) returns within a minute; five minutes is a hang.
DEFAULT_HOOK_TIMEOUT = 300.0
# The doctor's look: ten looks, one a second, show a busy engine's counters moving (vLLM publishes every
# step, SGLang at least every few seconds), and a person at a terminal waits that long without wondering.
DEFAULT_SECONDS = 10.0
# The kubelet's defaults for a probe's period and failureThreshold; `inject` writes them.
DEFAULT_PERIOD = 10
DEFAULT_FAILURE_THRESHOLD = 3


class Option:
    """One flag: its metavar ("" for a switch; ending in "..." when it may repeat), how its text is read,
    its default, what it means, and the environment variable the probe also reads it from."""

    __slots__ = (
        "_env_shown",
        "_shown",
        "attribute",
        "bare",
        "default",
        "env",
        "flag",
        "help",
        "metavar",
        "read",
        "short",
    )

    def __init__(
        self,
        flag: str,
        metavar: str,
        read: Callable[[str, str], object],
        default: object,
        help: str,
        *,
        env: str = "",
        shown: str = "",
        env_shown: str = "",
        short: str = "",
        bare: str = "",
    ) -> None:
        self.flag = flag
        # The name of the attribute its value sets on a command's configuration (settings.py).
        self.attribute = flag[2:].replace("-", "_")
        self.metavar = metavar
        self.read = read
        self.default = default
        self.help = help
        self.env = env
        self.short = short  # a one-letter alias (-f)
        # The text a flag given without a value means, for a flag whose value is optional ("" when it is
        # not): `--flag` is `--flag=BARE`; `--flag=VALUE`, or `--flag VALUE` when VALUE reads, gives one.
        self.bare = bare
        self._shown = shown
        self._env_shown = env_shown

    # Worked out when --help or the docs ask, not when the probe imports the table (a run never asks).
    @property
    def shown(self) -> str:
        """The default as --help and the docs show it."""
        if self._shown:
            return self._shown
        default = self.default
        return "off" if not self.metavar else num(default) if isinstance(default, float) else str(default)

    @property
    def env_shown(self) -> str:
        """The default for a command that reads the environment, when the environment can supply it."""
        return self._env_shown or self.shown

    @property
    def usage(self) -> str:
        """The flag as --help and the docs write it: `-f, --filename FILE`, `--include-waiting[=WHEN]`."""
        flag = f"{self.short}, {self.flag}" if self.short else self.flag
        return f"{flag}[=WHEN]" if self.bare else f"{flag} {self.metavar}".strip()

    @property
    def is_switch(self) -> bool:
        return not self.metavar and not self.bare

    @property
    def repeats(self) -> bool:
        return self.metavar.endswith("...")


_EACH_ENGINE = "the engine's"

URL = Option(
    "--url",
    "URL",
    read_url,
    DEFAULT_URL,
    "the engine's Prometheus page; its host may be $(NAME), read from the environment at every run (the pod's"
    " address: the kubelet expands no variable in a probe's command)",
    env="STALLPROBE_URL",
)
WINDOW = Option(
    "--window",
    "SECONDS",
    read_positive,
    DEFAULT_WINDOW,
    "busy with no progress this long is stalled",
    env="STALLPROBE_WINDOW",
)
TIMEOUT = Option(
    "--timeout",
    "SECONDS",
    read_positive,
    DEFAULT_TIMEOUT,
    "one deadline per scrape, connect to last byte",
    env="STALLPROBE_TIMEOUT",
)
STATE_FILE = Option(
    "--state-file",
    "PATH",
    read_nonempty,
    None,
    "the last sample's file",
    env="STALLPROBE_STATE_FILE",
    shown="$TMPDIR/stallprobe-<host_port_path>-<hash>.state",
)
SATURATION = Option(
    "--saturation",
    "N",
    read_positive,
    DEFAULT_SATURATION,
    "waiting >= N while progressing is saturated",
    env="STALLPROBE_SATURATION",
)
THRASH_WINDOW = Option(
    "--thrash-window",
    "SECONDS",
    read_positive,
    DEFAULT_THRASH_WINDOW,
    "busy, tokens moving, no request finished this long (prefill far ahead of decoding, or preemptions"
    " climbing) is thrashing: said, not acted on",
    env="STALLPROBE_THRASH_WINDOW",
)
FAIL_THRASHING_AFTER = Option(
    "--fail-thrashing-after",
    "SECONDS",
    read_positive,
    None,
    "thrashing this long is stalled: liveness fails and readiness drains (off by default: a whole pool"
    " overloaded at once thrashes together, and draining every member would empty it)",
    env="STALLPROBE_FAIL_THRASHING_AFTER",
    shown="never",
)
ENGINE = Option("--engine", "NAME", read_engine, "auto", ", ".join(ENGINE_NAMES), env="STALLPROBE_ENGINE")
INCLUDE_WAITING = Option(
    "--include-waiting",
    "",
    read_waiting,
    None,
    "which waiting requests are owed work: auto (waiting for capacity, nothing running), always (bare), never",
    env="STALLPROBE_INCLUDE_WAITING",
    shown="auto",
    bare="always",
)
PROGRESS_METRIC = Option(
    "--progress-metric",
    "NAME...",
    read_metric_name,
    (),
    "also progress when this changes",
    env="STALLPROBE_PROGRESS_METRIC",
    shown="none",
)
RUNNING_METRIC = Option(
    "--running-metric",
    "NAME",
    read_metric_name,
    None,
    "gauge of running requests",
    env="STALLPROBE_RUNNING_METRIC",
    shown=_EACH_ENGINE,
)
WAITING_METRIC = Option(
    "--waiting-metric",
    "NAME",
    read_metric_name,
    None,
    "gauge of queued requests",
    env="STALLPROBE_WAITING_METRIC",
    shown=_EACH_ENGINE,
)
PROMPT_METRIC = Option(
    "--prompt-metric",
    "NAME",
    read_metric_name,
    None,
    "counter of prompt tokens",
    env="STALLPROBE_PROMPT_METRIC",
    shown=_EACH_ENGINE,
)
GENERATION_METRIC = Option(
    "--generation-metric",
    "NAME",
    read_metric_name,
    None,
    "counter of generated tokens",
    env="STALLPROBE_GENERATION_METRIC",
    shown=_EACH_ENGINE,
)
ENGINE_LABEL = Option(
    "--engine-label",
    "LABEL",
    read_engine_label,
    None,
    "label naming an engine; none: one",
    env="STALLPROBE_ENGINE_LABEL",
    shown=_EACH_ENGINE,
)
JSON = Option("--json", "", read_switch, False, "print JSON objects instead of lines", env="STALLPROBE_JSON")
STRICT = Option(
    "--strict",
    "",
    read_switch,
    False,
    "fail (exit 3, 4 or 5) when the engine's page cannot be judged, instead of asking its health route",
    env="STALLPROBE_STRICT",
)
REPORT_ONLY = Option(
    "--report-only",
    "",
    read_switch,
    False,
    "liveness: judge, print and keep the state, and exit 0 unless the engine's server refuses or its health"
    " route answers an error (the line says what the exit would have been); a --ready run ignores it",
    env="STALLPROBE_REPORT_ONLY",
)
READY = Option(
    "--ready",
    "",
    read_switch,
    False,
    "readiness: exit 0 unless the engine is stalled under --drain-after or the window, paused, or its health"
    " route fails",
    env="STALLPROBE_READY",
)
DRAIN_AFTER = Option(
    "--drain-after",
    "SECONDS",
    read_positive,
    DEFAULT_DRAIN_AFTER,
    "readiness: busy with no progress (or silent) this long is not ready, out of routing",
    env="STALLPROBE_DRAIN_AFTER",
)
CANARY = Option(
    "--canary",
    "",
    read_switch,
    False,
    "when the engine looks idle and nothing moved, send one 1-token completion; no answer is a stall",
    env="STALLPROBE_CANARY",
)
CANARY_INTERVAL = Option(
    "--canary-interval",
    "SECONDS",
    read_positive,
    DEFAULT_CANARY_INTERVAL,
    "the least time between two canaries to a healthy idle engine",
    env="STALLPROBE_CANARY_INTERVAL",
)
SERVER_LOAD = Option(
    "--server-load",
    "",
    read_switch,
    False,
    "when the engine looks idle, ask its HTTP requests in flight (vLLM /load)",
    env="STALLPROBE_SERVER_LOAD",
)
API_KEY_FILE = Option(
    "--api-key-file",
    "PATH",
    read_nonempty,
    None,
    "a file holding the API key the routes want (Authorization: Bearer; its first line, of several)",
    env="STALLPROBE_API_KEY_FILE",
    shown="none",
    env_shown="VLLM_API_KEY or LLAMA_API_KEY when set",
)
API_KEY_ENV = Option(
    "--api-key-env",
    "NAME",
    read_variable_name,
    None,
    "the environment variable holding the API key, read at every run (the engine's --api-key $(NAME))",
    env="STALLPROBE_API_KEY_ENV",
    shown="none",
)
REPORT_ONLY_FILE = Option(
    "--report-only-file",
    "PATH",
    read_nonempty,
    None,
    "the kill switch: while this file says 1/true/yes/on, a liveness run is report-only (inject mounts it"
    " from its ConfigMap's report-only key: kubectl patch turns it on without a rollout)",
    env="STALLPROBE_REPORT_ONLY_FILE",
    shown="none",
)
# PID 1's standard output is the container's log: what `kubectl logs` shows and every log pipeline collects.
TRANSITION_LOG = Option(
    "--transition-log",
    "PATH",
    read_nonempty,
    "/proc/1/fd/1",
    "where a run whose verdict or readiness changed writes its line, prefixed `stallprobe: ` (none: nowhere)",
    env="STALLPROBE_TRANSITION_LOG",
)
TERMINATION_LOG = Option(
    "--termination-log",
    "PATH",
    read_nonempty,
    None,
    "where a failing liveness run writes its evidence for the kubelet (the container's terminationMessagePath)",
    env="STALLPROBE_TERMINATION_LOG",
    shown="none",
)

INTERVAL = Option("--interval", "SECONDS", read_positive, DEFAULT_INTERVAL, "poll every this long")
ONCE = Option("--once", "", read_switch, False, "poll twice, one interval apart, print and exit")
EVERY = Option(
    "--every",
    "",
    read_switch,
    False,
    "piped: a line for every engine at every poll, not only the changes and one summary line a poll",
)
ON_STALLED = Option(
    "--on-stalled",
    "CMD",
    read_command,
    (),
    "run CMD once per stall episode of an engine (restart it; drain the load balancer first)",
    shown="none",
)
ON_SATURATED = Option(
    "--on-saturated", "CMD", read_command, (), "run CMD once per saturation episode (page; never restart)", shown="none"
)
COOLDOWN = Option(
    "--cooldown",
    "SECONDS",
    read_non_negative,
    DEFAULT_COOLDOWN,
    "per endpoint, the least time between two runs of a hook",
)
LISTEN = Option(
    "--listen",
    "HOST:PORT",
    read_address,
    None,
    "serve /metrics (Prometheus) and /ready?url=URL (load balancers) while polling",
    shown="off",
)
AGENT = Option(
    "--agent",
    "HOST:PORT",
    read_address,
    None,
    "answer HAProxy's agent checks (agent-send: an engine's host:port or URL) while polling",
    shown="off",
)
HOOK_TIMEOUT = Option(
    "--hook-timeout",
    "SECONDS",
    read_positive,
    DEFAULT_HOOK_TIMEOUT,
    "kill a hook (and its process group) after this long",
)

SECONDS = Option("--seconds", "SECONDS", read_positive, DEFAULT_SECONDS, "look at the engine this long, once a second")

FILENAME = Option("--filename", "FILE", read_nonempty, "-", "the manifests (- for stdin)", short="-f")
CONTAINER = Option(
    "--container", "NAME", read_nonempty, None, "inject into the container of this name only", shown="any"
)
PERIOD = Option("--period", "SECONDS", read_count, DEFAULT_PERIOD, "the probe's periodSeconds")
FAILURE_THRESHOLD = Option(
    "--failure-threshold", "N", read_count, DEFAULT_FAILURE_THRESHOLD, "the probe's failureThreshold"
)
FORCE = Option(
    "--force", "", read_switch, False, "replace any liveness (and readiness) probe, not just a plain /health check"
)
STATE_VOLUME = Option("--state-volume", "", read_switch, False, "keep the state in an emptyDir always")
CONFIGMAP = Option(
    "--configmap",
    "NAME",
    read_dns_name,
    None,
    "a fixed name for the ConfigMap that carries the probe",
    shown="stallprobe-HASH from the build's sha256, after the workloads' app.kubernetes.io/instance if one",
)
PYZ = Option(
    "--pyz",
    "FILE",
    read_nonempty,
    None,
    "a stallprobe.pyz to ship, checked against --pyz-sha256 or a release's SHA256SUMS beside it",
    shown="built from this installation",
)
PYZ_SHA256 = Option(
    "--pyz-sha256",
    "HEX",
    read_sha256,
    None,
    "with --pyz: the sha256 the archive must have, else nothing is written",
    shown="the SHA256SUMS beside --pyz, if there is one",
)
PYTHON = Option(
    "--python",
    "PYTHON",
    read_nonempty,
    None,
    "the image's interpreter (python3.12, /opt/conda/bin/python): the probe's command runs it, and the "
    "archive ships bytecode for it where it runs here too (~10 ms less CPU a run)",
    shown="python3, or the one the container's command runs",
)

# Half an hour for the model to load before inject's startup guard gives up: a 405B model pulled from a
# hub (~800 GB at a few GB/s) and loaded across 16 GPUs takes tens of minutes, and the guard costs nothing
# when the engine comes up sooner (it passes at the first answer of its health route). A load that hangs
# past it is restarted, as any wedge is.
DEFAULT_STARTUP_BUDGET = 1800.0
CHECK = Option(
    "--check",
    "",
    read_switch,
    False,
    f"write nothing; exit {ExitCode.CHANGES} when a run would change the manifests (CI)",
)
STARTUP_BUDGET = Option(
    "--startup-budget",
    "SECONDS",
    read_positive,
    DEFAULT_STARTUP_BUDGET,
    "the startupProbe inject adds (where nothing guards loading) waits this long for the model",
)
PRINT_PROBE = Option(
    "--print-probe",
    "",
    read_switch,
    False,
    "print only the container fields and the ConfigMap (needs --engine, --port)",
)
NO_READY = Option(
    "--no-ready",
    "",
    read_switch,
    False,
    "add no readiness probe: a container's own stays as it is, one inject wrote only asks the health route",
)
INJECT_PORT = Option(
    "--port",
    "PORT",
    read_port,
    None,
    "with --container: the port its engine serves HTTP on, where the manifest does not show it; --print-probe's",
    shown="none",
)
HOST_ADDRESS = Option(
    "--host-address",
    "ADDR",
    read_nonempty,
    None,
    "with --container: the address its engine binds, where the manifest does not show it (0.0.0.0, ::1, "
    "10.0.0.5, or $(VAR) for a variable holding the pod's IP); --print-probe's",
    shown="from the manifest",
)
OUTPUT = Option("--output", "FORMAT", read_output_format, "yaml", "with --print-probe: yaml or json")

# How an engine's page is read and judged: the same for the probe, watch, and the probes inject writes.
ENGINE_OPTIONS = (
    WINDOW,
    SATURATION,
    THRASH_WINDOW,
    FAIL_THRASHING_AFTER,
    ENGINE,
    INCLUDE_WAITING,
    PROGRESS_METRIC,
    RUNNING_METRIC,
    WAITING_METRIC,
    PROMPT_METRIC,
    GENERATION_METRIC,
    ENGINE_LABEL,
)
PROBE = (
    URL,
    TIMEOUT,
    STATE_FILE,
    *ENGINE_OPTIONS,
    API_KEY_FILE,
    API_KEY_ENV,
    CANARY,
    CANARY_INTERVAL,
    SERVER_LOAD,
    READY,
    DRAIN_AFTER,
    JSON,
    STRICT,
    REPORT_ONLY,
    REPORT_ONLY_FILE,
    TRANSITION_LOG,
    TERMINATION_LOG,
)
WATCH = (
    INTERVAL,
    TIMEOUT,
    *ENGINE_OPTIONS,
    API_KEY_FILE,
    CANARY,
    CANARY_INTERVAL,
    SERVER_LOAD,
    ONCE,
    JSON,
    EVERY,
    ON_STALLED,
    ON_SATURATED,
    COOLDOWN,
    HOOK_TIMEOUT,
    LISTEN,
    AGENT,
    DRAIN_AFTER,
)
# The doctor looks at the engine as the probe would (every look option, the readiness rule's drain window
# too), and reads the probe's environment as the probe does.
DOCTOR = (URL, SECONDS, TIMEOUT, *ENGINE_OPTIONS, API_KEY_FILE, CANARY, CANARY_INTERVAL, SERVER_LOAD, DRAIN_AFTER)
# The probe's own flags that inject writes into the probes it adds, when given.
PASSED_ON = (*ENGINE_OPTIONS, CANARY, CANARY_INTERVAL, SERVER_LOAD, API_KEY_FILE, API_KEY_ENV, STRICT, REPORT_ONLY)
INJECT = (
    FILENAME,
    CONTAINER,
    TIMEOUT,
    *PASSED_ON,
    PERIOD,
    FAILURE_THRESHOLD,
    FORCE,
    STATE_VOLUME,
    CONFIGMAP,
    PYZ,
    PYZ_SHA256,
    PYTHON,
    DRAIN_AFTER,
    NO_READY,
    STARTUP_BUDGET,
    CHECK,
    PRINT_PROBE,
    INJECT_PORT,
    HOST_ADDRESS,
    OUTPUT,
)
