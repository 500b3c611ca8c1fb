"""The ResourceSlice publisher (services/vgpu_device_plugin/dra/slicepub.py) against a fake of the
KubeApi port's calls it makes. The local cluster does not serve resource.k8s.io objects yet (the
emulation adds the DRA kinds), so the fake below plays kube-apiserver's part as 1.36 does it:
resourceVersion compare-and-swap (409), create of an existing name (409), immutable driver / node /
pool (422), taint ``timeAdded`` stamping, and, on request, dropping device taints as a server
without DRADeviceTaints does. The real server's behaviour is tests/realk8s/test_dra_schema.py."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import Gpu, GpuUuid, Mode, NodeInventory, NodeName
from vgpu.core.dra import names, slices
from vgpu.gpu.fake import FakeGpuBackend
from vgpu.gpu.port import DeviceInfo, EventKind, GpuEvent
from vgpu_device_plugin import inventory as inventories
from vgpu_device_plugin.dra import slicepub
from vgpu_device_plugin.health import HealthMonitor, HealthTracker

NODE = "n1"
NAME = slices.slice_name(NODE)
JsonObj = dict[str, Any]


class FakeSliceServer:
    """resourceslices and nodes, kept as kube-apiserver keeps them (see the module docstring)."""

    def __init__(self) -> None:
        self.slices: dict[str, JsonObj] = {}
        self.nodes: dict[str, JsonObj] = {NODE: {"metadata": {"name": NODE, "uid": "node-uid-1"}}}
        self.drop_taints = False
        self.failures: list[errors.KubeError] = []  # raised by the next calls, one each
        self.before_write: Callable[[], None] | None = None  # runs once, just before a write lands
        self.calls: list[str] = []
        self._rv = 0
        self._changed = asyncio.Condition()

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    async def _fail(self, call: str) -> None:
        """Record ``call`` (waking tests that wait on calls); raise the next injected failure."""
        self.calls.append(call)
        await self._notify()
        if self.failures:
            raise self.failures.pop(0)

    def _race(self) -> None:
        hook, self.before_write = self.before_write, None
        if hook is not None:
            hook()

    def _store(self, body: JsonObj, *, old: JsonObj | None) -> JsonObj:
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        meta["resourceVersion"] = self._next_rv()
        meta.setdefault("uid", "slice-uid")
        spec = obj["spec"]
        for dev in spec.get("devices") or []:
            if self.drop_taints:
                dev.pop("taints", None)
            for taint in dev.get("taints") or []:
                taint.setdefault("timeAdded", f"2026-12-07T00:00:{self._rv:02d}Z")
        if old is not None:
            for field in ("driver", "nodeName"):
                if spec.get(field) != old["spec"].get(field):
                    raise errors.KubeError(f"spec.{field}: field is immutable", status=422, reason="Invalid")
            if spec["pool"]["name"] != old["spec"]["pool"]["name"]:
                raise errors.KubeError("spec.pool.name: field is immutable", status=422, reason="Invalid")
        self.slices[meta["name"]] = obj
        return copy.deepcopy(obj)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def put(self, body: JsonObj) -> JsonObj:
        """Someone else writes ``body`` (a create or an unconditional update)."""
        body = copy.deepcopy(body)
        body["metadata"].pop("resourceVersion", None)
        return self._store(body, old=None)

    async def wait_for(self, done: Callable[[FakeSliceServer], bool]) -> None:
        async with asyncio.timeout(10), self._changed:
            await self._changed.wait_for(lambda: done(self))

    def generation(self) -> int:
        return int(self.slices[NAME]["spec"]["pool"]["generation"])

    # ----- the SliceApi calls -----

    async def get(self, kind: str, name: str, *, namespace: str | None = None) -> JsonObj:
        await self._fail(f"get {kind}")
        table = self.nodes if kind == "nodes" else self.slices
        if name not in table:
            raise errors.NotFound(f"{kind} {name} not found", status=404, reason="NotFound")
        return copy.deepcopy(table[name])

    async def create(self, kind: str, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        assert kind == "resourceslices"
        await self._fail("create")
        self._race()
        if body["metadata"]["name"] in self.slices:
            raise errors.Conflict("already exists", status=409, reason="AlreadyExists")
        stored = self._store(body, old=None)
        await self._notify()
        return stored

    async def replace(self, kind: str, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        assert kind == "resourceslices"
        await self._fail("replace")
        self._race()
        name = body["metadata"]["name"]
        old = self.slices.get(name)
        if old is None:
            raise errors.NotFound("not found", status=404, reason="NotFound")
        if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
            raise errors.Conflict("the object has been modified", status=409, reason="Conflict")
        stored = self._store(body, old=old)
        await self._notify()
        return stored

    async def delete(
        self, kind: str, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> None:
        await self._fail("delete")
        if self.slices.pop(name, None) is None:
            raise errors.NotFound("not found", status=404, reason="NotFound")
        await self._notify()


class Source:
    """An inventory source the test changes by hand (``HealthMonitor``'s version/wait shape)."""

    def __init__(self, gpus: tuple[Gpu, ...]) -> None:
        self.version = 0
        self.gpus = gpus
        self._changed = asyncio.Condition()

    def inventory(self) -> NodeInventory:
        return NodeInventory(NodeName(NODE), self.gpus)

    async def set(self, gpus: tuple[Gpu, ...]) -> None:
        async with self._changed:
            self.gpus = gpus
            self.version += 1
            self._changed.notify_all()

    async def wait_changed(self, version: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.version != version)
            return self.version


def gpu(index: int, *, healthy: bool = True) -> Gpu:
    return Gpu(GpuUuid(f"GPU-{index}"), index, 10, 24576, 100, "NVIDIA L4", health=healthy)


HEALTHY = (gpu(0), gpu(1))
SICK = (gpu(0), gpu(1, healthy=False))


@contextlib.asynccontextmanager
async def publishing(
    server: FakeSliceServer, source: Source, **kw: Any
) -> AsyncIterator[list[slicepub.SlicePublisher]]:
    kw.setdefault("backoff_s", (0.001, 0.004))
    got: list[slicepub.SlicePublisher] = []
    task = asyncio.create_task(
        slicepub.run(server, node=NODE, inventory_source=source, publisher=got.append, **kw)
    )
    try:
        yield got
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def stored_devices(server: FakeSliceServer) -> list[JsonObj]:
    return list(server.slices[NAME]["spec"].get("devices") or [])


async def test_first_start_creates_the_slice_owned_by_the_node() -> None:
    server = FakeSliceServer()
    async with publishing(server, Source(HEALTHY)):
        await server.wait_for(lambda s: NAME in s.slices)
    stored = server.slices[NAME]
    assert stored["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in stored["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert stored["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"


async def test_a_restart_keeps_an_equal_slice_and_updates_a_different_one() -> None:
    server = FakeSliceServer()
    pub = slicepub.SlicePublisher(server, node=NODE)
    assert await pub.sync(NodeInventory(NodeName(NODE), HEALTHY)) is True
    rv = server.slices[NAME]["metadata"]["resourceVersion"]
    restarted = slicepub.SlicePublisher(server, node=NODE)
    assert await restarted.sync(NodeInventory(NodeName(NODE), HEALTHY)) is False  # nothing written
    assert server.slices[NAME]["metadata"]["resourceVersion"] == rv
    assert "delete" not in server.calls
    changed = slicepub.SlicePublisher(server, node=NODE)
    assert await changed.sync(NodeInventory(NodeName(NODE), (gpu(0),))) is True  # a GPU fewer
    assert server.generation() == 2 and len(stored_devices(server)) == 1


async def test_health_changes_update_the_slice_and_raise_the_generation() -> None:
    server = FakeSliceServer()
    source = Source(HEALTHY)
    async with publishing(server, source, resync_s=3600):
        await server.wait_for(lambda s: NAME in s.slices)
        await source.set(SICK)
        await server.wait_for(lambda s: s.generation() == 2)
        taint = stored_devices(server)[1]["taints"][0]
        assert (taint["key"], taint["effect"]) == (names.UNHEALTHY_TAINT_KEY, "NoSchedule")
        await source.set(HEALTHY)
        await server.wait_for(lambda s: s.generation() == 3)
        assert not any("taints" in d for d in stored_devices(server))


async def test_a_conflicting_write_is_read_again_and_retried() -> None:
    server = FakeSliceServer()
    pub = slicepub.SlicePublisher(server, node=NODE)
    await pub.sync(NodeInventory(NodeName(NODE), HEALTHY))

    def someone_labels_it() -> None:
        other = copy.deepcopy(server.slices[NAME])
        other["metadata"]["labels"] = {"by": "someone"}
        server.put(other)

    server.before_write = someone_labels_it
    assert await pub.sync(NodeInventory(NodeName(NODE), SICK)) is True
    assert server.calls.count("replace") == 2  # the first met a 409
    stored = server.slices[NAME]
    assert stored["metadata"]["labels"] == {"by": "someone"}  # their change survives ours
    assert stored["spec"]["devices"][1]["taints"]


async def test_a_create_that_races_another_writer_becomes_an_update() -> None:
    server = FakeSliceServer()
    rival = slices.build(NodeInventory(NodeName(NODE), (gpu(0),)), driver_version=None).body
    server.before_write = lambda: server.put(rival)
    pub = slicepub.SlicePublisher(server, node=NODE)
    assert await pub.sync(NodeInventory(NodeName(NODE), HEALTHY)) is True
    assert server.calls.count("create") == 1 and server.calls.count("replace") == 1
    assert len(stored_devices(server)) == 2 and server.generation() == 2


async def test_conflicts_without_end_give_up_after_a_few_tries() -> None:
    server = FakeSliceServer()
    pub = slicepub.SlicePublisher(server, node=NODE)
    await pub.sync(NodeInventory(NodeName(NODE), HEALTHY))

    def always_conflict() -> None:
        server.put(server.slices[NAME])
        server.before_write = always_conflict

    server.before_write = always_conflict
    with pytest.raises(errors.Conflict, match="still conflicting"):
        await pub.sync(NodeInventory(NodeName(NODE), SICK))
    assert server.calls.count("replace") == slicepub.CONFLICT_RETRIES


async def test_another_drivers_slice_under_our_name_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeSliceServer()
    foreign = slices.build(NodeInventory(NodeName(NODE), HEALTHY), driver_version=None).body
    foreign["spec"]["driver"] = "gpu.example.com"
    server.put(foreign)
    source = Source(HEALTHY)
    with caplog.at_level(logging.ERROR):
        async with publishing(server, source):
            await server.wait_for(lambda s: s.calls.count("get resourceslices") >= 3)  # retried
            assert server.slices[NAME]["spec"]["driver"] == "gpu.example.com"
            assert (
                "create" not in server.calls
                and "replace" not in server.calls
                and "delete" not in server.calls
            )
            del server.slices[NAME]  # it goes away: ours is created on the next try
            await server.wait_for(
                lambda s: s.slices.get(NAME, {}).get("spec", {}).get("driver") == names.DRIVER
            )
    assert any(
        f"node {NODE}" in r.getMessage() and "gpu.example.com" in r.getMessage() for r in caplog.records
    )


async def test_our_drivers_slice_for_another_node_is_recreated() -> None:
    server = FakeSliceServer()
    stale = slices.build(NodeInventory(NodeName("elsewhere"), HEALTHY), driver_version=None).body
    stale["metadata"]["name"] = NAME
    stale["spec"]["pool"]["generation"] = 4
    server.put(stale)
    pub = slicepub.SlicePublisher(server, node=NODE)
    assert await pub.sync(NodeInventory(NodeName(NODE), HEALTHY)) is True
    assert server.calls.count("delete") == 1
    assert server.slices[NAME]["spec"]["nodeName"] == NODE and server.generation() == 5


async def test_api_errors_are_logged_with_the_node_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeSliceServer()
    server.failures = [
        errors.KubeError("etcdserver: request timed out", status=500),
        errors.KubeError("connection refused", status=0),
        errors.TooManyRequests("slow down", status=429),
    ]
    with caplog.at_level(logging.ERROR):
        async with publishing(server, Source(HEALTHY)):
            await server.wait_for(lambda s: NAME in s.slices)
    failed = [r.getMessage() for r in caplog.records if "publishing ResourceSlice" in r.getMessage()]
    assert len(failed) == 3 and all(m.startswith(f"node {NODE}: ") for m in failed)
    assert "etcdserver: request timed out" in failed[0]


async def test_the_back_off_doubles_up_to_its_longest_and_resets_after_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = FakeSliceServer()
    server.failures = [errors.KubeError("down", status=503) for _ in range(5)]
    source = Source(HEALTHY)
    with caplog.at_level(logging.ERROR):
        async with publishing(server, source, backoff_s=(0.001, 0.004), resync_s=3600):
            await server.wait_for(lambda s: NAME in s.slices)
            server.failures = [errors.KubeError("down again", status=503)]
            await source.set(SICK)
            await server.wait_for(lambda s: s.generation() == 2)
    delays = [
        r.getMessage().rsplit("retrying in ", 1)[1] for r in caplog.records if "retrying in" in r.getMessage()
    ]
    assert delays == ["0.001 s", "0.002 s", "0.004 s", "0.004 s", "0.004 s", "0.001 s"]


async def test_a_node_registered_again_owns_the_recreated_slice() -> None:
    server = FakeSliceServer()
    pub = slicepub.SlicePublisher(server, node=NODE)
    await pub.sync(NodeInventory(NodeName(NODE), HEALTHY))
    # the Node is deleted and registers again: the garbage collector takes the slice with it
    server.nodes[NODE] = {"metadata": {"name": NODE, "uid": "node-uid-2"}}
    del server.slices[NAME]
    assert await pub.sync(NodeInventory(NodeName(NODE), HEALTHY)) is True
    assert server.slices[NAME]["metadata"]["ownerReferences"][0]["uid"] == "node-uid-2"
    gets = server.calls.count("get nodes")
    assert await pub.sync(NodeInventory(NodeName(NODE), SICK)) is True  # an update: no Node read
    assert server.calls.count("get nodes") == gets


async def test_a_missing_node_is_an_error_retried_until_it_exists() -> None:
    server = FakeSliceServer()
    server.nodes.clear()
    async with publishing(server, Source(HEALTHY)):
        await server.wait_for(lambda s: s.calls.count("get nodes") >= 2)
        assert not server.slices
        server.nodes[NODE] = {"metadata": {"name": NODE, "uid": "late"}}
        await server.wait_for(lambda s: NAME in s.slices)
    assert server.slices[NAME]["metadata"]["ownerReferences"][0]["uid"] == "late"


async def test_without_device_taints_unhealthy_gpus_leave_the_slice() -> None:
    server = FakeSliceServer()
    server.drop_taints = True
    pub = slicepub.SlicePublisher(server, node=NODE)
    assert await pub.sync(NodeInventory(NodeName(NODE), SICK)) is True
    assert pub.taints is False
    assert [d["name"] for d in stored_devices(server)] == ["gpu-0"]
    assert await pub.sync(NodeInventory(NodeName(NODE), SICK)) is False  # and it stays that way
    assert await pub.sync(NodeInventory(NodeName(NODE), HEALTHY)) is True  # healed: back in
    assert [d["name"] for d in stored_devices(server)] == ["gpu-0", "gpu-1"]


async def test_a_stored_taint_keeps_its_time_through_later_updates() -> None:
    server = FakeSliceServer()
    pub = slicepub.SlicePublisher(server, node=NODE)
    await pub.sync(NodeInventory(NodeName(NODE), SICK))
    stamped = stored_devices(server)[1]["taints"][0]["timeAdded"]
    await pub.sync(NodeInventory(NodeName(NODE), (*SICK, gpu(2))))
    assert stored_devices(server)[1]["taints"][0]["timeAdded"] == stamped


async def test_a_deleted_slice_is_recreated_on_the_next_resync() -> None:
    server = FakeSliceServer()
    async with publishing(server, Source(HEALTHY), resync_s=0.01):
        await server.wait_for(lambda s: NAME in s.slices)
        await server.delete("resourceslices", NAME)
        await server.wait_for(lambda s: NAME in s.slices)


def _info(index: int, *, mig: bool = False, numa: int | None = 0) -> DeviceInfo:
    return DeviceInfo(
        uuid=GpuUuid(f"GPU-{index}"),
        index=index,
        name="NVIDIA A100-SXM4-40GB",
        memory_total_bytes=40960 << 20,
        minor_number=index,
        pci_bus_id=f"0000:0{index}:00.0",
        numa_node=numa,
        mig_enabled=mig,
    )


async def test_the_monitor_source_gives_the_plugins_gpus_with_their_health() -> None:
    infos = [_info(0), _info(1, numa=None), _info(2, mig=True)]
    config = DevicePluginConfig(device_memory_scaling=1.0, device_core_scaling=2.0)
    inv = inventories.build(infos, config)
    tracker = HealthTracker([d.uuid for d in inv.gpus], clock=lambda: 0.0, recovery_s=60, ignored_xids=())
    monitor = HealthMonitor(FakeGpuBackend(infos), tracker, probe_interval_s=3600)
    source = slicepub.MonitorSource(NODE, inv, config, monitor)
    first = source.inventory()
    assert [(g.index, g.mode, g.cores, g.numa, g.health) for g in first.gpus] == [
        (0, Mode.HAMI_CORE, 200, 0, True),
        (1, Mode.HAMI_CORE, 200, -1, True),  # NUMA unknown: no numaNode attribute
        (2, Mode.MIG, 100, 0, True),
    ]
    version = source.version
    waiter = asyncio.create_task(source.wait_changed(version))
    await monitor.handle_event(GpuEvent(EventKind.XID, GpuUuid("GPU-1"), xid=79))
    assert await asyncio.wait_for(waiter, 5) != version
    assert [g.health for g in source.inventory().gpus] == [True, False, True]
