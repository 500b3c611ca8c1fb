"""``vgpu-device-plugin``: the composition root. Builds the GPU backend, the Kubernetes API, the pod
cache, the reporter and the plugin manager from flags and config; owns signals; runs everything.

SIGTERM/SIGINT stop cleanly (sockets removed, GPUs unhealthy in the annotation, Lease released);
SIGHUP re-reads the GPUs and re-serves + re-registers. ``--mode dra`` runs the DRA driver instead
(``run_dra``): the ResourceSlice publisher and the kubelet DRA plugin (registration socket and
DRAPlugin service), and neither the device-plugin resources nor the extender's node annotations. Exit codes: 0 after a clean stop, 1 when the
GPU driver is missing and ``--fail-on-init-error`` is true, 2 for bad flags or config.
"""

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Protocol

import yaml
from vgpu import logsink
from vgpu.core import annotations, errors
from vgpu.core import config as core_config
from vgpu.core.config import DevicePluginConfig
from vgpu.core.dra import cdiclaim
from vgpu.core.dra import names as dra_names
from vgpu.gpu import fake, nvml
from vgpu.gpu.port import GpuBackend
from vgpu.kube import client
from vgpu.kube.port import ClaimReader, KubeApi

from vgpu_device_plugin import config, dirwatch, hamicore, inventory, reporter
from vgpu_device_plugin.dra import healthwatch, prepare, registrar, service, slicepub
from vgpu_device_plugin.health import HealthMonitor, HealthTracker
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.manager import Deps, PluginManager
from vgpu_device_plugin.podcache import InformerView

log = logging.getLogger("vgpu_device_plugin")


def build_backend(settings: config.Settings) -> GpuBackend:
    """The GPU backend, opened. GpuBackendError when the driver (or fake file) is unusable."""
    if settings.backend == "fake":
        assert settings.fake_gpus is not None  # checked by config.resolve
        try:
            raw = yaml.safe_load(settings.fake_gpus.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise errors.GpuBackendError(f"fake GPUs: cannot load {settings.fake_gpus}: {exc}") from None
        fake_backend = fake.FakeGpuBackend.from_yaml(raw, seed=settings.node)
        fake_backend.open()
        return fake_backend
    backend = nvml.load(sysfs_root=settings.sysfs_root)
    backend.open()
    return backend


def build_api(settings: config.Settings) -> client.OfficialKubeApi:
    """The production KubeApi adapter (the official client): ``--kubeconfig``, else in-cluster."""
    return client.OfficialKubeApi.from_kubeconfig(settings.kubeconfig)


async def _serve(
    settings: config.Settings, *, api: client.OfficialKubeApi, backend: GpuBackend, init_error: str
) -> int:
    try:
        if settings.mode == "dra":
            return await run_dra(settings, api=api, backend=backend)
        return await run(settings, api=api, backend=backend, init_error=init_error)
    finally:
        await api.close()


async def run(settings: config.Settings, *, api: KubeApi, backend: GpuBackend, init_error: str = "") -> int:
    """Run until SIGTERM/SIGINT (or ``stop`` on the returned manager); returns the exit code.

    ``init_error``: why the GPU backend did not start (``--fail-on-init-error=false``); written to the
    node so the scheduler and operators see why the node has no GPUs."""
    cfg = settings.device_plugin
    keys = annotations.Keys(settings.config.annotation_prefix)
    view = InformerView(api, node=settings.node)
    deps = Deps(
        backend=backend,
        api=api,
        view=view,
        reporter=reporter.NodeReporter(
            api,
            node=settings.node,
            keys=keys,
            lease_namespace=settings.config.scheduler.lease_namespace,
            lease_duration_s=int(settings.config.scheduler.lease_timeout_s),
            register_interval_s=cfg.register_interval_s,
            init_error=init_error,
        ),
        config=cfg,
        node=settings.node,
        plugin_dir=settings.plugin_dir,
        host=HostFs(settings.host_root, hook_path=cfg.hook_path),
        keys=keys,
        node_feed=view,
        pod_feed=view,
    )
    manager = PluginManager(deps)
    loop = asyncio.get_running_loop()
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    loop.add_signal_handler(signal.SIGTERM, manager.request_stop)
    loop.add_signal_handler(signal.SIGINT, manager.request_stop)
    loop.add_signal_handler(signal.SIGHUP, manager.request_restart, "SIGHUP")
    try:
        async with asyncio.TaskGroup() as tg:
            view_task = tg.create_task(view.run(), name="pod-cache")
            log.info("node %s: waiting for the pod and node caches to fill", settings.node)
            synced = asyncio.ensure_future(view.wait_synced())
            stopping = asyncio.ensure_future(manager.stopping.wait())
            await asyncio.wait({synced, stopping}, return_when=asyncio.FIRST_COMPLETED)
            for waiter in (synced, stopping):
                waiter.cancel()
            await asyncio.gather(synced, stopping, return_exceptions=True)
            if not manager.stopping.is_set():
                await manager.run()
            view_task.cancel()
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        backend.close()
    log.info("node %s: device plugin stopped", settings.node)
    return 0


class DraApi(KubeApi, ClaimReader, Protocol):
    """The API calls of the DRA mode: the port's, and reading ResourceClaims."""


class SlicePublish(Protocol):
    """Keeps the node's ResourceSlice current until cancelled (``publish_slices``'s shape)."""

    async def __call__(
        self,
        api: KubeApi,
        *,
        node: str,
        inv: inventory.Inventory,
        config: DevicePluginConfig,
        monitor: HealthMonitor,
    ) -> None: ...


async def publish_slices(
    api: KubeApi,
    *,
    node: str,
    inv: inventory.Inventory,
    config: DevicePluginConfig,
    monitor: HealthMonitor,
) -> None:
    """Keep this node's ResourceSlice current until cancelled (``dra.slicepub``)."""
    await slicepub.run(api, node=node, inventory_source=slicepub.MonitorSource(node, inv, config, monitor))


async def run_dra(
    settings: config.Settings,
    *,
    api: DraApi,
    backend: GpuBackend,
    publish: SlicePublish = publish_slices,
    watcher: dirwatch.DirWatcher | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """The DRA mode until SIGTERM/SIGINT (or ``stop``): GPU health, the slice publisher, the
    kubelet DRA plugin (``dra.prepare``/``service``/``registrar``); returns the exit code (1 when
    the DRAPlugin socket cannot be served)."""
    cfg = settings.device_plugin
    node = settings.node
    stop = stop if stop is not None else asyncio.Event()
    inv = inventory.build(await asyncio.to_thread(backend.devices), cfg)
    inventory.log_gpus(inv, node=node)
    tracker = HealthTracker(
        [g.uuid for g in inv.gpus],
        clock=time.monotonic,
        recovery_s=cfg.health_recovery_s,
        ignored_xids=cfg.ignored_xids,
        xid_checks=cfg.health_checks_enabled,
    )
    monitor = HealthMonitor(
        backend,
        tracker,
        probe_interval_s=cfg.health_probe_interval_s,
        events_enabled=cfg.health_checks_enabled,
    )
    host = HostFs(settings.host_root, hook_path=cfg.hook_path)
    scale = max(1.0, cfg.device_memory_scaling)
    gpus = [cdiclaim.Gpu(ref=inv.refs[g.uuid], memory_mib=int(g.memory_mib * scale)) for g in inv.shared_gpus]
    preparer = prepare.Preparer(
        prepare.Deps(
            claims=api, node=node, config=cfg, gpus=gpus, host=host, plugin_dir=settings.dra_plugin_dir
        )
    )
    await preparer.start()
    server = service.DraServer(
        preparer,
        settings.dra_plugin_dir / dra_names.DRA_SOCKET,
        health=healthwatch.MonitorHealth(slicepub.MonitorSource(node, inv, cfg, monitor)),
    )
    reg = registrar.Registrar(
        registrar.RegistrationService(driver=dra_names.DRIVER, endpoint=server.socket_path),
        settings.registry_dir / dra_names.REGISTRATION_SOCKET,
        watcher=watcher if watcher is not None else dirwatch.InotifyWatcher(),
        node=node,
        poll_s=cfg.kubelet_poll_s,
    )
    files = hamicore.HamiCoreWatch(host, node=node)
    shared = [g.uuid for g in inv.shared_gpus]
    loop = asyncio.get_running_loop()
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    # the extender mode's SIGHUP re-reads the GPUs; here a restart of the pod does (the slice and
    # the prepared claims survive it), so SIGHUP is only logged instead of ending the process
    loop.add_signal_handler(
        signal.SIGHUP, log.info, "node %s: SIGHUP ignored in DRA mode (restart the pod)", node
    )
    try:
        try:
            await server.start()
        except OSError as exc:  # its directory missing or not ours: the pod restarts and tries again
            log.error("node %s: %s", node, exc)
            return 1
        if shared:
            await files.apply(monitor, shared)
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(monitor.run(), name="health"),
                tg.create_task(publish(api, node=node, inv=inv, config=cfg, monitor=monitor), name="slices"),
                tg.create_task(reg.run(), name="dra-registration"),
            ]
            if shared:
                watch = files.run(monitor, shared, interval_s=cfg.health_probe_interval_s)
                tasks.append(tg.create_task(watch, name="hami-core-files"))
            log.info("node %s: DRA driver %s running with %d GPU(s)", node, dra_names.DRIVER, len(gpus))
            await stop.wait()
            for task in tasks:
                task.cancel()
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        await server.stop()
        backend.close()
    log.info("node %s: DRA plugin stopped", node)
    return 0


def _configure_logging(verbose: int) -> logsink.LogSink:
    """Log lines are written by a thread, never by the event loop (Allocate's path)."""
    level = logging.WARNING if verbose < 0 else logging.DEBUG if verbose >= 2 else logging.INFO
    return logsink.to_stderr(level)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = config.resolve(argv, os.environ)
    except errors.ConfigError as exc:
        print(f"vgpu-device-plugin: {exc}", file=sys.stderr)
        return 2
    sink = _configure_logging(settings.verbose)
    try:
        return _main(settings)
    finally:
        sink.close()


def _main(settings: config.Settings) -> int:
    resolved = core_config.to_dict(settings.device_plugin)
    log.info(
        "starting on node %s in %s mode: backend %s, device-plugin path %s, host root %s, config %s",
        settings.node,
        settings.mode,
        settings.backend,
        settings.plugin_dir,
        settings.host_root,
        json.dumps(resolved, sort_keys=True),
    )
    init_error = ""
    try:
        backend = build_backend(settings)
    except errors.GpuBackendError as exc:
        if settings.fail_on_init_error:
            log.error(
                "node %s: %s (use --fail-on-init-error=false to run with zero devices)", settings.node, exc
            )
            return 1
        log.warning("node %s: %s; running with zero devices (--fail-on-init-error=false)", settings.node, exc)
        backend = fake.FakeGpuBackend([])
        init_error = str(exc)
    try:
        api = build_api(settings)
    except errors.ConfigError as exc:  # a missing or unusable kubeconfig (translated by the adapter)
        log.error("node %s: cannot load the Kubernetes configuration: %s", settings.node, exc)
        backend.close()
        return 2
    return asyncio.run(_serve(settings, api=api, backend=backend, init_error=init_error))


if __name__ == "__main__":
    sys.exit(main())
