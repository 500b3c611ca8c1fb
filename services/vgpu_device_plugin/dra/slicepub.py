"""Keeps this node's ResourceSlice current (the DRA mode's inventory, ``vgpu.core.dra.slices``).

:func:`run` is the entry point the device plugin's main starts in DRA mode. It writes the slice at
start (creating it, or updating the one an earlier plugin left: the slice is never deleted, so
claims and kube-scheduler see the node's GPUs through plugin restarts), then again whenever the
inventory source says something changed (a GPU's health) and every ``resync_s`` (someone deleted
or edited it). Each write is a compare-and-swap: a 409 (the slice changed under us, or a create
raced another) re-reads and retries. A slice under our name written by another driver is never
touched (logged, retried with back-off in case it goes away); one of our driver with another
node or pool (fields that cannot change) is deleted and recreated. An API server that drops
device taints (DRADeviceTaints off) is noticed from its answer: unhealthy GPUs are then left out
of the slice instead. API errors are logged with the node's name and retried with exponential
back-off. All API calls go through the ``KubeApi`` port (the official client's adapter runs them
on threads), so nothing here blocks the event loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from vgpu.core import errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import Gpu, Mode, NodeInventory, NodeName
from vgpu.core.dra import slices
from vgpu.kube.port import JsonObj, Kind
from vgpu.waits import wait_at_most

from vgpu_device_plugin import inventory as inventories
from vgpu_device_plugin.health import HealthMonitor

log = logging.getLogger(__name__)

KIND: Kind = "resourceslices"
CONFLICT_RETRIES = 5


class SliceApi(Protocol):
    """The calls the publisher makes (``vgpu.kube.port.KubeApi`` has them all)."""

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj: ...

    async def create(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj: ...

    async def replace(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj: ...

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> None: ...


class InventorySource(Protocol):
    """What is on the node now, and a way to wait for it to change (``HealthMonitor``'s shape)."""

    @property
    def version(self) -> int: ...

    def inventory(self) -> NodeInventory: ...

    async def wait_changed(self, version: int) -> int: ...


class ForeignSlice(errors.KubeError):
    """A slice under our name that another driver wrote: we leave it alone."""


@dataclasses.dataclass(frozen=True)
class MonitorSource:
    """An :class:`InventorySource` over the device plugin's own inventory and health monitor: the
    shared GPUs as the register annotation describes them (scaled memory and cores), the GPUs with
    MIG enabled as unshared devices, each with the health the monitor tracks."""

    node: str
    inventory_: inventories.Inventory
    config: DevicePluginConfig
    monitor: HealthMonitor

    @property
    def version(self) -> int:
        return self.monitor.version

    def inventory(self) -> NodeInventory:
        health = self.monitor.tracker.snapshot()
        numa = {d.uuid: d.numa_node for d in self.inventory_.gpus}
        gpus = [
            dataclasses.replace(g, numa=-1 if numa.get(g.uuid) is None else g.numa)
            for g in inventories.register_gpus(self.inventory_, self.config, health)
        ]
        gpus += [
            Gpu(
                uuid=d.uuid,
                index=d.index,
                count=1,
                memory_mib=d.memory_mib,
                cores=100,
                type=inventories.model_type(d.name),
                numa=-1 if d.numa_node is None else d.numa_node,
                mode=Mode.MIG,
                health=health.get(d.uuid, True),
            )
            for d in self.inventory_.gpus
            if d.mig_enabled
        ]
        return NodeInventory(NodeName(self.node), tuple(sorted(gpus, key=lambda g: g.index)))

    async def wait_changed(self, version: int) -> int:
        return await self.monitor.wait_changed(version)


class SlicePublisher:
    """Makes the stored slice say what the inventory says (:meth:`sync`); see the module docstring."""

    def __init__(
        self, api: SliceApi, *, node: str, driver_version: str | None = None, own_by_node: bool = True
    ) -> None:
        self._api = api
        self._node = node
        self._driver_version = driver_version
        self._own_by_node = own_by_node
        self._node_uid: str | None = None
        self.name = slices.slice_name(node)
        self.taints = True  # False once the API server has been seen dropping device taints
        self.writes = 0
        self._last_skipped: tuple[slices.Skipped, ...] | None = None

    async def _owner_uid(self, *, refresh: bool) -> str | None:
        """The Node's uid, read once and again whenever the slice is (re)created: a Node deleted
        and registered again under the same name has a new uid, and the garbage collector removes
        a slice whose owner is gone."""
        if not self._own_by_node:
            return None
        if self._node_uid is None or refresh:
            node = await self._api.get("nodes", self._node)
            uid = (node.get("metadata") or {}).get("uid")
            self._node_uid = uid if isinstance(uid, str) and uid else None
        return self._node_uid

    async def _read(self) -> JsonObj | None:
        try:
            return await self._api.get(KIND, self.name)
        except errors.NotFound:
            return None

    def _log_skipped(self, skipped: tuple[slices.Skipped, ...]) -> None:
        if skipped == self._last_skipped:
            return
        self._last_skipped = skipped
        for s in skipped:
            log.warning(
                "node %s: GPU %d %s left out of the ResourceSlice: %s", self._node, s.index, s.uuid, s.reason
            )

    async def sync(self, inventory: NodeInventory) -> bool:
        """Write the slice if it differs from ``inventory``; True when something was written."""
        for _ in range(CONFLICT_RETRIES):
            existing = await self._read()
            generation = 1
            if existing is not None:
                whose = slices.ownership(existing, node=self._node)
                if whose == "foreign":
                    driver = (existing.get("spec") or {}).get("driver")
                    raise ForeignSlice(
                        f"ResourceSlice {self.name} belongs to driver {driver!r}, not ours: left alone",
                        status=409,
                        reason="AlreadyExists",
                    )
                if whose == "stale":
                    log.warning(
                        "node %s: ResourceSlice %s names another node or pool: recreating it",
                        self._node,
                        self.name,
                    )
                    with contextlib.suppress(errors.NotFound):
                        await self._api.delete(KIND, self.name)
                    generation = _generation(existing) + 1
                    existing = None
            owner = await self._owner_uid(refresh=existing is None)
            built = slices.build(
                inventory,
                driver_version=self._driver_version,
                generation=generation,
                taints=self.taints,
                node_uid=owner,
            )
            self._log_skipped(built.skipped)
            body = slices.reconcile(existing, built.body)
            if body is None:
                return False
            try:
                if existing is None:
                    stored = await self._api.create(KIND, body)
                else:
                    stored = await self._api.replace(KIND, body)
            except errors.Conflict:
                continue  # changed or created under us: read again
            self.writes += 1
            if self.taints and slices.taints_dropped(body, stored):
                log.warning(
                    "node %s: the API server dropped the device taints (DRADeviceTaints off): "
                    "unhealthy GPUs are left out of the ResourceSlice instead",
                    self._node,
                )
                self.taints = False
                continue
            _log_written(self._node, stored, built)
            return True
        raise errors.Conflict(
            f"ResourceSlice {self.name}: still conflicting after {CONFLICT_RETRIES} tries", status=409
        )


def _generation(obj: Mapping[str, object]) -> int:
    spec = obj.get("spec")
    pool = spec.get("pool") if isinstance(spec, Mapping) else None
    value = pool.get("generation") if isinstance(pool, Mapping) else None
    return value if isinstance(value, int) and value >= 0 else 0


def _log_written(node: str, stored: Mapping[str, object], built: slices.SliceBuild) -> None:
    devices = built.body["spec"].get("devices") or []
    tainted = sum(1 for d in devices if d.get("taints"))
    log.info(
        "node %s: ResourceSlice %s written: generation %d, %d GPU(s), %d tainted unhealthy, %d left out",
        node,
        built.body["metadata"]["name"],
        _generation(stored),
        len(devices),
        tainted,
        len(built.skipped),
    )


async def run(
    api: SliceApi,
    *,
    node: str,
    inventory_source: InventorySource,
    driver_version: str | None = None,
    resync_s: float = 300.0,
    backoff_s: tuple[float, float] = (1.0, 60.0),
    own_by_node: bool = True,
    publisher: Callable[[SlicePublisher], None] | None = None,
) -> None:
    """Keep ``node``'s ResourceSlice current until cancelled (never deletes it). ``backoff_s`` is
    the first and the longest wait after a failed write (doubling in between); a change of the
    inventory ends a wait early. ``own_by_node``: the Node is the slice's owner (deleted with it;
    needs ``get nodes``). ``publisher`` is handed the :class:`SlicePublisher` (tests, metrics)."""
    pub = SlicePublisher(api, node=node, driver_version=driver_version, own_by_node=own_by_node)
    if publisher is not None:
        publisher(pub)
    first, longest = backoff_s
    delay = first
    while True:
        version = inventory_source.version
        try:
            await pub.sync(inventory_source.inventory())
        except errors.KubeError as exc:
            log.error(
                "node %s: publishing ResourceSlice %s failed: %s; retrying in %.3g s",
                node,
                pub.name,
                exc,
                delay,
            )
            await wait_at_most(inventory_source.wait_changed(version), delay)
            delay = min(delay * 2, longest)
            continue
        delay = first
        await wait_at_most(inventory_source.wait_changed(version), resync_s)
