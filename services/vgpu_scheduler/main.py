"""``vgpu-scheduler``: the composition root. Flags and the shared config file in; the Kubernetes API
adapter, the state, the HTTP(S) app built; signals owned; everything run in one TaskGroup.

Exit codes: 0 after SIGTERM/SIGINT, 2 for bad flags, config or TLS files, 1 when the server fails.
``--ready-file PATH`` receives two lines once listening, the Service port's ``host:port`` then the
extender's (so a demo can start it on port 0).

Stopping is bounded in every state: requests still running get ``SHUTDOWN_TIMEOUT_S``, watches
are closed (their sockets shut), API calls blocked in their daemon threads are abandoned, and a
watchdog started by the first SIGTERM/SIGINT ends the process with code 1 if the orderly stop has
not finished within ``STOP_DEADLINE_S`` (a loop stuck in one long step).
"""

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import ssl
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from vgpu import configfile, cpus, logsink
from vgpu.core import config as core_config
from vgpu.core import errors
from vgpu.kube import aioapi, offload
from vgpu.kube import client as kube_client

from vgpu_scheduler import app, certreload, limits, listener
from vgpu_scheduler.certreload import CertReloader

SchedulerApi = kube_client.OfficialKubeApi | aioapi.AioKubeApi | offload.OffloadedKubeApi
USER_AGENT = "vgpu-scheduler/v1"  # apiClient asyncio (the official client says OpenAPI-Generator/...)

log = logging.getLogger("vgpu_scheduler")
STOP_DEADLINE_S = 8.0  # below Kubernetes' default 30 s grace period, above an orderly stop (~2 s)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vgpu-scheduler",
        description="kube-scheduler extender (filter, bind), admission webhook, metrics",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG)")
    p.add_argument("--config", type=Path, help="shared kube-vgpu YAML config")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, help="port (default 8443 with TLS, else 8080; 0 picks a free one)")
    p.add_argument(
        "--extender-port",
        type=int,
        default=limits.DEFAULT_EXTENDER_PORT,
        help=f"loopback port (127.0.0.1) for kube-scheduler's /filter and /bind, plain HTTP "
        f"(default {limits.DEFAULT_EXTENDER_PORT}; 0 picks a free one)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=listener.Limits.max_connections,
        help=f"open connections per listener; more are closed at once (default {listener.Limits.max_connections})",
    )
    p.add_argument(
        "--extender-max-nodes",
        type=int,
        default=limits.DEFAULT_MAX_NODES,
        help=f"candidate nodes a /filter body may carry; sizes its body cap: 3 MiB for the pod plus 256 bytes a "
        f"node name, or 16 KiB a Node object with --extender-node-objects (default {limits.DEFAULT_MAX_NODES})",
    )
    p.add_argument(
        "--extender-node-objects",
        action="store_true",
        help="kube-scheduler's extender entry is not nodeCacheCapable, so /filter bodies carry a Node "
        "object per node, not its name: sizes the body cap for that (the chart sets nodeCacheCapable)",
    )
    p.add_argument("--tls-cert-file", type=Path, help="serving certificate (PEM); enables HTTPS")
    p.add_argument("--tls-key-file", type=Path, help="serving key (PEM)")
    p.add_argument(
        "--node-policy", choices=[p.value for p in core_config.Policy], help="overrides the config"
    )
    p.add_argument("--gpu-policy", choices=[p.value for p in core_config.Policy], help="overrides the config")
    p.add_argument("--scheduler-name", help="overrides scheduler.schedulerName")
    p.add_argument(
        "--ready-file",
        type=Path,
        help="write the Service and extender host:port here (two lines) once listening",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v info from libraries, -vv debug")
    return p


def load_config(args: argparse.Namespace) -> core_config.Config:
    """The config file (if any) with the flag overrides applied; ConfigError names the bad key."""
    config = configfile.load(args.config)
    overrides: dict[str, object] = {}
    if args.node_policy:
        overrides["node_policy"] = core_config.Policy(args.node_policy)
    if args.gpu_policy:
        overrides["gpu_policy"] = core_config.Policy(args.gpu_policy)
    if args.scheduler_name:
        overrides["scheduler_name"] = args.scheduler_name
    if overrides:
        config = dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler, **overrides))  # type: ignore[arg-type]
    return config


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if (args.tls_cert_file is None) != (args.tls_key_file is None):
        raise errors.ConfigError("--tls-cert-file/--tls-key-file", "give both or neither")
    if args.tls_cert_file is None:
        return None
    try:
        return certreload.server_context(args.tls_cert_file, args.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise errors.ConfigError("--tls-cert-file/--tls-key-file", f"cannot load: {exc}") from None


def check_listener_flags(args: argparse.Namespace) -> None:
    """ConfigError naming the flag when a listener flag is out of range."""
    for flag, port in (("--port", args.port), ("--extender-port", args.extender_port)):
        if port is not None and not 0 <= port <= 65535:
            raise errors.ConfigError(flag, f"not a port: {port}")
    for flag, value in (
        ("--max-connections", args.max_connections),
        ("--extender-max-nodes", args.extender_max_nodes),
    ):
        if value < 1:
            raise errors.ConfigError(flag, f"must be at least 1, got {value}")


def make_api(config: core_config.Config, kubeconfig: str | None, *, usable_cpus: float) -> SchedulerApi:
    """The API adapter ``scheduler.apiClient`` and ``apiWriter`` ask for (``auto`` weighs
    ``usable_cpus``), configured from ``kubeconfig`` (None: in-cluster, else the default
    kubeconfig); ``ConfigError`` when that cannot be loaded."""
    if config.scheduler.api_client is core_config.ApiClient.THREADS:
        return kube_client.OfficialKubeApi.from_kubeconfig(
            kubeconfig, api_workers=config.scheduler.api_workers
        )
    api = kube_client.aio_from_kubeconfig(
        kubeconfig, user_agent=USER_AGENT, max_in_flight=config.scheduler.api_workers
    )
    if not config.scheduler.writes_from_helper(usable_cpus=usable_cpus):
        return api
    # the helper loads the same configuration itself; loaded here first, so a bad one stops us
    factory = functools.partial(kube_client.aio_from_kubeconfig, kubeconfig, user_agent=USER_AGENT)
    return offload.OffloadedKubeApi(
        api,
        factory,
        max_in_flight=config.scheduler.api_workers,
        watches=config.scheduler.watches_from_helper(usable_cpus=usable_cpus),
    )


def _write_ready_file(path: Path, address: str, extender_address: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{address}\n{extender_address}\n")
    os.replace(tmp, path)


async def serve(
    config: core_config.Config,
    api: SchedulerApi,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    ready_file: Path | None,
    extender_port: int = limits.DEFAULT_EXTENDER_PORT,
    limits: limits.ListenerLimits | None = None,
    reloader: CertReloader | None = None,
) -> None:
    """Run until SIGTERM/SIGINT. ``reloader`` (with TLS) picks up rotated serving certificates."""
    pool = api.pool if isinstance(api, kube_client.OfficialKubeApi) else api  # readiness and /metrics
    service = app.SchedulerService(config, api, limits=limits, api_pool=pool)
    if reloader is not None:  # a reloaded pair serves the handshakes from then on
        ssl_context = reloader.context
        reloader.on_reload = service.use_ssl_context
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    watchdog: list[threading.Timer] = []

    def on_signal() -> None:
        stop.set()
        if not watchdog:
            timer = threading.Timer(STOP_DEADLINE_S, _force_exit)
            timer.daemon = True
            timer.start()
            watchdog.append(timer)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    def listening(address: str, extender_address: str) -> None:
        if ready_file is not None:
            _write_ready_file(ready_file, address, extender_address)

    try:
        if isinstance(api, offload.OffloadedKubeApi):
            await api.start()  # before the first bind: a child takes about a second to start
        async with asyncio.TaskGroup() as group:
            server = group.create_task(
                service.run(
                    host=host,
                    port=port,
                    ssl_context=ssl_context,
                    extender_port=extender_port,
                    on_listening=listening,
                ),
                name="server",
            )
            stopper = group.create_task(stop.wait(), name="signals")
            reloading = group.create_task(reloader.run(), name="cert-reload") if reloader else None
            await asyncio.wait([server, stopper], return_when=asyncio.FIRST_COMPLETED)
            log.info("stopping")
            server.cancel()
            stopper.cancel()
            if reloading is not None:
                reloading.cancel()
    except ExceptionGroup as group_error:
        failed_to_listen = group_error.subgroup(OSError)
        if failed_to_listen is not None:
            raise failed_to_listen.exceptions[0] from None
        raise
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await api.close()
        for timer in watchdog:
            timer.cancel()


def _force_exit() -> None:
    """The watchdog: the orderly stop took longer than STOP_DEADLINE_S; leave now."""
    sys.stderr.write(f"vgpu-scheduler: not stopped {STOP_DEADLINE_S:g} s after the signal; exiting\n")
    sys.stderr.flush()
    os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.verbose >= 2 else logging.INFO
    sink = logsink.to_stderr(level)  # log lines are written by a thread, never by the event loop
    if args.verbose == 0:
        logging.getLogger("aiohttp").setLevel(logging.WARNING)
    try:
        return _main(args)
    finally:
        sink.close()


def _main(args: argparse.Namespace) -> int:
    try:
        config = load_config(args)
        ssl_context = tls_context(args)
        check_listener_flags(args)
    except errors.ConfigError as exc:
        print(f"vgpu-scheduler: bad configuration: {exc}", file=sys.stderr)
        return 2
    port = args.port if args.port is not None else (8443 if ssl_context else 8080)
    log.info("resolved config: %s", json.dumps(core_config.to_dict(config), sort_keys=True))
    usable = cpus.usable()
    try:
        api = make_api(config, args.kubeconfig, usable_cpus=usable.cpus)
    except errors.ConfigError as exc:  # a missing or unusable kubeconfig (translated by the adapter)
        print(f"vgpu-scheduler: cannot load Kubernetes configuration: {exc}", file=sys.stderr)
        return 2
    helper = api if isinstance(api, offload.OffloadedKubeApi) else None  # what make_api decided
    log.info(
        "API writes: %s (scheduler.apiWriter: %s; %s); watches read %s (scheduler.apiWatches: %s)",
        "in this process" if helper is None else "from a helper process",
        config.scheduler.api_writer,
        usable.describe(),
        "by the helper" if helper is not None and helper.watches_in_child else "here",
        config.scheduler.api_watches,
    )
    reloader = (
        CertReloader(ssl_context, args.tls_cert_file, args.tls_key_file) if ssl_context is not None else None
    )
    try:
        asyncio.run(
            serve(
                config,
                api,
                host=args.host,
                port=port,
                ssl_context=ssl_context,
                ready_file=args.ready_file,
                extender_port=args.extender_port,
                limits=limits.ListenerLimits.build(
                    max_connections=args.max_connections,
                    max_nodes=args.extender_max_nodes,
                    node_objects=args.extender_node_objects,
                ),
                reloader=reloader,
            )
        )
    except OSError as exc:
        print(
            f"vgpu-scheduler: cannot serve on {args.host}:{port} and 127.0.0.1:{args.extender_port}: {exc}",
            file=sys.stderr,
        )
        return 1
    except errors.KubeError as exc:  # the API writer process could not start (offload.py)
        print(f"vgpu-scheduler: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
