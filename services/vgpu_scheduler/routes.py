"""The scheduler's two route tables, their handlers and the servers built on them.

* **extender** (``EXTENDER_ROUTES``: ``/filter``, ``/bind``, ``/preempt``) on 127.0.0.1 only:
  kube-scheduler runs in the same pod and is the only caller these verbs may have, since they write
  decisions, node locks and Bindings with the scheduler's cluster-wide rights. Served by
  ``extender_http.py``: each verb takes the request body and returns a ``Reply``
  (``extender_wire.py``); ``/filter`` is a plain function, answered in the loop callback that
  reads the request.
* **service** (``SERVICE_ROUTES``: ``/healthz``, ``/readyz``, ``/metrics``, the dashboard's
  ``/ui`` routes, and ``/webhook``) on the Service port, an aiohttp app.

Handlers translate HTTP to the ``Services`` group (built by ``app.SchedulerService``) and back.
Extender verbs answer HTTP 200 with ``Error`` set when they fail (kube-scheduler's contract); a body
that is not valid ExtenderArgs is HTTP 400 with the reason (and ``Error``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from vgpu.core import errors

from vgpu_scheduler import bodies, extender_http, extender_wire, listener, ui, untrusted, viewaccess
from vgpu_scheduler import limits as limits_mod
from vgpu_scheduler import load as load_mod
from vgpu_scheduler import state as state_mod
from vgpu_scheduler.binder import Binder, parse_binding_args
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.extender import Extender
from vgpu_scheduler.extender_wire import Reply
from vgpu_scheduler.metrics import Metrics
from vgpu_scheduler.preempt import Preempter

log = logging.getLogger(__name__)

NOT_READY = (
    "the GPU scheduler has just started and its view of the cluster (nodes, pods, leases) is not "
    "synced yet; it asks for a retry once it is"
)
MAX_REFUSED_BEFORE_READY = 100_000  # uids kept for the retry after the sync (a few MiB at most)


@dataclass
class Services:
    """Everything the handlers use."""

    state: state_mod.ClusterState
    extender: Extender
    binder: Binder
    metrics: Metrics
    events: EventRecorder
    webhook: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None
    preempter: Preempter | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    load: load_mod.Load = field(default_factory=load_mod.Load)
    dashboard: ui.Dashboard | None = None  # None: built on the state and the extender's reasons
    views: viewaccess.ViewAccess | None = None  # None: /metrics and /ui* open (viewsAuth: none)
    hot_calls: int = 0  # /filter, /bind, /preempt and /webhook calls so far (idle: unchanged)
    # pods whose /filter or /bind was refused before the state synced: the sweep after it asks
    # kube-scheduler to retry them (retries.py, "After a start")
    refused_before_ready: set[str] = field(default_factory=set)

    def refuse_unready(self, verb: str, uid: str) -> str:
        """Note pod ``uid``'s call refused before the state synced; the answer's ``Error``."""
        if not self.refused_before_ready:
            log.info("answering %s with an error until the state has synced (pod uid %s first)", verb, uid)
        if uid and len(self.refused_before_ready) < MAX_REFUSED_BEFORE_READY:
            self.refused_before_ready.add(uid)
        return NOT_READY


SERVICES = web.AppKey("services", Services)


def parse_json(body: bytes) -> object:
    """An extender body as JSON, or ``ParseError`` (HTTP 400) saying why: a large body that cannot
    be what kube-scheduler sends, told without parsing it (``bodies.cannot_be_extender_args``), not
    JSON (NaN and Infinity included: ``bodies.loads``), not UTF-8, nested too deep for the parser
    (RecursionError) or an integer past Python's 4,300-digit limit."""
    if (why := bodies.cannot_be_extender_args(body)) is not None:
        raise errors.ParseError("body", why)
    try:
        return bodies.loads(body)
    except RecursionError:
        raise errors.ParseError("body", "not acceptable JSON: nested too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and the digit limit are ValueErrors
        raise errors.ParseError("body", f"not JSON: {exc}") from None


def filter_verb(services: Services, body: bytes) -> Reply:
    """``POST /filter``: decided from memory and answered in the turn that read it (extender_http)."""
    services.hot_calls += 1
    started = time.perf_counter()
    outcome = "error"
    try:
        args = parse_json(body)
        bodies.check_extender_args(args)
        if not services.ready.is_set():  # an empty or half-listed state would place pods on full GPUs
            return Reply(
                200, {"Error": services.refuse_unready("/filter", bodies.extender_args_pod_uid(args))}
            )
        raw, originals = untrusted.names_only(args, services.state.inventory.node_object)
        reply = services.extender.filter(raw)
        outcome = reply.outcome
        if reply.path is not None:
            services.metrics.filter_paths.labels(reply.path).inc()
        return Reply(200, untrusted.restore(reply.body, originals))
    except errors.ParseError as exc:
        outcome = "bad_request"
        return Reply(400, {"Error": str(exc)})
    except errors.VgpuError as exc:
        log.exception("filter failed")
        return Reply(200, {"Error": str(exc)})
    finally:
        services.metrics.filter_seconds.labels(outcome).observe(time.perf_counter() - started)
        if outcome in ("error", "bad_request"):
            services.metrics.errors.labels("filter").inc()


async def bind_verb(services: Services, body: bytes) -> Reply:
    """``POST /bind``: a task of its own (the Binding, the node lock and the decision are writes)."""
    services.hot_calls += 1
    started = time.perf_counter()
    outcome = "error"
    try:
        args = parse_json(body)
        if not services.ready.is_set():
            _, _, uid, _ = parse_binding_args(args)  # (a body that does not parse is still a 400)
            return Reply(200, {"Error": services.refuse_unready("/bind", uid)})
        message = await services.binder.bind(args)
        outcome = "error" if message else "bound"
        return Reply(200, {"Error": message})
    except errors.ParseError as exc:
        outcome = "bad_request"
        return Reply(400, {"Error": str(exc)})
    except asyncio.CancelledError:  # kube-scheduler hung up (the extender listener cancels the call)
        outcome = "abandoned"
        raise
    finally:
        services.metrics.bind_seconds.labels(outcome).observe(time.perf_counter() - started)
        if outcome not in ("bound", "abandoned"):
            services.metrics.errors.labels("bind").inc()


async def preempt_verb(services: Services, body: bytes) -> Reply:
    """``POST /preempt``: ExtenderPreemptionResult; never an HTTP error but 400 for a body that
    does not parse."""
    services.hot_calls += 1
    started = time.perf_counter()
    outcome = "error"
    try:
        if services.preempter is None:
            return Reply(200, {"NodeNameToMetaVictims": {}, "Error": "preemption not configured"})
        if not services.ready.is_set():
            return Reply(200, {"NodeNameToMetaVictims": {}, "Error": NOT_READY})
        reply = await services.preempter.preempt(parse_json(body))
        outcome = reply.outcome
        return Reply(200, extender_wire.RawJson(reply.data))
    except errors.ParseError as exc:
        outcome = "bad_request"
        return Reply(400, {"Error": str(exc)})
    except errors.VgpuError as exc:
        log.exception("preempt failed")
        return Reply(200, {"NodeNameToMetaVictims": {}, "Error": str(exc)})
    finally:
        services.metrics.preempt_seconds.labels(outcome).observe(time.perf_counter() - started)
        if outcome in ("victims", "none"):
            services.metrics.preemptions.labels("verb", outcome).inc()
        if outcome in ("error", "bad_request"):
            services.metrics.errors.labels("preempt").inc()


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


METRICS_CHUNK_BYTES = 64 << 10


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header takes gzip (Prometheus sends ``gzip``); ``q=0`` refuses it."""
    for item in accept_encoding.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        if coding.lower() not in ("gzip", "x-gzip", "*"):
            continue
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


async def _metrics(request: web.Request) -> web.StreamResponse:
    """The exposition, gzipped for a caller that takes it, and sent in 64 KiB pieces with a turn of
    the loop between them: at 1,000 nodes the text is 10 MiB, whose TLS encryption in one write
    held the loop (and any /filter) for about 45 ms (docs/benchmarks.md, "Twenty-second pass")."""
    compress = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    body = await request.app[SERVICES].metrics.scrape(compress=compress)
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
    if compress:
        response.headers["Content-Encoding"] = "gzip"
    response.content_length = len(body)
    await response.prepare(request)
    view = memoryview(body)
    for start in range(0, len(body), METRICS_CHUNK_BYTES):
        await response.write(view[start : start + METRICS_CHUNK_BYTES])
        await asyncio.sleep(0)
    await response.write_eof()
    return response


async def _no_webhook(_: web.Request) -> web.Response:
    return web.Response(status=503, text="admission webhook not configured")


def _timed_webhook(services: Services) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    handler = services.webhook or _no_webhook

    async def webhook(request: web.Request) -> web.StreamResponse:
        services.hot_calls += 1
        started = time.perf_counter()
        outcome = "error"
        try:
            response = await handler(request)
            outcome = "ok" if response.status < 400 else "bad_request" if response.status < 500 else "error"
            return response
        finally:
            services.metrics.webhook_seconds.labels(outcome).observe(time.perf_counter() - started)

    return webhook


Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]
ExtenderRoute = tuple[str, str, Callable[[Services, bytes], Reply | Awaitable[Reply]]]

# loopback only: kube-scheduler's verbs (extender_http.py serves them)
EXTENDER_ROUTES: tuple[ExtenderRoute, ...] = (
    ("POST", "/filter", filter_verb),
    ("POST", "/bind", bind_verb),
    ("POST", "/preempt", preempt_verb),
)
# the Service port: the API server's webhook calls, probes, Prometheus, the dashboard
SERVICE_ROUTES: tuple[Route, ...] = (
    ("GET", "/healthz", _healthz),
    ("GET", "/readyz", _readyz),
    ("GET", "/metrics", _metrics),
    ("GET", "/ui", ui.page),
    ("GET", "/ui/state", ui.state),
    ("GET", "/ui/events", ui.events),
)


def _app(
    services: Services,
    routes: tuple[Route, ...],
    limits: listener.Limits,
    limit_log: listener.LimitLog,
) -> web.Application:
    app = web.Application(
        client_max_size=limits.max_body_bytes,
        middlewares=[listener.body_limits(limits, limit_log)],
    )
    app[SERVICES] = services
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    return app


def build_extender_server(
    services: Services,
    *,
    limits: listener.Limits,
    limit_log: listener.LimitLog,
    filter_max_body_bytes: int | None = None,
) -> extender_http.ExtenderServer:
    """``EXTENDER_ROUTES``, for the loopback listener: ``/filter`` inline, the others as tasks.
    ``/filter`` takes bodies of up to ``filter_max_body_bytes`` (None: the listener's cap)."""
    caps = {"/bind": limits_mod.BIND_MAX_BODY_BYTES}
    if filter_max_body_bytes is not None:
        caps["/filter"] = filter_max_body_bytes

    def verb(path: str, call: Callable[[Services, bytes], Any]) -> extender_wire.Verb:
        return extender_wire.Verb(
            functools.partial(call, services),
            inline=not asyncio.iscoroutinefunction(call),
            max_body_bytes=caps.get(path),
        )

    verbs = {path: verb(path, call) for _, path, call in EXTENDER_ROUTES}
    return extender_http.ExtenderServer(verbs, limits=limits, limit_log=limit_log)


def build_service_app(
    services: Services, *, limits: listener.Limits, limit_log: listener.LimitLog
) -> web.Application:
    """``SERVICE_ROUTES`` and ``/webhook``, for the Service port, the views behind
    ``services.views`` when set; ends the dashboard's event streams at shutdown and closes the
    events recorder."""
    app = _app(services, SERVICE_ROUTES, limits, limit_log)
    if services.views is not None:
        app.middlewares.append(services.views.middleware)
    app.router.add_post("/webhook", _timed_webhook(services))
    board = services.dashboard or ui.Dashboard(services.state, services.extender.reasons)
    app[ui.DASHBOARD] = board

    async def end_streams(_: web.Application) -> None:
        await board.aclose()

    app.on_shutdown.append(end_streams)

    async def close_events(_: web.Application) -> None:
        await services.events.aclose()

    app.on_cleanup.append(close_events)
    return app
