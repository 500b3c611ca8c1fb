"""The local cluster's object store: what etcd plus the API server's registry do, in memory.

Semantics (the ones our code relies on):
- one global, increasing ``resourceVersion`` (an int rendered as a string) stamped on every write;
  ``uid``, ``creationTimestamp`` and ``generateName`` are filled in on create;
- optimistic concurrency: an update or patch whose ``metadata.resourceVersion`` is stale is a
  ``Conflict``; creating an existing name is a ``Conflict`` (AlreadyExists);
- subresources: writes to the main resource keep the stored ``status`` of kinds that have a status
  subresource (pods, nodes, namespaces, resourcequotas); ``subresource="status"`` writes change
  only ``status``. Pod binding sets ``spec.nodeName`` and the ``PodScheduled`` condition, and is a
  Conflict when the pod is already bound;
- delete is immediate (no finalizers, no graceful deletion, no ``deletionTimestamp``);
- watches (``Watcher``) replay from a resourceVersion out of a bounded history, raising ``Gone``
  (410) when it is too old; ``""``/``"0"`` starts with synthetic ADDED events for what exists.
  A watch filtered by selectors sees an object that starts or stops matching as ADDED or DELETED,
  as the real watch cache does. BOOKMARKs go to watchers that asked for them (``emit_bookmarks``).

Everything runs on one event loop and no mutation awaits, so no locks are needed. Returned
objects are copies: callers may modify them freely.
"""

from __future__ import annotations

import collections
import datetime
import random
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from vgpu.core import errors
from vgpu.kube.port import JsonObj, ObjectList, WatchEvent
from vgpu.localcluster import patch as patches
from vgpu.localcluster import selectors
from vgpu.localcluster.kinds import KINDS, KindInfo, default_pod_spec, kind_info, resolve_priority
from vgpu.localcluster.patch import clone
from vgpu.localcluster.watcher import Watcher

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
PatchType = str  # "merge" | "strategic" | "json"


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _invalid(message: str) -> errors.KubeError:
    return errors.KubeError(message, status=422, reason="Invalid")


def _bad(message: str) -> errors.KubeError:
    return errors.KubeError(message, status=400, reason="BadRequest")


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
        self._rv = 0
        # (rv, kind, event, the object before a MODIFIED): stored objects are never mutated in place
        self._history: collections.deque[tuple[int, str, WatchEvent, JsonObj | None]] = collections.deque()
        self._history_size = history_size
        self._floor = 0  # every event with rv > floor is still in the history
        self._watchers: set[Watcher] = set()
        self._watch_queue_size = watch_queue_size
        self._clock = clock
        self._rng = rng or random.Random()
        for ns in default_namespaces:
            self.create("namespaces", {"metadata": {"name": ns}})

    # ----- reads -----

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self._rv)

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
        return ObjectList(items=items, resource_version=str(self._rv))

    def _key(self, info: KindInfo, name: str, namespace: str | None) -> tuple[str, str]:
        if info.namespaced and not namespace:
            raise _bad(f"{info.plural} are namespaced: a namespace is required")
        return (namespace or "" if info.namespaced else "", name)

    def _stored(self, info: KindInfo, name: str, namespace: str | None) -> JsonObj:
        obj = self._objects[info.plural].get(self._key(info, name, namespace))
        if obj is None:
            raise errors.NotFound(f'{info.plural} "{name}" not found', status=404, reason="NotFound")
        return obj

    # ----- writes -----

    def _validate(self, info: KindInfo, body: Any, namespace: str | None) -> JsonObj:
        if not isinstance(body, dict):
            raise _bad(f"{info.kind} body must be a JSON object")
        if body.get("kind") not in (None, "", info.kind):
            raise _bad(f"the kind of the object ({body.get('kind')}) is not {info.kind}")
        if body.get("apiVersion") not in (None, "", info.api_version):
            raise _bad(f"the apiVersion of the object ({body.get('apiVersion')}) is not {info.api_version}")
        meta = body.get("metadata")
        if meta is None:
            meta = body["metadata"] = {}
        if not isinstance(meta, dict):
            raise _invalid(f"{info.kind}.metadata: must be an object")
        body_ns = meta.get("namespace")
        if info.namespaced:
            if body_ns not in (None, "", namespace):
                raise _bad(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        for field in ("labels", "annotations"):
            value = meta.get(field)
            if value is None:
                continue
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise _invalid(f"metadata.{field}: Invalid value: must be a map of string to string")
        if field_set := [f for f in ("spec", "status") if f in body and not isinstance(body[f], dict | None)]:
            raise _invalid(f"{info.kind}.{field_set[0]}: must be an object")
        body["kind"] = info.kind
        body["apiVersion"] = info.api_version
        return body

    def _check_name(self, info: KindInfo, name: Any) -> str:
        if not isinstance(name, str) or not name:
            raise _invalid(f"{info.kind}.metadata.name: Required value: name or generateName is required")
        if len(name) > 253 or not _NAME_RE.match(name):
            raise _invalid(
                f'{info.kind} "{name}" is invalid: metadata.name: Invalid value: "{name}": a lowercase '
                "RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
            )
        return name

    def _commit(self, info: KindInfo, event_type: str, obj: JsonObj, old: JsonObj | None) -> None:
        """Record one event in the history and fan it out to matching watchers."""
        event = WatchEvent(event_type, obj)  # type: ignore[arg-type]
        self._history.append((self._rv, info.plural, event, old))
        while len(self._history) > self._history_size:
            self._floor = self._history.popleft()[0]
        for w in list(self._watchers):
            if w.info is info:
                self._deliver(w, event, old)

    @staticmethod
    def _deliver(w: Watcher, event: WatchEvent, old: JsonObj | None) -> None:
        now = w.matches(event.object)
        before = old is not None and w.matches(old)
        if event.type == "MODIFIED" and now != before:
            w.push(WatchEvent("ADDED" if now else "DELETED", event.object))
        elif now:
            w.push(event)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def create(self, kind: str, body: JsonObj, *, namespace: str | None = None) -> JsonObj:
        info = kind_info(kind)
        obj = self._validate(info, clone(body), namespace)
        meta = obj["metadata"]
        table = self._objects[kind]
        if not meta.get("name") and meta.get("generateName"):
            prefix = str(meta["generateName"])
            for _ in range(100):
                name = prefix + "".join(self._rng.choice(_SUFFIX_ALPHABET) for _ in range(5))
                if self._key(info, name, namespace) not in table:
                    break
            meta["name"] = name
        name = self._check_name(info, meta.get("name"))
        key = self._key(info, name, namespace)
        if key in table:
            raise errors.Conflict(f'{kind} "{name}" already exists', status=409, reason="AlreadyExists")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self._clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        meta.pop("deletionTimestamp", None)
        if kind == "pods":
            spec = obj.setdefault("spec", {}) or {}
            obj["spec"] = spec
            containers = spec.get("containers")
            if not isinstance(containers, list) or not containers:
                raise _invalid(f'Pod "{name}" is invalid: spec.containers: Required value')
            for i, c in enumerate(containers):
                if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
                    raise _invalid(f'Pod "{name}" is invalid: spec.containers[{i}].name: Required value')
            default_pod_spec(spec)
            resolve_priority(spec, self._objects["priorityclasses"].values(), pod=name)
            obj["status"] = {"phase": "Pending"}
        if kind == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            obj["status"] = {"phase": "Active"}
        meta["resourceVersion"] = self._next_rv()
        table[key] = obj
        self._commit(info, "ADDED", obj, None)
        return clone(obj)

    def update(
        self, kind: str, body: JsonObj, *, namespace: str | None = None, subresource: str | None = None
    ) -> JsonObj:
        """PUT: replace the object (or only its status with ``subresource="status"``)."""
        info = kind_info(kind)
        obj = self._validate(info, clone(body), namespace)
        name = obj["metadata"].get("name")
        if not isinstance(name, str) or not name:
            raise _invalid(f"{info.kind}.metadata.name: Required value")
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
            self._check_pod_spec(current, result)
        if info.plural == "namespaces":
            result["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        result["metadata"]["resourceVersion"] = self._next_rv()
        self._objects[info.plural][self._key(info, name, namespace)] = result
        self._commit(info, "MODIFIED", result, current)
        return clone(result)

    @staticmethod
    def _check_pod_spec(current: JsonObj, new: JsonObj) -> None:
        old_node = (current.get("spec") or {}).get("nodeName")
        new_node = (new.get("spec") or {}).get("nodeName")
        if old_node and new_node != old_node:
            raise _invalid(
                f'Pod "{current["metadata"]["name"]}" is invalid: spec.nodeName: field is immutable'
            )

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
                raise _bad("merge patch: the patch must be a JSON object")
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
            raise _invalid(f"{info.kind}: the patched object is not a JSON object")
        meta = result.get("metadata")
        if not isinstance(meta, dict):
            raise _invalid(f"{info.kind}.metadata: must be an object")
        for field in ("name", "namespace", "uid", "creationTimestamp"):
            if meta.get(field) != current["metadata"].get(field):
                raise _invalid(f'{info.kind} "{name}" is invalid: metadata.{field}: field is immutable')
        return self._validate(info, result, namespace)

    def delete(
        self, kind: str, name: str, *, namespace: str | None = None, grace_period_s: int | None = None
    ) -> JsonObj:
        """Remove at once and return the object as last stored (with the deletion's resourceVersion).

        A pod bound to a node and not finished, deleted with ``grace_period_s`` > 0, is only marked
        (``deletionTimestamp`` now + grace, ``deletionGracePeriodSeconds``): its kubelet stops it and
        deletes it with grace 0, as upstream. Unlike upstream, no grace period given means at once
        (the pod's ``terminationGracePeriodSeconds`` is not applied by default)."""
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
            meta = current["metadata"]
            if meta.get("deletionTimestamp"):
                return clone(current)  # already terminating
            marked = clone(current)
            when = self._clock() + datetime.timedelta(seconds=grace_period_s)
            marked["metadata"]["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
            marked["metadata"]["deletionGracePeriodSeconds"] = grace_period_s
            marked["metadata"]["resourceVersion"] = self._next_rv()
            self._objects[kind][self._key(info, name, namespace)] = marked
            self._commit(info, "MODIFIED", marked, current)
            return clone(marked)
        del self._objects[kind][self._key(info, name, namespace)]
        gone = clone(current)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        self._commit(info, "DELETED", gone, None)
        return clone(gone)

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
        if not node:
            raise _invalid("Binding.target.name: Required value")
        for what, want, have in (
            ("UID", uid, current["metadata"]["uid"]),
            ("ResourceVersion", resource_version, current["metadata"]["resourceVersion"]),
        ):
            if want and want != have:
                raise errors.Conflict(
                    f'Operation cannot be fulfilled on pods/binding "{name}": Precondition failed: '
                    f"{what} in precondition: {want}, {what} in object meta: {have}",
                    status=409,
                    reason="Conflict",
                )
        if current["metadata"].get("deletionTimestamp"):
            raise errors.Conflict(
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is being deleted, '
                "cannot be assigned to a host",
                status=409,
                reason="Conflict",
            )
        spec = current.get("spec") or {}
        if spec.get("nodeName"):
            raise errors.Conflict(
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                f'assigned to node "{spec["nodeName"]}"',
                status=409,
                reason="Conflict",
            )
        for key, value in (annotations or {}).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise _invalid(f"Binding.metadata.annotations[{key!r}]: must be a string")
        result = clone(current)
        result.setdefault("spec", {})["nodeName"] = node
        if annotations:
            result["metadata"]["annotations"] = {
                **(result["metadata"].get("annotations") or {}),
                **annotations,
            }
        status = result.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": self._clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        status["conditions"] = conditions
        result["metadata"]["resourceVersion"] = self._next_rv()
        self._objects["pods"][(namespace, name)] = result
        self._commit(info, "MODIFIED", result, current)
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
        w = Watcher(
            info,
            namespace=namespace if info.namespaced else None,
            labels=selectors.parse_label_selector(label_selector),
            fields=selectors.parse_field_selector(field_selector, kind=kind),
            allow_bookmarks=allow_bookmarks,
            max_queue=self._watch_queue_size,
            on_close=self._watchers.discard,
        )
        if resource_version in (None, "", "0"):
            for _, obj in sorted(self._objects[kind].items()):
                if w.matches(obj):
                    w.push(WatchEvent("ADDED", obj))
        else:
            try:
                since = int(str(resource_version))
            except ValueError:
                raise _bad(f"invalid resource version {resource_version!r}") from None
            if since < self._floor:
                raise errors.Gone(
                    f"too old resource version: {since} ({self._floor + 1})", status=410, reason="Expired"
                )
            for rv, plural, event, old in self._history:
                if rv > since and plural == kind:
                    self._deliver(w, event, old)
        self._watchers.add(w)
        return w

    def emit_bookmarks(self) -> None:
        """Send a BOOKMARK with the current resourceVersion to every watcher that allows them."""
        for w in list(self._watchers):
            if w.allow_bookmarks:
                marker = {
                    "kind": w.info.kind,
                    "apiVersion": w.info.api_version,
                    "metadata": {"resourceVersion": str(self._rv)},
                }
                w.push(WatchEvent("BOOKMARK", marker))

    def close_watchers(self) -> None:
        """End every open watch (a server restart, or a test dropping connections)."""
        for w in list(self._watchers):
            w.close()

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    @property
    def watchers(self) -> tuple[Watcher, ...]:
        """The open watches (their ``ended`` events tell when each goes away)."""
        return tuple(self._watchers)
