"""Render a kustomize overlay the way `kubectl kustomize` does, for the subset infra/k8s uses: `resources` (files
and folders with a kustomization.yaml), `namespace`, `images` and strategic-merge `patches` (by path). kustomize
itself is no PyPI package, so where kubectl is not installed the tests render with this (`rendered` uses kubectl
where it is, and tests/test_deployment_processes.py checks the two agree there); any other kustomization key is
refused, so the manifests cannot drift into features this does not render."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

KNOWN_KEYS = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
# Strategic merge: the lists Kubernetes merges by a key (its patchMergeKey); any other list is replaced.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass", "PriorityClass"}


class KustomizeError(ValueError):
    """A kustomization this renderer (and so the tests) cannot stand behind."""


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def render(folder: Path) -> list[dict[str, Any]]:
    """Every resource the kustomization in `folder` produces, in order."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN_KEYS
    if unknown:
        raise KustomizeError(f"{folder}/kustomization.yaml uses {sorted(unknown)}: not rendered by tests/kustomize.py")
    resources: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        target = (folder / entry).resolve()
        if not target.exists():
            raise KustomizeError(f"{folder}/kustomization.yaml: resource {entry} does not exist")
        resources += render(target) if target.is_dir() else load_documents(target)
    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise KustomizeError(f"{folder}: only `patches: - path: FILE` is rendered, not {sorted(patch_entry)}")
        for patch in load_documents(folder / patch_entry["path"]):
            _apply_patch(resources, patch, folder / patch_entry["path"])
    if "namespace" in kustomization:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource.setdefault("metadata", {})["namespace"] = kustomization["namespace"]
    for image in kustomization.get("images", []):
        _set_image(resources, image)
    return resources


def rendered(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The overlay's resources by (kind, name), rendered by `kubectl kustomize` where kubectl is installed, else by
    `render`."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        documents = render(folder)
    else:
        done = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, check=True)
        documents = [document for document in yaml.safe_load_all(done.stdout) if document]
    return {(document["kind"], document["metadata"]["name"]): document for document in documents}


def _identity(resource: dict[str, Any]) -> tuple[str, str, str]:
    return resource["apiVersion"], resource["kind"], resource["metadata"]["name"]


def _apply_patch(resources: list[dict[str, Any]], patch: dict[str, Any], path: Path) -> None:
    matches = [i for i, resource in enumerate(resources) if _identity(resource) == _identity(patch)]
    if len(matches) != 1:
        raise KustomizeError(f"{path}: patch for {_identity(patch)} matches {len(matches)} resources")
    resources[matches[0]] = merge(resources[matches[0]], patch)


def merge(base: Any, patch: Any, field: str | None = None) -> Any:
    """Strategic merge of `patch` into `base` (maps merge, keyed lists merge by key, other values replace)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            merged[key] = merge(merged[key], value, key) if key in merged else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        merged_list = copy.deepcopy(base)
        for item in patch:
            position = next((i for i, old in enumerate(merged_list) if old.get(key) == item.get(key)), None)
            if position is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[position] = merge(merged_list[position], item)
        return merged_list
    return copy.deepcopy(patch)


def _set_image(resources: list[dict[str, Any]], image: dict[str, str]) -> None:
    for resource in resources:
        spec = resource.get("spec", {})
        pod = spec.get("template", {}).get("spec") or spec.get("jobTemplate", {}).get("spec", {}).get(
            "template", {}
        ).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            if container["image"].split(":")[0] == image["name"]:
                tag = image.get("newTag") or [*container["image"].split(":"), "latest"][1]
                container["image"] = f"{image.get('newName', image['name'])}:{tag}"
