"""The emulated kubelet's DRA device health (KEP-4680, ``ResourceHealthStatus``, beta and on in
1.36): ``pkg/kubelet/cm/dra/healthinfo.go``, ``manager.go``'s ``HandleWatchResourcesStream`` and
``UpdateAllocatedResourcesStatus``, and the plugin manager's stream loop (docs/protocol.md, "Device
health for kubelet").

**The stream** (:func:`watch`): once a DRA plugin registered, kubelet calls
``v1alpha1.DRAResourceHealth/NodeWatchResources`` on its endpoint and reads every message into the
:class:`HealthCache`. When the stream ends, for whatever reason (EOF, an error, ``Unimplemented``
from a plugin without health), the driver's entries are dropped (its devices read ``Unknown``) and
the call is made again :data:`RETRY_S` later, until the plugin deregisters (the task is cancelled).

**The cache** keeps per driver, per ``<pool>/<device>``: health, message (cut to 1024 characters),
the timeout (``health_check_timeout_seconds``, :data:`DEFAULT_TIMEOUT_S` when not positive) and when
kubelet received it (its own clock: the plugin's ``last_updated_time`` is not used). A device
heard of no later than its timeout ago reads ``Unknown`` with no message. A message changes a
device when its health, message or timeout differ (the pods holding it are synced at once);
devices the message leaves out turn ``Unknown`` once timed out.

**The pod status** (:func:`container_statuses`): for each container status whose container lists
``resources.claims``, one ``allocatedResourcesStatus`` entry per claim reference named
``claim:<name>`` (``claim:<name>/<request>`` with a request), whose ``resources`` are the prepared
devices of that claim (of that request when one is named), each ``{resourceID, health, message}``:
the resource ID is the device's first CDI id, else ``<driver>/<pool>/<device>``; duplicates are
dropped, an entry with no device is left out. :class:`PodHealth` gives admission these statuses
and, when a message changed devices, writes them anew for every pod holding one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

import grpc

from vgpu.core import errors
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2 as pb
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2_grpc as pb_grpc
from vgpu.localcluster.statuswriter import StatusWriter

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S: Final = 30.0  # healthinfo.go DefaultHealthTimeout
RETRY_S: Final = 5.0  # wait.UntilWithContext's period around the stream
MESSAGE_MAX: Final = 1024  # v1.ResourceHealthMessageMaxLength
HEALTH_NAMES: Final = {pb.HEALTHY: "Healthy", pb.UNHEALTHY: "Unhealthy"}  # anything else: Unknown

Key = tuple[str, str]  # (pool, device)


@dataclasses.dataclass(frozen=True)
class PreparedDevice:
    """One device a plugin's NodePrepareResources answered for a claim."""

    driver: str
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class _Entry:
    health: str
    message: str
    timeout_s: float
    received: float


def truncate(message: str) -> str:
    return message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 3] + "..."


class HealthCache:
    """What kubelet knows of each driver's devices; see the module docstring."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._drivers: dict[str, dict[Key, _Entry]] = {}

    def update(self, driver: str, devices: Iterable[pb.DeviceHealth]) -> set[Key]:
        """Take one stream message; the devices that changed."""
        now = self._clock()
        known = self._drivers.setdefault(driver, {})
        changed: set[Key] = set()
        reported: set[Key] = set()
        for d in devices:
            key = (d.device.pool_name, d.device.device_name)
            timeout = (
                float(d.health_check_timeout_seconds)
                if d.health_check_timeout_seconds > 0
                else DEFAULT_TIMEOUT_S
            )
            entry = _Entry(HEALTH_NAMES.get(d.health, "Unknown"), truncate(d.message), timeout, now)
            old = known.get(key)
            if old is None or (old.health, old.message, old.timeout_s) != (
                entry.health,
                entry.message,
                entry.timeout_s,
            ):
                changed.add(key)
            known[key] = entry
            reported.add(key)
        for key, old in list(known.items()):
            if key not in reported and old.health != "Unknown" and now - old.received > old.timeout_s:
                known[key] = _Entry("Unknown", "", old.timeout_s, now)
                changed.add(key)
        return changed

    def clear(self, driver: str) -> None:
        self._drivers.pop(driver, None)

    def get(self, driver: str, pool: str, device: str) -> tuple[str, str]:
        """(health, message) of one device now."""
        entry = self._drivers.get(driver, {}).get((pool, device))
        if entry is None or self._clock() - entry.received > entry.timeout_s:
            return ("Unknown", "")
        return (entry.health, entry.message)


async def watch(
    channel: grpc.aio.Channel,
    *,
    driver: str,
    cache: HealthCache,
    on_change: Callable[[str, set[Key]], None],
    retry_s: float = RETRY_S,
) -> None:
    """kubelet's health stream loop for one registered plugin, until cancelled."""
    stub = pb_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
    while True:
        try:
            async for message in stub.NodeWatchResources(pb.NodeWatchResourcesRequest()):
                changed = cache.update(driver, message.devices)
                if changed:
                    on_change(driver, changed)
            log.info("DRA plugin %s: the health stream ended", driver)
        except grpc.aio.AioRpcError as err:
            # kubelet logs "Error receiving from WatchResources stream" and tries again
            log.debug("DRA plugin %s: health stream: %s %s", driver, err.code().name, err.details())
        cache.clear(driver)
        await asyncio.sleep(retry_s)


class HealthWatch:
    """The cache and one :func:`watch` task per registered driver."""

    def __init__(self, *, retry_s: float = RETRY_S) -> None:
        self.cache = HealthCache()
        self.retry_s = retry_s
        self.on_change: Callable[[str, set[Key]], None] = lambda driver, keys: None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, driver: str, channel: grpc.aio.Channel) -> None:
        """Watch ``driver``'s plugin on ``channel`` (its registration; replaces any earlier watch)."""
        old = self._tasks.pop(driver, None)
        if old is not None:
            old.cancel()
        self._tasks[driver] = asyncio.create_task(
            watch(channel, driver=driver, cache=self.cache, on_change=self._changed, retry_s=self.retry_s),
            name=f"dra-health-{driver}",
        )

    async def stop(self, driver: str) -> None:
        """``driver`` deregistered: its stream is cancelled, its devices read Unknown."""
        task = self._tasks.pop(driver, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.cache.clear(driver)

    def _changed(self, driver: str, keys: set[Key]) -> None:
        self.on_change(driver, keys)


async def sync_pod(
    api: KubeApi,
    status: StatusWriter,
    *,
    pod_ref: Mapping[str, Any],
    statuses_for: Callable[[JsonObj, list[JsonObj]], list[JsonObj]],
) -> None:
    """Write the pod's ``allocatedResourcesStatus`` anew when it changed (kubelet's status sync
    after a health update); a pod not running yet is left to its admission, which writes it."""
    meta = pod_ref["metadata"]
    ns = meta.get("namespace") or "default"
    try:
        pod = await api.get("pods", meta["name"], namespace=ns)
    except errors.KubeError as err:
        log.info("pod %s/%s: health sync skipped: %s", ns, meta["name"], err)
        return
    current = (pod.get("status") or {}).get("containerStatuses") or []
    if pod["metadata"].get("uid") != meta.get("uid") or not current:
        return
    statuses = statuses_for(pod, current)
    if statuses == current:
        return
    try:
        await status.merge_patch_status(
            "pods", meta["name"], {"status": {"containerStatuses": statuses}}, namespace=ns
        )
    except errors.KubeError as err:
        log.warning("pod %s/%s: writing its resources' health: %s", ns, meta["name"], err)


class PreparedClaim(Protocol):
    """A claim kubelet prepared (``kubeletdra.ClaimInfo``)."""

    devices: list[PreparedDevice]
    pods: set[str]
    prepared: bool


class PodHealth:
    """Keeps pods' ``allocatedResourcesStatus`` current: the statuses admission writes, and the
    sync of the pods holding a device a health message changed (kubelet's update channel)."""

    def __init__(
        self,
        api: KubeApi,
        status: StatusWriter,
        *,
        cache: HealthCache,
        claims: Mapping[tuple[str, str], PreparedClaim],
        claim_name: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None],
        pod_by_uid: Callable[[str], JsonObj | None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        """``claims``: (namespace, claim name) -> the prepared claim (read live); ``claim_name``:
        the claim of a pod's ``resourceClaims`` entry; ``spawn``: run a sync in the background."""
        self._api = api
        self._status = status
        self._cache = cache
        self._claims = claims
        self._claim_name = claim_name
        self._pod_by_uid = pod_by_uid
        self._spawn = spawn

    def pod_devices(self, pod: Mapping[str, Any]) -> dict[str, list[PreparedDevice]]:
        """The pod's claim entry name -> the devices prepared for its claim (prepared ones only)."""
        ns = (pod.get("metadata") or {}).get("namespace") or "default"
        out = {}
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            name = self._claim_name(pod, entry)
            info = self._claims.get((ns, name)) if name is not None else None
            if info is not None and info.prepared:
                out[str(entry.get("name"))] = info.devices
        return out

    def statuses(self, pod: JsonObj, statuses: list[JsonObj]) -> list[JsonObj]:
        return container_statuses(pod, statuses, claims=self.pod_devices(pod), cache=self._cache)

    def changed(self, driver: str, keys: set[Key]) -> None:
        """A health message changed ``keys`` of ``driver``: sync the pods holding them."""
        uids = {
            uid
            for info in self._claims.values()
            if any(d.driver == driver and (d.pool, d.device) in keys for d in info.devices)
            for uid in info.pods
        }
        for uid in uids:
            pod = self._pod_by_uid(uid)
            if pod is not None:
                self._spawn(sync_pod(self._api, self._status, pod_ref=pod, statuses_for=self.statuses))


def _resource_ids(devices: Sequence[PreparedDevice], request: str, cache: HealthCache) -> list[JsonObj]:
    out: list[JsonObj] = []
    seen: set[str] = set()
    base = request.split("/", 1)[0]
    for d in devices:
        if request and d.requests and base not in d.requests:
            continue
        resource_id = d.cdi_ids[0] if d.cdi_ids else f"{d.driver}/{d.pool}/{d.device}"
        if resource_id in seen:
            continue
        seen.add(resource_id)
        health, message = cache.get(d.driver, d.pool, d.device)
        entry: JsonObj = {"resourceID": resource_id, "health": health}
        if message:
            entry["message"] = message
        out.append(entry)
    return out


def container_statuses(
    pod: Mapping[str, Any],
    statuses: Sequence[Mapping[str, Any]],
    *,
    claims: Mapping[str, Sequence[PreparedDevice]],
    cache: HealthCache,
) -> list[JsonObj]:
    """``statuses`` (the pod's ``containerStatuses``) with ``allocatedResourcesStatus`` as kubelet
    writes it; ``claims``: the pod's claim entry name -> the devices prepared for its claim."""
    specs = {c.get("name"): c for c in (pod.get("spec") or {}).get("containers") or ()}
    out = []
    for given in statuses:
        status = dict(given)
        refs = ((specs.get(status.get("name")) or {}).get("resources") or {}).get("claims") or ()
        if refs:
            entries = []
            for ref in refs:
                name, request = str(ref.get("name", "")), str(ref.get("request") or "")
                if name not in claims:
                    continue
                resources = _resource_ids(claims[name], request, cache)
                if resources:
                    full = f"claim:{name}/{request}" if request else f"claim:{name}"
                    entries.append({"name": full, "resources": resources})
            if entries:
                status["allocatedResourcesStatus"] = entries
            else:
                status.pop("allocatedResourcesStatus", None)
        out.append(status)
    return out
