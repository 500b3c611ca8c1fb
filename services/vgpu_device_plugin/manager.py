"""The plugin lifecycle: start (inventory → serve → Register), watch for restarts, stop cleanly.

A *session* reads the GPUs, builds one gRPC server per resource, serves each socket and only then
registers it with kubelet, and runs health monitoring, the register-annotation publisher and the
outside-usage reporter (GPU memory used outside kube-vgpu, ``outside.py``). A
session ends when kubelet restarts (``kubelet.sock`` re-created, or our socket removed: polled
every ``kubelet_poll_s``), on ``request_restart()`` (SIGHUP), on ``request_stop()`` (SIGTERM) or
when a background task dies; then a new session starts. A session that fails to start is retried
after ``start_retry_s``, sooner when kubelet.sock changes. A GPU an earlier session served that the
driver no longer lists is still served, Unhealthy, until its probes heal it. The liveness Lease is
renewed across sessions; on stop the sockets are removed, GPUs marked unhealthy and the Lease released.
"""

import asyncio
import contextlib
import logging
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vgpu.core import annotations, errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import Gpu
from vgpu.gpu.port import DeviceInfo, EventKind, GpuBackend, GpuEvent
from vgpu.kube.port import KubeApi
from vgpu.waits import wait_at_most

from vgpu_device_plugin import cachesweep, inventory, lockreaper, registration
from vgpu_device_plugin.allocator import HamiAllocator
from vgpu_device_plugin.health import HealthMonitor, HealthTracker
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.outside import OutsideUsageReporter
from vgpu_device_plugin.passthrough import PassthroughAllocator
from vgpu_device_plugin.podcache import ClusterView, NodeFeed
from vgpu_device_plugin.reporter import NodeReporter
from vgpu_device_plugin.server import AllocateHandler, DevicePluginService, PluginServer

log = logging.getLogger(__name__)

# a per-container directory younger than this is kept even when its pod is not (yet) in the view
CACHE_DIR_GRACE_S = 60.0


@dataclass
class Deps:
    """Everything a plugin session needs, built by main (or by a test)."""

    backend: GpuBackend
    api: KubeApi
    view: ClusterView
    reporter: NodeReporter
    config: DevicePluginConfig  # already resolved for this node
    node: str
    plugin_dir: pathlib.Path
    host: HostFs
    keys: annotations.Keys = field(default_factory=annotations.Keys)
    clock: Callable[[], float] = time.monotonic
    # the node watch's changes, for Allocate's late lock release (main passes the view itself)
    node_feed: NodeFeed | None = None


def _file_id(path: pathlib.Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns)


def _with_missing(
    listed: list[DeviceInfo], previous: list[DeviceInfo]
) -> tuple[list[DeviceInfo], list[DeviceInfo]]:
    """The GPUs to serve: those listed now plus those an earlier session served that are missing
    now (off the bus), in index order; and the missing ones. A GPU is never dropped by a restart."""
    seen = {d.uuid for d in listed}
    missing = [d for d in previous if d.uuid not in seen]
    return sorted([*listed, *missing], key=lambda d: d.index), missing


class PluginManager:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.services: list[DevicePluginService] = []
        self.monitor: HealthMonitor | None = None
        self.sessions_started = 0
        self.start_failures = 0
        self._wake = asyncio.Event()
        self.stopping = asyncio.Event()  # set by request_stop
        self._stop = False
        self._restart_reason = ""
        self._last_gpus: list[Gpu] = []
        self._last_devices: list[DeviceInfo] = []  # the GPUs the last session served
        self._started = asyncio.Condition()

    @property
    def kubelet_socket(self) -> pathlib.Path:
        return self.deps.plugin_dir / registration.KUBELET_SOCKET

    def request_stop(self) -> None:
        self._stop = True
        self.stopping.set()
        self._wake.set()

    def request_restart(self, reason: str = "restart requested") -> None:
        self._restart_reason = reason
        self._wake.set()

    async def wait_started(self, count: int) -> None:
        """Wait until ``count`` sessions have registered with kubelet (for tests and the demo)."""
        async with self._started:
            await self._started.wait_for(lambda: self.sessions_started >= count)

    async def wait_failures(self, count: int) -> None:
        """Wait until ``count`` session starts have failed."""
        async with self._started:
            await self._started.wait_for(lambda: self.start_failures >= count)

    async def run(self) -> None:
        lease = asyncio.create_task(self._lease_loop(), name="lease")
        try:
            while not self._stop:
                try:
                    reason = await self._session()
                except (errors.VgpuError, OSError) as exc:
                    log.error(
                        "node %s: plugin start failed: %s; retrying in %.0f s",
                        self.deps.node,
                        exc,
                        self.deps.config.start_retry_s,
                    )
                    async with self._started:
                        self.start_failures += 1
                        self._started.notify_all()
                    await self._wait_retry()
                    continue
                log.info("node %s: plugin session ended: %s", self.deps.node, reason)
        finally:
            lease.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lease
            await self.deps.reporter.shutdown(self._last_gpus)

    async def _wait_retry(self) -> None:
        start = self.deps.clock()
        seen = _file_id(self.kubelet_socket)
        while not self._stop and self.deps.clock() - start < self.deps.config.start_retry_s:
            if self._restart_reason:
                self._restart_reason = ""
                return
            if _file_id(self.kubelet_socket) != seen:
                log.info("node %s: kubelet.sock changed; retrying now", self.deps.node)
                return
            await self._sleep_or_wake(self.deps.config.kubelet_poll_s)

    async def _sleep_or_wake(self, seconds: float) -> None:
        await wait_at_most(self._wake.wait(), seconds)
        self._wake.clear()

    def _handler(self, resource: inventory.Resource, inv: inventory.Inventory) -> AllocateHandler:
        d = self.deps
        if resource.shared:
            return HamiAllocator(
                api=d.api, view=d.view, node=d.node, config=d.config, keys=d.keys, refs=inv.refs, host=d.host
            )
        return PassthroughAllocator(resource=resource, config=d.config, refs=inv.refs, host=d.host)

    async def _session(self) -> str:
        d = self.deps
        cfg = d.config
        listed = await asyncio.to_thread(d.backend.devices)
        devices, missing = _with_missing(listed, self._last_devices)
        for gone in missing:
            log.warning(
                "node %s: GPU %d %s not listed by the driver; kept as Unhealthy until it answers again",
                d.node,
                gone.index,
                gone.uuid,
            )
        self._last_devices = devices
        inv = inventory.build(devices, cfg)
        if not inv.gpus:
            log.warning("node %s: no GPUs found; serving zero devices", d.node)
        for g in inv.gpus:
            log.info(
                "node %s: GPU %d %s %s %d MiB NUMA %s MIG %s",
                d.node,
                g.index,
                g.uuid,
                g.name,
                g.memory_mib,
                g.numa_node,
                "on" if g.mig_enabled else "off",
            )
        tracker = HealthTracker(
            [g.uuid for g in inv.gpus],
            clock=d.clock,
            recovery_s=cfg.health_recovery_s,
            ignored_xids=cfg.ignored_xids,
            xid_checks=cfg.health_checks_enabled,
        )
        if self.monitor is not None:
            tracker.adopt(self.monitor.tracker)
        served = set(tracker.uuids())
        for gone in missing:  # its probes (by UUID) fail while it is gone and heal it when it is back
            if gone.uuid in served:
                tracker.on_event(GpuEvent(EventKind.LOST, gone.uuid, detail="not listed by the driver"))
        monitor = HealthMonitor(
            d.backend,
            tracker,
            probe_interval_s=cfg.health_probe_interval_s,
            events_enabled=cfg.health_checks_enabled,
        )
        handlers = [(r, self._handler(r, inv)) for r in inv.resources]
        servers = [
            PluginServer(
                DevicePluginService(
                    resource=r,
                    health=monitor,
                    handler=handler,
                    get_preferred_allocation=cfg.get_preferred_allocation and r.shared,
                ),
                d.plugin_dir / r.socket_name,
            )
            for r, handler in handlers
        ]
        unsubscribe = [
            d.node_feed.subscribe_node(h.node_changed)
            for _, h in handlers
            if d.node_feed is not None and isinstance(h, HamiAllocator)
        ]
        background: list[asyncio.Task[None]] = []
        try:
            for server in servers:
                await server.start()
            for server in servers:
                await registration.register(
                    self.kubelet_socket,
                    endpoint=server.socket_path.name,
                    resource_name=server.service.resource.name,
                    plugin_options=server.service.options,
                    wait_for_ready=_file_id(self.kubelet_socket) is not None,
                )
            kubelet_id = _file_id(self.kubelet_socket)
            self.services = [s.service for s in servers]
            self.monitor = monitor
            background = [
                asyncio.create_task(monitor.run(), name="health"),
                asyncio.create_task(self._publish_loop(inv, monitor), name="register-annotation"),
            ]
            if cfg.outside_usage_enabled and inv.shared_gpus:
                outside = OutsideUsageReporter(
                    backend=d.backend,
                    api=d.api,
                    view=d.view,
                    host=d.host,
                    node=d.node,
                    keys=d.keys,
                    config=cfg,
                )
                shared = [g.uuid for g in inv.shared_gpus]
                background.append(asyncio.create_task(outside.run(shared), name="outside-usage"))
            async with self._started:
                self.sessions_started += 1
                self._started.notify_all()
            return await self._watch(servers, kubelet_id, background)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            for server in servers:
                await server.stop()
            for stop_feeding in unsubscribe:
                stop_feeding()

    async def _watch(
        self,
        servers: list[PluginServer],
        kubelet_id: tuple[int, int] | None,
        background: list[asyncio.Task[None]],
    ) -> str:
        while True:
            if self._stop:
                return "stop requested"
            if self._restart_reason:
                reason, self._restart_reason = self._restart_reason, ""
                return reason
            for server in servers:
                if not server.socket_path.exists():
                    return f"socket {server.socket_path} removed (kubelet restart?)"
            if _file_id(self.kubelet_socket) != kubelet_id:
                return "kubelet.sock re-created (kubelet restart)"
            for task in background:
                if task.done():
                    exc = task.exception() if not task.cancelled() else None
                    return f"background task {task.get_name()} ended: {exc!r}"
            await self._sleep_or_wake(self.deps.config.kubelet_poll_s)

    async def _publish_loop(self, inv: inventory.Inventory, monitor: HealthMonitor) -> None:
        d = self.deps
        while True:
            version = monitor.version
            gpus = inventory.register_gpus(inv, d.config, monitor.tracker.snapshot())
            self._last_gpus = gpus
            try:
                await d.reporter.publish(gpus)
            except errors.KubeError as exc:
                log.error("node %s: writing the register annotation failed: %s; retrying in 5 s", d.node, exc)
                await asyncio.sleep(5.0)
                continue
            await wait_at_most(monitor.wait_changed(version), d.config.register_interval_s)

    async def _lease_loop(self) -> None:
        d = self.deps
        while True:
            try:
                await d.reporter.renew_lease()
            except errors.KubeError as exc:
                log.error("node %s: lease renewal failed: %s", d.node, exc)
            try:  # a lock whose holder will never Allocate here must not outlive it
                await lockreaper.release_orphaned_lock(api=d.api, view=d.view, node=d.node, keys=d.keys)
            except errors.KubeError as exc:
                log.error("node %s: checking the node lock failed: %s", d.node, exc)
            # HAMi-core's directories of pods gone from the node (grace: the watch's delivery lag)
            live = cachesweep.live_uids(d.view.pods())
            await asyncio.to_thread(cachesweep.sweep, d.host, live_pod_uids=live, grace_s=CACHE_DIR_GRACE_S)
            await asyncio.sleep(d.config.lease_renew_s)
