"""The one aiohttp app: ``/filter``, ``/bind``, ``/webhook``, ``/healthz``, ``/readyz``, ``/metrics``.

``build_app`` wires handlers to an already-built ``Services`` group (tests pass fakes in).
``SchedulerService`` builds that group from a Config and a KubeApi, runs the watches that feed the
state, serves HTTP(S) and tears everything down in order; ``main.py`` only adds flags and signals.
Extender verbs answer HTTP 200 with ``Error`` set when they fail (kube-scheduler's contract);
a body that is not valid ExtenderArgs is HTTP 400 with the reason (and ``Error``).
"""

import asyncio
import contextlib
import datetime
import gc
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from vgpu.core import errors
from vgpu.core.config import Config
from vgpu.kube.port import KubeApi

from vgpu_scheduler import bodies
from vgpu_scheduler import load as load_mod
from vgpu_scheduler import state as state_mod
from vgpu_scheduler.binder import Binder
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.extender import Extender
from vgpu_scheduler.metrics import Metrics
from vgpu_scheduler.webhook import Webhook

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 20  # Nodes mode sends whole Node objects: thousands of them
SHUTDOWN_TIMEOUT_S = 2.0  # requests still running at shutdown get this long, then are cancelled
# (aiohttp then waits as long again for the cancelled handlers' clean-up)


@dataclass
class Services:
    """Everything the handlers use."""

    state: state_mod.ClusterState
    extender: Extender
    binder: Binder
    metrics: Metrics
    events: EventRecorder
    webhook: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    load: load_mod.Load = field(default_factory=load_mod.Load)


SERVICES = web.AppKey("services", Services)


def _bad_request(reason: str) -> web.Response:
    return web.json_response({"Error": reason}, status=400)


def parse_json(body: bytes) -> object:
    """The body as JSON, or ``ParseError`` (HTTP 400) saying why: not JSON, not UTF-8, nested too
    deep for the parser (RecursionError) or an integer past Python's 4,300-digit limit."""
    try:
        return json.loads(body)
    except RecursionError:
        raise errors.ParseError("body", "not acceptable JSON: nested too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and the digit limit are ValueErrors
        raise errors.ParseError("body", f"not JSON: {exc}") from None


async def _read_json(request: web.Request) -> object:
    return parse_json(await request.read())


async def _filter(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    started = time.perf_counter()
    outcome = "error"
    try:
        args = await _read_json(request)
        bodies.check_extender_args(args)
        reply = await services.extender.filter(args)
        outcome = reply.outcome
        return web.json_response(reply.body)
    except errors.ParseError as exc:
        outcome = "bad_request"
        return _bad_request(str(exc))
    except errors.VgpuError as exc:
        log.exception("filter failed")
        return web.json_response({"Error": str(exc)})
    finally:
        services.metrics.filter_seconds.labels(outcome).observe(time.perf_counter() - started)
        if outcome in ("error", "bad_request"):
            services.metrics.errors.labels("filter").inc()


async def _bind(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    started = time.perf_counter()
    outcome = "error"
    try:
        message = await services.binder.bind(await _read_json(request))
        outcome = "error" if message else "bound"
        return web.json_response({"Error": message})
    except errors.ParseError as exc:
        outcome = "bad_request"
        return _bad_request(str(exc))
    finally:
        services.metrics.bind_seconds.labels(outcome).observe(time.perf_counter() - started)
        if outcome != "bound":
            services.metrics.errors.labels("bind").inc()


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    if not services.ready.is_set():
        return web.Response(status=503, text="waiting for the first full sync of nodes, pods and leases")
    problem = services.load.problem()
    if problem is not None:
        return web.Response(status=503, text=problem)
    return web.Response(text="ok")


async def _metrics(request: web.Request) -> web.Response:
    metrics = request.app[SERVICES].metrics
    body = await asyncio.to_thread(metrics.render, metrics.snapshot())
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _no_webhook(_: web.Request) -> web.Response:
    return web.Response(status=503, text="admission webhook not configured")


def build_app(services: Services) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SERVICES] = services
    app.router.add_post("/filter", _filter)
    app.router.add_post("/bind", _bind)
    app.router.add_post("/webhook", services.webhook or _no_webhook)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)

    async def close_events(_: web.Application) -> None:
        await services.events.aclose()

    app.on_cleanup.append(close_events)
    return app


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class SchedulerService:
    """The whole extender process minus flags: state, watches, HTTP server."""

    def __init__(
        self,
        config: Config,
        api: KubeApi,
        *,
        clock: Callable[[], float] = time.time,
        wall_clock: Callable[[], datetime.datetime] = _utc_now,
        api_pool: load_mod.PoolBacklog | None = None,
    ) -> None:
        """``api_pool`` is the API adapter's call pool, for readiness (None: not checked)."""
        self.config = config
        self.api = api
        name = config.scheduler.scheduler_name
        self.events = EventRecorder(api, component=name)
        self.lag_probe = load_mod.LoopLagProbe()
        load = load_mod.Load(probe=self.lag_probe, pool=api_pool)

        def node_warning(node: dict[str, object], reason: str, message: str) -> None:
            with contextlib.suppress(RuntimeError):  # no running loop: only in unit tests
                self.events.emit(_node_ref(node), reason=reason, message=message, type="Warning")

        self.state = state_mod.ClusterState(config, clock=clock, on_node_warning=node_warning)
        self.informers = state_mod.informers(api, self.state)
        self.services = Services(
            state=self.state,
            extender=Extender(config=config, state=self.state, events=self.events, clock=clock),
            binder=Binder(
                config=config, state=self.state, api=api, events=self.events, wall_clock=wall_clock
            ),
            metrics=Metrics(self.state, clock=clock, events=self.events, load=load),
            events=self.events,
            webhook=Webhook(config, self.state).handle,
            load=load,
        )
        self.app = build_app(self.services)
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._froze_gc = False

    async def start(
        self, *, host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None
    ) -> str:
        """Start watching and serving; returns ``host:port`` actually bound (port 0 picks one)."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(inf.run(), name=f"informer-{inf.kind}") for inf in self.informers]
        self._tasks.append(loop.create_task(self._become_ready(), name="readiness"))
        self._tasks.append(loop.create_task(self.lag_probe.run(), name="loop-lag-probe"))
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=ssl_context)
        await site.start()
        address = self._runner.addresses[0]
        return f"{address[0]}:{address[1]}"

    async def run(
        self,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        on_listening: Callable[[str], None] | None = None,
    ) -> None:
        """Serve until cancelled, then tear down (the composition root runs this in a TaskGroup)."""
        try:
            address = await self.start(host=host, port=port, ssl_context=ssl_context)
            log.info(
                "serving the extender, webhook and metrics on %s (%s)",
                address,
                "https" if ssl_context else "http",
            )
            if on_listening is not None:
                on_listening(address)
            await asyncio.Event().wait()
        finally:
            await self.stop()

    async def _become_ready(self) -> None:
        await asyncio.gather(*(inf.synced.wait() for inf in self.informers))
        # informer callbacks are plain functions: the first lists are applied before synced is seen
        # the synced state is long-lived: keep it out of the cyclic GC's scans (filter p99)
        gc.collect()
        gc.freeze()
        self._froze_gc = True
        self.services.ready.set()
        log.info("state synced: %d nodes, %d pods; ready", len(self.state.nodes), len(self.state.pods))

    async def wait_ready(self, timeout_s: float = 10.0) -> None:
        await asyncio.wait_for(self.services.ready.wait(), timeout_s)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # closes the events recorder too
            self._runner = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.services.binder.aclose()
        await self.events.aclose()
        if self._froze_gc:  # hand the frozen objects back to the collector
            gc.unfreeze()
            self._froze_gc = False


def _node_ref(node: dict[str, object]) -> dict[str, object]:
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "uid": uid, "namespace": "default"},
    }
