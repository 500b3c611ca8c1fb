"""Issue 13 through the whole local stack (API server, kube-scheduler emulation calling our extender
over HTTP, our scheduler service, device plugins on fake GPUs, kubelets)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.scheduler.stack import Stack, full_stack

pytestmark = pytest.mark.slow

ONE_NODE = {
    "nodes": [{"name": "gpu-a", "gpus": [{"model": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960, "count": 2}]}]
}


async def _until(stack: Stack, ns: str, name: str, done: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    """The pod once ``done(pod)`` holds, waiting on the pods watch (bounded)."""
    api = stack.cluster.api
    async with asyncio.timeout(timeout_s):
        while True:
            listed = await api.list("pods", namespace=ns)
            got = next((p for p in listed.items if p["metadata"]["name"] == name), None)
            if got is not None and done(got):
                return got
            async for _ in api.watch(
                "pods", resource_version=listed.resource_version, namespace=ns, timeout_s=5
            ):
                break


async def _condition(holds: Any, timeout_s: float = 10.0) -> None:
    """Yield to the loop until ``holds()`` (the scheduler's watches deliver on this loop); bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not holds():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


def _unschedulable_message(pod: dict[str, Any]) -> str:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message", ""))
    return ""


async def test_over_quota_pod_stays_pending_with_the_quota_reason() -> None:
    """The pods are created straight through the API (no webhook in this stack: as if it was down
    or the quota was lowered later); the filter alone keeps the namespace within its quota."""
    async with full_stack(ONE_NODE) as stack:
        api = stack.cluster.api
        await api.create("namespaces", {"metadata": {"name": "team"}})
        await api.create(
            "resourcequotas",
            {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "15000"}}},
            namespace="team",
        )
        state = stack.service.state
        await _condition(lambda: state.quota.quota_limits("team") != (None, None))
        await api.create("pods", stack.pod_body("first", mem=10000), namespace="team")
        first = await _until(stack, "team", "first", lambda p: _phase(p) == "Running")
        assert first["spec"]["nodeName"] == "gpu-a"
        await api.create("pods", stack.pod_body("second", mem=8000), namespace="team")
        want = "namespace team: GPU memory quota exceeded (used 10000 of 15000, requested 8000)"
        second = await _until(stack, "team", "second", lambda p: want in _unschedulable_message(p))
        assert _phase(second) == "Pending" and not second["spec"].get("nodeName")
        # another namespace is not held back, and freeing the quota lets the pod in
        await api.create("pods", stack.pod_body("elsewhere", mem=8000), namespace="default")
        await _until(stack, "default", "elsewhere", lambda p: _phase(p) == "Running")
        await api.delete("pods", "first", namespace="team")
        await _until(stack, "team", "second", lambda p: _phase(p) == "Running")


TWO_GPUS_ONE_BUSY = {
    "nodes": [
        {
            "name": "gpu-a",
            "gpus": [
                # GPU 0 looks free to kube-vgpu, but a process started by hand holds 10000 MiB of it
                {
                    "model": "NVIDIA T4",
                    "memoryMib": 16000,
                    "uuid": "GPU-busy",
                    "processes": [{"pid": 4242, "usedMib": 10000}],
                },
                {"model": "NVIDIA T4", "memoryMib": 16000, "uuid": "GPU-idle"},
            ],
        }
    ]
}


async def test_outside_usage_keeps_a_pod_off_a_gpu_that_looks_free() -> None:
    async with full_stack(TWO_GPUS_ONE_BUSY) as stack:
        api = stack.cluster.api
        state = stack.service.state
        # the device plugin measured it and the scheduler read it from the node annotation
        await _condition(lambda: state.inventory.outside("gpu-a") == {"GPU-busy": 10000, "GPU-idle": 0})
        node = await api.get("nodes", "gpu-a")
        assert node["metadata"]["annotations"]["hami.io/node-nvidia-outside-usage"] == (
            '{"GPU-busy":10000,"GPU-idle":0}'
        )
        # GPU spread would take GPU 0 (index order on a tie); with 10000 MiB used there it takes GPU 1
        await api.create("pods", stack.pod_body("first", mem=8000), namespace="default")
        first = await _until(stack, "default", "first", lambda p: _phase(p) == "Running")
        assert first["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"].startswith("GPU-idle,")
        await api.create("pods", stack.pod_body("second", mem=8000), namespace="default")
        second = await _until(stack, "default", "second", lambda p: _phase(p) == "Running")
        assert second["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"].startswith("GPU-idle,")
        want = "no GPU with 8000 MiB free: best has 6000 (10000 used outside kube-vgpu)"
        await api.create("pods", stack.pod_body("third", mem=8000), namespace="default")
        third = await _until(stack, "default", "third", lambda p: want in _unschedulable_message(p))
        assert _phase(third) == "Pending"
