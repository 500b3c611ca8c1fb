"""Release this node's lock when the pod holding it will never run an Allocate here.

The scheduler takes the node lock (``hami.io/mutex.lock``) at ``/bind``; the plugin releases it
after Allocate. When Allocate never comes (kubelet rejected the pod while this plugin was down,
the pod was deleted, or this plugin was killed mid-Allocate), the lock would name a dead pod until
the next bind on this node took it over. ``release_orphaned_lock`` runs with every Lease renewal
and removes such a lock: its holder is gone, finished, Running (its Allocate is over), or has bind
phase ``success``/``failed`` (the scheduler's takeover rules). A holder that is still Pending
(being bound or admitted) keeps it. The write is a compare-and-swap on the node's
resourceVersion, so a lock taken meanwhile by another bind is never removed.
"""

import logging

from vgpu.core import annotations, errors
from vgpu.kube.port import KubeApi

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
    raw = annotations.of(obj).get(keys.node_lock) if obj is not None else None
    if obj is None or not raw:
        return False
    try:
        lock = annotations.decode_node_lock(raw, field=keys.node_lock)
    except errors.AnnotationError:
        return False  # the scheduler clears unreadable locks at its next bind
    if lock.legacy:
        return False  # no holder named: the scheduler's lock timeout applies
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
