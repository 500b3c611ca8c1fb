"""The KubeApi port: the few API calls our services make, as one async Protocol.

Objects are plain Kubernetes JSON (``dict``, camelCase keys as on the wire), not client models:
that is what annotations, watches and the extender already speak, and it is cheap to hold in caches.
Implementations: ``vgpu.kube.client.OfficialKubeApi`` (the official ``kubernetes`` client, run off
the event loop) and ``vgpu.localcluster.client.LocalKubeApi`` (direct, in-process, for tests).
Errors are ``vgpu.core.errors.KubeError`` subclasses (NotFound, Conflict, Gone), never foreign ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

JsonObj = dict[str, Any]
Kind = Literal["nodes", "pods", "resourcequotas", "leases", "events", "namespaces", "poddisruptionbudgets"]
EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


def delete_options(grace_period_s: int | None) -> JsonObj | None:
    """The DELETE body for ``KubeApi.delete``'s grace period (None: no body, the server's default)."""
    if grace_period_s is None:
        return None
    return {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace_period_s}


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: the type and the object (for BOOKMARK only metadata.resourceVersion)."""

    type: EventType
    object: JsonObj


@dataclass(frozen=True)
class ObjectList:
    """A list answer: the items and the collection's resourceVersion to watch from."""

    items: list[JsonObj]
    resource_version: str


class KubeApi(Protocol):
    """What kube-vgpu needs from an API server. All methods are coroutines; none blocks the loop.

    ``kind`` is the plural resource name. ``namespace`` is None for cluster-scoped kinds (nodes,
    namespaces) and for listing across all namespaces.
    """

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JsonObj: ...

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList: ...

    def watch(
        self,
        kind: Kind,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: float | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version``; raises Gone when it is too old. Ends at timeout_s."""
        ...

    async def create(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj: ...

    async def replace(self, kind: Kind, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        """PUT; ``body.metadata.resourceVersion`` set means compare-and-swap (Conflict on mismatch)."""
        ...

    async def merge_patch(
        self, kind: Kind, name: str, patch: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        """JSON merge patch (RFC 7386). A ``metadata.resourceVersion`` in the patch is a precondition."""
        ...

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> None:
        """DELETE; ``grace_period_s`` is DeleteOptions.gracePeriodSeconds (None: the server's
        default; a pod deleted with a grace period gets ``deletionTimestamp`` and stays until its
        kubelet has stopped it)."""
        ...

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """POST pods/<name>/binding with target Node ``node``; ``annotations`` travel in the Binding's
        metadata and the API server merges them into the pod in the same write."""
        ...

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
        """Record an Event about ``involved`` (an object: kind, name, namespace, uid are read);
        ``count`` > 1 says it happened that many times (repeats coalesced by the recorder)."""
        ...
