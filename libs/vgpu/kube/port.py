"""The KubeApi port: the few API calls our services make, as one async Protocol.

Objects are plain Kubernetes JSON (``dict``, camelCase keys as on the wire), not client models:
that is what annotations, watches and the extender already speak, and it is cheap to hold in caches.
Implementations: ``vgpu.kube.client.OfficialKubeApi`` (the official ``kubernetes`` client, run off
the event loop on threads), ``vgpu.kube.aioapi.AioKubeApi`` (aiohttp, on the event loop) and
``vgpu.localcluster.client.LocalKubeApi`` (direct, in-process, for tests).
Errors are ``vgpu.core.errors.KubeError`` subclasses (NotFound, Conflict, Gone), never foreign ones.
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from vgpu.core import errors

JsonObj = dict[str, Any]
# what a cache keeps of each object it watches (vgpu.kube.slim): client-go's SetTransform
Transform = Callable[[JsonObj], JsonObj]
Kind = Literal[
    "nodes",
    "pods",
    "resourcequotas",
    "leases",
    "events",
    "namespaces",
    "poddisruptionbudgets",
    "tokenreviews",
    "subjectaccessreviews",
    "priorityclasses",
    "deviceclasses",
    "resourceslices",
    "resourceclaims",
    "resourceclaimtemplates",
]
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


# plural -> (group version path prefix, apiVersion, Kind, namespaced): every kind the adapters serve
RESOURCES: dict[str, tuple[str, str, str, bool]] = {
    "nodes": ("/api/v1", "v1", "Node", False),
    "pods": ("/api/v1", "v1", "Pod", True),
    "events": ("/api/v1", "v1", "Event", True),
    "resourcequotas": ("/api/v1", "v1", "ResourceQuota", True),
    "namespaces": ("/api/v1", "v1", "Namespace", False),
    "leases": ("/apis/coordination.k8s.io/v1", "coordination.k8s.io/v1", "Lease", True),
    "poddisruptionbudgets": ("/apis/policy/v1", "policy/v1", "PodDisruptionBudget", True),
    # create only: who a bearer token is and what it may do (the scheduler's views, viewauth.py)
    "tokenreviews": ("/apis/authentication.k8s.io/v1", "authentication.k8s.io/v1", "TokenReview", False),
    "subjectaccessreviews": (
        "/apis/authorization.k8s.io/v1",
        "authorization.k8s.io/v1",
        "SubjectAccessReview",
        False,
    ),
    "priorityclasses": ("/apis/scheduling.k8s.io/v1", "scheduling.k8s.io/v1", "PriorityClass", False),
    # Dynamic Resource Allocation (the DRA mode)
    "deviceclasses": ("/apis/resource.k8s.io/v1", "resource.k8s.io/v1", "DeviceClass", False),
    "resourceslices": ("/apis/resource.k8s.io/v1", "resource.k8s.io/v1", "ResourceSlice", False),
    "resourceclaims": ("/apis/resource.k8s.io/v1", "resource.k8s.io/v1", "ResourceClaim", True),
    "resourceclaimtemplates": (
        "/apis/resource.k8s.io/v1",
        "resource.k8s.io/v1",
        "ResourceClaimTemplate",
        True,
    ),
}


def resource_path(kind: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    """The REST path of ``kind`` (a collection, or the object ``name``, or its subresource ``sub``);
    a kind not in ``RESOURCES`` is a 404, a namespaced object without a namespace a 400."""
    if kind not in RESOURCES:
        raise errors.KubeError(f"kind {kind!r} is not served by this adapter", status=404, reason="NotFound")
    prefix, _, _, namespaced = RESOURCES[kind]
    path = prefix
    if namespaced and namespace:
        path += f"/namespaces/{urllib.parse.quote(namespace, safe='')}"
    elif namespaced and name is not None:
        raise errors.KubeError(
            f"{kind} are namespaced: a namespace is required", status=400, reason="BadRequest"
        )
    path += f"/{kind}"
    if name is not None:
        path += f"/{urllib.parse.quote(name, safe='')}"
    if sub is not None:
        path += f"/{sub}"
    return path


def binding_body(
    namespace: str, name: str, *, node: str, uid: str | None, annotations: Mapping[str, str] | None
) -> JsonObj:
    """The ``pods/<name>/binding`` body: target Node ``node``, the pod's uid as a precondition,
    ``annotations`` to merge into the pod in the same write."""
    meta: JsonObj = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


# The Eviction versions, newest first: policy/v1 from Kubernetes 1.22, policy/v1beta1 before it.
EVICTION_VERSIONS = ("policy/v1", "policy/v1beta1")


def eviction_version_refused(exc: errors.KubeError) -> bool:
    """True for the 400 of an API server that does not know that Eviction version (kube-apiserver
    1.20 answers a policy/v1 one: 'no kind "Eviction" is registered for version "policy/v1"')."""
    return exc.status == 400 and 'no kind "Eviction" is registered' in str(exc)


async def evict(
    post: Callable[[str, JsonObj], Awaitable[object]],
    namespace: str,
    name: str,
    *,
    uid: str | None,
    grace_period_s: int | None,
) -> None:
    """POST the pod's Eviction with ``post(path, body)``, in the newest version the API server
    knows (``EVICTION_VERSIONS``); its errors are the caller's."""
    path = resource_path("pods", namespace, name, "eviction")
    for version in EVICTION_VERSIONS:
        body = eviction_body(namespace, name, uid=uid, grace_period_s=grace_period_s, api_version=version)
        try:
            await post(path, body)
            return
        except errors.KubeError as exc:
            if version == EVICTION_VERSIONS[-1] or not eviction_version_refused(exc):
                raise


def eviction_body(
    namespace: str,
    name: str,
    *,
    uid: str | None,
    grace_period_s: int | None,
    api_version: str = EVICTION_VERSIONS[0],
) -> JsonObj:
    """The ``pods/<name>/eviction`` body (an Eviction of ``api_version``): the pod's uid as a
    precondition (a pod of the same name made since is not evicted), the grace period (None: the
    pod's own)."""
    options: JsonObj = {}
    if uid:
        options["preconditions"] = {"uid": uid}
    if grace_period_s is not None:
        options["gracePeriodSeconds"] = grace_period_s
    body: JsonObj = {
        "apiVersion": api_version,
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if options:
        body["deleteOptions"] = {"apiVersion": "v1", "kind": "DeleteOptions", **options}
    return body


def translate(status: int, body: bytes | str | None, *, what: str) -> errors.KubeError:
    """An HTTP error answer (a Status body, ideally) as one of our errors."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    message, reason = text.strip() or f"HTTP {status}", ""
    with contextlib.suppress(ValueError, AttributeError):
        parsed = json.loads(text)
        message = str(parsed.get("message") or message)
        reason = str(parsed.get("reason") or "")
    cls = {404: errors.NotFound, 409: errors.Conflict, 410: errors.Gone, 429: errors.TooManyRequests}.get(
        status, errors.KubeError
    )
    return cls(f"{what}: {message}", status=status, reason=reason)


def watch_event(line: bytes | str, path: str, transform: Transform | None = None) -> WatchEvent:
    """One line of a watch stream, its object passed through ``transform`` (see ``KubeApi.watch``);
    an ERROR event or an undecodable line raises."""
    try:
        raw = json.loads(line)
        etype, obj = raw["type"], raw["object"]
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.KubeError(f"watch {path}: undecodable event: {exc}", status=0) from None
    if etype == "ERROR":
        code = obj.get("code", 500) if isinstance(obj, dict) else 500
        raise translate(int(code), json.dumps(obj), what=f"watch {path}")
    if etype not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") or not isinstance(obj, dict):
        raise errors.KubeError(f"watch {path}: unexpected event type {etype!r}", status=0)
    return transformed(WatchEvent(etype, obj), transform)


def transformed(event: WatchEvent, transform: Transform | None) -> WatchEvent:
    """``event`` with its object passed through ``transform`` (a BOOKMARK's is left as it is)."""
    if transform is None or event.type == "BOOKMARK":
        return event
    return WatchEvent(event.type, transform(event.object))


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
        transform: Transform | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version``; raises Gone when it is too old. Ends at timeout_s.
        ``transform`` (a module-level function: it may travel to another process by reference) is
        applied to each event's object, a BOOKMARK's excepted, before it is handed out: client-go's
        SetTransform, made where the event is decoded."""
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

    async def evict_pod(
        self, namespace: str, name: str, *, uid: str | None = None, grace_period_s: int | None = None
    ) -> None:
        """POST pods/<name>/eviction: the API server deletes the pod unless a PodDisruptionBudget
        selecting it allows no disruption now (``errors.TooManyRequests``, 429)."""
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


RESOURCE_CLAIMS_PREFIX = "/apis/resource.k8s.io/v1"
"""resource.k8s.io's GA version (Kubernetes 1.34 on): where the DRA kubelet plugin reads claims."""


def resource_claim_path(namespace: str, name: str) -> str:
    """The REST path of the ResourceClaim ``namespace/name``."""
    quote = urllib.parse.quote
    return f"{RESOURCE_CLAIMS_PREFIX}/namespaces/{quote(namespace, safe='')}/resourceclaims/{quote(name, safe='')}"


class ClaimReader(Protocol):
    """The one call the DRA kubelet plugin makes: read a ResourceClaim (NotFound when it is gone)."""

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObj: ...
