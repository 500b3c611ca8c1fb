"""Through the whole stack: kube-scheduler emulation calls our extender over HTTP, kubelets admit
through our device plugin. Pods end Running on GPUs that never overcommit; deleting frees."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from vgpu.core import annotations
from vgpu.core.config import Config

from tests.scheduler.stack import full_stack

KEYS = annotations.KEYS
TWO_NODES = {
    "nodes": [
        {"name": "gpu-a", "gpus": [{"model": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960, "count": 2}]},
        {"name": "gpu-b", "gpus": [{"model": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960, "count": 2}]},
    ]
}


async def _until_phase(stack, names: list[str], phases: tuple[str, ...], timeout_s: float = 30.0) -> dict:
    api = stack.cluster.api
    got: dict = {}
    async with asyncio.timeout(timeout_s):
        while True:
            listed = await api.list("pods", namespace="default")
            got = {p["metadata"]["name"]: p for p in listed.items if p["metadata"]["name"] in names}
            if len(got) == len(names) and all(
                (p.get("status") or {}).get("phase") in phases for p in got.values()
            ):
                return got
            async for _ in api.watch(
                "pods", resource_version=listed.resource_version, namespace="default", timeout_s=5
            ):
                break


@pytest.mark.slow
async def test_pods_run_on_shared_gpus_and_deleting_frees() -> None:
    config = Config()
    strict = dataclasses.replace(
        config, scheduler=dataclasses.replace(config.scheduler, avoid_busy_nodes=False)
    )
    async with full_stack(TWO_NODES, config=strict) as stack:
        api = stack.cluster.api
        names = [f"p{i}" for i in range(6)]
        for name in names:
            await api.create("pods", stack.pod_body(name, mem=10000, cores=20), namespace="default")
        pods = await _until_phase(stack, names, ("Running", "Failed"))
        assert {p["status"]["phase"] for p in pods.values()} == {"Running"}, [
            p["status"] for p in pods.values()
        ]
        per_gpu: dict[str, int] = {}
        for pod in pods.values():
            ann = pod["metadata"]["annotations"]
            assert ann[KEYS.bind_phase] == "success"
            assert pod["spec"]["nodeName"] == ann[KEYS.assigned_node]
            for container in annotations.decode_pod_devices(ann[KEYS.devices_allocated]):
                for d in container:
                    per_gpu[d.uuid] = per_gpu.get(d.uuid, 0) + d.memory_mib
        assert all(v <= 40960 for v in per_gpu.values())
        # strict node binpack (busy nodes not avoided): everything fits on the first node
        assert {p["spec"]["nodeName"] for p in pods.values()} == {"gpu-a"}
        for name in names:
            await api.delete("pods", name, namespace="default")
        state = stack.service.state
        async with asyncio.timeout(10):
            while state.used("gpu-a"):
                await state.changed("gpu-a").wait()
