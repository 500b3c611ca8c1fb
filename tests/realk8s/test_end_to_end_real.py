"""The whole first wave on a real control plane (marked ``realk8s``): GPU pods created with no
scheduler name go through kube-apiserver's admission (our webhook), the real kube-scheduler
(our extender's filter and bind), kubelet's device manager (our emulation, calling the
``vgpu-device-plugin`` binary's Allocate over gRPC) and come out Running with the slice they
asked for; a pod no GPU can hold stays Pending with our reason in its PodScheduled condition."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from vgpu.core import annotations as hami
from vgpu.kube import informer
from vgpu.kube.port import JsonObj
from vgpu.localcluster import description
from vgpu.localcluster.kubeletadmit import ALLOCATIONS_ANNOTATION

from tests.realk8s.stack import real_stack

pytestmark = [pytest.mark.realk8s, pytest.mark.slow, pytest.mark.timeout(300)]

KEYS = hami.Keys("hami.io")
NODES = description.load(
    {
        "nodes": [
            {"name": "node-a", "gpus": [{"count": 2, "model": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960}]},
            {"name": "node-b", "gpus": [{"model": "Tesla T4", "memoryMib": 16384}]},
        ]
    }
)


def _pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]},
    }


@contextlib.asynccontextmanager
async def _watching(
    api: Any, kind: Any, **kw: Any
) -> AsyncIterator[tuple[dict[str, JsonObj], Callable[[Callable[[], bool]], Any]]]:
    """A watch of ``kind``: its objects by name, and ``until(done)`` woken by each event."""
    seen: dict[str, JsonObj] = {}
    changed = asyncio.Event()

    def on_event(change: informer.Change) -> None:
        seen[change.object["metadata"]["name"]] = change.object
        changed.set()

    async def until(done: Callable[[], bool]) -> None:
        while not done():  # the test's timeout bounds it
            changed.clear()
            await changed.wait()

    task = asyncio.create_task(informer.Informer(api, kind, on_event=on_event, **kw).run())
    try:
        yield seen, until
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _scheduled_false(pod: JsonObj) -> str | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or "")
    return None


async def test_gpu_pods_run_with_their_slice_through_real_kubernetes(
    k8s_bin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    async with real_stack(k8s_bin, tmp_path, nodes=NODES) as stack:
        api = stack.api
        async with (
            _watching(api, "nodes") as (nodes, until_nodes),
            _watching(api, "pods", namespace="default") as (pods, until_pods),
        ):
            # both nodes advertise their vGPUs (the device plugins registered with kubelet)
            await until_nodes(
                lambda: (
                    [
                        (nodes.get(n) or {}).get("status", {}).get("allocatable", {}).get("nvidia.com/gpu")
                        for n in ("node-a", "node-b")
                    ]
                    == ["20", "10"]
                )
            )
            for name, limits in (
                ("small", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}),
                ("pair", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"}),
                ("huge", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}),
            ):
                await api.create("pods", _pod(name, limits), namespace="default")

            def settled() -> bool:
                phases = [(pods.get(n) or {}).get("status", {}).get("phase") for n in ("small", "pair")]
                # the bind phase is written after Allocate answers: it may land after Running
                written = [
                    ((pods.get(n) or {}).get("metadata", {}).get("annotations") or {}).get(KEYS.bind_phase)
                    for n in ("small", "pair")
                ]
                return (
                    phases == ["Running"] * 2
                    and written == ["success"] * 2
                    and _scheduled_false(pods.get("huge") or {}) is not None
                )

            await until_pods(settled)

    for name in ("small", "pair"):
        pod = pods[name]
        assert pod["spec"]["schedulerName"] == "vgpu-scheduler"  # the webhook's
        notes = pod["metadata"]["annotations"]
        assert notes[KEYS.bind_phase] == "success"  # the device plugin's Allocate wrote it
        assigned = hami.decode_pod_devices(notes[KEYS.devices_allocated], field="allocated")
        recorded = json.loads(notes[ALLOCATIONS_ANNOTATION])["main"]  # what kubelet got from Allocate
        envs = recorded["envs"]
        uuids = [d.uuid for d in assigned[0]]
        assert envs["NVIDIA_VISIBLE_DEVICES"].split(",") == uuids
        memory = 2000 if name == "small" else 1000  # the limit written 2000 read back as 2k: 2,000 MiB
        assert [envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(len(uuids))] == [f"{memory}m"] * len(
            uuids
        )
    assert pods["pair"]["spec"]["nodeName"] == "node-a"  # the only node with two GPUs
    assert (
        len(
            {
                d.uuid
                for d in hami.decode_pod_devices(
                    pods["pair"]["metadata"]["annotations"][KEYS.devices_allocated], field="a"
                )[0]
            }
        )
        == 2
    )
    message = _scheduled_false(pods["huge"])
    assert message is not None and "nodes are available" in message
    assert "nodeName" not in pods["huge"]["spec"]
