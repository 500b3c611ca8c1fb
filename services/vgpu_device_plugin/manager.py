"""The plugin lifecycle: start (inventory → serve → Register), watch for restarts, stop cleanly.

A *session* reads the GPUs, builds one gRPC server per resource, serves each socket and only then
registers it with kubelet, and runs health monitoring, the register-annotation publisher and the
outside-usage reporter (GPU memory used outside kube-vgpu, ``outside.py``). A kubelet restart
(``kubelet.sock`` re-created, or our socket removed) is seen at once through inotify on the
device-plugin directory (``dirwatch``; polled every ``kubelet_poll_s`` where inotify is not
available, and as a safety net): the session serves fresh sockets and registers again with the
inventory and health it holds (no driver read, no grace period: kubelet re-admits its pods
within milliseconds of its restart). A session ends on ``request_restart()`` (SIGHUP), on
``request_stop()`` (SIGTERM), when re-registering fails or when a background task dies; then a new
session starts. A session that fails to start is retried after ``start_retry_s``, sooner when
kubelet.sock changes. A GPU an earlier session served that the
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

from vgpu_device_plugin import (
    cdiguard,
    cdispecfile,
    dirwatch,
    inventory,
    lockreaper,
    registration,
    writebehind,
)
from vgpu_device_plugin.allocator import HamiAllocator
from vgpu_device_plugin.health import HealthMonitor, HealthTracker
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.outside import OutsideUsageReporter
from vgpu_device_plugin.passthrough import PassthroughAllocator
from vgpu_device_plugin.podcache import ClusterView, NodeFeed, PodFeed
from vgpu_device_plugin.podoverlay import PodOverlay
from vgpu_device_plugin.reporter import NodeReporter
from vgpu_device_plugin.server import AllocateHandler, DevicePluginService, PluginServer

log = logging.getLogger(__name__)


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
    # the pod watch's changes, for GetPreferredAllocation's wait for a pod (main passes the view)
    pod_feed: PodFeed | None = None
    # how kubelet's restarts are seen at once (polling every kubelet_poll_s where it cannot watch)
    dir_watcher: dirwatch.DirWatcher = field(default_factory=dirwatch.InotifyWatcher)


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
        self.registrations = 0  # every resource registered: at a session's start and after kubelet restarts
        self.start_failures = 0
        self._dir_watch: dirwatch.Watch | None = None
        self.missing_cdi_devices: list[str] = []  # CDI device names no spec on the host defines
        self.writes = writebehind.WriteQueue()  # Allocate's writes, made after its answers
        self.overlay = PodOverlay()  # what those writes will leave (a new session must see it too)
        self._watch_mode = ""
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

    async def wait_registered(self, count: int) -> None:
        """Wait until every resource has been registered ``count`` times (sessions and re-registrations)."""
        async with self._started:
            await self._started.wait_for(lambda: self.registrations >= count)

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
            if self._dir_watch is not None:
                self._dir_watch.close()
                self._dir_watch = None
            await self.writes.close(timeout_s=10.0)  # the bind phases and lock releases still due
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
        self._ensure_dir_watch()
        await wait_at_most(self._wake.wait(), seconds)
        self._wake.clear()

    def _ensure_dir_watch(self) -> None:
        """Watch the device-plugin directory (again, after it went away); a change wakes the loop."""
        if self._dir_watch is not None and self._dir_watch.active:
            return
        self._dir_watch = self.deps.dir_watcher.watch(self.deps.plugin_dir, self._wake.set)
        mode = "inotify" if self._dir_watch is not None else "polling"
        if mode != self._watch_mode:
            log.info(
                "node %s: kubelet restarts are seen by %s on %s%s",
                self.deps.node,
                mode,
                self.deps.plugin_dir,
                "" if self._dir_watch is not None else f" (every {self.deps.config.kubelet_poll_s:g} s)",
            )
            self._watch_mode = mode

    def _handler(self, resource: inventory.Resource, inv: inventory.Inventory) -> AllocateHandler:
        handler = self._allocator(resource, inv)
        if self.deps.config.device_list_strategy != "cdi-cri":
            return handler
        guard = cdiguard.CdiGuard(handler, view=self.deps.view, config=self.deps.config, node=self.deps.node)
        guard.verdict()  # logs a warning now where the kubelet version calls for one
        return guard

    def _allocator(self, resource: inventory.Resource, inv: inventory.Inventory) -> AllocateHandler:
        d = self.deps
        if resource.shared:
            return HamiAllocator(
                api=d.api,
                view=d.view,
                node=d.node,
                config=d.config,
                keys=d.keys,
                refs=inv.refs,
                host=d.host,
                writes=self.writes,
                overlay=self.overlay,
                pod_feed=d.pod_feed,
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
        d.host.cdi = await asyncio.to_thread(cdispecfile.publish, d.host.root, config=cfg, node=d.node)
        self.missing_cdi_devices = await cdiguard.check_specs(
            root=d.host.root, config=cfg, names=cdiguard.cdi_names(inv, cfg), node=d.node
        )
        handlers = [(r, self._handler(r, inv)) for r in inv.resources]
        servers = self._servers(handlers, monitor)
        allocators = [h.inner if isinstance(h, cdiguard.CdiGuard) else h for _, h in handlers]
        unsubscribe = [
            d.node_feed.subscribe_node(h.node_changed)
            for h in allocators
            if d.node_feed is not None and isinstance(h, HamiAllocator)
        ]
        background: list[asyncio.Task[None]] = []
        try:
            kubelet_id = await self._serve_and_register(servers)
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
            return await self._watch(servers, kubelet_id, background, handlers=handlers, monitor=monitor)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            for server in servers:
                await server.stop()
            for stop_feeding in unsubscribe:
                stop_feeding()

    def _servers(
        self, handlers: list[tuple[inventory.Resource, AllocateHandler]], monitor: HealthMonitor
    ) -> list[PluginServer]:
        cfg = self.deps.config
        return [
            PluginServer(
                DevicePluginService(
                    resource=r,
                    health=monitor,
                    handler=handler,
                    get_preferred_allocation=cfg.get_preferred_allocation and r.shared,
                ),
                self.deps.plugin_dir / r.socket_name,
            )
            for r, handler in handlers
        ]

    async def _serve_and_register(self, servers: list[PluginServer]) -> tuple[int, int] | None:
        """Serve every socket, then register each with kubelet; kubelet.sock's identity registered with."""
        for server in servers:
            await server.start()
        kubelet_id = _file_id(self.kubelet_socket)
        for server in servers:
            await registration.register(
                self.kubelet_socket,
                endpoint=server.socket_path.name,
                resource_name=server.service.resource.name,
                plugin_options=server.service.options,
                wait_for_ready=kubelet_id is not None,
            )
        self.services = [s.service for s in servers]
        async with self._started:
            self.registrations += 1
            self._started.notify_all()
        return kubelet_id

    async def _watch(
        self,
        servers: list[PluginServer],
        kubelet_id: tuple[int, int] | None,
        background: list[asyncio.Task[None]],
        *,
        handlers: list[tuple[inventory.Resource, AllocateHandler]],
        monitor: HealthMonitor,
    ) -> str:
        """Until the session ends: on a kubelet restart serve fresh sockets and register again
        (``servers`` is updated in place, so the session stops the current ones)."""
        gone_before: list[str] = []
        while True:
            if self._stop:
                return "stop requested"
            if self._restart_reason:
                reason, self._restart_reason = self._restart_reason, ""
                return reason
            now = _file_id(self.kubelet_socket)
            removed = [s.socket_path.name for s in servers if not s.socket_path.exists()]
            # our socket gone while kubelet.sock is the one we registered with: most likely a kubelet
            # restart under way (the new kubelet wipes the directory, then makes kubelet.sock), so
            # wait for kubelet.sock to change; still the same on the next check: register again
            settled = not removed or removed == gone_before
            gone_before = removed
            if now is not None and (now != kubelet_id or (removed and settled)):
                why = (
                    "kubelet.sock re-created (kubelet restart)" if now != kubelet_id else f"{removed} removed"
                )
                fresh = self._servers(handlers, monitor)
                old, servers[:] = list(servers), fresh
                for server in old:  # kubelet dropped their connections; nothing to wait for
                    await server.stop(grace_s=0)
                try:
                    kubelet_id = await self._serve_and_register(servers)
                except (errors.VgpuError, OSError) as failure:
                    return f"registering again after {why} failed: {failure}"
                log.info("node %s: registered again after %s", self.deps.node, why)
                gone_before = []
                continue
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
            await asyncio.sleep(d.config.lease_renew_s)
