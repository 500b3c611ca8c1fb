"""``OfficialKubeApi``: the KubeApi port over the official ``kubernetes`` client (production adapter).

The official client supplies configuration (kubeconfig or in-cluster service account), TLS,
authentication (tokens, exec plugins, refresh) and its urllib3 transport; requests go through
its ``ApiClient`` with our own paths and ``_preload_content``-style raw bodies, so objects are the
camelCase JSON dicts of the wire, never client models. Every blocking call runs on the adapter's
own ``CallPool`` (``api_workers`` daemon threads, never asyncio's shared default executor). A watch
streams in a daemon thread of its own that feeds an asyncio queue, so watches never take a worker
from the calls; closing or cancelling the iterator shuts the socket so the thread ends at once, and
the iterator waits for it at most ``WATCH_STOP_WAIT_S`` (a thread still connecting is abandoned:
it is a daemon and exits when its connect or read times out).

This module and ``vgpu.kube.kubeconfig`` are the only importers of ``kubernetes``;
``ApiException`` and urllib3 errors are translated here into ``vgpu.core.errors`` (NotFound,
Conflict, Gone, KubeError with the HTTP status, 0 when the server was not reached).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import json
import math
import os
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from vgpu.core import errors
from vgpu.kube import aioapi, events, port, threads
from vgpu.kube.port import JsonObj, Kind, ObjectList, WatchEvent

_END = object()
API_WORKERS = 16  # threads for API calls (watches have their own); kube-scheduler filters 16 at once
WATCH_STOP_WAIT_S = 2.0  # a stopped watch's thread is waited for this long, then left to exit alone


def default_kubeconfig_files(environ: Mapping[str, str]) -> list[str]:
    """Where the client (as kubectl) looks without a path: every file of ``$KUBECONFIG`` (a
    ``:``-separated list), else ``~/.kube/config``."""
    listed = [f for f in environ.get("KUBECONFIG", "").split(os.pathsep) if f]
    return [os.path.expanduser(f) for f in listed] or [os.path.expanduser("~/.kube/config")]


def load_configuration(path: str | None = None) -> Any:
    """The official client's ``Configuration`` from ``path``; with None: in-cluster config when
    KUBERNETES_SERVICE_HOST is set, else the default kubeconfig (``$KUBECONFIG`` or
    ``~/.kube/config``). A missing or unusable one is a ``ConfigError``."""
    config = kubernetes.client.Configuration()
    if path is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        tried = default_kubeconfig_files(os.environ)
        path = os.pathsep.join(tried)  # what is tried is what is loaded (the client reads $KUBECONFIG once)
        if not any(os.path.isfile(f) for f in tried):
            raise errors.ConfigError(
                "kubeconfig",
                f"none found (tried {', '.join(tried)}, and this is not a pod: KUBERNETES_SERVICE_HOST is "
                "unset); point at one with --kubeconfig PATH or KUBECONFIG=PATH",
            )
    try:
        if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
        else:
            kubernetes.config.load_kube_config(config_file=path, client_configuration=config)  # type: ignore[no-untyped-call]
    except (kubernetes.config.ConfigException, OSError, ValueError, TypeError) as exc:
        # a missing or unreadable kubeconfig is a configuration error, not a crash (translated here)
        raise errors.ConfigError("kubeconfig", f"{path or 'default kubeconfig'}: {exc}") from None
    return config


def aio_from_kubeconfig(
    path: str | None = None,
    *,
    user_agent: str,
    request_timeout_s: float = 30.0,
    max_in_flight: int | None = None,
) -> aioapi.AioKubeApi:
    """An ``AioKubeApi`` configured as the official client would be from ``path``
    (``load_configuration``): the server, its CA (or none checked), a client certificate, the TLS
    server name, a proxy, and the bearer token through the client's own refresh hooks (in-cluster
    service-account token files, exec plugins), asked for again every
    ``aioapi.CREDENTIALS_REFRESH_S`` and after a 401. ``max_in_flight``: requests at once (the
    rest wait), as the official client's pool bounds its connections."""
    config = load_configuration(path)
    try:
        if config.verify_ssl:
            context = ssl.create_default_context(cafile=config.ssl_ca_cert)  # None: the system's CAs
            if config.assert_hostname is False:
                context.check_hostname = False
        else:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if config.cert_file:
            context.load_cert_chain(config.cert_file, config.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise errors.ConfigError("kubeconfig", f"{path or 'default kubeconfig'}: TLS files: {exc}") from None
    return aioapi.AioKubeApi(
        config.host,
        user_agent=user_agent,
        ssl_context=context,
        credentials=aioapi.Credentials(source=functools.partial(_bearer, config)),
        server_hostname=config.tls_server_name or None,
        proxy=config.proxy or None,
        request_timeout_s=request_timeout_s,
        max_in_flight=max_in_flight,
    )


def _bearer(config: Any) -> str | None:
    """The Authorization header the official client would send (``Configuration.auth_settings``:
    its refresh hook runs first)."""
    value = config.get_api_key_with_prefix("BearerToken", alias="authorization")
    return str(value) if value else None


class OfficialKubeApi:
    """Implements ``vgpu.kube.port.KubeApi`` with a ``kubernetes.client.ApiClient``."""

    def __init__(
        self, api_client: Any, *, request_timeout_s: float = 30.0, pool: threads.CallPool | None = None
    ) -> None:
        self._client = api_client
        self._timeout_s = request_timeout_s
        self.pool = pool or threads.CallPool(API_WORKERS)

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, *, request_timeout_s: float = 30.0, api_workers: int = API_WORKERS
    ) -> OfficialKubeApi:
        """From ``path`` (``load_configuration``). ``api_workers`` threads make API calls; urllib3
        keeps as many connections (plus a few for the watches) alive."""
        config = load_configuration(path)
        config.connection_pool_maxsize = api_workers + 8
        return cls(
            kubernetes.client.ApiClient(config),
            request_timeout_s=request_timeout_s,
            pool=threads.CallPool(api_workers),
        )

    async def close(self) -> None:
        self.pool.close()
        await asyncio.to_thread(self._client.close)

    # ----- the blocking core, run in worker threads -----

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = None,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            request = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            return self._client.call_api(*request, _request_timeout=timeout or self._timeout_s)
        except ApiException as exc:
            raise port.translate(exc.status or 0, exc.body, what=f"{method} {path}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise errors.KubeError(f"{method} {path}: {exc}", status=0) from None

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._open(method, path, **kw)
        try:
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise errors.KubeError(f"{method} {path}: {exc}", status=0) from None
        if not 200 <= resp.status < 300:
            raise port.translate(resp.status, data, what=f"{method} {path}")
        try:
            return json.loads(data) if data else None
        except ValueError as exc:
            raise errors.KubeError(
                f"{method} {path}: the answer is not JSON: {exc}", status=resp.status
            ) from None

    async def _request(self, method: str, path: str, **kw: Any) -> Any:
        return await self.pool.run(functools.partial(self._call, method, path, **kw))

    # ----- the KubeApi port -----

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        result: JsonObj = await self._request("GET", port.resource_path(kind, namespace, name))
        return result

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        query = [
            (k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v
        ]
        answer = await self._request("GET", port.resource_path(kind, namespace), query=query)
        _, api_version, kind_name, _ = port.RESOURCES[kind]
        items = answer.get("items") or []
        for item in items:
            # list items come without kind/apiVersion on the wire; our objects always carry them
            item.setdefault("kind", kind_name)
            item.setdefault("apiVersion", api_version)
        return ObjectList(
            items=items, resource_version=str((answer.get("metadata") or {}).get("resourceVersion", ""))
        )

    async def watch(
        self,
        kind: Kind,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: float | None = None,
        transform: port.Transform | None = None,
    ) -> AsyncIterator[WatchEvent]:
        query = [("watch", "true"), ("allowWatchBookmarks", "true")]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if timeout_s is not None:
            query.append(("timeoutSeconds", str(max(1, math.ceil(timeout_s)))))
        read_timeout = None if timeout_s is None else timeout_s + 30.0
        path = port.resource_path(kind, namespace)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        finished: asyncio.Future[None] = loop.create_future()
        lock = threading.Lock()  # orders "the worker stored its response" against "we stopped"
        holder: dict[str, Any] = {}

        def put(item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def pump() -> None:
            try:
                resp = self._open("GET", path, query=query, timeout=(self._timeout_s, read_timeout))
                with lock:
                    holder["resp"] = resp
                    if stop.is_set():
                        return
                if not 200 <= resp.status < 300:
                    put(port.translate(resp.status, resp.read(), what=f"watch {path}"))
                    return
                buffer = b""
                for chunk in resp.response.stream(amt=None, decode_content=False):
                    if stop.is_set():
                        return
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            put(line)
            except errors.KubeError as exc:
                put(exc)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if not stop.is_set():
                    put(errors.KubeError(f"watch {path}: {exc}", status=0))
            finally:
                put(_END)
                resp = holder.get("resp")
                if resp is not None:
                    with contextlib.suppress(Exception):
                        resp.response.release_conn()
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    loop.call_soon_threadsafe(_resolve, finished)

        threads.spawn(pump, name=f"watch-{kind}")
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, errors.KubeError):
                    raise item
                yield port.watch_event(item, path, transform)
        finally:
            with lock:
                stop.set()
                resp = holder.get("resp")
            _shutdown(resp)
            # the thread ends at once once its socket is shut; one still connecting is left behind
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(finished), WATCH_STOP_WAIT_S)

    async def create(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        result: JsonObj = await self._request("POST", port.resource_path(kind, namespace), body=body)
        return result

    async def replace(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        name = (body.get("metadata") or {}).get("name")
        if not name:
            raise errors.KubeError("replace: body.metadata.name is required", status=422, reason="Invalid")
        result: JsonObj = await self._request("PUT", port.resource_path(kind, namespace, name), body=body)
        return result

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObj:
        """``port.ClaimReader``: GET resource.k8s.io/v1 ``namespace/name``."""
        result: JsonObj = await self._request("GET", port.resource_claim_path(namespace, name))
        return result

    async def merge_patch(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        result: JsonObj = await self._request(
            "PATCH",
            port.resource_path(kind, namespace, name),
            body=dict(patch),
            content_type="application/merge-patch+json",
        )
        return result

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> None:
        await self._request(
            "DELETE", port.resource_path(kind, namespace, name), body=port.delete_options(grace_period_s)
        )

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        body = port.binding_body(namespace, name, node=node, uid=uid, annotations=annotations)
        await self._request("POST", port.resource_path("pods", namespace, name, "binding"), body=body)

    async def evict_pod(
        self, namespace: str, name: str, *, uid: str | None = None, grace_period_s: int | None = None
    ) -> None:
        async def post(path: str, body: JsonObj) -> None:
            await self._request("POST", path, body=body)

        await port.evict(post, namespace, name, uid=uid, grace_period_s=grace_period_s)

    async def create_event(
        self,
        *,
        namespace: str,
        involved: JsonObj,
        reason: str,
        message: str,
        type: Literal["Normal", "Warning"] = "Normal",
        component: str = "vgpu-scheduler",
        count: int = 1,
    ) -> None:
        now = datetime.datetime.now(datetime.UTC)
        body = events.event_body(
            involved, reason=reason, message=message, type=type, component=component, now=now, count=count
        )
        await self._request("POST", port.resource_path("events", namespace), body=body)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _shutdown(resp: Any) -> None:
    """Unblock a worker thread reading a streaming response by shutting its socket down."""
    if resp is None:
        return
    raw = getattr(resp, "response", None)
    conn = getattr(raw, "connection", None) or getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
