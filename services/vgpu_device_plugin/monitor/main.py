"""``vgpu-monitor``: the usage monitor's composition root (a second container of the device-plugin
DaemonSet, same image). It takes the device plugin's flags and config (node, kubeconfig, GPU backend,
host root, hook path) plus ``--metrics-bind-address``, watches this node's pods, and serves
``/metrics`` and ``/healthz``. SIGTERM/SIGINT stop it. Exit codes: 0 after a clean stop, 2 for bad
flags or config. A GPU driver that cannot start is logged and the region metrics are still served.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
import signal
import sys
import time
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from vgpu import logsink
from vgpu.core import errors
from vgpu.gpu import fake
from vgpu.gpu.port import GpuBackend
from vgpu.kube.port import KubeApi

from vgpu_device_plugin import config
from vgpu_device_plugin import main as plugin_main
from vgpu_device_plugin.monitor.exporter import Monitor
from vgpu_device_plugin.podcache import InformerView

log = logging.getLogger("vgpu_monitor")

MONITOR = web.AppKey("monitor", Monitor)


def parser() -> argparse.ArgumentParser:
    p = config.parser(
        prog="vgpu-monitor",
        description="kube-vgpu usage monitor: what each GPU container really uses, on /metrics",
        modes=False,
    )
    p.add_argument(
        "--metrics-bind-address",
        default=":9394",
        help="host:port of /metrics and /healthz (HAMi's vGPU monitor port; port 0 picks a free one)",
    )
    return p


def containers_dir(settings: config.Settings) -> pathlib.Path:
    """Where Allocate puts each container's HAMi-core directory, as this process sees the host."""
    hook = settings.device_plugin.hook_path.strip("/")
    return settings.host_root.joinpath(hook, "vgpu", "containers")


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise errors.ConfigError("--metrics-bind-address", f"expected host:port, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


async def _metrics(request: web.Request) -> web.Response:
    body = await request.app[MONITOR].scrape()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_app(monitor: Monitor) -> web.Application:
    app = web.Application()
    app[MONITOR] = monitor
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    return app


async def run(
    settings: config.Settings,
    *,
    api: KubeApi,
    backend: GpuBackend,
    address: str,
    stop: asyncio.Event,
    ready: asyncio.Future[str] | None = None,
) -> int:
    """Serve until ``stop`` is set; ``ready`` gets the bound host:port once the pod cache has synced."""
    host, port = _split_address(address)
    view = InformerView(api, node=settings.node)
    monitor = Monitor(
        backend=backend,
        view=view,
        containers_dir=containers_dir(settings),
        node=settings.node,
        clock=time.time,
    )
    runner = web.AppRunner(build_app(monitor), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        log.info(
            "node %s: monitor serving /metrics on %s:%s, reading %s",
            settings.node,
            bound[0],
            bound[1],
            containers_dir(settings),
        )
        async with asyncio.TaskGroup() as tg:
            cache = tg.create_task(view.run(), name="monitor-pod-cache")
            synced = asyncio.ensure_future(view.wait_synced())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({synced, stopping}, return_when=asyncio.FIRST_COMPLETED)
            for waiter in (synced, stopping):
                waiter.cancel()
            await asyncio.gather(synced, stopping, return_exceptions=True)
            if ready is not None and not stop.is_set():
                ready.set_result(f"{bound[0]}:{bound[1]}")
            await stop.wait()
            cache.cancel()
    finally:
        await runner.cleanup()
        backend.close()
    log.info("node %s: monitor stopped", settings.node)
    return 0


async def _serve(settings: config.Settings, address: str, backend: GpuBackend) -> int:
    api = plugin_main.build_api(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        return await run(settings, api=api, backend=backend, address=address, stop=stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        settings = config.settings(args, os.environ)
        _split_address(args.metrics_bind_address)
    except errors.ConfigError as exc:
        print(f"vgpu-monitor: {exc}", file=sys.stderr)
        return 2
    level = (
        logging.WARNING if settings.verbose < 0 else logging.DEBUG if settings.verbose >= 2 else logging.INFO
    )
    sink = logsink.to_stderr(level)  # log lines are written by a thread, never by the event loop
    try:
        return _main(settings, args)
    finally:
        sink.close()


def _main(settings: config.Settings, args: argparse.Namespace) -> int:
    log.info(
        "starting on node %s: backend %s, host root %s, hook path %s, metrics on %s",
        settings.node,
        settings.backend,
        settings.host_root,
        settings.device_plugin.hook_path,
        args.metrics_bind_address,
    )
    try:
        backend = plugin_main.build_backend(settings)
    except errors.GpuBackendError as exc:
        log.warning(
            "node %s: %s; serving the containers' own figures without the driver's", settings.node, exc
        )
        backend = fake.FakeGpuBackend([])
    try:
        return asyncio.run(_serve(settings, args.metrics_bind_address, backend))
    except errors.ConfigError as exc:
        log.error("node %s: cannot load the Kubernetes configuration: %s", settings.node, exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
