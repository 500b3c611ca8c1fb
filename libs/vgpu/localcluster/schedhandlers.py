"""The kube-scheduler emulation's event handlers: the informers' changes into its cache and queue.

As kube-scheduler's ``eventhandlers.go``: a pod of one of its profiles without ``spec.nodeName``
enters the scheduling queue (or is requeued when it was updated); an assigned pod updates the cache
(an assumed one is confirmed); an assigned pod deleted or finished, a node added or changed in a way
that matters to scheduling, moves every unschedulable pod back to be tried.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpu.kube import informer
from vgpu.localcluster import podresources, schedcache, schedqueue

PodKey = schedcache.PodKey


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    """A pod's (namespace, name)."""
    meta = pod.get("metadata") or {}
    return (meta.get("namespace") or "default", meta.get("name") or "")


def pod_updated(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """kube-scheduler's ``isPodUpdated``: anything but status and resourceVersion changed."""
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    return (
        old.get("spec") != new.get("spec")
        or old_meta.get("labels") != new_meta.get("labels")
        or old_meta.get("annotations") != new_meta.get("annotations")
    )


class EventHandlers:
    """Keeps ``cache`` and ``queue`` in step with the pod and node informers' changes."""

    def __init__(
        self,
        *,
        profiles: frozenset[str],
        cache: schedcache.SchedulerCache,
        queue: schedqueue.SchedulingQueue[PodKey],
    ) -> None:
        self._profiles = profiles
        self._cache = cache
        self._queue = queue

    def wanted(self, pod: Mapping[str, Any]) -> bool:
        """Whether ``pod`` is one to schedule: unassigned, of one of the profiles, not terminated."""
        spec = pod.get("spec") or {}
        return (
            not spec.get("nodeName")
            and spec.get("schedulerName") in self._profiles
            and not podresources.is_terminated(pod)
        )

    def on_pod(self, change: informer.Change) -> None:
        pod = change.object
        key = pod_key(pod)
        if change.type == "DELETED":
            self._queue.forget(key)
            assumed = self._cache.confirm(key)
            self._cache.update_pod(key, None)
            if assumed or (pod.get("spec") or {}).get("nodeName"):
                self._queue.move_all()  # AssignedPodDelete: its resources are free again
            return
        if (pod.get("spec") or {}).get("nodeName"):
            self._cache.confirm(key)
            self._cache.update_pod(key, pod)
            self._queue.forget(key)
            old = change.old
            if old is not None and podresources.is_terminated(pod) and not podresources.is_terminated(old):
                self._queue.move_all()  # gone from kube-scheduler's informer: a delete
            return
        self._cache.update_pod(key, pod)
        if self._cache.is_assumed(key):
            return  # its binding cycle is running
        if not self.wanted(pod):
            self._queue.forget(key)
        elif change.old is not None and pod_updated(change.old, pod):
            self._queue.updated(key)
        else:
            self._queue.add(key)

    def on_node(self, change: informer.Change) -> None:
        if change.type == "DELETED":
            self._cache.remove_node(change.object["metadata"]["name"])
        elif self._cache.set_node(change.object):
            self._queue.move_all()
