"""Before its state has synced the scheduler refuses ``/filter`` and ``/bind`` (an empty or
half-listed pod cache shows full GPUs as free), and asks kube-scheduler to retry the refused pods
once it has (routes.py, retries.py "After a start")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import annotations
from vgpu.kube.port import Kind, ObjectList
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_scheduler import retries, routes

from tests.scheduler.scenario import Cluster, gpu_container, gpus

KEYS = annotations.KEYS


class PodsListWaits(LocalKubeApi):
    """Holds the pods LIST until ``answer`` is set: a large cluster's pods still being listed."""

    def __init__(self, store: Store, **kw: Any) -> None:
        super().__init__(store, **kw)
        self.answer = asyncio.Event()

    async def list(self, kind: Kind, **kw: Any) -> ObjectList:
        if kind == "pods":
            await self.answer.wait()
        return await super().list(kind, **kw)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    c.api = PodsListWaits(c.store, clock=c.clock.wall)
    c.add_node("node-a")  # two GPUs of 16000 MiB, both taken whole by a running pod
    for i, gpu in enumerate(gpus("node-a")):
        c.store.create(
            "pods",
            {
                "metadata": {
                    "name": f"full-{i}",
                    "annotations": {
                        KEYS.assigned_node: "node-a",
                        KEYS.devices_allocated: f"{gpu.uuid},NVIDIA,16000,0:;",
                        KEYS.bind_phase: "success",
                    },
                },
                "spec": {"nodeName": "node-a", "containers": [gpu_container(mem=16000)]},
                "status": {"phase": "Running"},
            },
            namespace="default",
        )
    c.add_pod("waiting", gpu_container(mem=8000))
    yield c
    await c.stop()


async def test_filter_and_bind_are_refused_until_synced_then_the_refused_pod_is_retried(
    cluster: Cluster,
) -> None:
    await cluster.start(wait_ready=False)
    await cluster.until(lambda: "node-a" in cluster.state.nodes)  # the nodes are in, the pods not yet
    answer = await cluster.filter("waiting")
    assert answer["Error"] == routes.NOT_READY and not answer.get("NodeNames")
    assert await cluster.bind("waiting", "node-a") == routes.NOT_READY
    assert cluster.decision("waiting") is None and "nodeName" not in cluster.pod("waiting")["spec"]
    assert cluster.api.answer is not None
    cluster.api.answer.set()
    assert cluster.service is not None
    await cluster.service.wait_ready()
    await cluster.until(lambda: retries.RETRY_ANNOTATION in cluster.pod("waiting")["metadata"]["annotations"])
    answer = await cluster.filter("waiting")  # kube-scheduler's retry: now against the whole state
    assert answer["NodeNames"] == [] and "node-a" in answer["FailedNodes"], answer
