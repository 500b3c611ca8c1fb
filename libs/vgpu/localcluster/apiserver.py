"""``ApiServer``: the HTTP door to a ``Store``, shaped so the official ``kubernetes`` client works.

Routes: ``/api/v1/...`` (nodes, pods, events, resourcequotas, namespaces, with ``status`` and pod
``binding`` subresources, plus the legacy ``namespaces/{ns}/bindings``) and ``/apis/{group}/{v}/...``
(``coordination.k8s.io/v1`` leases, ``admissionregistration.k8s.io/v1``
mutatingwebhookconfigurations); discovery (``/api``, ``/apis``, ``/version``) and ``/healthz``.
Verbs: get, list, watch (``?watch=true|1``, streaming JSON lines), create, update, patch (merge,
strategic merge, JSON patch by Content-Type), delete (with uid/resourceVersion preconditions).
Errors are ``Status`` objects with the upstream code, reason and message. A watch from a
resourceVersion that is too old gets an ``ERROR`` event carrying a 410 Status, as the real
server sends it (or an HTTP 410 with ``watch_gone_as_http=True``). Pod creates and updates of
pods and nodes go through ``admission.Admission`` (mutating, then validating webhooks), which is
reachable as ``server.admission``. TLS (``tls_cert``/``tls_key``) is optional, and so is
authentication: a bearer ``token`` (the caller is then ``admission.DEFAULT_USER``) and/or ``users``,
bearer tokens mapped to the ``userInfo`` (username, groups) admission webhooks are told; any other
token is a 401. Without either, every caller is ``DEFAULT_USER``. TokenReview and
SubjectAccessReview are answered from those tokens and ``server.reviews.grants`` (``apireviews``). The Binding
subresource copies the Binding's ``metadata.annotations`` onto the pod (``Store.bind``). Requests
are counted per client at ``/debug/requests``, and ``write_latency_s`` delays every write as etcd
would (``apistats``).

This module serves and routes; the parts are siblings: ``apiauth`` (who calls: ``server.auth``),
``apipaths`` (which resource a path names), ``apiverbs`` (what each verb does to the store),
``apiwatch`` (the watch stream and bookmarks: ``server.watches``), ``discovery``.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import ssl
from collections.abc import Mapping

from aiohttp import web

from vgpu.core import errors
from vgpu.kube import kubeconfig
from vgpu.kube.port import JsonObj
from vgpu.localcluster import admission, apiauth, apireviews, apistats, apiverbs, apiwatch, discovery
from vgpu.localcluster.apipaths import parse_path, status_body
from vgpu.localcluster.store import Store

log = logging.getLogger(__name__)


class ApiServer:
    """The emulated API server on ``host:port`` (port 0 picks a free one; read ``url`` after start)."""

    def __init__(
        self,
        store: Store,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
        token: str | None = None,
        users: Mapping[str, JsonObj] | None = None,
        bookmark_interval_s: float = 60.0,
        watch_gone_as_http: bool = False,
        write_latency_s: float = 0.0,
    ) -> None:
        self.store = store
        self.stats = apistats.RequestStats(write_latency_s=write_latency_s)
        self.admission = admission.Admission(store)
        self._host = host
        self._port = port
        self._tls_cert = tls_cert
        self._tls_key = tls_key
        self._tls_ca = tls_ca
        self.auth = apiauth.BearerAuth(token=token, users=users)
        self.reviews = apireviews.Reviews(self.auth)  # TokenReview, SubjectAccessReview (its grants)
        self.watches = apiwatch.WatchStreams(
            store, bookmark_interval_s=bookmark_interval_s, gone_as_http=watch_gone_as_http
        )
        self._verbs = apiverbs.ResourceVerbs(store, admission=self.admission, watches=self.watches)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def add_mutating_webhooks(self, configuration: JsonObj) -> JsonObj:
        """Register a MutatingWebhookConfiguration (admissionregistration.k8s.io/v1) in the store."""
        return self.store.create("mutatingwebhookconfigurations", configuration)

    def add_validating_webhooks(self, configuration: JsonObj) -> JsonObj:
        """Register a ValidatingWebhookConfiguration (admissionregistration.k8s.io/v1) in the store."""
        return self.store.create("validatingwebhookconfigurations", configuration)

    async def start(self) -> None:
        app = web.Application(
            middlewares=[self.auth.middleware, self.stats.middleware], client_max_size=16 * 1024 * 1024
        )
        for path, handler in (
            ("/version", self._version),
            ("/healthz", self._ok),
            ("/readyz", self._ok),
            ("/livez", self._ok),
            ("/api", self._api_versions),
            ("/apis", self._api_groups),
        ):
            app.router.add_get(path, handler)
            app.router.add_get(path + "/", handler)
        self.reviews.add_routes(app)
        app.router.add_route("*", "/{tail:.*}", self._resource)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        ssl_ctx = None
        if self._tls_cert:
            ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_ctx.load_cert_chain(self._tls_cert, self._tls_key)
        site = web.TCPSite(self._runner, self._host, self._port, ssl_context=ssl_ctx)
        await site.start()
        server = site._server
        assert server is not None and isinstance(server, asyncio.base_events.Server)
        port = server.sockets[0].getsockname()[1]
        self.url = f"{'https' if ssl_ctx else 'http'}://{self._host}:{port}"
        self.watches.start()
        log.info("local API server listening on %s", self.url)

    async def stop(self) -> None:
        await self.watches.stop()
        if self._runner is not None:
            server = self._runner.server
            if server is not None:
                # drop kept-alive connections at once: a TLS close would otherwise wait on the peer
                for handler in server.connections:
                    if handler.transport is not None:
                        handler.transport.abort()
            await self._runner.cleanup()
            self._runner = None
        await self.admission.close()

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def write_kubeconfig(self, path: str | pathlib.Path, *, token: str | None = None) -> pathlib.Path:
        """Write a kubeconfig for this server (load it with ``kubernetes.config.load_kube_config``),
        authenticating with ``token`` (default: the server's ``token``)."""
        ca_pem = pathlib.Path(self._tls_ca).read_bytes() if self._tls_ca else None
        return kubeconfig.write_kubeconfig(
            path, server=self.url, token=token or self.auth.token, ca_pem=ca_pem
        )

    # ----- small endpoints -----

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response(discovery.VERSION_INFO)

    async def _api_versions(self, request: web.Request) -> web.Response:
        return web.json_response(discovery.api_versions())

    async def _api_groups(self, request: web.Request) -> web.Response:
        return web.json_response(discovery.api_groups())

    # ----- resources -----

    async def _resource(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        if path == "/api/v1" or (path.startswith("/apis/") and path.count("/") == 3):
            gv = "v1" if path == "/api/v1" else path[len("/apis/") :]
            resources = discovery.resource_list(gv)
            if request.method == "GET" and resources is not None:
                return web.json_response(resources)
        target = parse_path(path)
        if target is None:
            return web.json_response(
                status_body(404, "the server could not find the requested resource"), status=404
            )
        try:
            return await self._verbs.dispatch(request, target)
        except errors.KubeError as exc:
            code = exc.status or 500
            body = status_body(
                code, str(exc), reason=exc.reason, name=target.name or "", kind=target.info.plural
            )
            return web.json_response(body, status=code)
        except Exception as exc:
            log.exception("local API server: %s %s failed", request.method, request.path)
            return web.json_response(status_body(500, f"internal error: {exc}"), status=500)
