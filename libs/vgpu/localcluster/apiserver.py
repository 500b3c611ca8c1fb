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
token is a 401. Without either, every caller is ``DEFAULT_USER``. The Binding
subresource copies the Binding's ``metadata.annotations`` onto the pod (``Store.bind``). Requests
are counted per client at ``/debug/requests``, and ``write_latency_s`` delays every write as etcd
would (``apistats``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import pathlib
import ssl
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from vgpu.core import errors
from vgpu.kube import kubeconfig
from vgpu.kube.port import JsonObj, WatchEvent
from vgpu.localcluster import admission, apistats, discovery
from vgpu.localcluster.apipaths import Target, parse_path, status_body
from vgpu.localcluster.store import Store
from vgpu.localcluster.watcher import Watcher

log = logging.getLogger(__name__)

PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
}
DEFAULT_WATCH_TIMEOUT_S = 1800.0
USER = web.RequestKey("user", dict)


ENCODED_EVENTS_KEPT = 1024


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


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
        self._token = token
        self._users: dict[str, JsonObj] = dict(users or {})
        self._bookmark_interval_s = bookmark_interval_s
        self._watch_gone_as_http = watch_gone_as_http
        self._runner: web.AppRunner | None = None
        self._watchers: set[Watcher] = set()
        # each store event serialised once for all its watchers, as the watch cache does (bounded)
        self._lines: collections.OrderedDict[int, tuple[WatchEvent, bytes]] = collections.OrderedDict()
        self._bookmarks: asyncio.Task[None] | None = None
        self.url = ""

    def _encoded(self, event: WatchEvent) -> bytes:
        """``event`` as one watch line; the same store event reaches every watcher as one object."""
        cached = self._lines.get(id(event))
        if cached is not None and cached[0] is event:
            return cached[1]
        line = json.dumps({"type": event.type, "object": event.object}, separators=(",", ":")).encode()
        self._lines[id(event)] = (event, line + b"\n")
        if len(self._lines) > ENCODED_EVENTS_KEPT:
            self._lines.popitem(last=False)
        return line + b"\n"

    def add_mutating_webhooks(self, configuration: JsonObj) -> JsonObj:
        """Register a MutatingWebhookConfiguration (admissionregistration.k8s.io/v1) in the store."""
        return self.store.create("mutatingwebhookconfigurations", configuration)

    def add_validating_webhooks(self, configuration: JsonObj) -> JsonObj:
        """Register a ValidatingWebhookConfiguration (admissionregistration.k8s.io/v1) in the store."""
        return self.store.create("validatingwebhookconfigurations", configuration)

    async def start(self) -> None:
        app = web.Application(
            middlewares=[self._auth, self.stats.middleware], client_max_size=16 * 1024 * 1024
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
        self._bookmarks = asyncio.create_task(self._bookmark_loop(), name="apiserver-bookmarks")
        log.info("local API server listening on %s", self.url)

    async def stop(self) -> None:
        if self._bookmarks is not None:
            self._bookmarks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._bookmarks
            self._bookmarks = None
        for w in list(self._watchers):
            w.close()
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
        return kubeconfig.write_kubeconfig(path, server=self.url, token=token or self._token, ca_pem=ca_pem)

    async def _bookmark_loop(self) -> None:
        while True:
            await asyncio.sleep(self._bookmark_interval_s)
            for w in list(self._watchers):
                if w.allow_bookmarks:
                    self.store.emit_bookmarks()
                    break

    # ----- middleware and small endpoints -----

    def _authenticate(self, request: web.Request) -> JsonObj | None:
        """The caller's userInfo, or None when its bearer token is unknown (a 401)."""
        if self._token is None and not self._users:
            return admission.DEFAULT_USER
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return None
        token = header.removeprefix("Bearer ")
        return admission.DEFAULT_USER if token == self._token else self._users.get(token)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        user = self._authenticate(request)
        if user is None:
            return web.json_response(status_body(401, "Unauthorized"), status=401)
        request[USER] = user
        result: web.StreamResponse = await handler(request)
        return result

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
            return await self._dispatch(request, target)
        except errors.KubeError as exc:
            code = exc.status or 500
            body = status_body(
                code, str(exc), reason=exc.reason, name=target.name or "", kind=target.info.plural
            )
            return web.json_response(body, status=code)
        except Exception as exc:
            log.exception("local API server: %s %s failed", request.method, request.path)
            return web.json_response(status_body(500, f"internal error: {exc}"), status=500)

    async def _dispatch(self, request: web.Request, t: Target) -> web.StreamResponse:
        s = self.store
        kind = t.info.plural
        method = request.method
        if t.subresource not in (None, "status", "binding", "bindings") or (
            t.subresource in ("binding", "bindings") and method != "POST"
        ):
            raise errors.NotFound(
                f"the server could not find the requested resource ({kind}/{t.subresource})", status=404
            )
        if t.subresource == "status" and not t.info.has_status:
            raise errors.NotFound(f"{kind} has no status subresource", status=404)
        if method == "GET" and t.name is None:
            q = request.query
            if _flag(q.get("watch")):
                return await self._watch(request, t)
            listed = s.list(
                kind,
                namespace=t.namespace,
                label_selector=q.get("labelSelector"),
                field_selector=q.get("fieldSelector"),
            )
            for item in listed.items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
            return web.json_response(
                {
                    "kind": f"{t.info.kind}List",
                    "apiVersion": t.info.api_version,
                    "metadata": {"resourceVersion": listed.resource_version},
                    "items": listed.items,
                }
            )
        if method == "GET" and t.name is not None:
            return web.json_response(s.get(kind, t.name, namespace=t.namespace))
        if method == "POST" and t.subresource in ("binding", "bindings"):
            return await self._bind(request, t)
        if method == "POST" and t.name is None:
            body = await _json_body(request)
            if not isinstance(body, dict):
                raise errors.KubeError(
                    f"{t.info.kind} body must be a JSON object", status=400, reason="BadRequest"
                )
            if kind == "pods":
                assert t.namespace is not None
                body = await self.admission.admit_pod_create(
                    body, namespace=t.namespace, user_info=request[USER]
                )
            return web.json_response(s.create(kind, body, namespace=t.namespace), status=201)
        if t.name is None:
            return web.json_response(
                status_body(405, f"{method} is not supported on a collection"), status=405
            )
        if method == "PUT":
            body = await _json_body(request)
            if not isinstance(body, dict):
                raise errors.KubeError(
                    f"{t.info.kind} body must be a JSON object", status=400, reason="BadRequest"
                )
            name = (
                (body.get("metadata") or {}).get("name") if isinstance(body.get("metadata"), dict) else None
            )
            if name not in (None, t.name):
                raise errors.KubeError(
                    f"the name of the object ({name}) does not match the name on the URL ({t.name})",
                    status=400,
                    reason="BadRequest",
                )
            if isinstance(body.get("metadata"), dict):
                body["metadata"]["name"] = t.name
            if t.subresource is None and self.admission.admits(kind):
                put: JsonObj = body
                return web.json_response(
                    await self.admission.update(
                        kind, t.name, lambda _: put, namespace=t.namespace, user_info=request[USER]
                    )
                )
            return web.json_response(s.update(kind, body, namespace=t.namespace, subresource=t.subresource))
        if method == "PATCH":
            content_type = request.content_type
            patch_type = PATCH_TYPES.get(content_type)
            if patch_type is None:
                raise errors.KubeError(
                    f"the body of the request was in an unknown format - accepted media types include: {', '.join(PATCH_TYPES)}",
                    status=415,
                    reason="UnsupportedMediaType",
                )
            body = await _json_body(request)
            if t.subresource is None and self.admission.admits(kind):
                name = t.name
                return web.json_response(
                    await self.admission.update(
                        kind,
                        name,
                        lambda _: s.patched(kind, name, body, patch_type=patch_type, namespace=t.namespace),
                        namespace=t.namespace,
                        user_info=request[USER],
                    )
                )
            return web.json_response(
                s.patch(
                    kind,
                    t.name,
                    body,
                    patch_type=patch_type,
                    namespace=t.namespace,
                    subresource=t.subresource,
                )
            )
        if method == "DELETE":
            grace: int | None = None
            if request.can_read_body:
                options = await _json_body(request)
                self._check_preconditions(t, options)
                grace = options.get("gracePeriodSeconds")
                if grace is not None and (not isinstance(grace, int) or isinstance(grace, bool) or grace < 0):
                    raise errors.KubeError(
                        "DeleteOptions.gracePeriodSeconds must be a non-negative integer",
                        status=400,
                        reason="BadRequest",
                    )
            return web.json_response(s.delete(kind, t.name, namespace=t.namespace, grace_period_s=grace))
        return web.json_response(status_body(405, f"{method} is not supported"), status=405)

    def _check_preconditions(self, t: Target, options: Any) -> None:
        if not isinstance(options, Mapping):
            raise errors.KubeError("DeleteOptions must be a JSON object", status=400, reason="BadRequest")
        pre = options.get("preconditions") or {}
        if not isinstance(pre, Mapping):
            raise errors.KubeError(
                "DeleteOptions.preconditions must be an object", status=400, reason="BadRequest"
            )
        assert t.name is not None
        meta = self.store.get(t.info.plural, t.name, namespace=t.namespace)["metadata"]
        for field, key in (("uid", "uid"), ("resourceVersion", "resourceVersion")):
            want = pre.get(field)
            if want is not None and want != meta[key]:
                raise errors.Conflict(
                    f"Precondition failed: {field.capitalize() if field == 'uid' else 'ResourceVersion'} in "
                    f"precondition: {want}, {field} in object meta: {meta[key]}",
                    status=409,
                    reason="Conflict",
                )

    async def _bind(self, request: web.Request, t: Target) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict):
            raise errors.KubeError("Binding.target: Required value", status=422, reason="Invalid")
        raw_meta = body.get("metadata")
        meta: JsonObj = raw_meta if isinstance(raw_meta, dict) else {}
        name = t.name or meta.get("name")
        if not isinstance(name, str) or not name:
            raise errors.KubeError("Binding.metadata.name: Required value", status=422, reason="Invalid")
        node = body["target"].get("name")
        if not isinstance(node, str):
            raise errors.KubeError("Binding.target.name: Required value", status=422, reason="Invalid")
        assert t.namespace is not None
        notes = meta.get("annotations")
        if notes is not None and not isinstance(notes, dict):
            raise errors.KubeError(
                "Binding.metadata.annotations: must be an object", status=400, reason="BadRequest"
            )
        self.store.bind(
            t.namespace,
            name,
            node=node,
            uid=meta.get("uid") or None,
            resource_version=meta.get("resourceVersion") or None,
            annotations=notes,
        )
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
            status=201,
        )

    async def _watch(self, request: web.Request, t: Target) -> web.StreamResponse:
        q = request.query
        try:
            timeout_s = float(q.get("timeoutSeconds", DEFAULT_WATCH_TIMEOUT_S))
        except ValueError:
            raise errors.KubeError(
                f"invalid timeoutSeconds {q.get('timeoutSeconds')!r}", status=400, reason="BadRequest"
            ) from None
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        try:
            watcher = self.store.watch(
                t.info.plural,
                resource_version=q.get("resourceVersion"),
                namespace=t.namespace,
                label_selector=q.get("labelSelector"),
                field_selector=q.get("fieldSelector"),
                allow_bookmarks=_flag(q.get("allowWatchBookmarks")),
            )
        except errors.Gone as exc:
            if self._watch_gone_as_http:
                raise
            await response.prepare(request)
            error = {"type": "ERROR", "object": status_body(410, str(exc), reason="Expired")}
            await response.write(json.dumps(error).encode() + b"\n")
            await response.write_eof()
            return response
        self._watchers.add(watcher)
        try:
            response.enable_chunked_encoding()
            await response.prepare(request)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + max(0.0, timeout_s)
            while True:
                event = await watcher.next_event(timeout_s=max(0.0, deadline - loop.time()), copy=False)
                if event is None:
                    break
                lines = [self._encoded(event)]
                while (ready := watcher.pop_ready()) is not None:  # one write for all that are queued
                    lines.append(self._encoded(ready))
                await response.write(b"".join(lines))
            await response.write_eof()
        except ConnectionResetError:  # the client went away (a watcher process stopped): not an error
            log.debug("watch on %s ended by the client", t.info.plural)
        except asyncio.CancelledError:
            log.debug("watch on %s ended by the client", t.info.plural)
            raise
        finally:
            watcher.close()
            self._watchers.discard(watcher)
        return response


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.KubeError(
            f"the request body is not valid JSON: {exc}", status=400, reason="BadRequest"
        ) from None
