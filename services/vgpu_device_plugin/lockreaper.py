"""Release this node's lock when the pod holding it will never run an Allocate here.

The scheduler takes the node lock (``hami.io/mutex.lock``) at ``/bind``; the plugin releases it
after Allocate. When Allocate never comes (kubelet rejected the pod while this plugin was down,
the pod was deleted, or this plugin was killed mid-Allocate), the lock would name a dead pod until
the next bind on this node took it over. ``release_orphaned_lock`` runs with every Lease renewal
and removes such a lock: its holder is gone, finished, Running (its Allocate is over), or has bind
phase ``success``/``failed`` (the scheduler's takeover rules). A holder that is still Pending
(being bound or admitted) keeps it. The write is a compare-and-swap on the node's
resourceVersion, so a lock taken meanwhile by another bind is never removed.

``LateLocks`` applies the same judgement sooner to a lock the plugin's node watch delivers late:
Allocate releases the lock of the pod it served as the node cache shows it (no API read per
Allocate), and when that cache had not shown the pod's lock yet (the scheduler writes the lock,
then the Binding, and kubelet may call Allocate before the lock reaches the watch), the pod is
remembered (bounded, for ``ttl_s``) and its lock released as soon as the watch delivers it.
"""

import logging
import time
from collections.abc import Callable

from vgpu.core import annotations, errors
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_device_plugin.podcache import ClusterView

log = logging.getLogger(__name__)

_OVER = ("Succeeded", "Failed", "Running")


async def _why_orphaned(api: KubeApi, lock: annotations.NodeLock, keys: annotations.Keys) -> str | None:
    try:
        pod = await api.get("pods", lock.pod, namespace=lock.namespace)
    except errors.NotFound:
        return "is gone"
    phase = (pod.get("status") or {}).get("phase")
    if phase in _OVER:
        return f"is {phase}"
    bind_phase = annotations.of(pod).get(keys.bind_phase)
    if bind_phase in ("success", "failed"):
        return f"has bind phase {bind_phase}"
    return None


async def release_orphaned_lock(
    *, api: KubeApi, view: ClusterView, node: str, keys: annotations.Keys
) -> bool:
    """Remove this node's lock if its holder will never Allocate here; True when removed.
    ``KubeError`` from the API (other than a lost race, which is left for the next call) is raised."""
    obj = view.node()
    if obj is None:
        return False
    return await release_if_orphaned(obj, api=api, node=node, keys=keys)


def _holder(obj: JsonObj, keys: annotations.Keys) -> annotations.NodeLock | None:
    """The lock on ``obj`` when it names a holder; None without one, or when it is unreadable."""
    raw = annotations.of(obj).get(keys.node_lock)
    if not raw:
        return None
    try:
        lock = annotations.decode_node_lock(raw, field=keys.node_lock)
    except errors.AnnotationError:
        return None  # the scheduler clears unreadable locks at its next bind
    return None if lock.legacy else lock  # legacy: no holder named, the scheduler's timeout applies


async def release_if_orphaned(obj: JsonObj, *, api: KubeApi, node: str, keys: annotations.Keys) -> bool:
    """``release_orphaned_lock`` judging the node object ``obj`` (its resourceVersion guards the write)."""
    lock = _holder(obj, keys)
    if lock is None:
        return False
    why = await _why_orphaned(api, lock, keys)
    if why is None:
        return False
    patch = {
        "metadata": {
            "resourceVersion": obj["metadata"].get("resourceVersion"),
            "annotations": {keys.node_lock: None},
        }
    }
    try:
        await api.merge_patch("nodes", node, patch)
    except errors.Conflict:
        return False  # the node changed (perhaps a new lock): judged again at the next call
    log.info("node %s: released the lock of pod %s/%s, which %s", node, lock.namespace, lock.pod, why)
    return True


class LateLocks:
    """Pods whose Allocate is over while the node cache showed no lock of theirs; their lock,
    should the node watch deliver it later, is released (``release_if_orphaned``'s judgement).
    At most ``max_pods`` are remembered, each for ``ttl_s`` (the lock reaper covers the rest)."""

    def __init__(
        self,
        *,
        api: KubeApi,
        node: str,
        keys: annotations.Keys,
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = 30.0,
        max_pods: int = 64,
    ) -> None:
        self._api = api
        self._node = node
        self._keys = keys
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_pods = max_pods
        self._until: dict[tuple[str, str], float] = {}  # (namespace, name) -> forget after

    def remember(self, namespace: str, name: str) -> None:
        """The Allocate of ``namespace/name`` is over and no lock of it was seen on the node."""
        self._until.pop((namespace, name), None)  # re-inserted last: the dict stays oldest first
        self._until[(namespace, name)] = self._clock() + self._ttl_s
        while len(self._until) > self._max_pods:
            del self._until[next(iter(self._until))]

    def __len__(self) -> int:
        return len(self._until)

    async def node_changed(self, obj: JsonObj) -> None:
        """The node watch delivered ``obj``: release the lock it shows if it names a remembered pod
        that will never Allocate here. Cheap when nothing is remembered (no API call)."""
        if not self._until:
            return
        now = self._clock()
        for key in [k for k, until in self._until.items() if until <= now]:
            del self._until[key]
        lock = _holder(obj, self._keys)
        if lock is None or self._until.pop((lock.namespace, lock.pod), None) is None:
            return
        try:
            await release_if_orphaned(obj, api=self._api, node=self._node, keys=self._keys)
        except errors.KubeError as exc:  # the reaper tries again at the next Lease renewal
            log.error(
                "node %s: releasing the late lock of %s/%s failed: %s",
                self._node,
                lock.namespace,
                lock.pod,
                exc,
            )
