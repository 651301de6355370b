#!/usr/bin/env python3
"""One real vLLM taken through the situations a pod meets one after another, judged all along by the README's
liveness and readiness probes as the kubelet runs them: tests/test_timeline.py runs the short form, and

    .venv/bin/python tests/timeline.py --minutes 60

the long form (the same timeline repeated, the README's windows and periods), printing the per-situation table
that docs/failure-modes.md quotes (`--short` runs the test's windows instead; exit 0 when nothing was found
wrong, 1 when something was, 2 when the server did not come up).

Each situation alone has a test of its own (tests/test_real_vllm.py), on an engine made idle before it. Here one
engine meets them in turn under steady load: saturated, paused for a weight update and resumed, wedged
mid-generation and thawed, the admission wedge (nothing running, requests waiting for capacity) and its release,
a slow and then a silent API server, idle. A rule that holds alone can still break on the way from one to the
next: a stall clock carried across a pause in the state file fires early at the next wedge; a readiness that
does not come back after a recovery keeps a healthy engine out of routing for good.

The probes are the README's own stanza (its YAML block, read here): the commands a pod runs, `--window` and
`--drain-after` scaled down for the short form, sharing one state file as in a pod (the default one, under the
$TMPDIR they are given), each on a thread of its own every periodSeconds, as the kubelet runs them, whatever
the other does. A run longer than the timeoutSeconds `stallprobe inject` would write (observe.kubelet_timeout)
is a failure the kubelet counts.

The phases are data (PHASES): how each is entered and left, and what the probes must say while it lasts and
after it. What must hold, per phase:
- liveness: never exit non-zero where the engine is healthy (a false stall, the worst bug); where it is wedged,
  stalled no sooner than the window after the wedge began (an earlier one is a stall clock carried over: false
  too) and no later than the window plus a run and the machine's grace (later is a missed stall), and stalled
  on every run after until the wedge is undone; after the recovery, every run that starts once the engine is
  seen moving again exits 0.
- readiness: ready throughout where the engine is healthy or only slow; not ready at once when paused, and no
  sooner than --drain-after after a wedge; not ready on every run after, until the situation is undone; ready
  again within a bound after it, and ready on every run from then on.
Every wait is a poll with a deadline; nothing sleeps to make time pass: the probes' clock is the real one.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from conftest import clean_env
from realengine import EngineUnavailable, Load, Probe, ProbeRun, sigcont, sigstop
from realvllm import ENGINE_TIMEOUT, RUNNING, STARTUP_TIMEOUT, WAITING, Engine, VllmServer, progress, serve
from stallprobe.observe import kubelet_timeout

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# Where the README's stanza points the probes; replaced by the engine's own.
STANZA_URL = "http://127.0.0.1:8000/metrics"

# The steady load: more requests than --max-num-seqs, each sent again as it ends, so that a full batch runs with
# a queue behind it (saturated) from the first phase to the last but one. Short generations (about a second each
# on this machine): the admission wedge needs the running ones to finish on their own.
MAX_NUM_SEQS = 4
WORKERS = 6
LOAD_TOKENS = 256
# The slow API server: stopped for 4 s, longer than the README's --timeout (3 s), so that some runs get no answer
# in time; then running for 4 s, so that every silence ends well before --drain-after (12 s in the short form).
SLOW = (4.0, 4.0)


# --- the probes, as the kubelet runs them ---------------------------------------------------------------------


@dataclass(frozen=True)
class Stanza:
    """One probe of the README's container: its command, and the kubelet's settings."""

    command: list[str]
    period: float
    failure_threshold: int


def readme_stanzas() -> dict[str, Stanza]:
    """The liveness and readiness probes of the README's container stanza (its YAML block)."""
    text = README.read_text(encoding="utf-8")
    found: dict[str, Stanza] = {}
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL):
        for container in (yaml.safe_load(block) or {}).get("containers", []):
            for kind in ("liveness", "readiness"):
                probe = container.get(f"{kind}Probe")
                if probe:
                    command = [str(word) for word in probe["exec"]["command"]]
                    found[kind] = Stanza(command, float(probe["periodSeconds"]), int(probe["failureThreshold"]))
    if set(found) != {"liveness", "readiness"}:
        raise ValueError(f"README.md's YAML stanza has no liveness and readiness exec probes (found {sorted(found)})")
    return found


def flag(command: Sequence[str], name: str) -> str:
    """The value given to `name` in `command` (ValueError when the README's stanza lost it)."""
    if name not in command[:-1]:
        raise ValueError(f"the README's probe command has no {name}: {command}")
    return command[command.index(name) + 1]


def with_value(command: list[str], name: str, value: float) -> list[str]:
    flag(command, name)
    at = command.index(name) + 1
    return [*command[:at], f"{value:g}", *command[at + 1 :]]


class PodProbe(Probe):
    """A probe run with exactly the command given (a pod's, with no --json and no --state-file: the default state
    file under the $TMPDIR of `env`), each run kept in `runs`."""

    def __init__(self, command: list[str], env: dict[str, str], origin: float, timeout: float) -> None:
        self.command = command
        self.env = env
        self.origin = origin
        self.timeout = timeout
        self.runs: list[ProbeRun] = []


def said(run: ProbeRun) -> tuple[str, bool | None]:
    """The verdict a run printed (the line's prefix: "stalled", "suspect", "error"...), and with --ready whether
    it said ready (None without)."""
    line = run.line
    ready = None
    for prefix, value in (("not ready: ", False), ("ready: ", True)):
        if line.startswith(prefix):
            ready, line = value, line[len(prefix) :]
            break
    return line.split(":", 1)[0] if ":" in line else "?", ready


class Kubelet:
    """The two probes, each run every period on a thread of its own, as the kubelet runs them: the next run
    starts a period after the previous one started, or as soon as it ends when it took longer."""

    def __init__(self, probes: dict[str, PodProbe], periods: dict[str, float]) -> None:
        self.probes = probes
        self.periods = periods
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(name,), daemon=True) for name in probes]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _run(self, name: str) -> None:
        probe, period = self.probes[name], self.periods[name]
        while not self._stop.is_set():
            started = time.monotonic()
            probe.run()
            self._stop.wait(max(0.0, started + period - time.monotonic()))

    def runs(self, name: str) -> list[ProbeRun]:
        return list(self.probes[name].runs)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


# --- the scale ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """The windows and periods of one form of the timeline, and how long its situations last."""

    window: float  # liveness --window
    drain_after: float  # readiness --drain-after
    liveness_period: float  # periodSeconds of each probe
    readiness_period: float
    hold: float  # how long a situation that must not stall lasts: past the window, so that one would show
    grace: float  # a slow machine's delays: how much later than promised a stall or drain may still come

    def __post_init__(self) -> None:
        if not self.hold > self.window + self.liveness_period:
            raise ValueError("a healthy situation must last past the window and a liveness run")

    @property
    def gap(self) -> float:
        """The longest the engine may go unseen between two runs of either probe, in the ordinary course."""
        return max(self.liveness_period, self.readiness_period)


# The short form (tests/test_timeline.py): a window of 24 s, drained at 12 s, the probes every 2 s and 1 s. The
# slow API server stops for 4 s, longer than --timeout (3 s), so that runs get no answer, and less than
# --drain-after after the last answer, so that it stays ready.
SHORT = Scale(window=24, drain_after=12, liveness_period=2, readiness_period=1, hold=28, grace=10)


def long_scale(stanzas: dict[str, Stanza]) -> Scale:
    """The long form: the README's windows (--window 120 s, its default, --drain-after 30 s) and periods."""
    liveness, readiness = stanzas["liveness"], stanzas["readiness"]
    window = float(flag(liveness.command, "--window"))
    drain = float(flag(readiness.command, "--drain-after"))
    return Scale(window, drain, liveness.period, readiness.period, window + 2 * liveness.period, grace=20)


# --- the engine and what the phases do to it ----------------------------------------------------------------------


class Situations:
    """The engine under test and the situations the phases put it in; each `enter` returns the moment the
    situation began (time.monotonic()), once it is in force as seen from outside."""

    def __init__(self, engine: Engine, scale: Scale) -> None:
        self.engine = engine
        self.scale = scale
        self.load: Load | None = None
        self._slow = threading.Event()
        self._slowing: threading.Thread | None = None
        self.core = 0

    @property
    def api_server(self) -> int:
        return self.engine.server.pid

    def saturate(self) -> float:
        self.load = self.engine.generate(WORKERS, LOAD_TOKENS, repeat=True, limit=24 * 3600)
        self.engine.wait_for(
            lambda page: page[RUNNING] == MAX_NUM_SEQS and page[WAITING] > 0, "a full batch with a queue behind it"
        )
        return time.monotonic()

    def pause(self) -> float:
        answer = self.engine.request("POST", "/pause?mode=keep")
        began = time.monotonic()
        assert answer == (200, '{"status":"paused"}'), answer
        assert self.engine.is_paused()
        return began

    def resume(self) -> None:
        assert self.engine.request("POST", "/resume") == (200, '{"status":"resumed"}')

    def wedge(self) -> float:
        self.core = self.engine.core()
        began = time.monotonic()
        assert sigstop(self.core) == "T"
        frozen = self.engine.wait_frozen()
        assert frozen[RUNNING] >= 1, frozen
        return began

    def thaw(self) -> None:
        sigcont(self.core)

    def refuse_admission(self) -> float:
        self.engine.refuse_kv(True)
        # The running requests finish on their own; their repeats and the queue wait for capacity behind nothing.
        self.engine.wait_for(
            lambda page: page[RUNNING] == 0 and page.get("capacity", 0) > 0, "requests waiting, nothing running"
        )
        return time.monotonic()

    def admit(self) -> None:
        self.engine.refuse_kv(False)

    def slow_down(self) -> float:
        stopped, running = SLOW
        self._slow.clear()

        def cycle() -> None:
            while not self._slow.is_set():
                sigstop(self.api_server)
                self._slow.wait(stopped)
                sigcont(self.api_server)
                self._slow.wait(running)

        began = time.monotonic()
        self._slowing = threading.Thread(target=cycle, name="slow-api-server", daemon=True)
        self._slowing.start()
        return began

    def speed_up(self) -> None:
        self._slow.set()
        if self._slowing is not None:
            self._slowing.join(60)
        sigcont(self.api_server)

    def silence(self) -> float:
        began = time.monotonic()
        assert sigstop(self.api_server) == "T"
        return began

    def unsilence(self) -> None:
        sigcont(self.api_server)

    def idle(self) -> float:
        if self.load is not None:
            self.load.close()
            assert self.load.errors == [], self.load.errors
            self.engine.loads.remove(self.load)
            self.load = None
        self.engine.wait_for(lambda page: page[RUNNING] == 0 and page[WAITING] == 0, "idle once the load is gone")
        return time.monotonic()

    def undo_all(self) -> None:
        """Whatever a failed phase left: the API server and the engine core running, admission, no pause."""
        self.speed_up()
        self.engine.reset()
        self.load = None


# --- the phases, as data ---------------------------------------------------------------------------------------

# What a live engine may be told: moving, queued, not seen moving for less than the window, or idle. "baseline"
# only at the probes' first run: later, it would mean the state file was lost.
ALIVE = frozenset({"progressing", "saturated", "suspect", "idle"})


@dataclass(frozen=True)
class Phase:
    """One situation: how it is entered and left, and what the probes must say while it lasts.

    `liveness` is "alive" (exit 0 throughout, every verdict among `verdicts`) or "stalls" (verdicts among
    `verdicts` until stalled, then stalled until left). `readiness` is "ready" (throughout), "drains" (not ready
    once --drain-after has passed since the situation began) or "out" (not ready at once: paused). `shows` must
    appear in the line of some run while it lasts (the situation really happened); a stalled line must hold
    `stalled_line`.
    """

    name: str
    enter_how: str
    enter: Callable[[Situations], float]
    leave_how: str
    leave: Callable[[Situations], None] | None
    liveness: str
    verdicts: frozenset[str]
    readiness: str
    shows: str
    stalled_line: str = ""


PHASES = (
    Phase(
        "saturated", f"{WORKERS} requests at a time, --max-num-seqs {MAX_NUM_SEQS}", Situations.saturate,
        "-", None, "alive", ALIVE | {"baseline"}, "ready", "saturated: ",
    ),
    Phase(
        "paused", "POST /pause?mode=keep", Situations.pause,
        "POST /resume", Situations.resume, "alive", ALIVE | {"paused"}, "out", "paused: ",
    ),
    Phase(
        "wedged", "SIGSTOP the engine core mid-generation", Situations.wedge,
        "SIGCONT", Situations.thaw, "stalls", ALIVE, "drains", "stalled: ",
    ),
    Phase(
        "admission wedge", "KV cache refuses new requests (tests/vllm_refuse_kv.py)", Situations.refuse_admission,
        "admit again", Situations.admit, "stalls", ALIVE, "drains", "stalled: ",
        stalled_line="waiting for capacity, nothing running",
    ),
    Phase(
        "slow API server", f"SIGSTOP/SIGCONT the API server, {SLOW[0]:g} s/{SLOW[1]:g} s",
        Situations.slow_down, "SIGCONT", Situations.speed_up, "alive", ALIVE, "ready", "no complete answer within",
    ),
    Phase(
        "silent API server", "SIGSTOP the API server", Situations.silence,
        "SIGCONT", Situations.unsilence, "stalls", ALIVE, "drains", "stalled: ",
        stalled_line="no complete answer within",
    ),
    Phase(
        "idle", "the load hangs up", Situations.idle, "-", None, "alive", ALIVE, "ready", "idle: ",
    ),
)  # fmt: skip


# --- running the timeline and judging it ---------------------------------------------------------------------------


@dataclass
class Outcome:
    """One phase as it happened (times in seconds since the timeline's origin) and what was found wrong."""

    phase: Phase
    cycle: int
    entered: float
    began: float = math.nan
    left: float = math.nan  # the situation undone (nan: not left, it has no undoing)
    moved: float = math.nan  # after it was left, the engine's counters seen moving again
    end: float = math.nan  # the next phase entered
    liveness_runs: int = 0
    readiness_runs: int = 0
    false_stalls: int = 0
    missed_stalls: int = 0
    to_not_ready: float = math.nan
    to_stalled: float = math.nan
    back_to_ready: float = math.nan
    longest: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the rules allow, worth telling


class Timeline:
    """The engine, the probes on it, and the phases run one after another (`run_cycle`), each judged as it ends."""

    def __init__(self, server: VllmServer, folder: Path, scale: Scale, log: Callable[[str], None]) -> None:
        self.scale = scale
        self.log = log
        self.engine = Engine(server)
        self.situations = Situations(self.engine, scale)
        stanzas = readme_stanzas()
        self.failure_threshold = stanzas["liveness"].failure_threshold
        self.origin = time.monotonic()
        # The probes' $TMPDIR: their default state file, one for both (it is named after the URL), lives there.
        folder.mkdir(parents=True, exist_ok=True)
        env = clean_env(TMPDIR=str(folder))
        url = f"{server.url}/metrics"
        commands = {
            kind: [sys.executable, *(url if word == STANZA_URL else word for word in stanza.command[1:])]
            for kind, stanza in stanzas.items()
        }
        commands["liveness"] = with_value(commands["liveness"], "--window", scale.window)
        commands["readiness"] = with_value(commands["readiness"], "--drain-after", scale.drain_after)
        # The timeoutSeconds `stallprobe inject` writes for each: the readiness run asks the health route too.
        self.timeout_seconds = {
            kind: kubelet_timeout(float(flag(command, "--timeout")), asks=int("--ready" in command))
            for kind, command in commands.items()
        }
        self.probes = {
            kind: PodProbe(command, env, self.origin, self.timeout_seconds[kind] + 30)
            for kind, command in commands.items()
        }
        self.kubelet = Kubelet(self.probes, {"liveness": scale.liveness_period, "readiness": scale.readiness_period})
        self.outcomes: list[Outcome] = []

    def now(self) -> float:
        return time.monotonic() - self.origin

    def start(self) -> None:
        self.log(f"probes: {' '.join(self.probes['liveness'].command[1:])}")
        self.log(f"        {' '.join(self.probes['readiness'].command[1:])}")
        self.kubelet.start()
        # Both probes have a first run (the baseline) before the first situation.
        self.until(lambda: all(self.kubelet.runs(kind) for kind in self.probes), "a first run of each probe")

    def stop(self) -> None:
        self.kubelet.stop()
        if self.outcomes and math.isnan(self.outcomes[-1].end):
            self.close(self.outcomes[-1])

    def until(self, ok: Callable[[], bool], what: str, timeout: float = ENGINE_TIMEOUT) -> bool:
        """Poll `ok` until it holds (True) or `timeout` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                self.log(f"  not within {timeout:g} s: {what}")
                return False
            time.sleep(0.1)
        return True

    def runs_since(self, kind: str, since: float) -> list[ProbeRun]:
        return [run for run in self.kubelet.runs(kind) if run.at >= since]

    def first(self, kind: str, since: float, ok: Callable[[ProbeRun], bool]) -> ProbeRun | None:
        return next((run for run in self.runs_since(kind, since) if ok(run)), None)

    def run_cycle(self, cycle: int) -> None:
        """Every phase in turn. A situation that cannot be made or undone (the engine did not do what a phase
        asked of it) is a problem of its phase; everything is undone, and the cycle ends there."""
        for phase in PHASES:
            if self.outcomes:
                self.close(self.outcomes[-1])
            # The first phase holds the probes' first runs too.
            outcome = Outcome(phase, cycle, self.now() if self.outcomes else 0.0)
            self.outcomes.append(outcome)
            try:
                self.run_phase(outcome)
            except (AssertionError, EngineUnavailable, OSError) as exc:
                outcome.problems.append(f"the engine did not follow: {type(exc).__name__}: {exc}")
                self.situations.undo_all()
                return

    def run_phase(self, outcome: Outcome) -> None:
        phase, scale = outcome.phase, self.scale
        self.log(f"--- {phase.name} (cycle {outcome.cycle}): {phase.enter_how}")
        outcome.began = began = phase.enter(self.situations) - self.origin
        if phase.liveness == "stalls":
            # Held until the kubelet would restart the pod (failureThreshold stalled runs in a row), and readiness
            # has drained it; at most until either is missed.
            deadline = scale.window + scale.liveness_period + self.timeout_seconds["liveness"] + scale.grace
            self.until(
                lambda: (
                    self.stalled_in_a_row(began) >= self.failure_threshold
                    and self.first("readiness", began, lambda run: run.code == 1) is not None
                ),
                f"{phase.name}: stalled {self.failure_threshold} times in a row and not ready",
                timeout=deadline + self.failure_threshold * scale.liveness_period,
            )
        else:
            held = time.monotonic() + scale.hold
            self.until(lambda: time.monotonic() >= held, "the hold", timeout=scale.hold + 1)
        if phase.leave is None:
            return
        self.log(f"    {phase.name}: {phase.leave_how}")
        phase.leave(self.situations)
        outcome.left = self.now()
        # Recovered: the engine's counters move past what its page said once the situation was undone (read apart
        # from the probes), and readiness says ready again.
        moved_past = self.engine_progress()
        if self.until(lambda: self.engine_progress() > moved_past, f"{phase.name}: the engine to move again"):
            outcome.moved = moved = self.now()
            self.until(
                lambda: self.first("readiness", moved, lambda run: run.code == 0 and said(run)[1] is True) is not None,
                f"{phase.name}: ready again",
                timeout=ENGINE_TIMEOUT + scale.readiness_period,
            )
            self.until(lambda: self.first("liveness", moved, lambda run: True) is not None, "a liveness run")

    def engine_progress(self) -> float:
        """The engine's counters read apart from the probe; -1 when its page does not answer (the API server
        stopped)."""
        try:
            return progress(self.engine.page())
        except OSError:
            return -1.0

    def stalled_in_a_row(self, since: float) -> int:
        streak = 0
        for run in self.runs_since("liveness", since):
            streak = streak + 1 if run.code == 1 else 0
        return streak

    def close(self, outcome: Outcome) -> None:
        """End `outcome` now, and judge it (unless its situation could not be made: its problem says so)."""
        outcome.end = self.now()
        if not math.isnan(outcome.began):
            runs = {kind: self.kubelet.runs(kind) for kind in self.probes}
            judge(outcome, self.scale, self.timeout_seconds, runs)
        self.log(f"    {row(outcome)}")
        for note in outcome.notes:
            self.log(f"    note: {note}")
        for problem in outcome.problems:
            self.log(f"    PROBLEM {problem}")


def judge(outcome: Outcome, scale: Scale, seconds: dict[str, int], every: dict[str, list[ProbeRun]]) -> None:
    """What the probes said during `outcome`'s phase (`every` run of each, by kind), against what they must say
    (the module's docstring); `seconds` is each kind's timeoutSeconds. Fills in `outcome`'s counts, times and
    problems."""
    phase = outcome.phase
    problems = outcome.problems
    began, end = outcome.began, outcome.end
    left = outcome.left if not math.isnan(outcome.left) else end
    moved = outcome.moved
    runs = {kind: [run for run in every[kind] if outcome.entered <= run.at < end] for kind in seconds}
    outcome.liveness_runs, outcome.readiness_runs = len(runs["liveness"]), len(runs["readiness"])
    for kind, kind_runs in runs.items():
        outcome.longest[kind] = max((run.took for run in kind_runs), default=math.nan)
        for run in kind_runs:
            if run.took > seconds[kind]:
                problems.append(f"{kind} run over timeoutSeconds {seconds[kind]}: {run}")
            if run.code not in (0, 1):
                problems.append(f"{kind} run failed: {run}; stderr {run.stderr.strip()!r}")
    # While it lasted: the runs that ended before it was undone; after it: those that started after. A run across
    # the undoing may have read either world: it is held to the rules every run keeps (above), no more.
    during = {kind: [run for run in kind_runs if run.at + run.took < left] for kind, kind_runs in runs.items()}
    after = {kind: [run for run in kind_runs if run.at >= left] for kind, kind_runs in runs.items()}

    if not any(phase.shows in run.line for kind_runs in during.values() for run in kind_runs):
        problems.append(f"no run said {phase.shows!r}: the situation did not show")

    # Liveness while it lasts.
    live = during["liveness"]
    if phase.liveness == "alive":
        for run in live:
            if run.code != 0:
                outcome.false_stalls += 1
                problems.append(f"false stall: {run}")
            elif said(run)[0] not in phase.verdicts:
                problems.append(f"liveness said {said(run)[0]!r}: {run}")
    else:
        stalled = next((run for run in live if run.code == 1), None)
        for run in live[: live.index(stalled) if stalled else len(live)]:
            if said(run)[0] not in phase.verdicts:
                problems.append(f"liveness said {said(run)[0]!r} before the stall: {run}")
        if stalled is None:
            outcome.missed_stalls += 1
            problems.append("missed stall: liveness never said stalled")
        else:
            outcome.to_stalled = stalled.at + stalled.took - began
            earliest = scale.window - scale.gap - 1
            latest = scale.window + scale.liveness_period + seconds["liveness"] + scale.grace
            if outcome.to_stalled < earliest:
                outcome.false_stalls += 1
                problems.append(f"false stall: stalled {outcome.to_stalled:.1f} s after the wedge began: {stalled}")
            elif outcome.to_stalled > latest:
                outcome.missed_stalls += 1
                problems.append(f"missed stall: stalled only {outcome.to_stalled:.1f} s after (> {latest:g} s)")
            if phase.stalled_line not in stalled.line:
                problems.append(f"the stalled line does not say {phase.stalled_line!r}: {stalled.line}")
            for run in live[live.index(stalled) :]:
                if run.code != 1:
                    problems.append(f"liveness came back while the wedge lasted: {run}")

    # Readiness while it lasts.
    ready = during["readiness"]
    if phase.readiness == "ready":
        # A health route that gives no answer (the API server stopped between the page and it) is excused
        # like a page that gives none, until --drain-after: the slow API server is ready throughout.
        for run in ready:
            if run.code != 0 or said(run)[1] is not True:
                problems.append(f"not ready while {phase.name}: {run}")
    else:
        out = next((run for run in ready if run.code == 1 and said(run)[1] is False), None)
        for run in ready[: ready.index(out) if out else len(ready)]:
            if run.code != 0:
                problems.append(f"readiness failed before the drain was due: {run}")
        if out is None:
            problems.append("readiness never said not ready")
        else:
            outcome.to_not_ready = out.at + out.took - began
            due = 0.0 if phase.readiness == "out" else scale.drain_after
            earliest = due - scale.gap - 1
            latest = due + scale.readiness_period + seconds["readiness"] + scale.grace
            if outcome.to_not_ready < earliest:
                problems.append(f"not ready {outcome.to_not_ready:.1f} s after it began, before --drain-after: {out}")
            elif outcome.to_not_ready > latest:
                problems.append(f"not ready only {outcome.to_not_ready:.1f} s after it began (> {latest:g} s)")
            for run in ready[ready.index(out) :]:
                if run.code != 1 or said(run)[1] is not False:
                    problems.append(f"ready again while {phase.name} lasted: {run}")

    # After it: every liveness run that started once the engine moved again exits 0; readiness is ready again
    # and stays so.
    if not math.isnan(outcome.left):
        if math.isnan(moved):
            problems.append("the engine did not move again after the situation was undone")
        for run in after["liveness"]:
            if run.at >= moved and run.code != 0:
                outcome.false_stalls += 1
                problems.append(f"false stall after the recovery: {run}")
        back = next((run for run in after["readiness"] if run.code == 0 and said(run)[1] is True), None)
        if back is None:
            problems.append("readiness did not come back after the recovery")
        else:
            outcome.back_to_ready = back.at + back.took - outcome.left
            for run in after["readiness"][after["readiness"].index(back) :]:
                if run.code != 0 or said(run)[1] is not True:
                    problems.append(f"not ready again after the recovery: {run}")


# --- the table ---------------------------------------------------------------------------------------------------

COLUMNS = (
    "situation", "runs (live/ready)", "false stalls", "missed stalls", "to not-ready", "to stalled",
    "back to ready", "longest run (live/ready)",
)  # fmt: skip


def times(values: Sequence[float]) -> str:
    """A time, or the range of times over the cycles; "-" when none applies."""
    known = [value for value in values if not math.isnan(value)]
    if not known:
        return "-"
    low, high = min(known), max(known)
    return f"{low:.1f} s" if len(known) == 1 or f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f} s"


def row(outcome: Outcome) -> str:
    return " | ".join(cells([outcome], {}))


def cells(outcomes: Sequence[Outcome], limits: dict[str, int]) -> list[str]:
    longest = [
        f"{max(o.longest.get(kind, math.nan) for o in outcomes):.2f}" + (f"/{limits[kind]}" if limits else "")
        for kind in ("liveness", "readiness")
    ]
    return [
        outcomes[0].phase.name,
        f"{sum(o.liveness_runs for o in outcomes)}/{sum(o.readiness_runs for o in outcomes)}",
        str(sum(o.false_stalls for o in outcomes)),
        str(sum(o.missed_stalls for o in outcomes)),
        times([o.to_not_ready for o in outcomes]),
        times([o.to_stalled for o in outcomes]),
        times([o.back_to_ready for o in outcomes]),
        " / ".join(longest) + " s",
    ]


def table(timeline: Timeline) -> str:
    """The per-situation table (Markdown), every cycle of a situation on one line: counts summed, times as the
    range over the cycles, the longest runs against the timeoutSeconds of each probe."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for phase in PHASES:
        mine = [outcome for outcome in timeline.outcomes if outcome.phase is phase]
        if mine:
            lines.append("| " + " | ".join(cells(mine, timeline.timeout_seconds)) + " |")
    return "\n".join(lines)


def problems(timeline: Timeline) -> list[str]:
    return [f"{o.phase.name} (cycle {o.cycle}): {problem}" for o in timeline.outcomes for problem in o.problems]


def notes(timeline: Timeline) -> list[str]:
    return [f"{o.phase.name} (cycle {o.cycle}): {note}" for o in timeline.outcomes for note in o.notes]


def run_timeline(
    server: VllmServer, folder: Path, scale: Scale, log: Callable[[str], None], *, minutes: float = 0
) -> Timeline:
    """Every phase once, then again while fewer than `minutes` have passed; the timeline, every phase judged."""
    timeline = Timeline(server, folder, scale, log)
    timeline.start()
    try:
        cycle = 1
        timeline.run_cycle(cycle)
        while timeline.now() < minutes * 60:
            cycle += 1
            timeline.run_cycle(cycle)
    finally:
        timeline.stop()
        timeline.situations.undo_all()
    return timeline


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Take one real vLLM through the fault timeline, judged by the README's probes; print the table."
    )
    parser.add_argument(
        "--minutes", type=float, help="repeat the timeline until this long has passed (default 60; with --short, once)"
    )
    parser.add_argument("--short", action="store_true", help="the short form's windows instead of the README's")
    args = parser.parse_args()

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    scale = SHORT if args.short else long_scale(readme_stanzas())
    log(f"scale: {scale}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="timeline-") as tmp:
        try:
            with serve(Path(tmp) / "vllm", STARTUP_TIMEOUT, ["--max-num-seqs", str(MAX_NUM_SEQS)], log) as server:
                log(f"vLLM up in {time.monotonic() - started:.0f} s at {server.url}")
                minutes = args.minutes if args.minutes is not None else 0 if args.short else 60
                timeline = run_timeline(server, Path(tmp) / "probes", scale, log, minutes=minutes)
        except EngineUnavailable as exc:
            print(f"timeline: {exc}", file=sys.stderr)
            return 2
    print(table(timeline))
    found = problems(timeline)
    print(f"{len(timeline.outcomes)} phases in {timeline.now() / 60:.1f} min; {len(found)} problems")
    for note in notes(timeline):
        print(f"note: {note}")
    for problem in found:
        print(f"PROBLEM {problem}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
