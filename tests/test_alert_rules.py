"""The Prometheus alerting rules of ``deploy/prometheus/``: ``promtool check rules`` and
``check config`` accept them, ``promtool test rules`` runs their unit tests
(``linkguard-alerts.test.yml``: which alert fires when), and every metric they and their test
series name is one linkguard exports (``AGENT_METRICS``, ``SERVICE_METRICS``), with labels it
carries and status values it uses; every alert's runbook is a section of
``docs/monitoring.md``. The promtool tests skip without promtool (Debian's ``prometheus``
package) and fail instead under ``LINKGUARD_REQUIRE_REAL=1``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from linkguard.metrics import AGENT_METRICS, SERVICE_METRICS, MetricSpec
from linkguard.metrics.families import STATUSES
from tests.support import missing

ROOT = Path(__file__).resolve().parents[1]
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "linkguard-alerts.yml"
RULE_TESTS = RULES_DIR / "linkguard-alerts.test.yml"
CONFIG = RULES_DIR / "prometheus.yml"
MONITORING = ROOT / "docs" / "monitoring.md"

#: labels Prometheus adds to every scraped series
TARGET_LABELS = ("job", "instance")
#: metrics the rules may use that linkguard does not declare: Prometheus' own
PROMETHEUS_METRICS = {"up": ()}

_SELECTOR = re.compile(r"\b([a-zA-Z_][a-zA-Z0-9_]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_METRIC = re.compile(r"\b(linkguard_[a-z0-9_]+|up)\b")


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        missing("needs promtool (Debian's prometheus package: apt-get install prometheus)")
    assert path is not None
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=60
    )


def test_promtool_checks_the_rules_and_the_config() -> None:
    rules = _run("check", "rules", RULES.name)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS: 9 rules found" in rules.stdout
    config = _run("check", "config", CONFIG.name)
    assert config.returncode == 0, config.stdout + config.stderr
    assert "WARNING" not in config.stdout + config.stderr


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    result = _run("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _declared() -> dict[str, tuple[str, ...]]:
    """Every series name linkguard exports -> its labels (a histogram's ``_bucket``,
    ``_sum``, ``_count`` too), plus Prometheus' ``up`` and the allowance above."""
    names: dict[str, tuple[str, ...]] = dict(PROMETHEUS_METRICS)
    specs: tuple[MetricSpec, ...] = (*AGENT_METRICS, *SERVICE_METRICS)
    for spec in specs:
        names[spec.name] = spec.labels
        if spec.type == "histogram":
            names[f"{spec.name}_bucket"] = (*spec.labels, "le")
            names[f"{spec.name}_sum"] = names[f"{spec.name}_count"] = spec.labels
    return names


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _check_selectors(text: str, declared: dict[str, tuple[str, ...]], where: str) -> set[str]:
    """The metric names ``text`` uses (each declared), its label matchers checked against
    the metric's labels, ``status`` values against the port statuses."""
    used = set(_METRIC.findall(text))
    unknown = sorted(used - set(declared))
    assert not unknown, f"{where}: metrics linkguard does not export: {unknown}"
    for name, body in _SELECTOR.findall(text):
        assert name in declared, f"{where}: {name} is not a metric linkguard exports"
        for label, op, value in _MATCHER.findall(body):
            allowed = (*declared[name], *TARGET_LABELS)
            assert label in allowed, f"{where}: {name} has no label {label} ({allowed})"
            if label == "status":
                values = set(value.split("|")) if op == "=~" else {value}
                assert values <= set(STATUSES), f"{where}: status {value} not in {STATUSES}"
    return used


def test_every_metric_the_rules_use_is_declared() -> None:
    declared = _declared()
    used: set[str] = set()
    for rule in _rules():
        used |= _check_selectors(str(rule["expr"]), declared, rule["alert"])
    # what the issue asks the rules to watch, each at least once
    assert {
        "up",
        "linkguard_bus_connected",
        "linkguard_hosts_not_acking",
        "linkguard_hosts_unprotected",
        "linkguard_port_status",
        "linkguard_port_held_down",
    } <= used


def test_the_unit_tests_feed_series_linkguard_exports() -> None:
    declared = _declared()
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    series = [s["series"] for t in tests for s in t["input_series"]]
    assert series
    for s in series:
        _check_selectors(s if "{" in s else s + "{}", declared, s)
    tested = {a["alertname"] for t in tests for a in t["alert_rule_test"]}
    assert tested == {r["alert"] for r in _rules()}  # every alert has a test


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings in ``markdown``."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r["alert"])
def test_every_alert_has_a_runbook_section(rule: dict[str, Any]) -> None:
    runbook = rule["annotations"]["runbook"]
    page, _, anchor = runbook.removeprefix("linkguard ").partition("#")
    assert page == "docs/monitoring.md"
    assert anchor in _anchors(MONITORING.read_text()), f"no section #{anchor} in {page}"
    assert rule["labels"]["severity"] in ("critical", "warning")
