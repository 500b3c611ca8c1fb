"""The slice watch against a real kube-apiserver 1.36 (marked ``realk8s``): the server serves
lists and watches of resourceslices by ``spec.driver`` and ``spec.nodeName``, and a slice deleted (as kubelet does when it
starts) or edited while the device plugin's publisher runs (through its own adapter, the official
client on threads) is written again at once, with the resync hours away."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core.device import Gpu, GpuUuid, NodeInventory, NodeName
from vgpu.core.dra import slices
from vgpu.kube import aioapi, client, port
from vgpu_device_plugin.dra import slicepub, slicewatch

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]

NODE = "gpu-node"
NAME = slices.slice_name(NODE)


class _Source:
    """A fixed inventory: only the slice watch can start a write."""

    version = 0

    def inventory(self) -> NodeInventory:
        gpus = tuple(
            Gpu(GpuUuid(f"GPU-{i:08x}-1111-2222-3333-444455556666"), i, 10, 81559, 100, "H100")
            for i in range(2)
        )
        return NodeInventory(NodeName(NODE), gpus)

    async def wait_changed(self, version: int) -> int:
        await asyncio.Event().wait()  # never
        raise AssertionError("unreachable")


async def _next(events: AsyncIterator[port.WatchEvent], etype: str) -> dict[str, Any]:
    """The next ``etype`` event of the test's own watch (others skipped)."""
    async with asyncio.timeout(60):
        async for event in events:
            if event.type == etype:
                return event.object
    raise AssertionError("the watch ended")


async def test_a_deleted_or_edited_slice_is_written_again_at_once(
    api: aioapi.AioKubeApi, official: client.OfficialKubeApi
) -> None:
    await api.create("nodes", {"metadata": {"name": NODE}})
    selector = slicewatch.field_selector(NODE)  # the publisher's watch asks the same
    listed = await api.list("resourceslices", field_selector=selector)
    assert listed.items == []
    events = api.watch(
        "resourceslices", resource_version=listed.resource_version, field_selector=selector, timeout_s=240
    )
    task = asyncio.create_task(
        slicepub.run(official, node=NODE, inventory_source=_Source(), resync_s=4 * 3600)
    )
    try:
        first = await _next(events, "ADDED")
        await api.delete("resourceslices", NAME)  # kubelet's wipe at its start
        await _next(events, "DELETED")
        again = await _next(events, "ADDED")
        assert again["spec"]["devices"] == first["spec"]["devices"]
        assert again["metadata"]["uid"] != first["metadata"]["uid"]
        edited = copy.deepcopy(again)
        edited["spec"]["devices"] = edited["spec"]["devices"][:1]
        await api.replace("resourceslices", edited)
        assert len((await _next(events, "MODIFIED"))["spec"]["devices"]) == 1
        restored = await _next(events, "MODIFIED")
        assert restored["spec"]["devices"] == first["spec"]["devices"]
        assert restored["spec"]["pool"]["generation"] == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await events.aclose()  # type: ignore[attr-defined]
