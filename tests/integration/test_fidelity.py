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
        await _condition(lambda: state.quota_limits("team") != (None, None))
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
