"""The slice publisher against the local cluster (``vgpu.localcluster``), which serves
resource.k8s.io/v1 ResourceSlices with 1.36's validation once the emulation's DRA kinds are in
(skipped before): every slice shape accepted and read back, a write that meets someone else's
write (409) retried, the generation raised on each change and nothing written without one; a
slice deleted (as kubelet does when it starts) or edited while ``run`` runs is written again at
once, on the watch's word (the resync is hours away)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core.device import Gpu, GpuUuid, Mode, NodeInventory, NodeName
from vgpu.core.dra import slices
from vgpu.kube.port import JsonObj, WatchEvent
from vgpu.localcluster import kinds
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_device_plugin.dra import slicepub, slicewatch

pytestmark = pytest.mark.skipif(
    "resourceslices" not in kinds.KINDS, reason="the local cluster serves no ResourceSlices yet"
)


def gpu(index: int, **kw: Any) -> Gpu:
    base: dict[str, Any] = {
        "uuid": GpuUuid(f"GPU-{index}"),
        "index": index,
        "count": 10,
        "memory_mib": 81559,
        "cores": 100,
        "type": "NVIDIA H100 80GB HBM3",
    }
    base.update(kw)
    return Gpu(**base)


class RacingApi:
    """The local cluster, with someone else's write landing just before our first update."""

    def __init__(self, api: LocalKubeApi) -> None:
        self.api = api
        self.raced = False

    async def get(self, kind: Any, name: str, *, namespace: str | None = None) -> JsonObj:
        return await self.api.get(kind, name, namespace=namespace)

    async def create(self, kind: Any, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        return await self.api.create(kind, body, namespace=namespace)

    async def delete(
        self, kind: Any, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> None:
        await self.api.delete(kind, name, namespace=namespace, grace_period_s=grace_period_s)

    async def replace(self, kind: Any, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        if not self.raced:
            self.raced = True
            other = await self.api.get(kind, body["metadata"]["name"])
            other["metadata"].setdefault("labels", {})["by"] = "someone"
            await self.api.replace(kind, other)
        return await self.api.replace(kind, body, namespace=namespace)


async def test_every_shape_is_accepted_and_read_back() -> None:
    api = LocalKubeApi(Store())
    shapes = {
        "unhealthy": (gpu(0), gpu(1, health=False)),
        "mig": (gpu(0, mode=Mode.MIG, memory_mib=40960), gpu(1)),
        "several": (gpu(0, memory_mib=2), gpu(1, memory_mib=24576, cores=200), gpu(2, numa=-1)),
        "eight": tuple(gpu(i) for i in range(8)),
        "none": (),
    }
    for shape, gpus in shapes.items():
        body = slices.build(NodeInventory(NodeName(shape), gpus), driver_version="535.104.05").body
        created = await api.create("resourceslices", copy.deepcopy(body))
        assert slices.reconcile(created, body) is None, shape


async def test_a_conflicting_write_is_retried_and_the_generation_follows_changes() -> None:
    local = LocalKubeApi(Store())
    await local.create("nodes", {"metadata": {"name": "n1"}})
    pub = slicepub.SlicePublisher(RacingApi(local), node="n1")
    assert await pub.sync(NodeInventory(NodeName("n1"), (gpu(0), gpu(1)))) is True
    sick = NodeInventory(NodeName("n1"), (gpu(0), gpu(1, health=False)))
    assert await pub.sync(sick) is True  # met the 409, read again, wrote
    stored = await local.get("resourceslices", slices.slice_name("n1"))
    assert stored["spec"]["pool"]["generation"] == 2
    assert stored["metadata"]["labels"] == {"by": "someone"}
    assert stored["spec"]["devices"][1]["taints"][0]["timeAdded"]
    assert await pub.sync(sick) is False


class _Source:
    """A fixed inventory (no health changes: only the slice watch can start a write)."""

    def __init__(self, inventory: NodeInventory) -> None:
        self.version = 0
        self._inventory = inventory

    def inventory(self) -> NodeInventory:
        return self._inventory

    async def wait_changed(self, version: int) -> int:
        await asyncio.Event().wait()  # never
        raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def _publishing(api: LocalKubeApi, node: str) -> AsyncIterator[list[slicewatch.SliceWatch]]:
    """``slicepub.run`` on ``node`` with a resync of hours: any prompt write is the watch's."""
    watches: list[slicewatch.SliceWatch] = []
    inventory = NodeInventory(NodeName(node), (gpu(0), gpu(1)))
    task = asyncio.create_task(
        slicepub.run(
            api, node=node, inventory_source=_Source(inventory), resync_s=4 * 3600, watching=watches.append
        )
    )
    try:
        yield watches
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _next(events: AsyncIterator[WatchEvent], etype: str) -> JsonObj:
    """The next ``etype`` event of the test's own watch (other types skipped)."""
    async with asyncio.timeout(10):
        async for event in events:
            if event.type == etype:
                return event.object
    raise AssertionError("the watch ended")


async def test_a_deleted_slice_comes_back_without_waiting_for_the_resync() -> None:
    api = LocalKubeApi(Store())
    await api.create("nodes", {"metadata": {"name": "n1"}})
    name = slices.slice_name("n1")
    events = api.watch("resourceslices", resource_version="0", field_selector=f"metadata.name={name}")
    async with _publishing(api, "n1") as watches:
        first = await _next(events, "ADDED")
        await api.delete("resourceslices", name)  # what kubelet does when it starts
        await _next(events, "DELETED")
        again = await _next(events, "ADDED")
        assert again["spec"]["devices"] == first["spec"]["devices"]
        assert again["metadata"]["uid"] != first["metadata"]["uid"]
        assert watches[0].kicks >= 1
        await api.delete("resourceslices", name)  # and every time after
        await _next(events, "DELETED")
        await _next(events, "ADDED")
    await events.aclose()


async def test_an_edited_slice_is_restored_and_a_labelled_one_kept() -> None:
    api = LocalKubeApi(Store())
    await api.create("nodes", {"metadata": {"name": "n1"}})
    name = slices.slice_name("n1")
    events = api.watch("resourceslices", resource_version="0", field_selector=f"metadata.name={name}")
    async with _publishing(api, "n1"):
        first = await _next(events, "ADDED")
        edited = copy.deepcopy(first)
        edited["spec"]["devices"] = edited["spec"]["devices"][:1]  # GPU 1 gone from the scheduler
        edited["metadata"]["labels"] = {"by": "someone"}
        await api.replace("resourceslices", edited)
        assert len((await _next(events, "MODIFIED"))["spec"]["devices"]) == 1
        restored = await _next(events, "MODIFIED")
        assert restored["spec"]["devices"] == first["spec"]["devices"]
        assert restored["spec"]["pool"]["generation"] == 2
        assert restored["metadata"]["labels"] == {"by": "someone"}  # someone's label is kept
    await events.aclose()
