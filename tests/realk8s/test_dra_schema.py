"""The DRA mode's objects against a real kube-apiserver 1.36 (marked ``realk8s``): every
ResourceSlice shape the device plugin publishes and every DeviceClass the chart installs is
created with ``fieldValidation=Strict`` (an unknown or duplicated field is an error, not a
warning), with the feature gates at their 1.36 defaults, and read back equal to what was sent;
the publisher keeps a slice current through the real server's compare-and-swap; and the limits
the builder keeps to (a GPU under 2 MiB, a request policy's rules) are the server's."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.core.device import Gpu, GpuUuid, Mode, NodeInventory, NodeName
from vgpu.core.dra import deviceclass, names, slices
from vgpu.kube import aioapi, client, port
from vgpu_device_plugin.dra import slicepub

from tests.deploy.rendering import render

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]

STRICT = {"fieldValidation": "Strict"}


def _gpu(index: int, **kw: Any) -> Gpu:
    base: dict[str, Any] = {
        "uuid": GpuUuid(f"GPU-{index:08x}-1111-2222-3333-444455556666"),
        "index": index,
        "count": 10,
        "memory_mib": 81559,
        "cores": 100,
        "type": "NVIDIA H100 80GB HBM3",
        "numa": index // 4,
    }
    base.update(kw)
    return Gpu(**base)


SHAPES: dict[str, tuple[Gpu, ...]] = {
    "one-healthy": (_gpu(0, memory_mib=15360, type="NVIDIA-Tesla T4"),),
    "unhealthy": (_gpu(0), _gpu(1, health=False)),
    "mig": (_gpu(0, mode=Mode.MIG, memory_mib=40960), _gpu(1, memory_mib=40960)),
    "several-models": (_gpu(0, memory_mib=2), _gpu(1, memory_mib=24576, cores=200), _gpu(2, numa=-1)),
    "eight": tuple(_gpu(i, health=i != 5) for i in range(8)),
    "smallest-policies": (_gpu(0, count=1, cores=2), _gpu(1, count=1000, cores=1000)),
    "no-gpus": (),
}


async def _strict_create(api: aioapi.AioKubeApi, kind: port.Kind, body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = await api.request(
        "POST", port.resource_path(kind, None), body=body, query=STRICT
    )
    return answer


def _without_taint_times(spec: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    for dev in out.get("devices") or []:
        for taint in dev.get("taints") or []:
            taint.pop("timeAdded", None)
    return out


async def test_resource_v1_is_served_with_the_gates_dra_mode_needs(api: aioapi.AioKubeApi) -> None:
    group = await api.request("GET", "/apis/resource.k8s.io/v1")
    served = {r["name"] for r in group["resources"]}
    assert {"resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"} <= served


async def test_every_slice_shape_is_accepted_strictly_and_read_back_equal(api: aioapi.AioKubeApi) -> None:
    for shape, gpus in SHAPES.items():
        node = f"node-{shape}"
        built = slices.build(NodeInventory(NodeName(node), gpus), driver_version="535.104.05")
        assert not built.skipped, shape
        created = await _strict_create(api, "resourceslices", built.body)
        stored = await api.get("resourceslices", built.body["metadata"]["name"])
        for answer in (created, stored):
            # everything we wrote comes back as written (quantities already canonical) ...
            assert _without_taint_times(answer["spec"]) == built.body["spec"], shape
            # ... and kube-apiserver stamps each taint's timeAdded (DRADeviceTaints is on)
            for dev in answer["spec"].get("devices") or []:
                assert all("timeAdded" in t for t in dev.get("taints") or []), shape
        # taints kept: reconcile, given what the server stored, sees nothing to write
        assert slices.reconcile(stored, built.body) is None, shape


async def test_the_request_policy_limits_the_builder_keeps_are_the_servers(api: aioapi.AioKubeApi) -> None:
    """A 1 MiB GPU (min 1Mi + step 1Mi passes the capacity) and a bad version are refused by the
    server as the builder refuses them, and so are cores at 1 % (min 1 + step 1 passes it) and a
    GPU without slots; a 2 MiB GPU, 2 % cores and one slot pass (above)."""
    gpu = _gpu(0)
    entry = slices.device_entry(gpu, driver_version=None, taint=False)
    body = slices.build(NodeInventory(NodeName("limits"), (gpu,)), driver_version=None).body
    tiny = copy.deepcopy(entry)
    tiny["capacity"]["memory"] = {
        "value": "1Mi",
        "requestPolicy": {"default": "1Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
    }
    leading_zero = copy.deepcopy(entry)
    leading_zero["attributes"][names.ATTR_DRIVER_VERSION] = {"version": "535.104.05"}
    no_default = copy.deepcopy(entry)
    del no_default["capacity"]["cores"]["requestPolicy"]["default"]
    one_core = copy.deepcopy(entry)
    one_core["capacity"]["cores"]["value"] = "1"
    one_core["capacity"]["cores"]["requestPolicy"]["validRange"]["max"] = "1"
    no_slot = copy.deepcopy(entry)
    no_slot["capacity"]["slots"]["value"] = "0"
    cases = (
        ("tiny", tiny),
        ("leading-zero", leading_zero),
        ("no-default", no_default),
        ("one-core", one_core),
        ("no-slot", no_slot),
    )
    for case, dev in cases:
        bad = copy.deepcopy(body)
        bad["metadata"]["name"] = f"limits-{case}"
        bad["spec"]["devices"] = [dev]
        with pytest.raises(errors.KubeError) as refused:
            await _strict_create(api, "resourceslices", bad)
        assert refused.value.status == 422, case
    for small in (_gpu(0, memory_mib=1), _gpu(0, cores=1), _gpu(0, count=0)):
        assert slices.build(NodeInventory(NodeName("x"), (small,)), driver_version=None).skipped
    assert slices.driver_semver("535.104.05") == "535.104.5"


async def test_strict_validation_refuses_an_unknown_field(api: aioapi.AioKubeApi) -> None:
    """The rig does check strictly: a misspelt field is an error, so the tests above mean something."""
    body = slices.build(NodeInventory(NodeName("strict"), (_gpu(0),)), driver_version=None).body
    body["spec"]["devices"][0]["allowMultipleAllocation"] = True
    with pytest.raises(errors.KubeError) as refused:
        await _strict_create(api, "resourceslices", body)
    assert "unknown field" in str(refused.value)


class _Source:
    """An inventory source the test changes by hand."""

    def __init__(self, inventory: NodeInventory) -> None:
        self.version = 0
        self._inventory = inventory
        self._changed = asyncio.Condition()

    def inventory(self) -> NodeInventory:
        return self._inventory

    async def set(self, inventory: NodeInventory) -> None:
        async with self._changed:
            self._inventory = inventory
            self.version += 1
            self._changed.notify_all()

    async def wait_changed(self, version: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.version != version)
            return self.version


async def _stored_when(
    api: aioapi.AioKubeApi, name: str, done: Any, *, timeout_s: float = 60
) -> dict[str, Any]:
    async with asyncio.timeout(timeout_s):
        while True:
            with contextlib.suppress(errors.NotFound):
                obj: dict[str, Any] = await api.get("resourceslices", name)
                if done(obj):
                    return obj
            await asyncio.sleep(0.1)  # polling the server, bounded by the timeout


async def test_the_publisher_keeps_the_slice_current_on_the_real_server(
    api: aioapi.AioKubeApi, official: client.OfficialKubeApi
) -> None:
    """Through the device plugin's adapter (official client); the test looks with its own."""
    node = "gpu-node"
    created_node = await api.create("nodes", {"metadata": {"name": node}})
    healthy = NodeInventory(NodeName(node), tuple(_gpu(i) for i in range(4)))
    source = _Source(healthy)
    name = slices.slice_name(node)
    task = asyncio.create_task(
        slicepub.run(official, node=node, inventory_source=source, driver_version="550.54.15", resync_s=3600)
    )
    try:
        first = await _stored_when(api, name, lambda o: True)
        assert first["spec"]["pool"]["generation"] == 1
        assert first["metadata"]["ownerReferences"][0]["uid"] == created_node["metadata"]["uid"]
        sick = NodeInventory(NodeName(node), tuple(_gpu(i, health=i != 2) for i in range(4)))
        await source.set(sick)
        second = await _stored_when(api, name, lambda o: o["spec"]["pool"]["generation"] == 2)
        assert [bool(d.get("taints")) for d in second["spec"]["devices"]] == [False, False, True, False]
        # someone else bumps the slice under us (a stale resourceVersion for our next write) ...
        edited = copy.deepcopy(second)
        edited["metadata"].setdefault("labels", {})["touched"] = "yes"
        await api.replace("resourceslices", edited)
        await source.set(healthy)
        third = await _stored_when(api, name, lambda o: o["spec"]["pool"]["generation"] == 3)
        assert not any(d.get("taints") for d in third["spec"]["devices"])
        assert third["metadata"]["labels"] == {"touched": "yes"}  # kept, not overwritten
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    # a restarted plugin with the same inventory writes nothing: the slice survives unchanged
    publisher = slicepub.SlicePublisher(official, node=node, driver_version="550.54.15")
    assert await publisher.sync(healthy) is False


async def test_device_classes_from_the_builder_and_the_chart_are_accepted_and_equal(
    api: aioapi.AioKubeApi,
) -> None:
    models = ["NVIDIA A100-SXM4-40GB", "Tesla T4", 'odd "model" \\ name <&> é']
    built = deviceclass.device_classes(models=models, per_model=True)
    values = {"dra": {"enabled": True, "deviceClasses": {"perModel": True, "models": models}}}
    rendered = render(values, kube_version="v1.36.2").of_kind("DeviceClass")
    assert {c["metadata"]["name"]: c["spec"] for c in rendered} == {
        c["metadata"]["name"]: c["spec"] for c in built
    }
    for body in built:
        created = await _strict_create(api, "deviceclasses", body)
        assert created["spec"] == body["spec"]
    stored = {c["metadata"]["name"]: c["spec"] for c in (await api.list("deviceclasses")).items}
    assert stored == {c["metadata"]["name"]: c["spec"] for c in built}
