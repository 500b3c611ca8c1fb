"""Whether an admission request's object can be read as a Pod (docs/webhook.md, admission rule 1).

``shape_problem(pod)`` names the first field that is not shaped as a Pod's (a map of strings, a
list of containers, ...); ``size_problem(spec, config)`` refuses more containers than
``webhook.maxContainers``, which bounds the work of one review. Both return None when all is well.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpu.core.config import Config


def shape_problem(pod: Any) -> str | None:
    """Why ``pod`` cannot be read as a Pod, naming the field; None when it can."""
    if not isinstance(pod, dict):
        return "request.object: expected a Pod object"
    meta = pod.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        return "pod.metadata: expected an object"
    for key in ("labels", "annotations"):
        value = (meta or {}).get(key)
        if value is not None and not (
            isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        ):
            return f"pod.metadata.{key}: expected a map of strings"
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return "pod.spec: expected an object"
    for key in ("schedulerName", "nodeName", "runtimeClassName"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            return f"pod.spec.{key}: expected a string"
    for kind in ("initContainers", "containers"):
        containers = spec.get(kind)
        if containers is None:
            continue
        if not isinstance(containers, list):
            return f"pod.spec.{kind}: expected a list"
        for i, c in enumerate(containers):
            problem = _container_problem(c)
            if problem:
                return f"pod.spec.{kind}[{i}]{problem}"
    return None


def size_problem(spec: Mapping[str, Any], config: Config) -> str | None:
    """More containers than ``webhook.maxContainers`` (bounds the work of one review)."""
    count = sum(len(spec.get(kind) or ()) for kind in ("initContainers", "containers"))
    limit = config.webhook.max_containers
    if count > limit:
        return f"pod.spec: {count} containers (init and app), more than the limit of {limit} (webhook.maxContainers)"
    return None


def _container_problem(c: Any) -> str | None:
    if not isinstance(c, dict):
        return ": expected an object"
    if c.get("name") is not None and not isinstance(c["name"], str):
        return ".name: expected a string"
    env = c.get("env")
    if env is not None:
        if not isinstance(env, list):
            return ".env: expected a list"
        for j, item in enumerate(env):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return f".env[{j}]: expected an object with a string name"
    for key in ("resources", "securityContext"):
        if c.get(key) is not None and not isinstance(c[key], dict):
            return f".{key}: expected an object"
    resources = c.get("resources") or {}
    for key in ("limits", "requests"):
        if resources.get(key) is not None and not isinstance(resources[key], dict):
            return f".resources.{key}: expected an object"
    return None
