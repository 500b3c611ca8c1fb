"""Builders of the DRA objects the views read: our ResourceSlices (as the slices helper publishes
them, per docs/dra.md's contract) and ResourceClaims allocated by kube-scheduler, in the
``resource.k8s.io/v1`` JSON the API server serves."""

from __future__ import annotations

import uuid
from typing import Any

from vgpu.core.dra import names


def gpu_device(
    index: int,
    uuid: str,
    *,
    memory_mib: int = 40960,
    model: str = "NVIDIA A100-SXM4-40GB",
    unhealthy: bool = False,
    memory_default: str | None = "whole",
    cores_default: str | None = "0",
    shared: bool = True,
) -> dict[str, Any]:
    """One GPU as our slice publishes it: memory default the whole card, cores default 0."""
    memory: dict[str, Any] = {"value": f"{memory_mib}Mi"}
    if memory_default is not None:
        default = f"{memory_mib}Mi" if memory_default == "whole" else memory_default
        memory["requestPolicy"] = {"default": default, "validRange": {"min": "1Mi", "step": "1Mi"}}
    cores: dict[str, Any] = {"value": "100"}
    if cores_default is not None:
        cores["requestPolicy"] = {
            "default": cores_default,
            "validRange": {"min": "0", "max": "100", "step": "1"},
        }
    dev: dict[str, Any] = {
        "name": names.device_name(index),
        "attributes": {
            names.ATTR_UUID: {"string": uuid},
            names.ATTR_MODEL: {"string": model},
            names.ATTR_INDEX: {"int": index},
            names.ATTR_MEMORY_MIB: {"int": memory_mib},
            names.ATTR_NUMA: {"int": 0},
        },
        "capacity": {names.CAPACITY_MEMORY: memory, names.CAPACITY_CORES: cores},
    }
    if shared:
        dev["allowMultipleAllocations"] = True
    if unhealthy:
        dev["taints"] = [{"key": names.UNHEALTHY_TAINT_KEY, "effect": "NoSchedule"}]
    return dev


def resource_slice(
    node: str, *devices: dict[str, Any], generation: int = 1, driver: str = names.DRIVER, name: str = ""
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


def result(
    node: str,
    index: int,
    *,
    memory: str | None = None,
    cores: str | None = None,
    request: str = "gpu",
    driver: str = names.DRIVER,
) -> dict[str, Any]:
    """One allocation result; ``memory``/``cores`` None leave that capacity out of consumedCapacity."""
    out: dict[str, Any] = {
        "request": request,
        "driver": driver,
        "pool": node,
        "device": names.device_name(index),
        # a UUID, as the API server requires (kube-scheduler writes a random one)
        "shareID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{node}/{index}/{request}/{memory}/{cores}")),
    }
    consumed = {
        k: v for k, v in ((names.CAPACITY_MEMORY, memory), (names.CAPACITY_CORES, cores)) if v is not None
    }
    if consumed:
        out["consumedCapacity"] = consumed
    return out


def claim(
    namespace: str,
    name: str,
    *results: dict[str, Any],
    reserved: tuple[str, ...] = (),
    owner: str | None = None,
    uid: str = "",
) -> dict[str, Any]:
    """A claim allocated with ``results``, reserved for the pods ``reserved``, owned by pod ``owner``."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}"}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": f"pod-{owner}", "controller": True}
        ]
    status: dict[str, Any] = {}
    if results:
        status["allocation"] = {"devices": {"results": list(results)}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"pod-{p}"} for p in reserved]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": names.DEVICE_CLASS}}]}
        },
        "status": status,
    }
