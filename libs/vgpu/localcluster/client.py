"""``LocalKubeApi``: the KubeApi port served straight from a local ``Store`` (the fast door).

No HTTP and no serialisation: tests and the local cluster's own loops use it where the wire is
not what is under test. It behaves as the HTTP door does (same store, same errors); the official
client against ``vgpu.localcluster.apiserver`` is the slow door.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

from vgpu.kube import events, port
from vgpu.kube.port import JsonObj, Kind, ObjectList, WatchEvent
from vgpu.localcluster import eviction
from vgpu.localcluster.admission import Admission
from vgpu.localcluster.store import Store


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LocalKubeApi:
    """Implements ``vgpu.kube.port.KubeApi`` against ``store``. Watches end at ``timeout_s`` or
    when the store closes them (``Store.close_watchers``). Pod creates and pod and node updates run
    the admission webhooks only when an ``admission`` chain is given (e.g. ``ApiServer.admission``),
    as ``user_info`` (who the webhooks are told is asking; ``admission.DEFAULT_USER`` if None); by
    default this door skips admission."""

    def __init__(
        self,
        store: Store,
        *,
        admission: Admission | None = None,
        user_info: JsonObj | None = None,
        clock: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        self.store = store
        self._admission = admission
        self._user_info = user_info
        self._clock = clock

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj:
        return self.store.get(kind, name, namespace=namespace)

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObj:
        """``port.ClaimReader``: the stored ResourceClaim (its kind is served where the local API
        server has the DRA kinds; NotFound otherwise)."""
        return self.store.get("resourceclaims", name, namespace=namespace)

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        return self.store.list(
            kind, namespace=namespace, label_selector=label_selector, field_selector=field_selector
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
        watcher = self.store.watch(
            kind,
            resource_version=resource_version,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
        )
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        try:
            while True:
                remaining = None if deadline is None else max(0.0, deadline - loop.time())
                event = await watcher.next_event(timeout_s=remaining)
                if event is None:
                    return
                yield port.transformed(event, transform)
        finally:
            watcher.close()

    async def create(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        if kind == "pods" and self._admission is not None and namespace:
            body = await self._admission.admit_pod_create(
                body, namespace=namespace, user_info=self._user_info
            )
        return self.store.create(kind, body, namespace=namespace)

    async def replace(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        name = (body.get("metadata") or {}).get("name")
        if self._admission is not None and isinstance(name, str) and self._admission.admits(kind):
            return await self._admission.update(
                kind, name, lambda _: body, namespace=namespace, user_info=self._user_info
            )
        return self.store.update(kind, body, namespace=namespace)

    async def merge_patch(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        if self._admission is not None and self._admission.admits(kind):
            store = self.store
            return await self._admission.update(
                kind,
                name,
                lambda _: store.patched(kind, name, dict(patch), patch_type="merge", namespace=namespace),
                namespace=namespace,
                user_info=self._user_info,
            )
        return self.store.patch(kind, name, dict(patch), patch_type="merge", namespace=namespace)

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> None:
        self.store.delete(kind, name, namespace=namespace, grace_period_s=grace_period_s)

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        self.store.bind(namespace, name, node=node, uid=uid, annotations=annotations)

    async def evict_pod(
        self, namespace: str, name: str, *, uid: str | None = None, grace_period_s: int | None = None
    ) -> None:
        options: JsonObj = {} if grace_period_s is None else {"gracePeriodSeconds": grace_period_s}
        if uid:
            options["preconditions"] = {"uid": uid}
        eviction.evict(self.store, namespace, name, options=options, now=datetime.datetime.now(datetime.UTC))

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
        self.store.create(
            "events",
            events.event_body(
                involved,
                reason=reason,
                message=message,
                type=type,
                component=component,
                now=self._clock(),
                count=count,
            ),
            namespace=namespace,
        )
