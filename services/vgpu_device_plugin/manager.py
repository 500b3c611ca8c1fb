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
kubelet.sock changes. A GPU an earlier session served that the driver no longer lists is still
served, Unhealthy, until its probes heal it.

The count resource (``nvidia.com/gpu``) registers first and its failure fails the session (or, on
a re-registration, ends it); another resource's failed Register (a MIG profile) is logged and
retried every ``start_retry_s`` while the others serve. The liveness Lease is renewed only while
kubelet has the plugin (``lease``): the count resource registered (at the session's start or
again after a kubelet restart) and its ListAndWatch stream open. On stop the sockets are removed,
GPUs marked unhealthy and the Lease released. Across sessions, the per-container directories of
pods that are gone are removed (``containerdirs``), and Allocate's write queue, the overlay of
what it will leave and the ledger of answers are kept (a new session's Allocate sees them all).
"""

import asyncio
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
    containerdirs,
    dirwatch,
    hamicore,
    inventory,
    lease,
    ledger,
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


class PluginManager:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.services: list[DevicePluginService] = []
        self.monitor: HealthMonitor | None = None
        self.sessions_started = 0
        self.registrations = 0  # every resource registered: at a session's start and after kubelet restarts
        self.start_failures = 0
        self.missing_cdi_devices: list[str] = []  # CDI device names no spec on the host defines
        self.writes = writebehind.WriteQueue()  # Allocate's writes, made after its answers
        self.overlay = PodOverlay()  # what those writes will leave (a new session must see it too)
        # a change in the device-plugin directory (kubelet restarted) cuts the sleep between checks short
        self._waker = dirwatch.Waker(
            deps.dir_watcher, deps.plugin_dir, node=deps.node, poll_s=deps.config.kubelet_poll_s
        )
        self.stopping = asyncio.Event()  # set by request_stop
        self._stop = False
        self._restart_reason = ""
        self._last_gpus: list[Gpu] = []
        self._last_devices: list[DeviceInfo] = []  # the GPUs the last session served
        self._started = asyncio.Condition()
        self.lease = lease.LeaseKeeper(
            reporter=deps.reporter,
            api=deps.api,
            view=deps.view,
            node=deps.node,
            keys=deps.keys,
            renew_s=deps.config.lease_renew_s,
        )
        self._register_retry: asyncio.Task[None] | None = None  # resources kubelet did not take yet
        self.hami_core = hamicore.HamiCoreWatch(deps.host, node=deps.node)
        self.answers = ledger.Ledger(clock=deps.clock)  # Allocate's answers, across sessions

    @property
    def kubelet_socket(self) -> pathlib.Path:
        return self.deps.plugin_dir / registration.KUBELET_SOCKET

    def request_stop(self) -> None:
        self._stop = True
        self.stopping.set()
        self._waker.wake()

    def request_restart(self, reason: str = "restart requested") -> None:
        self._restart_reason = reason
        self._waker.wake()

    @property
    def alive(self) -> bool:
        """Whether kubelet has the plugin: the count resource registered and ListAndWatch open."""
        return self.lease.alive

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
        d = self.deps
        renewing = asyncio.create_task(self.lease.run(warn=lambda: self.sessions_started > 0), name="lease")
        reaper = containerdirs.ContainerDirReaper(
            host=d.host, view=d.view, api=d.api, node=d.node, clock=d.clock
        )
        sweeping = asyncio.create_task(reaper.run(), name="container-dirs")
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
            self._waker.close()
            await self.writes.close(timeout_s=10.0)  # the bind phases and lock releases still due
            for task in (renewing, sweeping):
                task.cancel()
            await asyncio.gather(renewing, sweeping, return_exceptions=True)
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
            await self._waker.sleep()

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
                hami_core_missing=self.hami_core.poke,
                answers=self.answers,
            )
        return PassthroughAllocator(resource=resource, config=d.config, refs=inv.refs, host=d.host)

    async def _session(self) -> str:
        d = self.deps
        cfg = d.config
        listed = await asyncio.to_thread(d.backend.devices)
        devices, missing = inventory.with_missing(listed, self._last_devices, node=d.node)
        self._last_devices = devices
        inv = inventory.build(devices, cfg)
        inventory.log_gpus(inv, node=d.node)
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
        d.host.cdi = await asyncio.to_thread(cdispecfile.publish, d.host, config=cfg, node=d.node)
        self.missing_cdi_devices = await cdiguard.check_specs(
            root=d.host.root, config=cfg, names=cdiguard.cdi_names(inv, cfg), node=d.node
        )
        shared_uuids = [g.uuid for g in inv.shared_gpus]
        if shared_uuids:  # checked before kubelet hears of the GPUs: never advertised healthy without it
            await self.hami_core.apply(monitor, shared_uuids)
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
            if shared_uuids:
                watch = self.hami_core.run(monitor, shared_uuids, interval_s=cfg.health_probe_interval_s)
                background.append(asyncio.create_task(watch, name="hami-core-files"))
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
            self.lease.serving(None)
            await self._stop_register_retry()
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
        """Serve every socket, then register each with kubelet, the count resource first (its
        failure raises); the others kubelet refused are retried in the background. Returns
        kubelet.sock's identity registered with."""
        for server in servers:
            await server.start()
        kubelet_id = _file_id(self.kubelet_socket)
        kubelet = registration.Kubelet(
            self.kubelet_socket, listening=lambda: _file_id(self.kubelet_socket) is not None
        )
        retry_s = self.deps.config.start_retry_s
        unregistered = await kubelet.register_all(
            [s.service for s in servers], on_primary=self.lease.serving, node=self.deps.node, retry_s=retry_s
        )
        await self._stop_register_retry()  # an earlier registration's, for servers now gone
        if unregistered:
            retry = kubelet.retry(unregistered, node=self.deps.node, retry_s=retry_s)
            self._register_retry = asyncio.create_task(retry, name="register-retry")
        self.services = [s.service for s in servers]
        async with self._started:
            self.registrations += 1
            self._started.notify_all()
        return kubelet_id

    async def _stop_register_retry(self) -> None:
        task, self._register_retry = self._register_retry, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

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
                self.lease.serving(None)  # until the fresh count resource is registered
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
            await self._waker.sleep()

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
