"""The local cluster's object store: what etcd plus the API server's registry do, in memory.

Semantics (the ones our code relies on):
- one global, increasing ``resourceVersion`` (an int rendered as a string) stamped on every write;
  ``uid``, ``creationTimestamp`` and ``generateName`` are filled in on create;
- optimistic concurrency: an update or patch whose ``metadata.resourceVersion`` is stale is a
  ``Conflict``; creating an existing name is a ``Conflict`` (AlreadyExists);
- subresources: writes to the main resource keep the stored ``status`` of kinds that have a status
  subresource (pods, nodes, namespaces, resourcequotas); ``subresource="status"`` writes change
  only ``status``. Pod binding sets ``spec.nodeName`` and the ``PodScheduled`` condition, and is a
  Conflict when the pod is already bound (``binding``);
- bodies are checked as kube-apiserver checks them (``validation``): 400 BadRequest, 422 Invalid;
- delete is immediate (no finalizers, no graceful deletion, no ``deletionTimestamp``);
- watches (``Watcher``) replay from a resourceVersion out of a bounded history, raising ``Gone``
  (410) when it is too old; ``""``/``"0"`` starts with synthetic ADDED events for what exists.
  A watch filtered by selectors sees an object that starts or stops matching as ADDED or DELETED,
  as the real watch cache does. BOOKMARKs go to watchers that asked for them (``emit_bookmarks``).
  The resourceVersion, the history and the watches are the store's ``eventlog.EventLog``.

Everything runs on one event loop and no mutation awaits, so no locks are needed. Returned
objects are copies: callers may modify them freely.
"""

from __future__ import annotations

import datetime
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from vgpu.core import errors
from vgpu.kube.port import JsonObj, ObjectList
from vgpu.localcluster import binding, dravalidation, quantities, selectors, validation
from vgpu.localcluster import patch as patches
from vgpu.localcluster.eventlog import EventLog
from vgpu.localcluster.kinds import KINDS, KindInfo, default_pod_spec, kind_info, resolve_priority
from vgpu.localcluster.patch import clone
from vgpu.localcluster.watcher import Watcher

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
PatchType = str  # "merge" | "strategic" | "json"


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _decoded(info: KindInfo, body: Any, namespace: str | None) -> JsonObj:
    """``body`` checked (``validation.validate``) and in the form kube-apiserver decodes and stores
    it: canonical quantities, MicroTimes in UTC (400 for a value that does not decode)."""
    obj = validation.validate(info, body, namespace)
    return quantities.canonicalize(info.plural, validation.micro_times(info, obj))


class Store:
    """In-memory objects of every kind in ``KINDS``, with watches. See the module docstring."""

    def __init__(
        self,
        *,
        history_size: int = 10_000,
        watch_queue_size: int = 100_000,
        clock: Callable[[], datetime.datetime] = _utcnow,
        rng: random.Random | None = None,
        default_namespaces: tuple[str, ...] = DEFAULT_NAMESPACES,
    ) -> None:
        self._objects: dict[str, dict[tuple[str, str], JsonObj]] = {k: {} for k in KINDS}
        self._log = EventLog(history_size=history_size, watch_queue_size=watch_queue_size)
        self._clock = clock
        self._rng = rng or random.Random()
        for ns in default_namespaces:
            self.create("namespaces", {"metadata": {"name": ns}})

    def now(self) -> datetime.datetime:
        """The store's time (what it stamps objects with): ages are measured against it."""
        return self._clock()

    # ----- reads -----

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return self._log.resource_version

    def get(self, kind: str, name: str, *, namespace: str | None = None) -> JsonObj:
        info = kind_info(kind)
        return clone(self._stored(info, name, namespace))

    def list(
        self,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        """Matching objects, ordered by namespace then name, and the current resourceVersion."""
        info = kind_info(kind)
        labels = selectors.parse_label_selector(label_selector)
        fields = selectors.parse_field_selector(field_selector, kind=kind)
        ns = namespace if info.namespaced else None
        items = [
            clone(obj)
            for (obj_ns, _), obj in sorted(self._objects[kind].items())
            if (ns is None or obj_ns == ns)
            and labels.matches(obj["metadata"].get("labels") or {})
            and fields.matches(obj)
        ]
        return ObjectList(items=items, resource_version=self._log.resource_version)

    def _key(self, info: KindInfo, name: str, namespace: str | None) -> tuple[str, str]:
        if info.namespaced and not namespace:
            raise validation.bad_request(f"{info.plural} are namespaced: a namespace is required")
        return (namespace or "" if info.namespaced else "", name)

    def _stored(self, info: KindInfo, name: str, namespace: str | None) -> JsonObj:
        obj = self._objects[info.plural].get(self._key(info, name, namespace))
        if obj is None:
            raise errors.NotFound(f'{info.plural} "{name}" not found', status=404, reason="NotFound")
        return obj

    # ----- writes -----

    def create(self, kind: str, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        info = kind_info(kind)
        obj = _decoded(info, clone(body), namespace)
        meta = obj["metadata"]
        table = self._objects[kind]
        if not meta.get("name") and meta.get("generateName"):
            prefix = str(meta["generateName"])
            for _ in range(100):
                name = prefix + "".join(self._rng.choice(_SUFFIX_ALPHABET) for _ in range(5))
                if self._key(info, name, namespace) not in table:
                    break
            meta["name"] = name
        name = validation.check_name(info, meta.get("name"))
        key = self._key(info, name, namespace)
        if key in table:
            raise errors.Conflict(f'{kind} "{name}" already exists', status=409, reason="AlreadyExists")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self._clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        meta.pop("deletionTimestamp", None)
        if kind == "pods":
            spec = obj.setdefault("spec", {}) or {}
            obj["spec"] = spec
            validation.check_pod_containers(name, spec)
            default_pod_spec(spec)
            resolve_priority(spec, self._objects["priorityclasses"].values(), pod=name)
            obj["status"] = {"phase": "Pending"}
        if kind == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            obj["status"] = {"phase": "Active"}
        if kind == "resourceclaims":
            obj.pop("status", None)  # the registry's PrepareForCreate: a new claim has no status
        dravalidation.check(kind, obj, now=self._clock())
        meta["resourceVersion"] = self._log.next_rv()
        table[key] = obj
        self._log.commit(info, "ADDED", obj, None)
        return clone(obj)

    def update(
        self, kind: str, body: JsonObj, *, namespace: str | None = None, subresource: str | None = None
    ) -> JsonObj:
        """PUT: replace the object (or only its status with ``subresource="status"``)."""
        info = kind_info(kind)
        obj = _decoded(info, clone(body), namespace)
        name = obj["metadata"].get("name")
        if not isinstance(name, str) or not name:
            raise validation.invalid(f"{info.kind}.metadata.name: Required value")
        return self._replace(info, obj, namespace, subresource)

    def _replace(
        self, info: KindInfo, new: JsonObj, namespace: str | None, subresource: str | None
    ) -> JsonObj:
        meta = new["metadata"]
        name = meta["name"]
        current = self._stored(info, name, namespace)
        cur_meta = current["metadata"]
        rv = meta.get("resourceVersion")
        if rv not in (None, "") and rv != cur_meta["resourceVersion"]:
            raise errors.Conflict(
                f'Operation cannot be fulfilled on {info.plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                status=409,
                reason="Conflict",
            )
        if meta.get("uid") not in (None, "", cur_meta["uid"]):
            raise errors.Conflict(
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {cur_meta['uid']}",
                status=409,
                reason="Conflict",
            )
        if subresource == "status":
            result = clone(current)
            if "status" in new:
                result["status"] = new["status"]
        elif subresource is not None:
            raise errors.NotFound(f"{info.plural}/{subresource} is not served", status=404)
        else:
            result = new
            for field in ("uid", "creationTimestamp"):
                result["metadata"][field] = cur_meta[field]
            if info.has_status:
                if "status" in current:
                    result["status"] = clone(current["status"])
                else:
                    result.pop("status", None)
        if info.plural == "pods" and subresource is None:
            validation.check_pod_update(current, result)
        dravalidation.check(info.plural, result, old=current, now=self._clock())
        if info.plural == "namespaces":
            result["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        result["metadata"]["resourceVersion"] = self._log.next_rv()
        self._objects[info.plural][self._key(info, name, namespace)] = result
        self._log.commit(info, "MODIFIED", result, current)
        return clone(result)

    def patch(
        self,
        kind: str,
        name: str,
        patch: Any,
        *,
        patch_type: PatchType = "merge",
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JsonObj:
        """PATCH with ``patch_type`` "merge", "strategic" or "json". A resourceVersion that the
        patch leaves different from the stored one is a Conflict (a precondition, as upstream)."""
        info = kind_info(kind)
        obj = self.patched(kind, name, patch, patch_type=patch_type, namespace=namespace)
        return self._replace(info, obj, namespace, subresource)

    def patched(
        self,
        kind: str,
        name: str,
        patch: Any,
        *,
        patch_type: PatchType = "merge",
        namespace: str | None = None,
    ) -> JsonObj:
        """The stored object with ``patch`` applied and validated, not stored (what admission sees
        on an UPDATE; ``update`` it to store, with its resourceVersion as the precondition)."""
        info = kind_info(kind)
        current = self._stored(info, name, namespace)
        if patch_type == "merge":
            if not isinstance(patch, dict):
                raise validation.bad_request("merge patch: the patch must be a JSON object")
            result = patches.merge_patch(current, patch)
        elif patch_type == "strategic":
            result = patches.strategic_merge_patch(current, patch)
        elif patch_type == "json":
            result = patches.json_patch(current, patch)
        else:
            raise errors.KubeError(
                f"unsupported patch type {patch_type!r}", status=415, reason="UnsupportedMediaType"
            )
        if not isinstance(result, dict):
            raise validation.invalid(f"{info.kind}: the patched object is not a JSON object")
        meta = result.get("metadata")
        if not isinstance(meta, dict):
            raise validation.invalid(f"{info.kind}.metadata: must be an object")
        for field in ("name", "namespace", "uid", "creationTimestamp"):
            if meta.get(field) != current["metadata"].get(field):
                raise validation.invalid(
                    f'{info.kind} "{name}" is invalid: metadata.{field}: field is immutable'
                )
        validated = validation.validate(info, result, namespace)
        try:
            return quantities.canonicalize(info.plural, validation.micro_times(info, validated))
        except errors.KubeError as exc:
            if exc.status != 400:
                raise
            # the patched object does not decode: kube-apiserver answers a PATCH 422 (field "patch")
            raise validation.invalid(
                f'{info.kind} "{name}" is invalid: patch: Invalid value: {exc}'
            ) from None

    def delete(
        self, kind: str, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> JsonObj:
        """Remove at once and return the object as last stored (with the deletion's resourceVersion).

        A pod bound to a node and not finished, deleted with ``grace_period_s`` > 0, is only marked
        (``deletionTimestamp`` now + grace, ``deletionGracePeriodSeconds``): its kubelet stops it and
        deletes it with grace 0, as upstream. Unlike upstream, no grace period given means at once
        (the pod's ``terminationGracePeriodSeconds`` is not applied by default). A pod removed at once
        is marked first with grace 0 (a MODIFIED, then the DELETED), as upstream."""
        info = kind_info(kind)
        current = self._stored(info, name, namespace)
        spec = current.get("spec") or {}
        phase = (current.get("status") or {}).get("phase")
        if (
            kind == "pods"
            and grace_period_s
            and spec.get("nodeName")
            and phase not in ("Succeeded", "Failed")
        ):
            if current["metadata"].get("deletionTimestamp"):
                return clone(current)  # already terminating
            return clone(self._mark(info, name, namespace, current, grace_s=grace_period_s))
        if kind == "pods":
            # upstream deletes a pod gracefully even with grace 0: it is first marked (a MODIFIED
            # with deletionTimestamp and deletionGracePeriodSeconds 0), then removed
            current = self._mark(info, name, namespace, current, grace_s=0)
        del self._objects[kind][self._key(info, name, namespace)]
        gone = clone(current)
        gone["metadata"]["resourceVersion"] = self._log.next_rv()
        self._log.commit(info, "DELETED", gone, None)
        return clone(gone)

    def _mark(
        self, info: KindInfo, name: str, namespace: str | None, current: JsonObj, *, grace_s: int
    ) -> JsonObj:
        """Store ``current`` marked for deletion in ``grace_s`` (a MODIFIED); an earlier
        ``deletionTimestamp`` is kept when the grace is 0 (the pod is removed right after)."""
        marked = clone(current)
        meta = marked["metadata"]
        if grace_s or not meta.get("deletionTimestamp"):
            when = self._clock() + datetime.timedelta(seconds=grace_s)
            meta["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        meta["deletionGracePeriodSeconds"] = grace_s
        meta["resourceVersion"] = self._log.next_rv()
        self._objects[info.plural][self._key(info, name, namespace)] = marked
        self._log.commit(info, "MODIFIED", marked, current)
        return marked

    def bind(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        uid: str | None = None,
        resource_version: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> JsonObj:
        """The ``pods/binding`` subresource, as kube-apiserver's ``BindingREST`` does it
        (``setPodHostAndAnnotations``): with the Binding's uid and resourceVersion as preconditions,
        refuse a pod being deleted or already assigned, else set ``spec.nodeName``, merge the
        Binding's ``metadata.annotations`` into the pod's and set ``PodScheduled=True``."""
        info = KINDS["pods"]
        current = self._stored(info, name, namespace)
        result = binding.bound_pod(
            current,
            node=node,
            uid=uid,
            resource_version=resource_version,
            annotations=annotations,
            now=self._clock(),
        )
        result["metadata"]["resourceVersion"] = self._log.next_rv()
        self._objects["pods"][(namespace, name)] = result
        self._log.commit(info, "MODIFIED", result, current)
        return clone(result)

    # ----- watch -----

    def watch(
        self,
        kind: str,
        *,
        resource_version: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        allow_bookmarks: bool = False,
    ) -> Watcher:
        """Start a watch. ``None``, ``""`` or ``"0"``: ADDED for every current match, then changes;
        otherwise changes after ``resource_version``, or ``Gone`` when the history lost some."""
        info = kind_info(kind)
        return self._log.watch(
            info,
            self._objects[kind],
            resource_version=resource_version,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            allow_bookmarks=allow_bookmarks,
        )

    def emit_bookmarks(self) -> None:
        """Send a BOOKMARK with the current resourceVersion to every watcher that allows them."""
        self._log.emit_bookmarks()

    def close_watchers(self) -> None:
        """End every open watch (a server restart, or a test dropping connections)."""
        self._log.close_watchers()

    @property
    def watcher_count(self) -> int:
        return self._log.watcher_count

    @property
    def watchers(self) -> tuple[Watcher, ...]:
        """The open watches (their ``ended`` events tell when each goes away)."""
        return self._log.watchers
