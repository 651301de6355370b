"""Never worse than the health check it replaces: a probe that reaches the engine's server but cannot judge
it asks the engine's own health route, as an httpGet probe of it would, instead of failing a serving engine.

One table: how the page (or the state file) is broken, what the health route answers, and what the probe
must say and exit with; each row runs the exact command a pod runs against the suite's stub engine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import fixture_page, refused_url, rewind, run_probe
from stallprobe.errors import ExitCode
from stubengine import Route, StubEngine

REAL = fixture_page("vllm-0.32.0-cpu-busy.prom")
# An engine upgrade that renames one family the probe needs (here the generation counter).
RENAMED = REAL.replace(b"vllm:generation_tokens_total", b"vllm:generation_tokens_renamed_total")
HTML = b"<!DOCTYPE html><html><body>It works!</body></html>"
UNJUDGED = r"unjudged: .*; /health answers 2xx, so the engine serves \(the probe cannot judge its progress\)"


def renamed(engine: StubEngine) -> None:
    engine.route("/metrics", RENAMED)


def html(engine: StubEngine) -> None:
    engine.route("/metrics", HTML)


def metrics_off(engine: StubEngine) -> None:  # vLLM with its metrics route gone: 404
    engine.route("/metrics", b"Not Found", 404)


def llamacpp_without_metrics(engine: StubEngine) -> None:  # llama-server without --metrics: 501
    engine.route("/metrics", b'{"error":{"code":501,"message":"This server does not support metrics endpoint."}}', 501)


def key_rotated(engine: StubEngine) -> None:  # the engine wants a key the probe lacks; /health stays public
    engine.key = "rotated"


def metrics_error(engine: StubEngine) -> None:
    engine.route("/metrics", b"oops", 500)


def health(status: int) -> Callable[[StubEngine], None]:
    def answer(engine: StubEngine) -> None:
        engine.route("/health", b"", status)

    return answer


def fine(engine: StubEngine) -> None:
    return


def canary_gets_html(engine: StubEngine) -> None:  # an idle engine whose API answers a login page
    engine.set(running=0)
    engine.route("/v1/models", b"<html>login</html>")


def canary_gets_500(engine: StubEngine) -> None:
    engine.set(running=0)
    engine.route("/v1/completions", b'{"error": "boom"}', 500)


# (name, page, health route, extra flags, state file in a read-only place, exit code, line pattern)
ROWS: list[tuple[str, Callable[[StubEngine], None], Callable[[StubEngine], None], tuple[str, ...], bool, int, str]] = [
    ("renamed_metric_serving", renamed, fine, (), False, ExitCode.OK, UNJUDGED),
    ("html_serving", html, fine, (), False, ExitCode.OK, UNJUDGED),
    ("metrics_off_serving", metrics_off, fine, (), False, ExitCode.OK, r"unjudged: scrape .*HTTP 404.*serves.*"),
    ("llamacpp_metrics_off", llamacpp_without_metrics, fine, (), False, ExitCode.OK, r"unjudged: .*HTTP 501.*"),
    ("key_lacking_serving", key_rotated, fine, (), False, ExitCode.OK, r"unjudged: .*HTTP 401.*API key.*serves.*"),
    ("metrics_500_serving", metrics_error, fine, (), False, ExitCode.OK, r"unjudged: .*HTTP 500.*serves.*"),
    ("state_unwritable", fine, fine, (), True, ExitCode.OK, r"unjudged: .*state.*serves.*"),
    ("renamed_health_fails", renamed, health(503), (), False, ExitCode.METRICS, r"error: .*; and health .*HTTP 503.*"),
    ("html_health_missing", html, health(404), (), False, ExitCode.METRICS, r"error: .*; and health .*HTTP 404.*"),
    ("off_health_fails", metrics_off, health(500), (), False, ExitCode.SCRAPE, r"error: .*HTTP 404.*; and .*500.*"),
    ("state_health_fails", fine, health(503), (), True, ExitCode.STATE, r"error: .*; and health .*HTTP 503.*"),
    ("strict_renamed", renamed, fine, ("--strict",), False, ExitCode.METRICS, r"error: required metric missing.*"),
    ("strict_key", key_rotated, fine, ("--strict",), False, ExitCode.SCRAPE, r"error: .*HTTP 401.*"),
    ("strict_state", fine, fine, ("--strict",), True, ExitCode.STATE, r"error: .*"),
    ("ready_renamed_serving", renamed, fine, ("--ready",), False, ExitCode.OK, "ready: " + UNJUDGED),
    ("ready_renamed_unhealthy", renamed, health(503), ("--ready",), False, ExitCode.METRICS, r"error: .*503.*"),
    ("healthy_page_is_judged", fine, health(503), (), False, ExitCode.OK, r"baseline: .*"),
    ("canary_html_serving", canary_gets_html, fine, ("--canary", "SECOND"), False, ExitCode.OK, r"unjudged: canary .*"),
    ("canary_500_serving", canary_gets_500, fine, ("--canary", "SECOND"), False, ExitCode.OK, r"unjudged: canary .*"),
    (
        "canary_500_unhealthy",
        canary_gets_500,
        health(500),
        ("--canary", "SECOND"),
        False,
        ExitCode.SCRAPE,
        r"error: canary .*HTTP 500.*",
    ),
]


@pytest.fixture
def engine() -> Iterator[StubEngine]:
    with StubEngine(running=2, generation=10, prompt=10) as stub:
        yield stub


@pytest.mark.parametrize(
    ("page", "route", "flags", "read_only", "code", "pattern"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_a_probe_that_cannot_judge_asks_the_health_route(
    engine: StubEngine,
    tmp_path: Path,
    page: Callable[[StubEngine], None],
    route: Callable[[StubEngine], None],
    flags: tuple[str, ...],
    read_only: bool,
    code: int,
    pattern: str,
) -> None:
    assert ROWS
    page(engine)
    route(engine)
    # A state folder the probe cannot write in: a regular file stands where the folder should be (root
    # writes through a read-only mode, so the mode alone would not stop it).
    if read_only:
        (tmp_path / "ro").write_text("")
    state = tmp_path / "ro" / "probe.state" if read_only else tmp_path / "probe.state"
    if "SECOND" in flags:  # the canary goes only to an engine seen idle before: a first run
        flags = tuple(flag for flag in flags if flag != "SECOND")
        run_probe("--url", engine.url, "--state-file", str(state), *flags)
        engine.requests.clear()
    result = run_probe("--url", engine.url, "--state-file", str(state), *flags)
    assert (result.returncode, result.stderr) == (code, ""), result.stdout
    assert result.stdout.count("\n") == 1
    assert re.fullmatch(pattern, result.stdout.strip()), result.stdout
    asked = engine.count("/health")
    assert asked == (0 if "--strict" in flags or (code == ExitCode.OK and "baseline" in pattern) else 1)


def test_a_server_that_does_not_answer_stays_a_failure(tmp_path: Path) -> None:
    url = refused_url()
    result = run_probe("--url", url, "--state-file", str(tmp_path / "s"))
    assert result.returncode == ExitCode.SCRAPE
    assert "connection refused" in result.stdout


def test_a_page_silent_for_the_window_stays_stalled(engine: StubEngine, tmp_path: Path) -> None:
    state = str(tmp_path / "probe.state")
    assert run_probe("--url", engine.url, "--state-file", state).returncode == ExitCode.OK
    engine.route("/metrics", REAL, delay=3)
    rewind(state, 200)
    result = run_probe("--url", engine.url, "--state-file", state, "--timeout", "0.5")
    assert result.returncode == ExitCode.STALLED, result.stdout
    assert result.stdout.startswith("stalled: ")
    assert engine.count("/health") == 0


def test_unjudged_in_json(engine: StubEngine, tmp_path: Path) -> None:
    html(engine)
    result = run_probe("--url", engine.url, "--state-file", str(tmp_path / "s"), "--json", "--ready")
    assert result.returncode == ExitCode.OK
    fields = json.loads(result.stdout)
    assert (fields["verdict"], fields["exit_code"], fields["ready"]) == ("unjudged", 0, True)
    assert "not a metrics page" in fields["error"]
    assert fields["message"].startswith("ready: unjudged: ")


# --- report-only: judge, say, keep the state, never act on the probe's own verdicts; never weaker than
# the httpGet of the health route it replaces


def test_report_only_says_the_stall_and_exits_0(engine: StubEngine, tmp_path: Path) -> None:
    state = str(tmp_path / "probe.state")
    assert run_probe("--url", engine.url, "--state-file", state, "--report-only").returncode == ExitCode.OK
    rewind(state, 200)
    result = run_probe("--url", engine.url, "--state-file", state, "--report-only")
    assert (result.returncode, result.stderr) == (ExitCode.OK, "")
    assert re.fullmatch(r"stalled: 2 running, .*; report-only: exit 0, not 1\n", result.stdout), result.stdout
    assert engine.count("/health") == 1  # asked only because the run would have failed
    # The state is kept: the stall clock runs on, so the next run is stalled too (and fails without the flag).
    result = run_probe("--url", engine.url, "--state-file", state)
    assert result.returncode == ExitCode.STALLED


def test_report_only_from_the_environment_acts_on_liveness_alone(engine: StubEngine, tmp_path: Path) -> None:
    """The kill switch of old (STALLPROBE_REPORT_ONLY on the container) reaches both probes; readiness, which
    only moves traffic, keeps draining a stuck engine whatever it says."""
    state = str(tmp_path / "probe.state")
    env = {"STALLPROBE_REPORT_ONLY": "1"}
    assert run_probe("--url", engine.url, "--state-file", state, env=env).returncode == ExitCode.OK
    rewind(state, 200)
    live = run_probe("--url", engine.url, "--state-file", state, env=env)
    assert (live.returncode, live.stdout.startswith("stalled: ")) == (ExitCode.OK, True), live.stdout
    ready = run_probe("--url", engine.url, "--state-file", state, "--ready", env=env)
    assert ready.returncode == ExitCode.STALLED
    assert re.fullmatch(r"not ready: stalled: [^\n]*\n", ready.stdout), ready.stdout
    assert "report-only" not in ready.stdout


def frozen(engine: StubEngine, tmp_path: Path, health_route: Route | None = None) -> str:
    """A state file whose engine has been busy and frozen for 200 s, and the health route as given."""
    state = str(tmp_path / "probe.state")
    assert run_probe("--url", engine.url, "--state-file", state).returncode == ExitCode.OK
    rewind(state, 200)
    if health_route is not None:
        engine.routes["/health"] = health_route
    return state


@pytest.mark.parametrize(
    ("health_route", "code", "words"),
    [
        (Route(b"", 503), ExitCode.SCRAPE, "report-only, but health http://127.0.0.1:PORT/health: HTTP 503"),
        (Route(b"", 500), ExitCode.SCRAPE, "report-only, but health http://127.0.0.1:PORT/health: HTTP 500"),
        (Route(b"", 404), ExitCode.SCRAPE, "report-only, but health http://127.0.0.1:PORT/health: HTTP 404"),
        (Route(b"", 200), ExitCode.OK, "report-only: exit 0, not 1"),
        # No answer within the deadline is ambiguous (a saturated engine's server is slow): excused.
        (Route(b"", 200, delay=5), ExitCode.OK, "report-only: exit 0, not 1 (health"),
    ],
    ids=["503", "500", "404", "200", "silent"],
)
def test_report_only_never_excuses_what_an_httpget_of_the_health_route_fails_on(
    engine: StubEngine, tmp_path: Path, health_route: Route, code: int, words: str
) -> None:
    state = frozen(engine, tmp_path, health_route)
    result = run_probe("--url", engine.url, "--state-file", state, "--report-only", "--timeout", "1")
    assert (result.returncode, result.stderr) == (code, ""), result.stdout
    assert result.stdout.startswith("stalled: ")
    assert words.replace("PORT", str(engine.port)) in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("args", "code", "excused", "words"),
    [
        (("--url", "REFUSED"), ExitCode.SCRAPE, False, "connection refused"),
        (("--window", "0"), ExitCode.USAGE, True, "--window must be"),
        (("--api-key-env", "NOT_SET_ANYWHERE"), ExitCode.USAGE, True, "NOT_SET_ANYWHERE is not set"),
        (("--url", "http://$(NOT_SET_ANYWHERE):8000/metrics"), ExitCode.USAGE, True, "NOT_SET_ANYWHERE is not set"),
    ],
    ids=["refused", "bad_flag", "key_variable_unset", "host_variable_unset"],
)
def test_report_only_excuses_the_probe_s_own_errors_never_a_dead_server(
    engine: StubEngine, tmp_path: Path, args: tuple[str, ...], code: int, excused: bool, words: str
) -> None:
    argv = [refused_url() if arg == "REFUSED" else arg for arg in args]
    result = run_probe(*argv, "--state-file", str(tmp_path / "s"), "--report-only")
    assert (result.returncode, result.stderr) == (ExitCode.OK if excused else code, ""), result.stdout
    assert result.stdout.startswith("error: ")
    assert words in result.stdout
    assert result.stdout.rstrip().endswith(f"; report-only: exit 0, not {code}") == excused
    # Without the flag, the same run fails with that code.
    plain = run_probe(*argv, "--state-file", str(tmp_path / "s"))
    assert plain.returncode == code


def test_report_only_asks_the_health_route_even_with_strict(engine: StubEngine, tmp_path: Path) -> None:
    html(engine)
    result = run_probe("--url", engine.url, "--state-file", str(tmp_path / "s"), "--report-only", "--strict")
    assert result.returncode == ExitCode.OK
    assert re.fullmatch(UNJUDGED, result.stdout.strip()), result.stdout


def test_the_kill_switch_file_turns_liveness_report_only_between_two_runs(engine: StubEngine, tmp_path: Path) -> None:
    """The ConfigMap's report-only key, mounted as a file: flipped in place (kubectl patch), read at every run."""
    switch = tmp_path / "report-only"
    state = frozen(engine, tmp_path)
    args = ("--url", engine.url, "--state-file", state, "--report-only-file", str(switch))
    assert run_probe(*args).returncode == ExitCode.STALLED  # no file: the key is not in the ConfigMap
    switch.write_text("true")
    on = run_probe(*args)
    assert (on.returncode, on.stdout.rstrip().endswith("report-only: exit 0, not 1")) == (ExitCode.OK, True)
    assert run_probe(*args, "--ready").returncode == ExitCode.STALLED  # readiness keeps draining
    switch.write_text("false\n")
    assert run_probe(*args).returncode == ExitCode.STALLED
    switch.write_text("maybe")  # anything but a word read as false holds restarts back
    assert run_probe(*args).returncode == ExitCode.OK
    switch.unlink()
    assert run_probe(*args).returncode == ExitCode.STALLED
