"""``AioKubeApi``: the KubeApi port (plus the status subresource) over aiohttp, on the event loop.

kube-scheduler and kubelet talk to kube-apiserver with client-go: many requests in flight on one
event loop, no thread per request. This adapter does the same: requests and watch streams are
coroutines on the caller's loop, so a busy process has no pool of threads competing with its event
loop for the GIL (``vgpu.kube.client.OfficialKubeApi`` runs the official client's urllib3 calls on
worker threads, a thread per watch). The vgpu-scheduler uses it by default (``scheduler.apiClient:
asyncio``); the local cluster's own components and the benches use it too.

Configuration, TLS and authentication come from the official client
(``vgpu.kube.client.aio_from_kubeconfig``: kubeconfig or in-cluster, the token refreshed through
its hooks) or are given directly (``url``, ``token``, ``ca_file``). A ``User-Agent`` names the
component. Error answers become ``vgpu.core.errors`` (NotFound, Conflict, Gone, KubeError with the
HTTP status; 0 when the server was not reached); a 401 makes the credentials refresh once and the
request go again.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

import aiohttp

from vgpu.core import errors
from vgpu.kube import events, port
from vgpu.kube.port import JsonObj, Kind, ObjectList, WatchEvent

DECODE_OFF_LOOP_BYTES = 1 << 20  # answers larger than this are decoded in a thread, off the loop
CREDENTIALS_REFRESH_S = 10.0  # how often a refreshable token is asked for again (its hooks decide)


class Credentials:
    """The ``Authorization`` header: fixed, or read from ``source`` (blocking: it may read a
    token file or run an exec plugin, so it runs in a thread) at most every ``refresh_s``, and at
    once after ``invalidate()`` (a 401)."""

    def __init__(
        self,
        *,
        header: str | None = None,
        source: Callable[[], str | None] | None = None,
        refresh_s: float = CREDENTIALS_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._header = header
        self._source = source
        self._refresh_s = refresh_s
        self._clock = clock
        self._read_at: float | None = None
        self._lock = asyncio.Lock()

    @property
    def refreshable(self) -> bool:
        return self._source is not None

    def invalidate(self) -> None:
        self._read_at = None

    async def header(self) -> str | None:
        if self._source is None:
            return self._header
        if self._read_at is not None and self._clock() - self._read_at < self._refresh_s:
            return self._header
        async with self._lock:
            if self._read_at is None or self._clock() - self._read_at >= self._refresh_s:
                try:
                    self._header = await asyncio.to_thread(self._source)
                except Exception as exc:  # an exec plugin or token file failing: say so, keep the old one
                    raise errors.KubeError(
                        f"refreshing the API credentials failed: {exc}", status=0
                    ) from None
                self._read_at = self._clock()
        return self._header


class RequestGate:
    """At most ``limit`` requests at once (None: no cap); the rest wait their turn, and how many
    wait and for how long is what readiness reads (``busy``, ``queued``, ``oldest_wait_s``)."""

    def __init__(self, limit: int | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._semaphore = asyncio.Semaphore(limit) if limit else None
        self._waiting: dict[int, float] = {}  # id of a waiting request -> when it began to wait
        self._clock = clock
        self.busy = 0  # requests holding a place

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def oldest_wait_s(self) -> float:
        return self._clock() - min(self._waiting.values()) if self._waiting else 0.0

    @contextlib.asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        """One of the ``limit`` places (waiting for it, counted in ``queued``)."""
        semaphore = self._semaphore
        if semaphore is not None and semaphore.locked():
            key = id(asyncio.current_task())
            self._waiting[key] = self._clock()
            try:
                await semaphore.acquire()
            finally:
                del self._waiting[key]
        elif semaphore is not None:
            await semaphore.acquire()
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            if semaphore is not None:
                semaphore.release()


class AioKubeApi:
    """Implements ``vgpu.kube.port.KubeApi`` and ``statuswriter.StatusWriter`` against ``url``.

    ``ssl_context`` wins over ``ca_file``; ``credentials`` over ``token``; ``server_hostname``:
    the TLS server name when it is not the URL's host; ``proxy``: an HTTP proxy URL."""

    def __init__(
        self,
        url: str,
        *,
        user_agent: str = "localcluster",
        token: str | None = None,
        ca_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        credentials: Credentials | None = None,
        server_hostname: str | None = None,
        proxy: str | None = None,
        request_timeout_s: float = 30.0,
        max_in_flight: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        self._credentials = credentials or Credentials(header=f"Bearer {token}" if token else None)
        self._ssl: ssl.SSLContext | bool = ssl_context or (
            ssl.create_default_context(cafile=ca_file) if ca_file else True
        )
        self._extra: dict[str, Any] = {}
        if server_hostname:
            self._extra["server_hostname"] = server_hostname
        if proxy:
            self._extra["proxy"] = proxy
        self._timeout_s = request_timeout_s
        self._session: aiohttp.ClientSession | None = None
        # at most this many requests at once (watches apart), the rest wait: the connections to
        # the API server stay bounded as the official client's pool bounds them; None: no cap
        self._gate = RequestGate(max_in_flight, clock=clock)

    # ----- what readiness and /metrics read of a call pool (vgpu_scheduler/load.py PoolBacklog) -----

    @property
    def busy(self) -> int:
        """Requests in flight (watches not counted)."""
        return self._gate.busy

    @property
    def queued(self) -> int:
        """Requests waiting for one of the ``max_in_flight`` places (0 without a cap)."""
        return self._gate.queued

    def oldest_wait_s(self) -> float:
        """How long the longest-waiting queued request has waited (0.0 when none waits)."""
        return self._gate.oldest_wait_s()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl),
                headers=self._headers,
                read_bufsize=1 << 22,  # a watch line is one object: nodes with annotations are large
            )
        return self._session

    async def _request_headers(self, content_type: str | None) -> dict[str, str]:
        headers = {}
        auth = await self._credentials.header()
        if auth:
            headers["Authorization"] = auth
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        target: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> Any:
        """One request; the decoded JSON answer, or the error it carried."""
        what = f"{method} {target}"
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        async with self._gate.place():
            return await self._send(
                method, target, what=what, data=data, content_type=content_type, query=query
            )

    async def _send(
        self,
        method: str,
        target: str,
        *,
        what: str,
        data: bytes | None,
        content_type: str,
        query: Mapping[str, str] | None,
    ) -> Any:
        for attempt in (1, 2):
            headers = await self._request_headers(content_type if data is not None else None)
            try:
                async with self._client().request(
                    method,
                    self.url + target,
                    data=data,
                    params=query,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                    **self._extra,
                ) as resp:
                    body = await resp.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise errors.KubeError(f"{what}: {exc!r}", status=0) from None
            if resp.status == 401 and attempt == 1 and self._credentials.refreshable:
                self._credentials.invalidate()  # an expired or rotated token: read it again, once
                continue
            if not 200 <= resp.status < 300:
                raise port.translate(resp.status, body, what=what)
            break
        try:
            if len(body) > DECODE_OFF_LOOP_BYTES:  # a big LIST: decoding it would stall /filter
                return await asyncio.to_thread(json.loads, body)
            return json.loads(body) if body else None
        except ValueError as exc:
            raise errors.KubeError(f"{what}: the answer is not JSON: {exc}", status=resp.status) from None

    # ----- the KubeApi port -----

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        result: JsonObj = await self.request("GET", port.resource_path(kind, namespace, name))
        return result

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        query = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        answer = await self.request("GET", port.resource_path(kind, namespace), query=query)
        _, api_version, kind_name, _ = port.RESOURCES[kind]
        items = answer.get("items") or []
        for item in items:
            item.setdefault("kind", kind_name)
            item.setdefault("apiVersion", api_version)
        return ObjectList(items, str((answer.get("metadata") or {}).get("resourceVersion", "")))

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
        query = {"watch": "true", "allowWatchBookmarks": "true"}
        for key, value in (
            ("resourceVersion", resource_version),
            ("labelSelector", label_selector),
            ("fieldSelector", field_selector),
            ("timeoutSeconds", None if timeout_s is None else str(max(1, int(timeout_s)))),
        ):
            if value:
                query[key] = value
        target = port.resource_path(kind, namespace)
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self._timeout_s,
            sock_read=None if timeout_s is None else timeout_s + 30.0,
        )
        headers = await self._request_headers(None)
        try:
            async with self._client().get(
                self.url + target, params=query, headers=headers, timeout=timeout, **self._extra
            ) as resp:
                if resp.status == 401:
                    self._credentials.invalidate()  # the informer's next watch or relist reads it again
                if resp.status != 200:
                    raise port.translate(resp.status, await resp.text(), what=f"watch {target}")
                async for line in resp.content:
                    if line.strip():
                        yield port.watch_event(line, target, transform)
        except (aiohttp.ClientError, OSError) as exc:
            raise errors.KubeError(f"watch {target}: {exc!r}", status=0) from None

    async def create(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        result: JsonObj = await self.request("POST", port.resource_path(kind, namespace), body=body)
        return result

    async def replace(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        name = (body.get("metadata") or {}).get("name")
        if not name:
            raise errors.KubeError("replace: body.metadata.name is required", status=422, reason="Invalid")
        result: JsonObj = await self.request("PUT", port.resource_path(kind, namespace, name), body=body)
        return result

    async def merge_patch(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        result: JsonObj = await self.request(
            "PATCH",
            port.resource_path(kind, namespace, name),
            body=dict(patch),
            content_type="application/merge-patch+json",
        )
        return result

    async def merge_patch_status(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        result: JsonObj = await self.request(
            "PATCH",
            port.resource_path(kind, namespace, name, "status"),
            body=dict(patch),
            content_type="application/merge-patch+json",
        )
        return result

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> None:
        await self.request(
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
        await self.request("POST", port.resource_path("pods", namespace, name, "binding"), body=body)

    async def evict_pod(
        self, namespace: str, name: str, *, uid: str | None = None, grace_period_s: int | None = None
    ) -> None:
        async def post(path: str, body: JsonObj) -> None:
            await self.request("POST", path, body=body)

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
        await self.request("POST", port.resource_path("events", namespace), body=body)

    async def __aenter__(self) -> AioKubeApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
