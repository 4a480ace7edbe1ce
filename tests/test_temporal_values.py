"""Temporal's Helm values (infra/temporal/values.yaml): the `monologue` namespace, SQL persistence, mutual TLS whose
server name the services use, the search attributes documented, the matcher the dev server runs with, and only keys
the pinned chart version accepts (tests/schemas/temporal-chart-1.6.0.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from cli.stack import MATCHER_CONFIG
from monologue import contracts as c
from monologue.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def test_the_temporal_values_register_the_namespace_and_document_the_search_attributes() -> None:
    path = ROOT / "infra" / "temporal" / "values.yaml"
    values = yaml.safe_load(path.read_text())
    config = values["server"]["config"]
    assert [ns["name"] for ns in config["namespaces"]["namespace"]] == ["monologue"] and config["namespaces"]["create"]
    stores = config["persistence"]["datastores"]
    assert {store["sql"]["pluginName"] for store in stores.values()} == {"postgres12"}
    frontend = values["server"]["tls"]["frontend"]
    assert frontend["enabled"] and frontend["requireClientAuth"] is True
    assert (
        frontend["serverName"]
        == Settings.model_validate({"temporal": {"tls": {"server_name": "temporal-frontend"}}}).temporal.tls.server_name
    )
    text = path.read_text()
    assert all(name in text for name in c.SEARCH_ATTRIBUTES)


def test_the_temporal_values_use_only_keys_the_pinned_chart_accepts() -> None:
    """Chart 1.6.0's own values (tests/schemas/temporal-chart-1.6.0.json): a key of an older chart (bundled
    databases, `persistence.default`, `schema.setup`) would be ignored or refused by it."""
    chart = json.loads((ROOT / "tests" / "schemas" / "temporal-chart-1.6.0.json").read_text())
    text = (ROOT / "infra" / "temporal" / "values.yaml").read_text()
    assert f"--version {chart['version']}" in text
    known, free = set(chart["keys"]), tuple(chart["free_form"])
    unknown = [path for path in _key_paths(yaml.safe_load(text)) if path not in known and not path.startswith(free)]
    assert unknown == []


def _key_paths(values: Any, prefix: str = "") -> list[str]:
    if not isinstance(values, dict):
        return []
    paths = []
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        paths += [path, *_key_paths(value, path)]
    return paths


def test_the_temporal_values_turn_on_the_matcher_the_dev_server_runs_with() -> None:
    """Priority and fairness as in `monologue up` (cli/stack.py MATCHER_CONFIG), the lease queue on one partition."""
    values = yaml.safe_load((ROOT / "infra" / "temporal" / "values.yaml").read_text())
    dynamic = values["server"]["dynamicConfig"]
    assert set(dynamic) == set(MATCHER_CONFIG)
    lease_queue = c.lease_task_queue(Settings().temporal.task_queue)
    for name, expected in MATCHER_CONFIG.items():
        [entry] = dynamic[name]
        assert str(entry["value"]).lower() == expected and entry["constraints"]["namespace"] == "monologue"
        if "Partitions" in name:
            assert entry["constraints"]["taskQueueName"] == lease_queue
