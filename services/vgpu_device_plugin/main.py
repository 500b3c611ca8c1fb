"""``vgpu-device-plugin``: the composition root. Builds the GPU backend, the Kubernetes API, the pod
cache, the reporter and the plugin manager from flags and config; owns signals; runs everything.

SIGTERM/SIGINT stop cleanly (sockets removed, GPUs unhealthy in the annotation, Lease released);
SIGHUP re-reads the GPUs and re-serves + re-registers. Exit codes: 0 after a clean stop, 1 when the
GPU driver is missing and ``--fail-on-init-error`` is true, 2 for bad flags or config.
"""

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence

import yaml
from vgpu import logsink
from vgpu.core import annotations, errors
from vgpu.core import config as core_config
from vgpu.gpu import fake, nvml
from vgpu.gpu.port import GpuBackend
from vgpu.kube import client
from vgpu.kube.port import KubeApi

from vgpu_device_plugin import config, reporter
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
        "starting on node %s: backend %s, device-plugin path %s, host root %s, config %s",
        settings.node,
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
