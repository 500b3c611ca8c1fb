"""Through the whole stack: a pod with a GPU init container and a GPU app container. kubelet's
device manager gives the app container the init container's device first (the local kubelet's
``devicesToAllocate`` does as kubelet's), and our device plugin refuses IDs on another GPU than the
scheduler's, so the scheduler must put both on one GPU (``vgpu.core.reuse``)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from vgpu.core import annotations
from vgpu.core.config import Config, Policy

from tests.scheduler.stack import Stack, full_stack

KEYS = annotations.KEYS
ONE_NODE = {
    "nodes": [{"name": "gpu-a", "gpus": [{"model": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960, "count": 2}]}]
}


def _limits(mem: int, cores: int) -> dict[str, Any]:
    return {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)}
    }


def _job(stack: Stack) -> dict[str, Any]:
    body = stack.pod_body("job", mem=8000, cores=50)
    body["spec"]["initContainers"] = [{"name": "setup", "image": "cuda", "resources": _limits(8000, 0)}]
    return body


async def _until_settled(stack: Stack, name: str, timeout_s: float = 30.0) -> dict[str, Any]:
    api = stack.cluster.api
    async with asyncio.timeout(timeout_s):
        while True:
            listed = await api.list("pods", namespace="default")
            for pod in listed.items:
                if pod["metadata"]["name"] == name and (pod.get("status") or {}).get("phase") in (
                    "Running",
                    "Failed",
                ):
                    return pod
            async for _ in api.watch(
                "pods", resource_version=listed.resource_version, namespace="default", timeout_s=5
            ):
                break


def _gpus(pod: dict[str, Any]) -> list[list[str]]:
    raw = pod["metadata"]["annotations"][KEYS.devices_allocated]
    return [[d.uuid for d in container] for container in annotations.decode_pod_devices(raw)]


async def test_an_init_container_and_an_app_container_the_gpu_policy_would_split_run_on_one_gpu() -> None:
    """A pod of another kind holds 30,000 MiB and 60 % of one GPU. By the binpack GPU policy alone,
    the init container (8,000 MiB) would go on that busier GPU and the app container (8,000 MiB,
    50 %), whose cores do not fit there, on the other: kubelet would then hand the app the init
    container's device on the busy GPU and the plugin would refuse the Allocate. Placed on the idle
    GPU both, the pod runs."""
    config = Config()
    binpack = dataclasses.replace(
        config, scheduler=dataclasses.replace(config.scheduler, gpu_policy=Policy.BINPACK)
    )
    async with full_stack(ONE_NODE, config=binpack) as stack:
        api = stack.cluster.api
        await api.create("pods", stack.pod_body("busy", mem=30000, cores=60), namespace="default")
        busy = await _until_settled(stack, "busy")
        assert busy["status"]["phase"] == "Running", busy["status"]
        ((busy_gpu,),) = _gpus(busy)
        await api.create("pods", _job(stack), namespace="default")
        job = await _until_settled(stack, "job")
        assert job["status"]["phase"] == "Running", job["status"]
        assert job["metadata"]["annotations"][KEYS.bind_phase] == "success"
        (init_gpu,), (app_gpu,) = _gpus(job)
        assert init_gpu == app_gpu != busy_gpu
