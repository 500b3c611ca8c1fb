"""``HttpKubeApi``: the KubeApi port (plus the status subresource) over aiohttp, for the local cluster's
own components when they run in a process of their own.

kube-scheduler and kubelet talk to kube-apiserver with client-go: many requests in flight on one
event loop, no thread per request. The emulations do the same with this client (the services use
``vgpu.kube.client.OfficialKubeApi``, as in production). Plain HTTP or HTTPS with a CA file, an
optional bearer token, a ``User-Agent`` naming the component (the API server counts requests by
it). Error answers become ``vgpu.core.errors`` (NotFound, Conflict, Gone, KubeError with the HTTP
status; 0 when the server was not reached).
"""

from __future__ import annotations

import datetime
import json
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import aiohttp

from vgpu.core import errors
from vgpu.kube import events, port
from vgpu.kube.port import JsonObj, Kind, ObjectList, WatchEvent

_PREFIX = {"leases": "/apis/coordination.k8s.io/v1", "poddisruptionbudgets": "/apis/policy/v1"}
_NAMESPACED = {"pods", "events", "resourcequotas", "leases", "poddisruptionbudgets"}
_LIST_KIND = {
    "nodes": ("v1", "Node"),
    "pods": ("v1", "Pod"),
    "events": ("v1", "Event"),
    "resourcequotas": ("v1", "ResourceQuota"),
    "namespaces": ("v1", "Namespace"),
    "leases": ("coordination.k8s.io/v1", "Lease"),
}


def _error(status: int, text: str, *, what: str) -> errors.KubeError:
    message, reason = text.strip() or f"HTTP {status}", ""
    try:
        parsed = json.loads(text)
        message, reason = str(parsed.get("message") or message), str(parsed.get("reason") or "")
    except (ValueError, AttributeError):
        pass
    cls = {404: errors.NotFound, 409: errors.Conflict, 410: errors.Gone}.get(status, errors.KubeError)
    return cls(f"{what}: {message}", status=status, reason=reason)


def path(kind: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    out = _PREFIX.get(kind, "/api/v1")
    if kind in _NAMESPACED and namespace:
        out += f"/namespaces/{urllib.parse.quote(namespace, safe='')}"
    out += f"/{kind}"
    if name is not None:
        out += f"/{urllib.parse.quote(name, safe='')}"
    if sub is not None:
        out += f"/{sub}"
    return out


class HttpKubeApi:
    """Implements ``vgpu.kube.port.KubeApi`` and ``statuswriter.StatusWriter`` against ``url``."""

    def __init__(
        self,
        url: str,
        *,
        user_agent: str = "localcluster",
        token: str | None = None,
        ca_file: str | None = None,
        request_timeout_s: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._ssl: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self._timeout_s = request_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl),
                headers=self._headers,
                read_bufsize=1 << 22,  # a watch line is one object: nodes with annotations are large
            )
        return self._session

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
        headers = {"Content-Type": content_type} if data is not None else None
        try:
            async with self._client().request(
                method,
                self.url + target,
                data=data,
                params=query,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
            ) as resp:
                text = await resp.text()
                if not 200 <= resp.status < 300:
                    raise _error(resp.status, text, what=what)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise errors.KubeError(f"{what}: {exc!r}", status=0) from None
        try:
            return json.loads(text) if text else None
        except ValueError as exc:
            raise errors.KubeError(f"{what}: the answer is not JSON: {exc}", status=resp.status) from None

    # ----- the KubeApi port -----

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        result: JsonObj = await self.request("GET", path(kind, namespace, name))
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
        answer = await self.request("GET", path(kind, namespace), query=query)
        api_version, kind_name = _LIST_KIND[kind]
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
        target = path(kind, namespace)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout_s)
        try:
            async with self._client().get(self.url + target, params=query, timeout=timeout) as resp:
                if resp.status != 200:
                    raise _error(resp.status, await resp.text(), what=f"watch {target}")
                async for line in resp.content:
                    if line.strip():
                        yield _event(line, target)
        except (aiohttp.ClientError, OSError) as exc:
            raise errors.KubeError(f"watch {target}: {exc!r}", status=0) from None

    async def create(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        result: JsonObj = await self.request("POST", path(kind, namespace), body=body)
        return result

    async def replace(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        name = (body.get("metadata") or {}).get("name")
        if not name:
            raise errors.KubeError("replace: body.metadata.name is required", status=422, reason="Invalid")
        result: JsonObj = await self.request("PUT", path(kind, namespace, name), body=body)
        return result

    async def merge_patch(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        result: JsonObj = await self.request(
            "PATCH",
            path(kind, namespace, name),
            body=dict(patch),
            content_type="application/merge-patch+json",
        )
        return result

    async def merge_patch_status(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        result: JsonObj = await self.request(
            "PATCH",
            path(kind, namespace, name, "status"),
            body=dict(patch),
            content_type="application/merge-patch+json",
        )
        return result

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> None:
        await self.request("DELETE", path(kind, namespace, name), body=port.delete_options(grace_period_s))

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        meta: JsonObj = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", path("pods", namespace, name, "binding"), body=body)

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
        await self.request("POST", path("events", namespace), body=body)

    async def __aenter__(self) -> HttpKubeApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _event(line: bytes, target: str) -> WatchEvent:
    try:
        raw = json.loads(line)
        etype, obj = raw["type"], raw["object"]
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.KubeError(f"watch {target}: undecodable event: {exc}", status=0) from None
    if etype == "ERROR":
        code = obj.get("code", 500) if isinstance(obj, dict) else 500
        raise _error(int(code), json.dumps(obj), what=f"watch {target}")
    if etype not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") or not isinstance(obj, dict):
        raise errors.KubeError(f"watch {target}: unexpected event type {etype!r}", status=0)
    return WatchEvent(etype, obj)
