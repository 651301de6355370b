"""The fleet alert rules (deploy/prometheus/stallprobe-rules.yaml) pass promtool's check and unit tests.

scripts/check-alert-rules cuts the PrometheusRule's spec out as a plain rule file and runs `promtool check
rules` and `promtool test rules` (deploy/prometheus/stallprobe-rules.test.yaml) on it. promtool comes
from Debian's prometheus package, which scripts/install-test-tools installs; without it the first test
fails, never skips.
The other tests exercise the cut alone, and what every rule must carry (a runbook in docs/alerts.md, a
`for:` on the Stalled alerts), and need no promtool.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_docs import anchors

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check-alert-rules"
RULES = REPO / "deploy" / "prometheus" / "stallprobe-rules.yaml"
ALERTS = (
    "VLLMEngineStalled",
    "VLLMEngineStalledQueued",
    "VLLMEngineSaturated",
    "SGLangEngineStalled",
    "SGLangEngineSaturated",
    "EngineLivenessRestartLoop",
)
# The alerts that page for a wedge: each waits out a restart that heals (stallprobe-rules.yaml's header).
STALLED = ("VLLMEngineStalled", "VLLMEngineStalledQueued", "SGLangEngineStalled")


def rules() -> dict[str, dict[str, object]]:
    spec = yaml.safe_load(RULES.read_text(encoding="utf-8"))["spec"]
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"]}


def check_alert_rules(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, check=False, cwd=REPO
    )


@pytest.mark.needs("promtool")  # Debian's prometheus package, or PROMTOOL naming a promtool binary
def test_rules_pass_promtool_check_and_every_unit_test() -> None:
    result = check_alert_rules()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"SUCCESS: {len(ALERTS)} rules found" in output, output  # no rule lost in the cut
    assert "OK: " in result.stdout, output


def test_emit_is_the_spec_shifted_left_and_nothing_else() -> None:
    result = check_alert_rules("--emit")
    assert result.returncode == 0, result.stderr
    header, *emitted = result.stdout.splitlines()
    assert header.startswith("# Cut from deploy/prometheus/stallprobe-rules.yaml")
    cr = RULES.read_text(encoding="utf-8").splitlines()
    spec = cr[cr.index("spec:") + 1 :]
    assert emitted[0] == "groups:"
    assert emitted == [line[2:] for line in spec]
    for alert in ALERTS:
        assert f"- alert: {alert}" in result.stdout


def test_every_alert_is_in_the_list_above() -> None:
    assert tuple(rules()) == ALERTS


@pytest.mark.parametrize("alert", ALERTS)
def test_every_alert_links_its_runbook_section_in_the_docs(alert: str) -> None:
    """runbook_url is a path in this repository (docs/alerts.md#anchor): the heading must exist, and be the
    runbook of that alert, so a renamed heading or a copied rule cannot send the pager to the wrong page."""
    annotations = rules()[alert]["annotations"]
    assert isinstance(annotations, dict)
    path, _, anchor = str(annotations["runbook_url"]).partition("#")
    assert path == "docs/alerts.md"
    assert anchor == f"runbook-{alert.lower()}"
    assert anchor in anchors((REPO / path).read_text(encoding="utf-8"))


@pytest.mark.parametrize("alert", STALLED)
def test_the_stalled_alerts_wait_out_a_restart_that_heals(alert: str) -> None:
    assert rules()[alert]["for"] == "5m"


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


def test_a_missing_promtool_is_a_clear_error() -> None:
    result = check_alert_rules("--promtool", "/nonexistent/promtool")
    assert result.returncode == 3
    assert "promtool not found" in result.stderr
    assert "apt-get install" in result.stderr
