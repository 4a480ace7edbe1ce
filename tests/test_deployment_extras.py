"""The optional servers beside the stack, in infra/: the TURN server's and the SFU's (Janus) manifests in
infra/k8s/extras and Janus's image share their secrets with the settings that read them, open the ports the nodes and
the API use, and run the configuration the tests run on loopback (cli/turn.py, cli/janus.py)."""

from __future__ import annotations

import re

import pytest

from monologue.settings import Settings
from tests.kustomize import load_documents
from tests.test_deployment import IMAGES, K8S, _container


def test_the_turn_extra_shares_the_secret_the_settings_read_and_the_nodes_may_reach_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """infra/k8s/extras/turn.yaml: coturn checks credentials with the secret MONOLOGUE_ICE__TURN_SECRET names (the
    one the API and nodes mint them from), on the port the nodes' egress policy opens."""
    resources = {(r["kind"], r["metadata"]["name"]): r for r in load_documents(K8S / "extras" / "turn.yaml")}
    coturn = _container(resources[("Deployment", "monologue-turn")])
    secret = next(e for e in coturn["env"] if e["name"] == "MONOLOGUE_ICE__TURN_SECRET")
    assert secret["valueFrom"]["secretKeyRef"]["name"] == "monologue-secrets"
    monkeypatch.setenv(secret["name"], "s3cret")  # the name is the setting's
    monkeypatch.setenv("MONOLOGUE_ICE__TURN_URLS", '["turn:turn.example.com:3478?transport=udp"]')
    ice = Settings().ice
    assert ice.turn_secret is not None and ice.turn_secret.get_secret_value() == "s3cret"
    assert {"--use-auth-secret", f"--static-auth-secret=$({secret['name']})"} <= set(coturn["args"])
    port = int(next(a for a in coturn["args"] if a.startswith("--listening-port=")).split("=")[1])
    (rule,) = resources[("NetworkPolicy", "monologue-egress-turn")]["spec"]["egress"]
    assert rule["ports"] == [{"protocol": "UDP", "port": port}]


def test_the_janus_extra_runs_the_configuration_the_tests_run_and_shares_the_settings_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """infra/k8s/extras/janus.yaml: its ConfigMap is cli/janus.py's configuration (the one the SFU tests run on
    loopback) for its folders; Janus's API secret is the key MONOLOGUE_SFU__API_SECRET names; the Service serves the
    HTTP transport's port, and the egress policy opens it and the mountpoints' RTP range to the API and the nodes."""
    from cli.janus import RTP_PORTS, config_files

    resources = {(r["kind"], r["metadata"]["name"]): r for r in load_documents(K8S / "extras" / "janus.yaml")}
    config = resources[("ConfigMap", "monologue-janus")]["data"]
    assert config == config_files("/etc/monologue-janus", port=8088, ip="0.0.0.0", libraries="/opt/janus")
    janus = _container(resources[("Deployment", "monologue-janus")])
    secret = next(e for e in janus["env"] if e["name"] == "MONOLOGUE_SFU__API_SECRET")
    assert secret["valueFrom"]["secretKeyRef"]["name"] == "monologue-secrets"
    monkeypatch.setenv(secret["name"], "s3cret")  # the name is the setting's
    monkeypatch.setenv("MONOLOGUE_SFU__JANUS_URL", "http://monologue-janus:8088/janus")
    sfu = Settings().sfu
    assert sfu.api_secret is not None and sfu.api_secret.get_secret_value() == "s3cret"
    assert f"--apisecret=$({secret['name']})" in janus["args"]
    (port,) = resources[("Service", "monologue-janus")]["spec"]["ports"]
    assert port["port"] == 8088 and f"port = {port['targetPort']}" in config["janus.transport.http.jcfg"]
    (rule,) = resources[("NetworkPolicy", "monologue-egress-janus")]["spec"]["egress"]
    low, high = (int(p) for p in RTP_PORTS.split("-"))
    assert {"protocol": "TCP", "port": 8088} in rule["ports"]
    assert {"protocol": "UDP", "port": low, "endPort": high} in rule["ports"]


def test_the_janus_image_runs_debians_package_as_a_user_with_only_the_two_libraries_it_needs() -> None:
    """infra/images/janus.Dockerfile: the folders it links match cli/janus.py's (what the tests load on loopback)."""
    from cli.janus import PARTS

    text = (IMAGES / "janus.Dockerfile").read_text()
    assert "apt-get install -y --no-install-recommends janus" in text and re.search(r"^USER 10002", text, re.M)
    for folder, library in PARTS.items():
        assert f"janus/{folder}/{library} /opt/janus/{folder}/" in text
