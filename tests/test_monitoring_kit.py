"""The alert rules (infra/prometheus) and the Grafana dashboard (infra/grafana) watch what the code exports: Debian's
promtool checks the rules and runs their unit tests (each alert fires on its failure and stays quiet on a healthy
cluster), every metric and label value the rules, their tests and the dashboard's queries name is one the code
exports (read off its registries, not listed here), the dashboard's queries parse and every exported metric is on
it. A query naming a metric nobody exports is empty, and an empty query alerts nobody."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from api.app import create_app
from monologue import contracts as c, metrics
from monologue.metrics import NODE, WebhookOutcome
from monologue.schemas import WebhookEvent
from monologue.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "infra" / "prometheus" / "alerts.yml"
ALERT_TESTS = ROOT / "infra" / "prometheus" / "alerts.test.yml"
DASHBOARD = ROOT / "infra" / "grafana" / "monologue.json"
# The sample names each family type puts on the wire (a counter `x` is queried as `x_total`, never `x`).
SAMPLES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
SEVERITIES = {"warning", "critical"}
# The values a query may give a label: the enums the code labels with (a misspelt value matches nothing, silently).
LABEL_VALUES: dict[str, set[str]] = {
    "class": set(c.QueueClass),
    "sink": set(c.SinkType),
    "family": set(c.Family),
    "outcome": set(WebhookOutcome),
    "event": set(WebhookEvent),
}
SESSION_STATUSES = {
    "monologue_sessions": set(c.SessionStatus) - c.TERMINAL,  # the gauge counts sessions still going
    "monologue_sessions_finished": set(c.TERMINAL),
}


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool comes with Debian's prometheus package, which infra/test.sh installs"
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60)


def _families(registry: CollectorRegistry) -> dict[str, str]:
    """name → type of every family `registry` exports, now or when it has figures: each collector's describe()
    where it has one (NVML on a machine without a GPU, the backlog without Temporal: nothing to collect, yet their
    families are named), else what it collects. prometheus-client keeps its collectors in a private map only."""
    families: dict[str, str] = {}
    for collector in list(registry._collector_to_names):
        described = collector.describe() if hasattr(collector, "describe") else collector.collect()
        families |= {family.name: family.type for family in described}
    return families


def _described_by_collector_classes() -> dict[str, str]:
    """name → type of what each Collector class of monologue.metrics exports when it has figures (the sessions from
    the database, the backlog from Temporal, GPUs from NVML: an API or node registers them at its start). describe()
    names families and reads nothing, so it runs on an instance whose constructor (a database, Temporal) is skipped."""
    classes = [cls for cls in vars(metrics).values() if isinstance(cls, type) and cls.__module__ == metrics.__name__]
    mine = [cls for cls in classes if Collector in cls.__mro__]  # a Protocol: issubclass() refuses it
    assert len(mine) >= 3, mine
    return {family.name: family.type for cls in mine for family in cls.describe(object.__new__(cls))}  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Sample name → its family, for everything a node (NODE) and an API process (its app's registry, and the
    collectors it registers at start) serve on /metrics."""
    app = create_app(Settings(home=tmp_path_factory.mktemp("api")))
    families = _families(NODE) | _families(app.state.metrics_registry) | _described_by_collector_classes()
    monologue = {name: kind for name, kind in families.items() if name.startswith("monologue_")}
    assert {"monologue_sessions", "monologue_http_requests", "monologue_gpu_utilization_ratio"} <= set(monologue)
    return {name + suffix: name for name, kind in monologue.items() for suffix in SAMPLES[kind]}


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


@cache
def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _panels() -> Iterator[dict[str, Any]]:
    for panel in _dashboard()["panels"]:
        yield from [panel, *panel.get("panels", [])]


def _expressions(source: str) -> list[str]:
    if source == "alerts":
        return [rule["expr"] for rule in _alert_rules()]
    if source == "alert tests":
        tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        return [series["series"] for test in tests for series in test["input_series"]]
    return [target["expr"] for panel in _panels() for target in panel.get("targets", [])]


def _names(expression: str) -> set[str]:
    """The monologue_* names in a PromQL expression, its string literals (label values) left out."""
    return set(re.findall(r"\bmonologue_[a-z0-9_]+", re.sub(r'"[^"]*"', '""', expression)))


def _label_values(expression: str) -> Iterator[tuple[str, str, str]]:
    """(sample name, label, value) for each equality or plain alternation (`a|b`) matcher in the selectors."""
    for name, matchers in re.findall(r"\b(monologue_[a-z0-9_]+)\s*\{([^}]*)\}", expression):
        for label, operator, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', matchers):
            if "~" not in operator or re.fullmatch(r"\w+(\|\w+)*", value):
                yield from ((name, label, alternative) for alternative in value.split("|"))


def test_promtool_checks_the_alert_rules() -> None:
    done = _promtool("check", "rules", ALERTS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_fires_on_its_failure_and_stays_quiet_on_a_healthy_cluster() -> None:
    """promtool's unit tests pass, and they cover each alert both ways."""
    done = _promtool("test", "rules", ALERT_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    cases = [case for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for rule in _alert_rules():
        outcomes = {bool(case["exp_alerts"]) for case in cases if case["alertname"] == rule["alert"]}
        assert outcomes == {True, False}, f"{rule['alert']}: cases where it fires and stays quiet, not {outcomes}"


def test_every_alert_says_how_bad_what_happened_and_what_to_do() -> None:
    rules = _alert_rules()
    assert len({rule["alert"] for rule in rules}) == len(rules) >= 6
    for rule in rules:
        assert rule["labels"]["severity"] in SEVERITIES and "for" in rule, rule["alert"]
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]


@pytest.mark.parametrize("source", ["alerts", "alert tests", "dashboard"])
def test_every_metric_and_label_value_queried_is_one_the_code_exports(source: str, exported: dict[str, str]) -> None:
    expressions = _expressions(source)
    named = set().union(*map(_names, expressions))
    assert named and named <= set(exported), f"{source} queries {sorted(named - set(exported))}: not exported"
    if source == "alert tests":
        return  # healthy and failing series, not queries
    for expression in expressions:
        for name, label, value in _label_values(expression):
            allowed = SESSION_STATUSES.get(exported[name]) if label == "status" else LABEL_VALUES.get(label)
            assert allowed is None or value in allowed, f"{name}{{{label}={value!r}}}: not one of {sorted(allowed)}"


def test_the_dashboard_asks_the_chosen_prometheus_with_queries_that_parse(tmp_path: Path) -> None:
    """Every panel and query uses the dashboard's Prometheus variable; promtool parses every query (as recording
    rules, Grafana's interval variable made a duration)."""
    [variable] = [v for v in _dashboard()["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    source = {"type": "prometheus", "uid": f"${{{variable['name']}}}"}
    records = []
    for panel in _panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == source and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source, panel["title"]
            expr = target["expr"].replace("$__rate_interval", "5m")
            records.append({"record": f"dashboard:panel_{panel['id']}_{target['refId']}", "expr": expr})
    rules = tmp_path / "dashboard-queries.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    done = _promtool("check", "rules", rules)
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [panel["id"] for panel in _panels()]
    assert len(ids) == len(set(ids))


def test_every_metric_the_code_exports_is_on_the_dashboard(exported: dict[str, str]) -> None:
    """A metric exported and never looked at is a question nobody asks; a new one gets a panel."""
    shown = {exported[name] for name in set().union(*map(_names, _expressions("dashboard"))) if name in exported}
    assert set(exported.values()) - shown == set()
