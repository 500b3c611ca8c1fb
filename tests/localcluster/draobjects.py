"""Builders of DRA objects as kube-vgpu's DRA mode writes them (DRA-DESIGN.md's shapes), for the
allocator, the local cluster and the differential tests against the real 1.36."""

from __future__ import annotations

from typing import Any

from vgpu.core.dra import names

JsonObj = dict[str, Any]
API = "resource.k8s.io/v1"


def device_class(name: str = names.DEVICE_CLASS, *, expression: str | None = None) -> JsonObj:
    expr = expression or f'device.driver == "{names.DRIVER}"'
    return {
        "apiVersion": API,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


def gpu(
    index: int, *, memory_mib: int = 16384, taints: list[JsonObj] | None = None, model: str = "A100"
) -> JsonObj:
    device: JsonObj = {
        "name": names.device_name(index),
        "allowMultipleAllocations": True,
        "attributes": {
            names.ATTR_INDEX: {"int": index},
            names.ATTR_UUID: {"string": f"GPU-{index:08d}"},
            names.ATTR_MODEL: {"string": model},
            names.ATTR_MEMORY_MIB: {"int": memory_mib},
        },
        "capacity": {
            names.CAPACITY_MEMORY: {
                "value": f"{memory_mib}Mi",
                "requestPolicy": {"default": f"{memory_mib}Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
            },
            names.CAPACITY_CORES: {
                "value": "100",
                "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
            },
        },
    }
    if taints:
        device["taints"] = taints
    return device


def resource_slice(node: str, devices: list[JsonObj], *, generation: int = 1) -> JsonObj:
    return {
        "apiVersion": API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{names.DRIVER}"},
        "spec": {
            "driver": names.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def gpu_request(
    *, count: int = 1, memory_mib: int | None = None, cores: int | None = None, name: str = "gpu"
) -> JsonObj:
    exactly: JsonObj = {"deviceClassName": names.DEVICE_CLASS, "allocationMode": "ExactCount", "count": count}
    requests: JsonObj = {}
    if memory_mib is not None:
        requests[names.CAPACITY_MEMORY] = f"{memory_mib}Mi"
    if cores is not None:
        requests[names.CAPACITY_CORES] = str(cores)
    if requests:
        exactly["capacity"] = {"requests": requests}
    return {"name": name, "exactly": exactly}


def claim_spec(*requests: JsonObj) -> JsonObj:
    return {"devices": {"requests": list(requests)}}


def claim(name: str, *requests: JsonObj, namespace: str = "default") -> JsonObj:
    return {
        "apiVersion": API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": claim_spec(*requests),
    }


def template(name: str, *requests: JsonObj, namespace: str = "default") -> JsonObj:
    return {
        "apiVersion": API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": {names.TEMPLATE_LABEL: "true"}},
        "spec": {"spec": claim_spec(*requests)},
    }


def dra_pod(name: str, template_name: str, *, containers: int = 1, namespace: str = "default") -> JsonObj:
    """A pod whose containers each use their own claim from ``template_name`` (the webhook's shape)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {names.MODE_ANNOTATION: names.MODE_DRA},
        },
        "spec": {
            "resourceClaims": [
                {"name": names.claim_name(i), "resourceClaimTemplateName": template_name}
                for i in range(containers)
            ],
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "busybox",
                    "resources": {"claims": [{"name": names.claim_name(i)}]},
                }
                for i in range(containers)
            ],
        },
    }
