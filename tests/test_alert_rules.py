"""The fleet alert rules (deploy/prometheus/stallprobe-rules.yaml, and stallprobe-watch-rules.yaml on a
watch's metrics) pass promtool's check and unit tests.

scripts/check-alert-rules cuts each PrometheusRule's spec out as a plain rule file and runs `promtool check
rules` and `promtool test rules` (FILE.test.yaml beside each) on it. promtool comes from Debian's
prometheus package, which scripts/install-test-tools installs; without it the first test fails, never
skips.
The other tests exercise the cut alone, and what every rule must carry (a runbook in docs/alerts.md, a
`for:`, a blindness alert for every dialect of engines.py), and need no promtool.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stallprobe.engines import DIALECTS, Dialect
from test_docs import anchors

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check-alert-rules"
PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "stallprobe-rules.yaml"
WATCH_RULES = PROMETHEUS / "stallprobe-watch-rules.yaml"
# Each file's alerts, in its order; its rules promtool counts are these and its recording rules.
ALERTS = {
    RULES: (
        "VLLMEngineStalled",
        "VLLMEngineStalledQueued",
        "VLLMEngineSaturated",
        "SGLangEngineStalled",
        "SGLangEngineSaturated",
        "VLLMProgressMetricMissing",
        "SGLangProgressMetricMissing",
        "LlamaCppProgressMetricMissing",
        "LMDeployProgressMetricMissing",
        "TensorRTLLMProgressMetricMissing",
        "EngineLivenessRestart",
        "EngineLivenessRestartLoop",
        "EnginePoolMostlyNotReady",
    ),
    WATCH_RULES: ("EngineStalled", "EngineSaturated", "StallprobeWatchDown"),
}
EVERY_ALERT = tuple(alert for alerts in ALERTS.values() for alert in alerts)
# The alerts that page for a wedge: each waits out a restart that heals (stallprobe-rules.yaml's header).
STALLED = ("VLLMEngineStalled", "VLLMEngineStalledQueued", "SGLangEngineStalled", "EngineStalled")
BLINDNESS = "stallprobe.blindness"


def groups(path: Path = RULES) -> list[dict[str, Any]]:
    """A PrometheusRule's groups, as YAML gives them (a group's `rules` is a list of mappings)."""
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))["spec"]
    return list(spec["groups"])


def rules(path: Path | None = None) -> dict[str, dict[str, object]]:
    """Every alert of one file (default: both) by name."""
    paths = [path] if path else list(ALERTS)
    return {rule["alert"]: rule for p in paths for group in groups(p) for rule in group["rules"] if "alert" in rule}


def recorded(name: str) -> str:
    """The expression of the recording rule that writes `name`."""
    for group in groups():
        for rule in group["rules"]:
            if rule.get("record") == name:
                return str(rule["expr"])
    raise AssertionError(f"no recording rule writes {name}")


def check_alert_rules(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, check=False, cwd=REPO
    )


@pytest.mark.needs("promtool")  # Debian's prometheus package, or PROMTOOL naming a promtool binary
def test_rules_pass_promtool_check_and_every_unit_test() -> None:
    result = check_alert_rules()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for path, alerts in ALERTS.items():
        records = len([rule for group in groups(path) for rule in group["rules"] if "record" in rule])
        assert f"SUCCESS: {len(alerts) + records} rules found" in output, output  # no rule lost in the cut
        assert f"OK: {path.name} passes" in result.stdout, output


@pytest.mark.parametrize("path", list(ALERTS), ids=lambda path: path.name)
def test_emit_is_the_spec_shifted_left_and_nothing_else(path: Path) -> None:
    result = check_alert_rules("--emit", "--rules", str(path))
    assert result.returncode == 0, result.stderr
    header, *emitted = result.stdout.splitlines()
    assert header.startswith(f"# Cut from deploy/prometheus/{path.name}")
    cr = path.read_text(encoding="utf-8").splitlines()
    spec = cr[cr.index("spec:") + 1 :]
    assert emitted[0] == "groups:"
    assert emitted == [line[2:] for line in spec]
    for alert in ALERTS[path]:
        assert f"- alert: {alert}" in result.stdout


def test_emit_without_rules_is_both_files_in_one_list_of_groups() -> None:
    result = check_alert_rules("--emit")
    assert result.returncode == 0, result.stderr
    emitted = yaml.safe_load(result.stdout)
    assert list(emitted) == ["groups"]
    names = [group["name"] for group in emitted["groups"]]
    assert names == [group["name"] for path in ALERTS for group in groups(path)]


@pytest.mark.parametrize("path", list(ALERTS), ids=lambda path: path.name)
def test_every_alert_is_in_the_list_above(path: Path) -> None:
    assert tuple(rules(path)) == ALERTS[path]


@pytest.mark.parametrize("alert", EVERY_ALERT)
def test_every_alert_links_its_runbook_section_in_the_docs(alert: str) -> None:
    """runbook_url is a path in this repository (docs/alerts.md#anchor): the heading must exist, and be the
    runbook of that alert, so a renamed heading or a copied rule cannot send the pager to the wrong page."""
    annotations = rules()[alert]["annotations"]
    assert isinstance(annotations, dict)
    path, _, anchor = str(annotations["runbook_url"]).partition("#")
    assert path == "docs/alerts.md"
    assert anchor == f"runbook-{alert.lower()}"
    assert anchor in anchors((REPO / path).read_text(encoding="utf-8"))


@pytest.mark.parametrize("alert", EVERY_ALERT)
def test_every_alert_waits_before_it_fires(alert: str) -> None:
    """A `for:` on every alert: one evaluation's blip (a failed scrape, a counter's extrapolation) is never
    a page or a ticket."""
    assert str(rules()[alert].get("for", "")).endswith("m"), rules()[alert].get("for")


@pytest.mark.parametrize("alert", STALLED)
def test_the_stalled_alerts_wait_out_a_restart_that_heals(alert: str) -> None:
    assert rules()[alert]["for"] == "5m"


def test_a_liveness_restart_is_a_ticket_and_a_loop_of_them_a_page() -> None:
    assert rules()["EngineLivenessRestart"]["labels"] == {"severity": "ticket"}
    assert rules()["EngineLivenessRestartLoop"]["labels"] == {"severity": "critical"}


def test_the_restart_loop_is_keyed_on_the_workload_not_the_pod() -> None:
    """A controller that recreates its pods (a LeaderWorkerSet, a Deployment's replacement) starts each at
    0 restarts under a new uid or name: counted per pod, the loop is never seen."""
    expr = str(rules()["EngineLivenessRestartLoop"]["expr"])
    assert "sum by (namespace, workload_kind, workload)" in expr
    assert "pod" not in expr.split("sum by", 1)[1].split(")", 1)[0]


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda dialect: dialect.name)
def test_every_dialect_has_a_blindness_alert_for_each_family_the_probe_requires(dialect: Dialect) -> None:
    """One alert per dialect of engines.py in the stallprobe.blindness group, one `family` per name of its
    Dialect.required(). A dialect added to engines.py fails here until its alert is written, at the end of
    that group (stallprobe-rules.yaml says how)."""
    required = set(dialect.required())
    blindness = [group for group in groups() if group["name"] == BLINDNESS]
    assert blindness, f"no {BLINDNESS} group"
    families = [
        set(re.findall(r'"family", "([^"]+)"', str(rule["expr"]))) for rule in blindness[0]["rules"] if "alert" in rule
    ]
    assert required in families, f"no alert of {BLINDNESS} names exactly {sorted(required)}"


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda dialect: dialect.name)
def test_every_dialect_s_engines_are_engines_to_the_kubernetes_alerts(dialect: Dialect) -> None:
    """stallprobe:engine_pod, which restricts every Kubernetes alert to engines, names each dialect's
    running gauge and generation counter."""
    expr = recorded("stallprobe:engine_pod")
    for name in (dialect.running, dialect.generation):
        assert f"max_over_time({name}[1h])" in expr, name


def test_the_watch_rules_live_in_deploy_not_in_the_pools_page() -> None:
    pools = (REPO / "docs" / "pools.md").read_text(encoding="utf-8")
    assert "- alert:" not in pools
    assert "deploy/prometheus/stallprobe-watch-rules.yaml" in pools


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nspec:\n  groups: []\nmetadata:\n  name: x\n",
            "with spec last",
            id="spec-not-last",
        ),
        pytest.param(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\nspec:\n  groups: []\n",
            "not a monitoring.coreos.com/v1 PrometheusRule",
            id="not-a-prometheusrule",
        ),
        pytest.param(
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: x\nspec:\n  groups:\n"
            "    - name: g\n      rules:\n        - alert: A\n          expr: *stalled\n",
            "no YAML anchors or aliases",
            id="alias",
        ),
        pytest.param(
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: x\nspec:\n  groups: []\n"
            "# a comment at column 0\n",
            "indented by two spaces",
            id="column-0-comment-in-spec",
        ),
        pytest.param(
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: x\nspec:\n  groups: []\n"
            "---\napiVersion: v1\n",
            "expected one of",
            id="two-documents",
        ),
    ],
)
def test_the_cut_refuses_what_it_cannot_shift_safely(tmp_path: Path, text: str, message: str) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(text, encoding="utf-8")
    result = check_alert_rules("--rules", str(rules), "--emit")
    assert result.returncode == 1, result.stdout
    assert message in result.stderr, result.stderr
    assert result.stdout == ""


def test_tests_for_some_rules_only_is_a_usage_error() -> None:
    result = check_alert_rules("--rules", str(RULES), "--rules", str(WATCH_RULES), "--tests", "x.test.yaml")
    assert result.returncode == 2
    assert "--tests given 1 times for 2 --rules" in result.stderr


def test_a_missing_promtool_is_a_clear_error() -> None:
    result = check_alert_rules("--promtool", "/nonexistent/promtool")
    assert result.returncode == 3
    assert "promtool not found" in result.stderr
    assert "apt-get install" in result.stderr
