"""The ResourceSlice publisher (services/vgpu_device_plugin/dra/slicepub.py) against a fake of the
KubeApi port's calls it makes (and the slice watch, ``slicewatch``). The fake below plays
kube-apiserver's part as 1.36 does it: resourceVersion compare-and-swap (409), create of an existing
name (409), immutable driver / node / pool (422), taint ``timeAdded`` stamping, on request dropping
device taints as a server without DRADeviceTaints does, and a watch that can be cut off and answer
410 Gone. The local cluster's and the real server's behaviour: test_slicepub_localcluster.py,
tests/realk8s/test_dra_schema.py and tests/realk8s/test_slicewatch_real.py."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
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
from vgpu.kube import informer, port
from vgpu_device_plugin import inventory as inventories
from vgpu_device_plugin.dra import slicepub, slicewatch
from vgpu_device_plugin.health import HealthMonitor, HealthTracker

NODE = "n1"
NAME = slices.slice_name(NODE)
JsonObj = dict[str, Any]


SELECTOR = f"spec.driver={names.DRIVER},spec.nodeName={NODE}"


def selected(obj: JsonObj) -> bool:
    """Whether the watch's selector (``SELECTOR``) matches ``obj``, as kube-apiserver decides."""
    spec = obj.get("spec") or {}
    return spec.get("driver") == names.DRIVER and spec.get("nodeName") == NODE


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
        # the watch (list + watch, for the slice watch): every change as (rv, type, object); a
        # watch from before ``compacted`` is Gone; while ``outage``, list and watch fail and open
        # watches end in error; ``consumed``: events the watcher took and asked past (applied);
        # opening a watch and consuming an event wake ``wait_for`` (the watcher is then current)
        self.events: list[tuple[int, str, JsonObj]] = []
        self.compacted = 0
        self.outage = False
        self.consumed = 0
        self.watch_selectors: list[str | None] = []

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
        etype = "MODIFIED" if meta["name"] in self.slices else "ADDED"
        self.slices[meta["name"]] = obj
        self.events.append((self._rv, etype, copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def put(self, body: JsonObj) -> JsonObj:
        """Someone else writes ``body`` (a create or an unconditional update)."""
        body = copy.deepcopy(body)
        body["metadata"].pop("resourceVersion", None)
        return self._store(body, old=None)

    async def edit(self, body: JsonObj) -> JsonObj:
        """Someone else writes ``body`` and the watchers hear of it."""
        stored = self.put(body)
        await self._notify()
        return stored

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
        gone = self.slices.pop(name, None)
        if gone is None:
            raise errors.NotFound("not found", status=404, reason="NotFound")
        self.events.append((int(self._next_rv()), "DELETED", gone))
        await self._notify()

    async def list(
        self,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> port.ObjectList:
        assert kind == "resourceslices" and field_selector == SELECTOR
        self.calls.append("list")
        if self.outage:
            raise errors.KubeError("connection refused", status=0)
        items = [copy.deepcopy(o) for o in self.slices.values() if selected(o)]
        return port.ObjectList(items, str(self._rv))

    async def watch(
        self,
        kind: str,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: float | None = None,
        transform: Any = None,
    ) -> AsyncIterator[port.WatchEvent]:
        assert kind == "resourceslices" and field_selector == SELECTOR
        self.watch_selectors.append(field_selector)
        await self._notify()
        if self.outage:
            raise errors.KubeError("connection refused", status=0)
        since = int(resource_version or 0)
        if since < self.compacted:
            raise errors.Gone(f"too old resource version: {since}", status=410, reason="Expired")

        def ready(after: int) -> bool:
            return self.outage or any(rv > after for rv, _, _ in self.events)

        while True:
            async with self._changed:
                await self._changed.wait_for(functools.partial(ready, since))
            if self.outage:
                raise errors.KubeError("watch stream reset", status=0)
            for rv, etype, obj in [e for e in self.events if e[0] > since]:
                since = rv
                if selected(obj):
                    yield port.WatchEvent(etype, copy.deepcopy(obj))  # type: ignore[arg-type]
                    self.consumed += 1
                    await self._notify()

    def compact(self) -> None:
        """The server forgets its history: a watch from before now is Gone."""
        self.compacted = self._rv


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


def seen(watches: list[slicewatch.SliceWatch], server: FakeSliceServer) -> Callable[[FakeSliceServer], bool]:
    """Whether the watch has applied everything the server holds now."""
    upto = server._rv
    return lambda _: bool(watches) and int(watches[0].informer.resource_version or 0) >= upto


async def test_a_deleted_slice_is_written_again_on_the_watchs_word_not_the_resync() -> None:
    server = FakeSliceServer()
    watches: list[slicewatch.SliceWatch] = []
    async with publishing(server, Source(HEALTHY), resync_s=3600, watching=watches.append):
        await server.wait_for(lambda s: NAME in s.slices)
        await server.delete("resourceslices", NAME)  # kubelet's start-up wipe
        await server.wait_for(lambda s: NAME in s.slices)
    assert server.watch_selectors[0] == slicewatch.field_selector(NODE) == SELECTOR
    assert watches[0].kicks >= 1


async def test_our_own_writes_and_label_edits_start_no_write(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeSliceServer()
    source = Source(HEALTHY)
    watches: list[slicewatch.SliceWatch] = []
    with caplog.at_level(logging.INFO):
        async with publishing(server, source, resync_s=3600, watching=watches.append) as pubs:
            await server.wait_for(lambda s: NAME in s.slices)
            await server.wait_for(seen(watches, server))  # our create's echo, or a list after it
            labelled = copy.deepcopy(server.slices[NAME])
            labelled["metadata"]["labels"] = {"team": "gpu"}
            await server.edit(labelled)
            await server.wait_for(seen(watches, server))
            await source.set(SICK)
            await server.wait_for(lambda s: NAME in s.slices and s.generation() == 2)
            await server.wait_for(seen(watches, server))
    assert watches[0].kicks == 0 and pubs[0].writes == 2
    assert server.calls.count("get resourceslices") == 2  # the first sync and the health change's
    assert server.slices[NAME]["metadata"]["labels"] == {"team": "gpu"}
    assert "writing it again" not in caplog.text


async def test_an_edited_slice_is_restored() -> None:
    server = FakeSliceServer()
    async with publishing(server, Source(HEALTHY), resync_s=3600):
        await server.wait_for(lambda s: NAME in s.slices)
        published = copy.deepcopy(server.slices[NAME]["spec"])
        edited = copy.deepcopy(server.slices[NAME])
        edited["spec"]["devices"] = edited["spec"]["devices"][:1]  # a GPU gone from the scheduler
        await server.edit(edited)
        await server.wait_for(lambda s: len(stored_devices(s)) == 2)
    assert server.slices[NAME]["spec"]["devices"] == published["devices"]
    assert server.generation() == 2  # one past the stored one, as every change of content


async def test_a_slice_deleted_while_the_watch_was_down_is_written_again_after_the_relist() -> None:
    server = FakeSliceServer()
    watches: list[slicewatch.SliceWatch] = []
    async with publishing(server, Source(HEALTHY), resync_s=3600, watching=watches.append):
        await server.wait_for(lambda s: NAME in s.slices)
        await server.wait_for(seen(watches, server))
        server.outage = True  # the open watch ends in error, the next ones fail
        await server.delete("resourceslices", NAME)  # unseen: no watch is open
        server.compact()  # and the server forgets it: resuming from the last version is Gone
        await server.wait_for(lambda s: len(s.watch_selectors) >= 2)
        server.outage = False
        await server.wait_for(lambda s: NAME in s.slices)
    assert watches[0].informer.relists == 2  # the first list, and the one after the 410


@pytest.mark.parametrize(
    "garbage",
    [
        {"metadata": {"name": NAME}},
        {"metadata": {"name": NAME, "resourceVersion": 7}, "spec": []},
        {"metadata": {"name": NAME}, "spec": {"driver": names.DRIVER, "nodeName": NODE, "pool": 7}},
        {
            "metadata": {"name": NAME},
            "spec": {"driver": names.DRIVER, "nodeName": NODE, "pool": {"name": NODE}, "devices": "gpu-0"},
        },
    ],
    ids=["no-spec", "wrong-types", "pool-not-object", "devices-not-list"],
)
async def test_a_garbage_slice_from_the_watch_is_not_taken_for_ours(garbage: JsonObj) -> None:
    server = FakeSliceServer()
    pub = slicepub.SlicePublisher(server, node=NODE)
    assert pub.published(garbage) is False  # nothing published yet
    await pub.sync(NodeInventory(NodeName(NODE), HEALTHY))
    assert pub.published(server.slices[NAME]) is True
    assert pub.published(garbage) is False
    watch = slicewatch.SliceWatch(server, publisher=pub, node=NODE)  # type: ignore[arg-type]
    watch._on_change(informer.Change("MODIFIED", garbage, None))
    assert watch.changed.is_set()  # read again and written


@pytest.mark.parametrize(
    "other",
    [
        {},
        {"metadata": "x", "spec": []},
        {"metadata": {"name": "n1-gpu.kube-vgpu.io-old"}, "spec": {"driver": names.DRIVER, "nodeName": NODE}},
    ],
    ids=["empty", "metadata-not-object", "another-name"],
)
async def test_changes_of_slices_not_named_ours_are_ignored(other: JsonObj) -> None:
    server = FakeSliceServer()
    pub = slicepub.SlicePublisher(server, node=NODE)
    await pub.sync(NodeInventory(NodeName(NODE), HEALTHY))
    watch = slicewatch.SliceWatch(server, publisher=pub, node=NODE)  # type: ignore[arg-type]
    watch._on_change(informer.Change("MODIFIED", other, None))
    watch._on_change(informer.Change("DELETED", other, other))
    watch._on_listed([other])  # a list without our slice: that one asks for a write
    assert watch.kicks == 1


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
