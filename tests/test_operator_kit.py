"""The operator's kit in infra/ holds what it promises, checked against the rendered overlays and the code: the
NetworkPolicies select real pods, open only ports those pods have, close every pod by default and let each reach
what its settings name (Temporal, the trace collector) and Prometheus scrape what the scrape config keeps; the public
egress refuses every range the SSRF guard refuses; the Ingress serves MONOLOGUE_API__PUBLIC_URL over TLS with room
for the API's uploads and streams; the GPU node runs at a PriorityClass the overlay makes. (kubernetes-validate's
strict check of every rendered object, these included, is tests/test_deployment.py's; the alert rules and the
dashboard are tests/test_monitoring_kit.py's.)"""

from __future__ import annotations

import ipaddress
import re
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from monologue.outbound import REFUSED_RANGES
from monologue.settings import Settings
from tests.kustomize import rendered

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = sorted(path.parent for path in (ROOT / "infra" / "k8s" / "overlays").glob("*/kustomization.yaml"))
Resources = dict[tuple[str, str], dict[str, Any]]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# IPv6 forms that carry an IPv4 address: the guard judges them by that address, which a NetworkPolicy cannot see.
IPV4_CARRIERS = [ipaddress.ip_network(cidr) for cidr in ("::ffff:0:0/96", "::/96", "2002::/16", "2001::/32")]
IPV4_CARRIERS.append(ipaddress.ip_network("64:ff9b::/96"))
PUBLIC_ADDRESS = ipaddress.ip_address("52.218.0.10")  # an S3 endpoint of AWS's (eu-west-1)
# A block this wide opens the internet; narrower ones are the operator's own addresses (a database, an endpoint).
WIDE_PREFIX = 8
_rendered = cache(rendered)  # read-only here: one rendering per overlay


def _pods(resources: Resources) -> dict[str, dict[str, Any]]:
    """Every pod template, by its workload's name."""
    return {name: r["spec"]["template"] for (kind, name), r in resources.items() if kind in ("Deployment", "Job")}


def _policies(resources: Resources) -> dict[str, dict[str, Any]]:
    return {name: r["spec"] for (kind, name), r in resources.items() if kind == "NetworkPolicy"}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes' label selector: matchLabels and matchExpressions, all of them; {} selects every pod."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, values = expression["key"], expression.get("values", [])
        matches = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[expression["operator"]]
        if not matches:
            return False
    return True


def _port_names(pod: dict[str, Any]) -> set[str]:
    return {port["name"] for container in pod["spec"]["containers"] for port in container.get("ports", [])}


def _applying(policies: dict[str, dict[str, Any]], pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in policies.items() if _selects(spec["podSelector"], pod["metadata"]["labels"])}


def _rules(policies: dict[str, dict[str, Any]], pod: dict[str, Any], direction: str) -> list[dict[str, Any]]:
    """The `ingress` or `egress` rules that apply to `pod`."""
    return [rule for spec in _applying(policies, pod).values() for rule in spec.get(direction, [])]


def _opens(rule: dict[str, Any], port: int | str) -> bool:
    return any(allowed["port"] == port for allowed in rule["ports"])


def _peer_namespace(peer: dict[str, Any]) -> str | None:
    name: str | None = peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
    return name


def _reaches_namespace(rules: list[dict[str, Any]], namespace: str, port: int | str, side: str) -> bool:
    """Some rule lets `pod` talk with pods in `namespace` on `port` (side "to": egress, "from": ingress)."""
    return any(_opens(rule, port) and any(_peer_namespace(peer) == namespace for peer in rule[side]) for rule in rules)


def _reaches_address(
    rules: list[dict[str, Any]], address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
) -> bool:
    for rule in rules:
        for block in (peer["ipBlock"] for peer in rule["to"] if "ipBlock" in peer and _opens(rule, port)):
            excepted = [ipaddress.ip_network(entry) for entry in block.get("except", [])]
            if address in ipaddress.ip_network(block["cidr"]) and not any(address in entry for entry in excepted):
                return True
    return False


def _namespace_and_port(address: str) -> tuple[str, int]:
    """`service.namespace.svc…:port` (or a URL of one) → (namespace, port)."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    assert parts.hostname and parts.port and ".svc" in parts.hostname, f"{address} is no in-cluster Service address"
    return parts.hostname.split(".")[1], parts.port


def _settings(config_map: dict[str, Any]) -> Settings:
    """The settings the ConfigMap gives every process (MONOLOGUE_A__B → a.b; the TLS files exist only in a pod)."""
    tree: dict[str, Any] = {}
    for name, value in config_map["data"].items():
        if name.startswith("MONOLOGUE_") and not name.startswith("MONOLOGUE_TEMPORAL__TLS__"):
            *groups, field = name.removeprefix("MONOLOGUE_").lower().split("__")
            node = tree
            for group in groups:
                node = node.setdefault(group, {})
            node[field] = value
    return Settings.model_validate(tree)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_every_network_policy_selects_pods_and_opens_only_ports_they_have(overlay: Path) -> None:
    """A policy that selects nothing protects nothing (a label renamed on one side); a named port the selected pod
    does not have opens nothing."""
    resources = _rendered(overlay)
    pods, policies = _pods(resources), _policies(resources)
    assert len(policies) >= 4
    for name, spec in policies.items():
        selected = [pod for pod in pods.values() if _selects(spec["podSelector"], pod["metadata"]["labels"])]
        assert selected, f"NetworkPolicy {name} selects no pod of {sorted(pods)}"
        for rule in spec.get("ingress", []):
            for port in (allowed["port"] for allowed in rule["ports"] if isinstance(allowed["port"], str)):
                lacking = [pod["metadata"]["labels"] for pod in selected if port not in _port_names(pod)]
                assert not lacking, f"NetworkPolicy {name} opens port {port}, which {lacking} have not"


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_every_pod_is_closed_by_default_and_reaches_what_its_settings_name(overlay: Path) -> None:
    """Denied both ways unless allowed; every pod reaches DNS, Temporal's frontend and the trace collector at the
    addresses the ConfigMap gives; the API and the nodes reach public https (S3, Kinesis Video, URL inputs,
    webhooks), the migrate Job does not."""
    resources = _rendered(overlay)
    pods, policies = _pods(resources), _policies(resources)
    settings = _settings(resources[("ConfigMap", "monologue-config")])
    temporal = _namespace_and_port(settings.temporal.address)
    collector = _namespace_and_port(settings.tracing.otlp_endpoint)
    for name, pod in pods.items():
        applying = _applying(policies, pod).values()
        assert any(
            set(spec["policyTypes"]) == {"Ingress", "Egress"} and not spec.get("ingress") and not spec.get("egress")
            for spec in applying
        ), f"{name}: no deny-all policy selects it"
        egress = _rules(policies, pod, "egress")
        for namespace, port in (temporal, collector, ("kube-system", 53)):
            assert _reaches_namespace(egress, namespace, port, "to"), f"{name} cannot reach {namespace}:{port}"
        public = _reaches_address(egress, PUBLIC_ADDRESS, 443)
        assert public == (name != "monologue-migrate"), f"{name}: public https {public}"
        assert not _reaches_address(egress, ipaddress.IPv4Address("169.254.169.254"), 80)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_prometheus_and_the_ingress_controller_reach_the_ports_they_use(overlay: Path) -> None:
    """Prometheus (the ScaledObject's serverAddress names its namespace) scrapes every port the scrape config keeps
    on each pod that has it; the API's Service port is open to pods outside the namespace (the controller's)."""
    resources = _rendered(overlay)
    pods, policies = _pods(resources), _policies(resources)
    [trigger] = resources[("ScaledObject", "monologue-node")]["spec"]["triggers"]
    prometheus, _ = _namespace_and_port(trigger["metadata"]["serverAddress"])
    scrape = yaml.safe_load(resources[("ConfigMap", "monologue-prometheus-scrape")]["data"]["monologue.yml"])
    [kept] = [
        rule["regex"]
        for rule in scrape["scrape_configs"][0]["relabel_configs"]
        if rule["source_labels"] == ["__meta_kubernetes_pod_container_port_name"] and rule.get("action") == "keep"
    ]
    for name in ("monologue-api", "monologue-node"):
        pod = pods[name]
        scraped = {port for port in _port_names(pod) if re.fullmatch(kept, port)}
        ingress = _rules(policies, pod, "ingress")
        assert scraped and all(_reaches_namespace(ingress, prometheus, port, "from") for port in scraped), name
    service_port = resources[("Service", "monologue-api")]["spec"]["ports"][0]["targetPort"]
    api_ingress = _rules(policies, pods["monologue-api"], "ingress")
    outside = {_peer_namespace(peer) for rule in api_ingress if _opens(rule, service_port) for peer in rule["from"]}
    assert outside - {prometheus, None}, "no ingress controller reaches the API"


def test_public_egress_refuses_every_range_the_ssrf_guard_refuses() -> None:
    """A block that opens the internet excepts every range monologue/outbound.py refuses (an IPv6 form carrying an
    IPv4 address whole), and nothing else; it opens plain http only where the guard allows http://."""
    resources = _rendered(OVERLAYS[0])
    refused: list[Network] = [network for network, _ in REFUSED_RANGES] + IPV4_CARRIERS
    allow_http = _settings(resources[("ConfigMap", "monologue-config")]).outbound.allow_http
    wide = 0
    for name, spec in _policies(resources).items():
        for rule in spec.get("egress", []):
            for block in (peer["ipBlock"] for peer in rule["to"] if "ipBlock" in peer):
                cidr = ipaddress.ip_network(block["cidr"])
                if cidr.prefixlen >= WIDE_PREFIX:
                    continue
                wide += 1
                excepted = [ipaddress.ip_network(entry) for entry in block.get("except", [])]
                open_ranges = [
                    network
                    for network in refused
                    if network.version == cidr.version
                    and network.overlaps(cidr)
                    and not any(network.subnet_of(entry) for entry in excepted)  # type: ignore[arg-type]
                ]
                assert open_ranges == [], f"{name} opens {open_ranges}, which the SSRF guard refuses"
                assert set(excepted) <= set(refused), f"{name} excepts {set(excepted) - set(refused)}"
                assert _opens(rule, 80) == allow_http and _opens(rule, 443), name
    assert wide >= 2  # IPv4 and IPv6


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_the_ingress_serves_the_public_url_over_tls_with_room_for_uploads_and_streams(overlay: Path) -> None:
    resources = _rendered(overlay)
    settings = _settings(resources[("ConfigMap", "monologue-config")])
    public = urlsplit(settings.api.public_url or "")
    [ingress] = [r for (kind, _), r in resources.items() if kind == "Ingress"]
    annotations, spec = ingress["metadata"]["annotations"], ingress["spec"]
    [rule] = spec["rules"]
    [tls] = spec["tls"]
    assert public.scheme == "https" and rule["host"] == public.hostname and public.hostname in tls["hosts"]
    assert tls["secretName"] and annotations["cert-manager.io/cluster-issuer"]
    [path] = rule["http"]["paths"]
    backend = path["backend"]["service"]
    service = resources[("Service", backend["name"])]
    assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}
    nginx = {key.removeprefix("nginx.ingress.kubernetes.io/"): value for key, value in annotations.items()}
    size = re.fullmatch(r"(\d+)([kmg]?)", nginx["proxy-body-size"].lower())
    assert size, nginx["proxy-body-size"]
    body_bytes = int(size[1]) * 1024 ** " kmg".index(size[2] or " ")
    assert body_bytes >= settings.limits.max_body_bytes
    longest_silence = max(settings.api.events_keepalive_s, settings.render.live_idle_timeout_s)
    for timeout in ("proxy-read-timeout", "proxy-send-timeout"):
        assert float(nginx[timeout]) > longest_silence, timeout
    assert nginx["proxy-buffering"] == "off"  # server-sent events must not wait in nginx's buffer


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_pods_run_at_priority_classes_the_overlay_makes(overlay: Path) -> None:
    """The GPU node names the PriorityClass its overlay makes (cluster-scoped, no global default, below the system
    classes); no pod names a class that does not exist (the pod would never be created)."""
    resources = _rendered(overlay)
    classes = {name: r for (kind, name), r in resources.items() if kind == "PriorityClass"}
    named = {name: pod["spec"].get("priorityClassName") for name, pod in _pods(resources).items()}
    assert {value for value in named.values() if value} <= set(classes), named
    for priority_class in classes.values():
        assert "namespace" not in priority_class["metadata"] and priority_class["globalDefault"] is False
        assert 0 < priority_class["value"] <= 1_000_000_000  # above that only system classes
    if overlay.name == "gpu":
        assert named["monologue-node"] in classes
