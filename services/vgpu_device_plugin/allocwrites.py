"""What an Allocate writes, handed to the write queue after kubelet has its answer.

A served container: the rewritten to-allocate (with ``bind-phase: success`` and the
``hami.io/vgpu-node`` label when no entry is left, then the node lock released). A failed Allocate:
bind phase ``failed``, then the lock released. Each write is first told to the ``PodOverlay``
(the pod as it will leave it), so the next Allocate reads this plugin's decision whether the write
has landed or not. The lock release is owner-checked with a resourceVersion precondition, judged on
the newest node known (the watch's, or the one the Allocate read from the API); a lock the cache
has not shown yet is released when the watch delivers it (``lockreaper.LateLocks``).
"""

import logging
from collections.abc import Callable
from typing import Any

from vgpu.core import annotations, errors
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_device_plugin import lockreaper, writebehind
from vgpu_device_plugin.podcache import ClusterView
from vgpu_device_plugin.podoverlay import PodOverlay, key, rv

log = logging.getLogger(__name__)

_LOCK_RELEASE_ATTEMPTS = 3


class AllocationWrites:
    def __init__(
        self,
        *,
        api: KubeApi,
        view: ClusterView,
        node: str,
        keys: annotations.Keys,
        writes: writebehind.Writes,
        overlay: PodOverlay,
        clock: Callable[[], float],
    ) -> None:
        self._api = api
        self._view = view
        self._node = node
        self._keys = keys
        self.writes = writes
        self.overlay = overlay
        self._late = lockreaper.LateLocks(api=api, node=node, keys=keys, clock=clock)

    def _allocation_patch(self, remaining: annotations.PodDevices) -> dict[str, Any]:
        notes: dict[str, Any] = {self._keys.devices_to_allocate: annotations.encode_pod_devices(remaining)}
        meta: dict[str, Any] = {"annotations": notes}
        if not any(remaining):
            notes[self._keys.bind_phase] = annotations.BindPhase.SUCCESS.value
            # the hami.io/vgpu-node label (kubectl get pods -l) rides on this write: no extra round trip
            meta["labels"] = {self._keys.assigned_node: self._node}
        return {"metadata": meta}

    async def served(self, pod: JsonObj, remaining: annotations.PodDevices, *, read: JsonObj | None) -> None:
        """After the answer: the rewritten to-allocate (and bind phase success with the last
        container) is written, then the node lock released. ``read``: the node the Allocate read
        from the API, if it did."""
        namespace, name = key(pod)
        patch = self._allocation_patch(remaining)
        seq = self.overlay.will_write(pod, patch)
        done = not any(remaining)

        async def write() -> None:
            try:
                patched = await self._api.merge_patch("pods", name, patch, namespace=namespace)
            except errors.NotFound:
                log.info("pod %s/%s: deleted before its allocation was written", namespace, name)
            else:
                self.overlay.written(seq, patched)
            if done:
                log.info("pod %s/%s: every container allocated; bind phase success", namespace, name)
                await self._release_lock(namespace, name, read=read)

        await self.writes.submit(f"pod {namespace}/{name}: writing the allocation", write)

    async def failed(self, pod: JsonObj, reason: str, *, read: JsonObj | None) -> None:
        """Bind phase failed, then the node lock released (``reason`` is logged)."""
        namespace, name = key(pod)
        log.warning("pod %s/%s: Allocate failed, bind phase failed: %s", namespace, name, reason)
        patch = {"metadata": {"annotations": {self._keys.bind_phase: annotations.BindPhase.FAILED.value}}}
        seq = self.overlay.will_write(pod, patch)

        async def write() -> None:
            try:  # another failure is retried by the queue
                patched = await self._api.merge_patch("pods", name, patch, namespace=namespace)
            except errors.NotFound:
                log.info("pod %s/%s: deleted before its bind phase was written", namespace, name)
            else:
                self.overlay.written(seq, patched)
            await self._release_lock(namespace, name, read=read)

        await self.writes.submit(f"pod {namespace}/{name}: marking the bind failed", write)

    def _known_node(self, read: JsonObj | None) -> JsonObj | None:
        """The newest node known: the watch's, or the one the Allocate read from the API."""
        cached = self._view.node()
        if read is None or (cached is not None and rv(cached) >= rv(read)):
            return cached
        return read

    async def _release_lock(self, namespace: str, name: str, *, read: JsonObj | None) -> None:
        """Remove the node lock if this pod holds it (resourceVersion precondition, re-read on conflict).
        No lock of the pod known: its lock, if the watch delivers one later, is released then."""
        node = self._known_node(read)
        for _ in range(_LOCK_RELEASE_ATTEMPTS):
            if node is None:
                self._late.remember(namespace, name)
                return
            raw = annotations.of(node).get(self._keys.node_lock)
            try:
                lock = annotations.decode_node_lock(raw, field=self._keys.node_lock) if raw else None
            except errors.AnnotationError:
                lock = None  # not ours to judge; the scheduler clears unreadable locks
            if lock is None or not lock.held_by(namespace, name):
                self._late.remember(namespace, name)  # perhaps the watch has not shown it yet
                return
            patch = {
                "metadata": {
                    "resourceVersion": node["metadata"].get("resourceVersion"),
                    "annotations": {self._keys.node_lock: None},
                }
            }
            try:
                await self._api.merge_patch("nodes", self._node, patch)
                log.info("node %s: lock of pod %s/%s released", self._node, namespace, name)
                return
            except errors.Conflict:
                node = await self._get_node()
            except errors.KubeError as exc:
                log.error("node %s: releasing the lock of %s/%s failed: %s", self._node, namespace, name, exc)
                return
        log.error("node %s: lock of %s/%s not released: kept conflicting", self._node, namespace, name)

    async def node_changed(self, node: JsonObj) -> None:
        """The node watch delivered ``node``: a lock it shows of a pod whose Allocate is over and
        that the cache did not show then is released (an API call only in that case)."""
        await self._late.node_changed(node)

    async def _get_node(self) -> JsonObj | None:
        try:
            return await self._api.get("nodes", self._node)
        except errors.KubeError as exc:
            log.error("node %s: re-reading the node failed: %s", self._node, exc)
            return None
