"""``POST /bind``: the node lock, the bind phase and the Binding (PROTOCOL.md F.7, H.3.7, I.8).

The lock is HAMi's ``hami.io/mutex.lock = <RFC3339>,<ns>,<pod>`` on the Node, taken by
compare-and-swap: a merge patch carrying ``metadata.resourceVersion``; a Conflict re-reads the
node and tries again. A lock held by another pod is waited for, woken by the node and pod watches
(no polling), within ``bind_lock_wait_s`` (below the extender's httpTimeout). A lock is taken over
at once when its holder pod is gone, finished, running (kubelet admitted it, so its Allocate is
over), or already has bind phase ``success``/``failed``,
when it does not parse, and when it is older than ``node_lock_timeout_s``.

With the lock held: bind phase ``allocating`` and bind time on the pod, then the Binding. The
device plugin releases the lock after Allocate. Any failure undoes everything: the lock is released
(only if still ours), the pod's decision annotations are cleared, the reservation dropped, and the
reply carries the error text; a Warning ``BindingFailed`` event is recorded.
"""

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

from vgpu.core import annotations, errors, request
from vgpu.core.config import Config
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.extender import pod_ref
from vgpu_scheduler.state import ClusterState

log = logging.getLogger(__name__)


def parse_binding_args(raw: Any) -> tuple[str, str, str, str]:
    """(namespace, pod, uid, node) from ExtenderBindingArgs; ``ParseError`` when malformed."""
    if not isinstance(raw, dict):
        raise errors.ParseError("ExtenderBindingArgs", "expected a JSON object")
    lowered = {str(k).lower(): v for k, v in raw.items()}
    out = []
    for key in ("PodNamespace", "PodName", "PodUID", "Node"):
        value = raw.get(key, lowered.get(key.lower()))
        if not isinstance(value, str) or (not value and key != "PodUID"):
            raise errors.ParseError(f"ExtenderBindingArgs.{key}", "expected a non-empty string")
        out.append(value)
    return out[0], out[1], out[2], out[3]


class Binder:
    """The bind verb. ``wall_clock`` gives aware UTC datetimes (lock times), injectable for tests."""

    def __init__(
        self,
        *,
        config: Config,
        state: ClusterState,
        api: KubeApi,
        events: EventRecorder,
        wall_clock: Callable[[], datetime.datetime],
    ) -> None:
        self._config = config
        self._state = state
        self._api = api
        self._events = events
        self._now = wall_clock
        self._keys = state.keys

    async def bind(self, raw: Any) -> str:
        """Bind the pod; returns "" on success or the error text (the reply's ``Error``)."""
        ns, name, uid, node = parse_binding_args(raw)
        pod = self._state.pod(ns, name)
        try:
            if (
                pod is None
                or (pod.get("metadata") or {}).get("annotations", {}).get(self._keys.assigned_node) != node
            ):
                pod = await self._api.get("pods", name, namespace=ns)  # the watch may lag our patch
        except errors.KubeError as exc:
            self._state.release(uid)
            return f"pod {ns}/{name}: {exc}"
        uid = uid or str(pod["metadata"].get("uid", ""))
        if not self._wants_gpu(pod):
            return await self._bind_plain(ns, name, uid, node, pod)
        chosen = ((pod.get("metadata") or {}).get("annotations") or {}).get(self._keys.assigned_node)
        locked = False
        try:
            if chosen != node:
                raise errors.SchedulingError(
                    f"pod {ns}/{name} was not filtered for node {node} (decision: {chosen or 'none'})"
                )
            await self._lock(node, ns, name)
            locked = True
            now = self._now()
            phase = {
                self._keys.bind_phase: annotations.BindPhase.ALLOCATING.value,
                self._keys.bind_time: str(int(now.timestamp())),
            }
            await self._api.merge_patch("pods", name, {"metadata": {"annotations": phase}}, namespace=ns)
            await self._api.bind_pod(ns, name, node=node, uid=uid or None)
        except (errors.KubeError, errors.SchedulingError) as exc:
            message = f"binding pod {ns}/{name} to node {node} failed: {exc}"
            log.warning("%s; rolling back", message)
            await self._undo(ns, name, uid, node, unlock=locked)
            self._events.emit(pod_ref(pod), reason="BindingFailed", message=message, type="Warning")
            return message
        log.info("bound pod %s/%s to node %s", ns, name, node)
        self._events.emit(
            pod_ref(pod),
            reason="BindingSucceed",
            message=f"Successfully binding node [{node}] to {ns}/{name}",
        )
        return ""

    def _wants_gpu(self, pod: JsonObj) -> bool:
        try:
            return request.parse_pod(pod, self._config).wants_gpu
        except errors.ParseError:
            return True  # the filter refused it; do not bind it around the GPU bookkeeping

    async def _bind_plain(self, ns: str, name: str, uid: str, node: str, pod: JsonObj) -> str:
        """A pod asking for no GPU (an extender with no managedResources sees every pod): no lock."""
        try:
            await self._api.bind_pod(ns, name, node=node, uid=uid or None)
        except errors.KubeError as exc:
            message = f"binding pod {ns}/{name} to node {node} failed: {exc}"
            self._events.emit(pod_ref(pod), reason="BindingFailed", message=message, type="Warning")
            return message
        return ""

    # --- the node lock ----------------------------------------------------------------------

    async def _lock(self, node: str, ns: str, pod: str) -> None:
        key = self._keys.node_lock
        wait_s = self._config.scheduler.bind_lock_wait_s
        deadline = time.monotonic() + wait_s
        fresh: JsonObj | None = None
        while True:
            obj = fresh or self._state.node_object(node) or await self._api.get("nodes", node)
            fresh = None
            meta = obj.get("metadata") or {}
            raw = (meta.get("annotations") or {}).get(key)
            if raw:
                lock: annotations.NodeLock | None
                try:
                    lock = annotations.decode_node_lock(raw, field=key)
                except errors.AnnotationError:
                    lock = None
                if lock is not None and lock.held_by(ns, pod):
                    return
                stale = await self._stale(lock, raw)
                if stale is None:
                    assert lock is not None
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise errors.SchedulingError(
                            f"node {node} is locked by {lock.namespace}/{lock.pod or '?'} "
                            f"since {annotations.format_rfc3339(lock.time)}; waited {wait_s:g} s"
                        )
                    expires_in = self._config.scheduler.node_lock_timeout_s - self._age_s(lock)
                    changed = self._state.changed(node)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), max(0.0, min(remaining, expires_in)) + 0.001)
                    continue
                log.info("node %s: taking over lock %r: %s", node, raw, stale)
            value = annotations.encode_node_lock(annotations.NodeLock(self._now(), ns, pod))
            patch = {
                "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {key: value}}
            }
            try:
                await self._api.merge_patch("nodes", node, patch)
                return
            except errors.Conflict:
                fresh = await self._api.get("nodes", node)

    def _age_s(self, lock: annotations.NodeLock) -> float:
        return (self._now() - lock.time).total_seconds()

    async def _stale(self, lock: annotations.NodeLock | None, raw: str) -> str | None:
        """Why the lock may be taken over now, or None when its holder may still need it."""
        if lock is None:
            return f"lock value {raw!r} does not parse"
        age = self._age_s(lock)
        if age > self._config.scheduler.node_lock_timeout_s:
            return f"expired ({int(age)} s old)"
        if lock.legacy:
            return None
        holder = self._state.pod(lock.namespace, lock.pod)
        if holder is None:
            try:
                holder = await self._api.get("pods", lock.pod, namespace=lock.namespace)
            except errors.NotFound:
                return f"holder pod {lock.namespace}/{lock.pod} is gone"
        holder_phase = (holder.get("status") or {}).get("phase")
        if holder_phase in ("Succeeded", "Failed"):
            return f"holder pod {lock.namespace}/{lock.pod} has finished"
        if holder_phase == "Running":  # kubelet admitted it: Allocate is behind it
            return f"holder pod {lock.namespace}/{lock.pod} is running"
        phase = ((holder.get("metadata") or {}).get("annotations") or {}).get(self._keys.bind_phase)
        if phase in (annotations.BindPhase.SUCCESS.value, annotations.BindPhase.FAILED.value):
            return f"holder pod {lock.namespace}/{lock.pod} has bind phase {phase}"
        return None

    async def _unlock(self, node: str, ns: str, pod: str) -> None:
        key = self._keys.node_lock
        for _ in range(5):
            obj = await self._api.get("nodes", node)
            meta = obj.get("metadata") or {}
            raw = (meta.get("annotations") or {}).get(key)
            if not raw or not raw.endswith(f",{ns},{pod}"):
                return  # released already, or someone else's now
            patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {key: None}}}
            try:
                await self._api.merge_patch("nodes", node, patch)
                return
            except errors.Conflict:
                continue

    async def _undo(self, ns: str, name: str, uid: str, node: str, *, unlock: bool) -> None:
        self._state.release(uid)
        if unlock:
            try:
                await self._unlock(node, ns, name)
            except errors.KubeError as exc:
                log.warning("node %s: could not release the lock of pod %s/%s: %s", node, ns, name, exc)
        keys = self._keys
        cleared: dict[str, None] = {
            k: None
            for k in (
                keys.assigned_node,
                keys.assigned_time,
                keys.devices_to_allocate,
                keys.devices_allocated,
                keys.bind_phase,
                keys.bind_time,
            )
        }
        patch = {"metadata": {"annotations": cleared, "labels": {keys.assigned_node: None}}}
        try:
            await self._api.merge_patch("pods", name, patch, namespace=ns)
        except errors.KubeError as exc:
            log.warning("pod %s/%s: could not clear its decision: %s", ns, name, exc)
