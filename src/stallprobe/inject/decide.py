"""Whether one container gets the probe, and how: a pure function of the container, its pod's role, the
options, and what the input shows around it (the ConfigMaps and Services of its namespace). No I/O;
tests/test_inject_decide.py holds it as a table.

The rules, in order, each with its reason:

1. Not an inference container (no engine in its image or command, and not the one --container names):
   ignored, silently; sidecars and init containers are never touched.
2. The worker template of a LeaderWorkerSet: its pods join the leader's engine (ray workers, SGLang
   ranks > 0, vLLM headless) and serve no HTTP; the leader's Service selects only the leader. A probe
   there can only fail, and with RecreateGroupOnPodRestart every failure recreates the whole group.
3. A command that marks a worker: --headless, --node-rank other than 0 (or one that differs per pod),
   vLLM's --data-parallel-start-rank > 0 without a load-balanced mode, --api-server-count 0, `ray start`,
   llama.cpp's rpc-server; or a router, not an engine: TensorRT-LLM's `trtllm-serve disaggregated`, in
   front of its context and generation servers, publishes none of their families. Same reason.
4. Metrics off by the operator's choice (vLLM's --disable-log-stats registers no vllm: family,
   LMDeploy's --disable-metrics none of lmdeploy:): every run would fail, so skipped, saying so,
   wherever the flag is written: an argument, the command, a shell script, or the value of a variable
   the command expands.
5. The port: only one the manifest shows the engine serves HTTP on, since a probe on any other fails
   every run, and a startup probe that fails for its whole budget restarts a healthy engine forever.
   Its port flag on the engine's server command (`$(VAR)` and `$VAR` resolved from env, envFrom and
   configMapKeyRef of ConfigMaps in the input, in its namespace), else the engine's own port variable,
   else its declared port: the one TCP containerPort, or among several the one named for HTTP (http,
   http-*, *-http, api, openai; or the target of a Service port of its pod named so or with appProtocol
   http). With its plain server as the command (or the image's entrypoint) and no flag, the engine serves
   on its default, which a declared port must not contradict (but llama.cpp, whose image may set its
   port variable, is read from its declared port). A script or image the manifest does not show is
   proven by nothing it declares, unless --container names it, or, for an image whose entrypoint inject
   does not know, two sources agree: args that are the engine's own flags, whose port flag says the
   container's one containerPort. --port given to inject settles what the manifest leaves open, but
   never overrides the engine's own flag or variable. Anything else (a Secret, a ConfigMap not in the
   input, several ports none named for HTTP): skipped, saying so.
6. The address, proven like the port: a probe that dials where the engine does not listen is refused
   every run, and the engine is restarted again and again. Its host flag, else its own address
   variable, else its default (serving.py); loopback or a wildcard is dialled at loopback, a literal
   address where it is, a variable holding the pod's IP (a fieldRef to status.podIP or status.hostIP)
   as `$(VAR)`, which the probe reads at run time. A host name, a Secret, a ConfigMap not in the input,
   a UNIX socket: skipped, saying so. --host-address settles what the manifest leaves open.
7. Metrics not on (SGLang without --enable-metrics and llama.cpp without --metrics publish none): turned
   on (an argument appended, or for llama.cpp its variable set), said on stderr; an SGLang shell script
   cannot be edited safely: skipped. Metrics that options of a config file turn on (TensorRT-LLM's
   return_perf_metrics and enable_iter_perf_stats, in the YAML its --extra_llm_api_options or --config
   names): the file is read where the input shows it (a key of a ConfigMap in the input, mounted where
   the flag points), and what it lacks is said, with what each option buys; where inject cannot see
   it, which options the probe needs is said. The probe goes in either way: without them every run
   falls back to the engine's health route ('unjudged'), a health check and nothing worse.
8. The interpreter: the probe is a Python program, and an exec probe whose interpreter the image lacks
   fails every run. --python's, else the one its command runs, else python3 in an image known to carry
   it, or where the engine is itself a Python program (said, naming the image, where inject does not
   know it). A C++ engine (llama.cpp) in an image that has none, or that inject does not know: skipped.
9. The API key: a key its command takes from a variable is read by the probe from that variable at run
   time (--api-key-env), a file of keys from that file; a key the probe cannot reach (written into the
   command) is said, with what to do. The key itself is never copied into the probe's command.
10. The liveness probe: absent, a plain /health check, or ours is (re)written; any other is the
   operator's and is kept unless --force. A failing run leaves its evidence where the kubelet reads the
   container's termination message when it ends (a liveness kill too): its terminationMessagePath, never
   changed, else Kubernetes' default /dev/termination-log.
11. The startup guard: without a startupProbe and without initialDelaySeconds, a liveness probe runs
   while the model loads, fails, and the kubelet kills the container before it ever serves.
12. Readiness (drain after --drain-after, 30 s, unless --no-ready): absent, a plain /health check or ours
   is (re)written; any other is kept unless --force.
13. The window of an engine whose page cannot show a long request's progress (TensorRT-LLM's counts
   tokens when a request finishes): its own (Dialect.window, far above vLLM's) where --window does not
   say, written into the probe and said. (Readiness keeps --drain-after: an engine of such a page is
   asked a request through the whole engine before it is drained.)
"""

from __future__ import annotations

from ..engines import DIALECTS
from ..serving import (
    LAUNCHER_KEY,
    MOUNT,
    PYZ_KEY,
    SERVING,
    TERMINATION_LOG,
    Address,
    address,
    default_address,
    python_in,
)
from .shell import (
    SHELLS,
    UNRESOLVED,
    Env,
    command_lines,
    environment,
    flag_value,
    has_flag,
    normal,
    references,
    standing,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from ..serving import Serving

__all__ = [
    "Choice",
    "Context",
    "Decision",
    "decide",
    "engine_of",
    "is_ours",
    "is_plain_health_check",
    "own_window",
    "says_http",
]

# The roles a pod template plays: a plain pod, the leader of a LeaderWorkerSet group, one of its workers,
# or the worker template of a set without a leader template (it makes the leader and the workers alike).
ROLES = ("pod", "leader", "worker", "shared")
LB_MODES = ("--data-parallel-hybrid-lb", "--data-parallel-external-lb")
TRUE = ("1", "true", "on", "enabled", "yes")
# Port names that say HTTP: these, or http-* (Istio's convention: a port's protocol, then a suffix) and
# *-http. Not `metrics`: each engine serves /metrics on its one HTTP port, so a metrics port other than
# that one is another process's (Ray's exporter, an exporter in a wrapper), and names nothing by itself.
HTTP_NAMES = ("http", "api", "openai")
# The fields of the pod a variable may hold that name the address its engine binds: the pod's IP (the
# host's, under hostNetwork, where the two are one). status.podIPs is a list, no one address.
POD_ADDRESSES = ("status.podIP", "status.hostIP")


class Choice:
    """What the options say about the choice: --container, --engine, --port, --host-address, --python,
    --force; whether a readiness probe is asked (drain), and whether --window was given."""

    __slots__ = ("container", "drain", "engine", "force", "host", "port", "python", "window_given")

    def __init__(
        self,
        *,
        container: str | None = None,
        engine: str | None = None,
        force: bool = False,
        drain: bool = False,
        port: int | None = None,
        host: str | None = None,
        python: str | None = None,
        window_given: bool = False,
    ) -> None:
        self.container = container
        self.engine = engine
        self.force = force
        self.drain = drain
        self.port = port
        self.host = host  # --host-address: a literal address, or $(VAR) naming one the probe reads
        self.python = python
        self.window_given = window_given


class Context:
    """What the input shows around a container: the ConfigMaps of its namespace that it holds (name to
    data), the ports of the Services of that namespace whose selector selects its pod, and its pod's
    volumes."""

    __slots__ = ("configmaps", "service_ports", "volumes")

    def __init__(
        self,
        configmaps: Mapping[str, Mapping[str, str]] | None = None,
        service_ports: Sequence[Any] = (),
        volumes: Sequence[Any] = (),
    ) -> None:
        self.configmaps = configmaps or {}
        self.service_ports = list(service_ports)
        self.volumes = list(volumes)


class Decision:
    """action: "probe", "skip" (why says why), "keep" (its own liveness probe), or "ignore" (not ours to
    touch, nothing said). For "probe": the engine, the port and where it came from, where the probe dials
    it, the interpreter it runs with, the key flags, what to turn on, and what else to say."""

    __slots__ = (
        "action",
        "address",
        "enable",
        "engine",
        "key",
        "liveness",
        "notes",
        "port",
        "port_from",
        "python",
        "readiness",
        "startup",
        "termination",
        "why",
        "window",
    )

    def __init__(
        self,
        action: str,
        why: str = "",
        *,
        engine: str | None = None,
        port: int = 0,
        port_from: str = "",
        address: Address | None = None,
        python: str = "",
        key: tuple[str, ...] = (),
        enable: tuple[str, str] = ("", ""),
        startup: bool = False,
        liveness: str = "",
        readiness: str = "",
        termination: str = TERMINATION_LOG,
        window: float | None = None,
        notes: tuple[str, ...] = (),
    ) -> None:
        self.action = action
        self.why = why
        self.engine = engine
        self.port = port
        self.port_from = port_from
        self.address = address  # where the probe dials the engine (serving.Address)
        self.python = python  # the interpreter the pod's command runs
        self.key = key  # the probe's flags for the engine's API key: ("--api-key-env", "VAR"), or ()
        self.enable = enable  # ("arg", "--enable-metrics") or ("env", "LLAMA_ARG_ENDPOINT_METRICS"): turn on
        self.startup = startup  # add the startup guard
        self.liveness = liveness  # "added", "replaced" or "ours"
        self.readiness = readiness  # "" (not asked), "added", "replaced", "ours" or "kept"
        self.termination = termination  # the container's termination message file, for the probe's evidence
        self.window = window  # the engine's own window, where --window does not say (None: the run's)
        self.notes = notes  # what else to say on stderr (an image inject does not know, a key out of reach)

    def __repr__(self) -> str:
        fields = {name: getattr(self, name) for name in self.__slots__}
        return f"Decision({fields})"


def _words(container: Mapping[str, Any]) -> list[str]:
    """Its command and args, as written."""
    return [str(word) for word in [*(container.get("command") or []), *(container.get("args") or [])]]


def _image(container: Mapping[str, Any]) -> str:
    # A container without one (which Kubernetes rejects) reads "None", which names no engine.
    return str(container.get("image"))


def engine_of(container: Mapping[str, Any]) -> str | None:
    """The engine a container runs, from its image and command line; None when it runs none we know."""
    words = [word.lower() for word in [_image(container), *_words(container)]]
    return next((d.name for d in DIALECTS if any(hint in word for hint in d.hints for word in words)), None)


# The word that says a probe's command runs ours: the launcher's path (python3 -I -S /opt/stallprobe/probe
# ...), or, in what an earlier release wrote, the archive's name inside its `-c` program.
OURS = (f"{MOUNT}/{LAUNCHER_KEY}", PYZ_KEY)


def is_ours(probe: Any) -> bool:
    """Whether inject wrote this probe (this release or an earlier one): its command runs the launcher, or
    names the archive."""
    command = probe.get("exec", {}).get("command") if isinstance(probe, dict) else None
    return isinstance(command, list) and any(str(word) == OURS[0] or OURS[1] in str(word) for word in command)


def _replacing(probe: Any, force: bool) -> str:
    """What becomes of a probe the container has: "added" (none), "ours" (already injected),
    "replaced" (a plain health check, or any with --force) or "kept" (the operator's own)."""
    if probe is None:
        return "added"
    if is_ours(probe):
        return "ours"
    return "replaced" if is_plain_health_check(probe) or force else "kept"


def is_plain_health_check(probe: Any) -> bool:
    """An HTTP GET of /health: it only says the process is alive, which is what the probe replaces."""
    path = probe.get("httpGet", {}).get("path") if isinstance(probe, dict) else None
    return isinstance(path, str) and path.rstrip("/") in ("/health", "/healthz")


def _is_server(words: list[str], servers: tuple[str, ...]) -> bool:
    # A server named by its path (/usr/bin/vllm serve) ends with its name, so it is found all the same.
    head = " ".join(words[:3])
    return any(server in head for server in servers)


def _port(text: str | None) -> int | None:
    if text is None or not (text.isascii() and text.isdigit()):
        return None
    try:
        number = int(text)
    except ValueError:  # past 4300 digits, int() refuses (Python's guard against slow conversions)
        return None
    return number if 0 < number < 65536 else None


def _worker(words: list[str]) -> str:
    """Why this command line is a multi-node worker's, or "" when nothing marks it one."""
    head = " ".join(words[:2]).rpartition("/")[2]
    if head.startswith("ray start"):
        return "it runs `ray start`: a Ray worker, whose engine serves from the head node"
    if words[0].rpartition("/")[2] == "rpc-server":
        return "it runs llama.cpp's rpc-server: a backend for a llama-server elsewhere, with no HTTP"
    if any(word.endswith("multi-node-serving.sh") for word in words) and "worker" in words:
        return "it runs multi-node-serving.sh worker: a Ray worker, whose engine serves from the leader"
    if has_flag(words, ("--headless",)):
        return "it runs with --headless: engine cores without an API server"
    rank = flag_value(words, ("--node-rank",))
    if rank is not None and rank != "0":
        if not rank.isdigit():  # $POD_INDEX, or anything else the manifest leaves open
            return f"its --node-rank is {rank}, which differs from pod to pod: only rank 0 serves HTTP"
        return f"it runs with --node-rank {rank}: only rank 0 serves HTTP"
    start = flag_value(words, ("--data-parallel-start-rank", "-dpr"))
    if start not in (None, "0") and not has_flag(words, LB_MODES):
        return f"it runs with --data-parallel-start-rank {start} without a load-balanced mode: headless"
    if flag_value(words, ("--api-server-count", "-asc")) == "0":
        return "it runs with --api-server-count 0: headless"
    return ""


def _metrics_off(lines: list[list[str]], flags: tuple[str, ...]) -> list[str]:
    """The flags among `flags` that the command lines give. A word an expanded variable filled is read as
    the shell reads an unquoted expansion, split at spaces: `vllm serve $EXTRA_ARGS`, or a `$(EXTRA_ARGS)`
    the kubelet put into one word. Better no probe than one that can only fail."""
    pieces = [normal(piece) for words in lines for word in words for piece in word.split()]
    return [flag for flag in flags if has_flag(pieces, (flag,))]


def says_http(name: Any) -> bool:
    """Whether a port's name says it serves HTTP (HTTP_NAMES says which)."""
    text = str(name)
    return text in HTTP_NAMES or text.startswith("http-") or text.endswith("-http")


def _tcp_ports(container: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        p
        for p in container.get("ports") or []
        if isinstance(p, dict) and "containerPort" in p and str(p.get("protocol", "TCP")) == "TCP"
    ]


def _declared(container: Mapping[str, Any], context: Context) -> tuple[int, str] | str:
    """The port its TCP containerPorts say serves HTTP: the one there is, or among several the one named
    for HTTP, or the one a Service's HTTP port targets (by name or number); else why not, or "" when it
    declares none."""
    ports = _tcp_ports(container)
    targets = [
        str(p.get("targetPort", p.get("port")))
        for p in context.service_ports
        if isinstance(p, dict) and (says_http(p.get("name")) or p.get("appProtocol") == "http")
    ]
    http = [p for p in ports if says_http(p.get("name")) or str(p.get("name")) in targets]
    http += [p for p in ports if str(p["containerPort"]) in targets]
    chosen = ports if len(ports) == 1 else http
    numbers = sorted({str(p["containerPort"]) for p in chosen})
    if len(numbers) == 1:
        port = _port(numbers[0])
        if port is None:
            return f"its containerPort is {numbers[0]!r}, not a port"
        label = "" if len(ports) == 1 else f" {chosen[0].get('name') or port}"
        return port, f"its containerPort{label}"
    if numbers:
        return f"its containerPorts named for HTTP disagree ({', '.join(numbers)})"
    shown = ", ".join(str(p["containerPort"]) for p in ports)
    return f"none of its containerPorts ({shown}) is named for HTTP" if ports else ""


def _port_of(
    container: Mapping[str, Any],
    engine: str | None,
    env: Env,
    *,
    servers: list[list[str]],
    lines: list[list[str]],
    choice: Choice,
    context: Context,
) -> tuple[int, str] | str:
    """The port the manifest shows the engine serves HTTP on, and where it says so; or why it shows none
    (rule 5)."""
    serving = SERVING.get(str(engine))
    flags = serving.port_flags if serving else ("--port",)
    # A port flag counts on the engine's server command, or on any command of the one --container names.
    flagged = servers or (lines if choice.container is not None else [])
    text = next((flag_value(w, flags) for w in reversed(flagged) if flag_value(w, flags) is not None), None)
    # Its own port variable, when anything may set it: given, unknown, or perhaps from an unread envFrom.
    maybe = [v for v in (serving.port_env if serving else ()) if not env.unset(v)]
    own: tuple[int, str] | str | None = None  # what its own flag or variable says: the port, or why not
    if text is not None:
        port = _port(text)
        names = references(text)
        own = (
            (port, f"{flags[0]} in its command")
            if port
            else f"its port is {text}: " + (env.why(names[0]) if names else "not a port (1-65535)")
        )
    elif maybe and maybe[0] in env.unknown:
        own = f"its port is not known: {env.why(maybe[0])}"
    elif maybe and maybe[0] in env.values:
        port = _port(env.values[maybe[0]])
        own = (port, maybe[0]) if port else f"its {maybe[0]} is {env.values[maybe[0]]!r}, not a port"
    if choice.port is not None:
        if isinstance(own, tuple) and own[0] != choice.port:
            return f"its port is {own[0]} ({own[1]}), not the {choice.port} --port gives"
        return choice.port, "--port given to inject"
    if own is not None:
        return own
    declared = _declared(container, context)
    if servers and not maybe:  # the engine's server, nothing setting its port: its default
        default = next(d.port for d in DIALECTS if d.name == engine)
        if isinstance(declared, tuple):
            # An engine that reads a port variable may have it from its image's ENV, which the manifest
            # does not show: there the containerPort says what the default cannot.
            if declared[0] == default or (serving and serving.port_env):
                return declared
            return (
                f"its command sets no port, so {engine} serves on its default {default}, "
                f"but {declared[1]} is {declared[0]}"
            )
        numbers = [str(p["containerPort"]) for p in _tcp_ports(container)]
        if not numbers or str(default) in numbers:
            return default, f"assumed: {engine}'s default, as its command sets no port"
        return (
            f"its command sets no port, so {engine} serves on its default {default}, but its containerPorts are "
            + ", ".join(numbers)
        )
    if isinstance(declared, tuple) and (servers or choice.container is not None):
        return declared
    if maybe:
        return f"its port is not known: {env.why(maybe[0])}"
    if choice.container is not None:
        return f"its port is unknown: no port flag, and {declared or 'no containerPort'}"
    if container.get("command") and lines:  # a script run by a shell is named with it: `bash start.sh`
        shown = lines[0][:2] if lines[0][0].rpartition("/")[2] in SHELLS else lines[0][:1]
        runs = f"it runs {' '.join(shown)}, not {engine}'s server"
    else:
        runs = f"its image {_image(container)} runs an entrypoint the manifest does not show"
    return f"its port is not proven: {runs}"


def _servers(container: Mapping[str, Any], lines: list[list[str]], serving: type[Serving] | None) -> list[list[str]]:
    """The command lines that run the engine's server: those that start it, or, where the container runs
    its image's entrypoint and that is the server (or runs it when its args start with a word that picks
    it: llama.cpp's tools.sh --server), its args."""
    if serving is None:
        return []
    image = _image(container)
    for pattern, first in () if container.get("command") else serving.images:
        if pattern in image and not first:  # args alone go to the image's entrypoint, the server
            return lines or [[]]
        if pattern in image and lines and lines[0][0] == first:
            return [lines[0][1:]]
    return [words for words in lines if _is_server(words, serving.servers)]


def _agreed(
    container: Mapping[str, Any], lines: list[list[str]], serving: type[Serving] | None
) -> tuple[int, str] | None:
    """The port of an image whose entrypoint inject does not know, given the engine's own flags alone (its
    command line starts with a flag: no command of its own runs before them), when two sources agree: the
    port flag among them, and the container's one containerPort (rule 5)."""
    if serving is None or not (lines and lines[0][0].startswith("-")):
        return None
    if any(pattern in _image(container) for pattern, _ in serving.images):  # an entrypoint inject knows
        return None
    port = _port(flag_value(lines[0], serving.port_flags))
    declared = [_port(str(p["containerPort"])) for p in _tcp_ports(container)]
    if port is None or declared != [port]:
        return None
    return port, f"{serving.port_flags[0]} in its args, as its containerPort says"


def _bound(text: str, env: Env) -> Address | str:
    """Where the probe dials an engine that binds `text` (its host flag or variable, as the kubelet and
    the shell fill it); or why it cannot say."""
    names = references(text)
    if names:
        name = names[0]
        exact = text in (f"$({name})", "${" + name + "}", f"${name}")
        field = env.fields.get(name)
        if exact and field in POD_ADDRESSES:
            return Address(f"$({name})", "")  # the probe reads it at run time: the kubelet does not expand it
        if exact and field:
            return f"{name} holds the pod's {field}, not its IP (status.podIP)"
        return env.why(name)
    if UNRESOLVED in text:
        return "it depends on what the manifest does not show"
    if text.endswith(".sock"):
        return "a UNIX socket, which the probe does not dial"
    found = address(text)
    return found if found is not None else "a name, whose address is not the manifest's to say"


def _address(words: list[str], env: Env, engine: str | None, choice: Choice) -> Address | str:
    """Where the probe dials the engine (rule 6): its host flag in its server's `words`, else its own
    address variable, else its default; --host-address where the manifest leaves it open. Or why not."""
    given = None if choice.host is None else address(choice.host) or Address(choice.host, "")
    serving = SERVING.get(str(engine))
    if serving is None:  # an engine inject does not know: not its flags to read
        return given or default_address(None)
    sock = next((flag for flag in serving.socket_flags if has_flag(words, (flag,))), None)
    if sock is not None:
        return f"it serves on a UNIX socket ({sock}), which the probe does not dial"
    text = flag_value(words, serving.host_flags)
    source = f"{serving.host_flags[0]} in its command"
    if text is None:
        # Its variable where the container sets it; an envFrom inject cannot read is taken not to: a
        # Secret's or a ConfigMap's value is fixed, and no fixed value is a pod's own address.
        variable = next((v for v in serving.host_env if v in env.values or v in env.unknown), None)
        if variable is None:
            return given or default_address(engine)
        text, source = env.values.get(variable, f"$({variable})"), variable
    own = _bound(text, env)
    if isinstance(own, Address) and given is not None and own != given:
        return f"its address is {text} ({source}), not the {choice.host} --host-address gives"
    return given or (own if isinstance(own, Address) else f"its address is {text}: {own}")


def _enable(
    container: Mapping[str, Any], engine: str | None, env: Env, words: list[str], servers: list[list[str]]
) -> tuple[str, str] | str:
    """How to turn its metrics on (rule 7): ("arg", FLAG), ("env", VARIABLE), or ("", "") when they are
    on or need nothing; or why it cannot be done."""
    serving = SERVING.get(str(engine))
    if serving is None or not serving.metrics_on:
        return "", ""
    if has_flag(words, serving.metrics_on) or any(
        variable in env.values and env.values[variable].lower() in TRUE for variable in serving.metrics_env
    ):
        return "", ""
    raw = _words(container)
    if serving.metrics_env:
        return "env", serving.metrics_env[0]
    if servers and (not raw or raw[0].rpartition("/")[2] not in SHELLS):
        return "arg", serving.metrics_on[0]
    return (
        f"{engine} publishes no metrics without {serving.metrics_on[0]}, and its command is a script inject "
        f"does not edit (add {serving.metrics_on[0]} to it)"
    )


def _is_python(word: str) -> bool:
    """Whether a command's first word runs a Python interpreter: python, python3, python3.12, by any path."""
    name = word.rpartition("/")[2]
    version = name.removeprefix("python")
    return (version != name and version.replace(".", "").isdigit()) or name == "python"


def _interpreter(
    container: Mapping[str, Any], engine: str | None, lines: list[list[str]], choice: Choice
) -> tuple[str, str] | str:
    """The Python the probe runs with (rule 8), and what to say of it; or why there is none."""
    if choice.python is not None:
        return choice.python, ""
    ran = next((words[0] for words in lines if words and _is_python(words[0])), None)
    if ran is not None:  # the command runs one: the probe runs with the same word
        return ran, ""
    image = _image(container)
    carries = python_in(image)
    if carries:
        return "python3", ""
    serving = SERVING.get(str(engine))
    if carries is None and serving is not None and serving.python:
        return "python3", (
            f"image {image} is not one inject knows; {engine} is a Python program, so the probe runs with "
            "python3 (--python PATH names another)"
        )
    held = "has no python3" if carries is False else "is not one inject knows to have a python3"
    way = f"{serving.python_image} has one, or " if serving is not None and serving.python_image else ""
    return f"its image {image} {held}, which the probe runs with ({way}--python PATH names the image's own)"


def _key(words: list[str], files: list[str], env: Env, engine: str | None) -> tuple[tuple[str, ...], str]:
    """The probe's flags for the key the engine's routes want (rule 9), and what to say: the variable its
    key flag names (`words`: its server's words, each variable standing for itself), or its file of keys
    (`files`: as the kubelet fills them). Its own key variable needs nothing: the probe reads it by
    itself. The key is never copied."""
    serving = SERVING.get(str(engine))
    if serving is None or not serving.key_flags:  # TensorRT-LLM's server takes no key
        return (), ""
    flag = serving.key_flags[0]
    text = flag_value(words, serving.key_flags)
    if text is not None:
        names = references(text)
        if names and text in ("${" + names[0] + "}", f"$({names[0]})", f"${names[0]}"):
            if not env.unset(names[0]):
                return ("--api-key-env", names[0]), ""
            return (), (
                f"its {flag} is {text}, which no variable of the container sets, so the probe cannot read it "
                f"(give it as {flag} $(VAR), VAR from a Secret)"
            )
        return (), (
            f"its {flag} is written into its command, which the probe never copies into its own, so the "
            f"probe sends no key (put the key in a Secret and give it as {flag} $(VAR))"
        )
    path = flag_value(files, serving.key_file_flags)
    variable = next((v for v in serving.key_file_env if not env.unset(v)), None)
    if path is None and variable is not None:
        path = env.values.get(variable, f"$({variable})")
    if path is None:
        return (), ""
    if UNRESOLVED in path:
        return (), f"its file of API keys is {path}, which the manifest does not show, so the probe sends no key"
    return ("--api-key-file", path), ""


ROLE_SKIPS = {
    "worker": "a LeaderWorkerSet worker: it joins the leader's engine and serves no HTTP",
    "shared": (
        "a LeaderWorkerSet without a leaderTemplate: this template makes the leader and its workers "
        "alike, and the workers serve no HTTP (give the leader its own template)"
    ),
}


def _not_serving(lines: list[list[str]], engine: str | None) -> str:
    """Why the container serves no HTTP a probe could read (rules 3 and 4), or ""."""
    for words in lines:
        why = _worker(words)
        if why:
            return f"a multi-node worker: {why}"
        if " ".join(words[:2]).rpartition("/")[2].startswith("trtllm-serve disaggregated"):
            return (
                "it runs `trtllm-serve disaggregated`, a router in front of TensorRT-LLM servers, without their metrics"
            )
    serving = SERVING.get(str(engine))
    off = _metrics_off(lines, serving.metrics_off if serving else ())
    if off:
        family = next(d.running for d in DIALECTS if d.name == engine).partition(":")[0]  # vllm:num_... -> vllm
        return f"metrics are off ({off[0]}): {engine} publishes no {family}: family, so a probe could only fail"
    return ""


def _options(text: str) -> set[str]:
    """The top-level options a YAML text sets true, read a line at a time: `option: true` (or yes, on, 1,
    quoted or not, a comment after it), a later line for the same option winning as in YAML."""
    found: set[str] = set()
    for line in text.splitlines():
        option, colon, value = line.partition(":")
        if colon and option == option.strip():
            word = value.partition("#")[0].strip().strip("'\"").lower()
            found = found | {option} if word in TRUE else found - {option}
    return found


def _mounted_file(container: Mapping[str, Any], context: Context, path: str) -> tuple[str, str, str] | str:
    """The ConfigMap and its key that the file at `path` in the container is, and the key's text (by its
    volume mounts, the deepest that holds the path, and its pod's volumes); or why inject cannot say."""
    mounts = [m for m in container.get("volumeMounts") or [] if isinstance(m, dict)]
    # A mount holds what is below its path; one of a subPath is also the file at its path.
    holding = [
        m
        for m in mounts
        if path.startswith(str(m.get("mountPath")).rstrip("/") + "/")
        or (path == m.get("mountPath") and m.get("subPath"))
    ]
    if not holding:
        return "no volume of the manifest is mounted there: the image's file, or one written at start"
    mount = max(holding, key=lambda m: len(str(m.get("mountPath")).rstrip("/")))
    below = path[len(str(mount.get("mountPath")).rstrip("/")) + 1 :]
    inside = "/".join(part for part in (str(mount.get("subPath") or ""), below) if part)
    volume = next((v for v in context.volumes if isinstance(v, dict) and v.get("name") == mount.get("name")), {})
    source = volume.get("configMap")
    if not isinstance(source, dict):
        return f"its volume {mount.get('name')} is no ConfigMap"
    name = str(source.get("name"))
    items = source.get("items")
    listed = (
        {str(i.get("path")): str(i.get("key")) for i in items if isinstance(i, dict)} if isinstance(items, list) else {}
    )
    key = listed.get(inside) if isinstance(items, list) else inside
    data = context.configmaps.get(name)
    if data is None:
        return f"ConfigMap {name}, which is not in the input"
    if key not in data:
        return f"ConfigMap {name} has no file {inside}"
    return name, str(key), data[str(key)]


def _config(container: Mapping[str, Any], words: list[str], engine: str | None, context: Context) -> str:
    """What to say of the options of a config file the engine's page needs (rule 7): "" when the input
    shows they are all set."""
    serving = SERVING.get(str(engine))
    if serving is None or not serving.config_needs:
        return ""
    needs = [f"{option}: true, {what}" for option, what in serving.config_needs]
    unjudged = "every run falls back to its health route ('unjudged')"
    path = flag_value(words, serving.config_flags)
    if path is None:
        return (
            f"it runs with no {serving.config_shown} YAML, so what the probe reads is off: it needs "
            f"{', and '.join(needs)}; without them {unjudged}"
        )
    found = _mounted_file(container, context, path) if UNRESOLVED not in path else "it depends on a variable"
    if isinstance(found, str):
        return (
            f"inject cannot see {path} ({found}): the probe needs in it {', and '.join(needs)}; without them {unjudged}"
        )
    name, key, text = found
    lacks = [need for need, (option, _) in zip(needs, serving.config_needs) if option not in _options(text)]
    if not lacks:
        return ""
    them = "it" if len(lacks) == 1 else "them"
    return f"its {path} (key {key} of ConfigMap {name}) lacks {', and '.join(lacks)}; without {them} {unjudged}"


def own_window(engine: str | None, choice: Choice) -> float | None:
    """The engine's own window where --window does not say (rule 13); None for the run's."""
    own = next((d.window for d in DIALECTS if d.name == engine), None)
    return None if choice.window_given else own


def _termination(container: Mapping[str, Any]) -> str:
    """The file the kubelet reads the container's termination message from (rule 10)."""
    path = container.get("terminationMessagePath")
    return path if isinstance(path, str) and path else TERMINATION_LOG


def _guards(container: Mapping[str, Any], choice: Choice) -> tuple[str, bool, str]:
    """What becomes of its probes (rules 10 to 12): the liveness probe ("kept": the operator's), whether
    the startup guard is added, and the readiness probe."""
    old = container.get("livenessProbe")
    # A kept initialDelaySeconds (from the plain check it replaces) is the operator's own guard.
    startup = "startupProbe" not in container and not (
        isinstance(old, dict) and isinstance(old.get("initialDelaySeconds"), int)
    )
    readiness = _replacing(container.get("readinessProbe"), choice.force) if choice.drain else ""
    return _replacing(old, choice.force), startup, readiness


def decide(container: Mapping[str, Any], role: str, choice: Choice, context: Context | None = None) -> Decision:
    """What to do with one container of a pod template playing `role` (one of ROLES), in `context`."""
    name = container.get("name")
    if choice.container is not None and name != choice.container:
        return Decision("ignore")
    found = engine_of(container)
    if found is None and choice.container is None:  # --engine names the dialect, not the containers: a
        return Decision("ignore")  # sidecar stays a sidecar
    engine = choice.engine or found
    if role in ROLE_SKIPS:
        return Decision("skip", ROLE_SKIPS[role])
    context = context or Context()
    env = environment(container, context.configmaps)
    if role == "leader":
        env.values.setdefault("LWS_WORKER_INDEX", "0")  # what LeaderWorkerSet sets in the leader's pod
    lines = command_lines(container, env)
    why = _not_serving(lines, engine)
    if why:
        return Decision("skip", why)
    serving = SERVING.get(str(engine))
    servers = _servers(container, lines, serving)
    agreed = None if servers or choice.container is not None else _agreed(container, lines, serving)
    servers = lines if agreed else servers
    port = agreed or _port_of(container, engine, env, servers=servers, lines=lines, choice=choice, context=context)
    if isinstance(port, str):
        return Decision("skip", f"{port} (--container {name or 'NAME'} --port N settles it)")
    words = [word for line in servers or lines for word in line]
    reached = _address(words, env, engine, choice)
    if isinstance(reached, str):
        return Decision("skip", f"{reached} (--container {name or 'NAME'} --host-address ADDR settles it)")
    enable = _enable(container, engine, env, words, servers)
    if isinstance(enable, str):
        return Decision("skip", enable)
    python = _interpreter(container, engine, [*servers, *lines], choice)
    if isinstance(python, str):
        return Decision("skip", python)
    standing_lines = command_lines(container, standing(env))
    key_words = [word for line in _servers(container, standing_lines, serving) or standing_lines for word in line]
    key, unreachable = _key(key_words, words, env, engine)
    config = _config(container, words, engine, context)
    window = own_window(engine, choice)
    liveness, startup, readiness = _guards(container, choice)
    if liveness == "kept":
        return Decision("keep", "not a plain /health check; --force replaces it", engine=engine)
    return Decision(
        "probe",
        engine=engine,
        port=port[0],
        port_from=port[1],
        address=reached,
        python=python[0],
        key=key,
        enable=enable,
        startup=startup,
        liveness=liveness,
        readiness=readiness,
        termination=_termination(container),
        window=window,
        notes=tuple(note for note in (python[1], unreachable, config) if note),
    )
