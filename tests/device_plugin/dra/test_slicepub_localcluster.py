"""The slice publisher against the local cluster (``vgpu.localcluster``), which serves
resource.k8s.io/v1 ResourceSlices with 1.36's validation once the emulation's DRA kinds are in
(skipped before): every slice shape accepted and read back, a write that meets someone else's
write (409) retried, the generation raised on each change and nothing written without one."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from vgpu.core.device import Gpu, GpuUuid, Mode, NodeInventory, NodeName
from vgpu.core.dra import slices
from vgpu.kube.port import JsonObj
from vgpu.localcluster import kinds
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_device_plugin.dra import slicepub

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
