"""The deployment files in infra/: every Kubernetes manifest, each overlay rendered (tests/kustomize.py), passes
kubernetes-validate's strict schemas for a current Kubernetes; what the manifests promise holds (probes on the
ports the processes serve, a grace period longer than a node's drain, GPUs requested, torchrun on the GPU node,
every image pinned to a registry, the node autoscaler scaling the node Deployment on metrics Monologue exports); the
Dockerfiles copy only files that exist and install only from their lock; the image locks carry hashes and the
versions CI tested. kubernetes-validate knows no custom resources: a KEDA ScaledObject is validated against KEDA's
own CRD schema (tests/schemas/keda-scaledobject.json), as strictly."""

from __future__ import annotations

import json
import re
from functools import cache
from importlib.resources import files as package_files
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from monologue import contracts as c
from monologue.metrics import NODE, LeaseBacklogCollector
from monologue.settings import Settings
from node.worker import SHUTDOWN_MARGIN_S
from tests.kustomize import KustomizeError, load_documents, merge, render

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "infra" / "k8s"
IMAGES = ROOT / "infra" / "images"
KUBERNETES = "1.37.0"
OVERLAYS = sorted(path.parent.name for path in (K8S / "overlays").glob("*/kustomization.yaml"))
DOCKERFILES = [IMAGES / f"{extra}.Dockerfile" for extra in ("api", "gpu", "node")]  # Monologue's own (Python) images
KEDA_SCHEMA = ROOT / "tests" / "schemas" / "keda-scaledobject.json"
SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")
# Strategic-merge patches: partial resources by design, validated once merged (in the rendered overlays).
PARTIAL_PATCHES = {"gpu-node.yaml", "gpu-node-scaling.yaml"}


def _overlay(name: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(resource["kind"], resource["metadata"]["name"]): resource for resource in render(K8S / "overlays" / name)}


def _container(resource: dict[str, Any]) -> dict[str, Any]:
    [container] = resource["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


@cache
def _scaled_object_validator() -> jsonschema.Draft202012Validator:
    """KEDA's CRD schema made as strict as the API server's strict field validation (`kubectl apply
    --validate=strict`), which rejects any field a structural schema does not declare: JSON Schema allows unknown
    fields unless told, so every object that lists its properties is closed here; `metadata` is Kubernetes'
    ObjectMeta from kubernetes-validate's own strict schemas. (The CRD's one CEL rule, min <= max replicas, is
    checked by test_the_node_scaledobject_targets_the_node_deployment_and_matches_its_slots.)"""
    schema = _closed(json.loads(KEDA_SCHEMA.read_text()))
    folder = package_files("kubernetes_validate") / "kubernetes-json-schema" / f"v{KUBERNETES}-local-strict"
    meta, definitions = (
        json.loads((folder / name).read_text()) for name in ("objectmeta-meta-v1.json", "_definitions.json")
    )
    schema["properties"]["metadata"] = {"$ref": meta["$id"]}
    registry: Registry[Any] = Registry().with_resources(
        (document["$id"], Resource.from_contents(document)) for document in (meta, definitions)
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    closed = dict(schema)
    if "properties" in schema:
        closed["properties"] = {name: _closed(field) for name, field in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            closed["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            closed[key] = _closed(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            closed[key] = [_closed(option) for option in schema[key]]
    return closed


def _validate(resource: dict[str, Any]) -> None:
    """Raises naming the field: a ScaledObject against KEDA's CRD schema, anything else kubernetes-validate's."""
    if (resource["apiVersion"], resource["kind"]) == SCALED_OBJECT:
        _scaled_object_validator().validate(resource)
    else:
        kubernetes_validate.validate(resource, KUBERNETES, strict=True)


def test_overlays_exist() -> None:
    assert OVERLAYS == ["cpu", "gpu"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_manifest_passes_kubernetes_validate(overlay: str) -> None:
    resources = render(K8S / "overlays" / overlay)
    kinds = {resource["kind"] for resource in resources}
    assert {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "Job",
        "ConfigMap",
        "Namespace",
        "ScaledObject",
    } <= kinds
    for resource in resources:
        _validate(resource)  # raises, naming the field


def test_every_manifest_file_passes_kubernetes_validate_on_its_own() -> None:
    """The patch files are partial by design; every other YAML under infra/k8s is a whole resource."""
    files = [p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml" and p.name not in PARTIAL_PATCHES]
    assert len(files) >= 8
    validated = [resource for path in files for resource in load_documents(path)]
    for resource in validated:
        _validate(resource)
    assert SCALED_OBJECT in {(resource["apiVersion"], resource["kind"]) for resource in validated}


def test_the_validator_rejects_a_broken_manifest() -> None:
    """Guards the tests above from passing vacuously."""
    deployment = _overlay("cpu")[("Deployment", "monologue-api")]
    broken = merge(deployment, {"spec": {"replicas": "two"}})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)
    typo = merge(deployment, {"spec": {"template": {"spec": {"terminationGracePeriod": 30}}}})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBERNETES, strict=True)


@pytest.mark.parametrize(
    "patch",
    [
        {"spec": {"minReplicas": 2}},  # a typo'd field (an HPA's name for it)
        {"spec": {"advanced": {"horizontalPodAutoscalerConfig": {"behaviour": {}}}}},  # a typo, deep down
        {"spec": {"maxReplicaCount": "twenty"}},  # a wrong type
        {"spec": {"pollingInterval": 0}},  # out of range
        {"spec": {"triggers": [{"type": "prometheus", "metadata": {"threshold": 2}}]}},  # metadata values are strings
        {"spec": {"triggers": []}},  # no trigger
        {"metadata": {"lables": {"a": "b"}}},  # ObjectMeta is checked too
    ],
    ids=["typo", "deep-typo", "type", "range", "metadata-type", "no-trigger", "objectmeta"],
)
def test_the_crd_validator_rejects_a_broken_scaledobject(patch: dict[str, Any]) -> None:
    """Guards the ScaledObject's validation from passing vacuously: each break alone is refused."""
    scaled = _overlay("cpu")[("ScaledObject", "monologue-node")]
    _validate(scaled)
    with pytest.raises(jsonschema.ValidationError):
        _validate(merge(scaled, patch))


def test_the_renderer_refuses_what_it_cannot_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\ncommonLabels: {a: b}\n")
    with pytest.raises(KustomizeError, match="commonLabels"):
        render(tmp_path)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_settings_in_the_manifests_are_settings_monologue_reads(overlay: str) -> None:
    """Every MONOLOGUE_* the config map and the containers set is a real setting (a typo would be ignored)."""
    resources = _overlay(overlay)
    env = dict(resources[("ConfigMap", "monologue-config")]["data"])
    for kind, name in (("Deployment", "monologue-api"), ("Deployment", "monologue-node")):
        env |= _env(_container(resources[(kind, name)]))
    env = {
        name: value for name, value in env.items() if name.startswith("MONOLOGUE_") and name != "MONOLOGUE_DIT_WEIGHTS"
    }
    tls_files = {
        name
        for name in env
        if name.startswith("MONOLOGUE_TEMPORAL__TLS__") and name != "MONOLOGUE_TEMPORAL__TLS__SERVER_NAME"
    }
    settings = Settings.model_validate(_nested({k: v for k, v in env.items() if k not in tls_files}))
    assert settings.temporal.namespace == "monologue" and settings.storage.backend == "s3"


def _nested(env: dict[str, str]) -> dict[str, Any]:
    """MONOLOGUE_A__B=v → {"a": {"b": "v"}}, as pydantic-settings reads the environment."""
    tree: dict[str, Any] = {}
    for name, value in env.items():
        *groups, field = name.removeprefix("MONOLOGUE_").lower().split("__")
        node = tree
        for group in groups:
            node = node.setdefault(group, {})
        node[field] = value
    return tree


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_node_drains_within_its_grace_period_and_is_probed_on_its_port(overlay: str) -> None:
    node = _overlay(overlay)[("Deployment", "monologue-node")]
    container, env = _container(node), _env(_container(node))
    grace = node["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(env["MONOLOGUE_NODE__GRACEFUL_SHUTDOWN_S"]) + SHUTDOWN_MARGIN_S
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {
        "metrics": int(env["MONOLOGUE_NODE__HTTP_PORT"]),
        "sdk-metrics": int(env["MONOLOGUE_NODE__TEMPORAL_METRICS_PORT"]),
        "media": int(env["MONOLOGUE_NODE__MEDIA_PORT"]),
    }
    # The API reaches the WebRTC signalling port at the pod's own address, on the port the node listens on.
    assert env["MONOLOGUE_NODE__MEDIA_URL"] == f"http://$(POD_IP):{env['MONOLOGUE_NODE__MEDIA_PORT']}"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert env["MONOLOGUE_NODE__HTTP_HOST"] == "0.0.0.0"


def test_the_gpu_node_runs_torchrun_with_its_gpus_as_a_guaranteed_pod() -> None:
    node = _overlay("gpu")[("Deployment", "monologue-node")]
    container = _container(node)
    assert container["args"][:3] == ["torchrun", "--nproc-per-node", "gpu"]
    assert container["args"][-2:] == ["-m", "node.launch"]
    resources = container["resources"]
    assert resources["requests"] == resources["limits"] and int(resources["limits"]["nvidia.com/gpu"]) >= 1
    assert _env(container)["MONOLOGUE_NODE__REQUIRE_GPU"] == "true"
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in node["spec"]["template"]["spec"]["volumes"])
    assert container["image"].startswith("registry.example.com/monologue/gpu:")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_is_served_probed_and_autoscaled(overlay: str) -> None:
    resources = _overlay(overlay)
    api = _container(resources[("Deployment", "monologue-api")])
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert resources[("Service", "monologue-api")]["spec"]["ports"][0]["targetPort"] == "http"
    hpa = resources[("HorizontalPodAutoscaler", "monologue-api")]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "monologue-api" and hpa["minReplicas"] >= 2
    assert "cpu" in api["resources"]["requests"]  # utilisation targets need a request
    job = resources[("Job", "monologue-migrate")]["spec"]["template"]["spec"]["containers"][0]
    assert "monologue migrate" in job["command"][-1] and "monologue temporal setup" in job["command"][-1]
    for resource in resources.values():
        pod = resource.get("spec", {}).get("template", {}).get("spec")
        if pod:
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert all("registry.example.com/" in container["image"] for container in pod["containers"])
            assert resource["metadata"]["namespace"] == "monologue"


def _scaler(resources: dict[tuple[str, str], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """The node ScaledObject's spec and its one trigger's metadata (a Prometheus query)."""
    spec = resources[("ScaledObject", "monologue-node")]["spec"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger.get("metricType", "AverageValue") == "AverageValue"
    return spec, trigger["metadata"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_node_scaledobject_targets_the_node_deployment_and_matches_its_slots(overlay: str) -> None:
    """It scales the real node Deployment, one node per node-full of slots wanted, and removes nodes one drain at a
    time: at most one pod per period, a period no shorter than a node's grace period."""
    resources = _overlay(overlay)
    spec, metadata = _scaler(resources)
    target = spec["scaleTargetRef"]
    node = resources[(target["kind"], target["name"])]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", "monologue-node")
    assert node["apiVersion"] == "apps/v1"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]  # the CRD's CEL rule, which JSON Schema lacks
    assert float(metadata["threshold"]) == int(_env(_container(node))["MONOLOGUE_NODE__CAPACITY"])
    assert metadata["ignoreNullValues"] == "false" and spec["fallback"]["behavior"] == "currentReplicas"
    scale_down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    grace = node["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert scale_down["policies"] and scale_down.get("selectPolicy") == "Min"
    for policy in scale_down["policies"]:
        assert policy["type"] == "Pods" and policy["value"] == 1 and policy["periodSeconds"] >= grace


def test_every_overlay_scales_on_the_same_query() -> None:
    """A patch repeats the trigger (lists are replaced whole): it must not drift from the base's."""
    queries = {overlay: _scaler(_overlay(overlay))[1]["query"] for overlay in OVERLAYS}
    assert len(set(queries.values())) == 1, queries


def test_the_scaler_queries_metrics_monologue_exports() -> None:
    """The backlog comes from the API's /metrics (LeaseBacklogCollector), the slots held from the nodes'; the class
    left out is a real QueueClass."""
    _, metadata = _scaler(_overlay("cpu"))
    queried = set(re.findall(r"\bmonologue_\w+", metadata["query"]))
    api = {family.name for family in LeaseBacklogCollector(dict).describe()}
    node = {family.name for family in NODE.collect()}
    assert queried <= api | node and queried & api and queried & node, queried
    for value in re.findall(r'class!?=~?"(\w+)"', metadata["query"]):
        assert c.QueueClass(value)


def test_the_scaler_asks_the_prometheus_that_scrapes_the_api_and_the_nodes() -> None:
    """The scrape config the manifests ship keeps the ports that serve both figures, at least as often as KEDA asks;
    the server address is an in-cluster Prometheus."""
    resources = _overlay("cpu")
    spec, metadata = _scaler(resources)
    address = urlsplit(metadata["serverAddress"])
    assert address.scheme in ("http", "https") and address.port and address.hostname
    assert address.hostname.endswith((".svc", ".svc.cluster.local"))
    scrape = yaml.safe_load(resources[("ConfigMap", "monologue-prometheus-scrape")]["data"]["monologue.yml"])
    [job] = scrape["scrape_configs"]
    [ports] = [
        rule["regex"]
        for rule in job["relabel_configs"]
        if rule["source_labels"] == ["__meta_kubernetes_pod_container_port_name"] and rule.get("action") == "keep"
    ]
    api_port = _container(resources[("Deployment", "monologue-api")])["ports"][0]["name"]  # /metrics is on it
    assert re.fullmatch(ports, api_port) and re.fullmatch(ports, "metrics")  # the node's (checked above)
    assert int(job["scrape_interval"].removesuffix("s")) <= spec["pollingInterval"]


def _copied(dockerfile: Path) -> list[str]:
    sources: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] in (["COPY"], ["ADD"]) and not any(word.startswith("--from=") for word in words):
            sources += [word for word in words[1:-1] if not word.startswith("--")]
    return sources


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[path.name for path in DOCKERFILES])
def test_dockerfiles_copy_only_files_that_exist_and_run_as_a_user_with_a_health_check(dockerfile: Path) -> None:
    sources = _copied(dockerfile)
    assert sources and all((ROOT / source).exists() for source in sources), [
        s for s in sources if not (ROOT / s).exists()
    ]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not any(source.split("/")[0] in ignored for source in sources)
    text = dockerfile.read_text()
    assert re.search(r"^USER 10001", text, re.M) and re.search(r"^HEALTHCHECK ", text, re.M)
    lock = f"infra/images/requirements-{dockerfile.name.split('.')[0]}.txt"
    assert lock in sources and "--require-hashes" in text


def test_the_image_locks_pin_what_ci_tested_with_hashes() -> None:
    ci = dict(line.split("==") for line in (ROOT / "infra/constraints.txt").read_text().splitlines() if "==" in line)
    ci = {name.lower().replace("_", "-"): version for name, version in ci.items()}
    for extra in ("api", "node", "gpu"):
        text = (IMAGES / f"requirements-{extra}.txt").read_text()
        pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==([^ \\\n]+)", text, re.M))
        assert text.count("--hash=sha256:") >= len(pins) > 20
        for name, version in pins.items():
            key = name.lower().replace("_", "-")
            assert key not in ci or ci[key] == version, f"{extra}: {name} {version} but CI tested {ci[key]}"
        packages = {name.lower() for name in pins}
        if extra == "api":
            assert not packages & {"torch", "av", "opencv-python-headless", "pillow"}
        assert ("torch" in packages) == (extra == "gpu")  # the CPU node's torch comes from PyTorch's CPU index
        assert {"prometheus-client", "temporalio", "opentelemetry-sdk"} <= packages
