"""Builders for the DRA simulation tests: our ResourceSlices as the device plugin publishes them
(``vgpu.core.dra.slices``), and pods as the webhook's DRA mode admits them (``admission.decide``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from vgpu.core import admission, config, jsonpatch
from vgpu.core.config import AdmissionMode
from vgpu.core.device import Gpu, GpuUuid, NodeInventory, NodeName
from vgpu.core.dra import names, slices

CFG = config.load(None)
DRA_CFG = dataclasses.replace(CFG, webhook=dataclasses.replace(CFG.webhook, default_mode=AdmissionMode.DRA))


def node_slice(node: str, *memory_mib: int, split: int = 10, healthy: bool = True) -> dict[str, Any]:
    """``node``'s ResourceSlice with one GPU per entry of ``memory_mib`` (UUID ``GPU-<node>-<i>``)."""
    gpus = tuple(
        Gpu(
            uuid=GpuUuid(f"GPU-{node}-{i}"),
            index=i,
            count=split,
            memory_mib=mib,
            cores=100,
            type="NVIDIA-Tesla T4",
            numa=0,
            health=healthy,
        )
        for i, mib in enumerate(memory_mib)
    )
    return slices.build(NodeInventory(NodeName(node), gpus), driver_version=None).body


def held_claim(
    node: str, index: int, *, namespace: str, pod: str, memory_mib: int, cores: int
) -> dict[str, Any]:
    """A claim kube-scheduler allocated (a share of ``gpu-<index>`` of ``node``), reserved for ``pod``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{pod}-vgpu-0", "namespace": namespace, "uid": f"uid-{pod}"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": names.DEVICE_CLASS,
                            "capacity": {"requests": {"memory": f"{memory_mib}Mi", "cores": str(cores)}},
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": names.DRIVER,
                            "pool": node,
                            "device": names.device_name(index),
                            "shareID": "00000000-0000-0000-0000-0000000000aa",
                            "consumedCapacity": {
                                "memory": f"{memory_mib}Mi",
                                "cores": str(cores),
                                "slots": "1",
                            },
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"pod-{pod}"}],
        },
    }


def gpu_pod(
    name: str,
    *,
    memory: int | None = None,
    percent: int | None = None,
    cores: int | None = None,
    gpus: int = 1,
    namespace: str = "team",
    mode: str | None = "dra",
) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": gpus}
    if memory is not None:
        limits["nvidia.com/gpumem"] = memory
    if percent is not None:
        limits["nvidia.com/gpumem-percentage"] = percent
    if cores is not None:
        limits["nvidia.com/gpucores"] = cores
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if mode is not None:
        meta["annotations"] = {names.MODE_ANNOTATION: mode}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def admitted(
    pod: dict[str, Any], *, sizes: tuple[int, ...]
) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
    """``pod`` as the webhook's DRA mode admits it, and the templates its claims name."""
    decision = admission.decide(
        pod,
        namespace=pod["metadata"]["namespace"],
        config=DRA_CFG,
        facts=admission.Facts(dra_memory_sizes_mib=sizes),
    )
    assert decision.allowed, decision.message
    return jsonpatch.apply(pod, decision.patch), decision.templates
