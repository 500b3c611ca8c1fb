"""Allocate's answers, kept so the same container asking again gets the same answer.

kubelet's Allocate names no pod or container, only device IDs, and kubelet holds a device ID for
one container at a time. When kubelet asks again for IDs it was already answered for (it restarted
before writing its checkpoint, or re-allocates a container), the container is the same one: the
answer is replayed, no to-allocate entry is consumed (a multi-container pod's entries never shift)
and no host directory is re-created. A record lives while its pod does (the pod cache shows it, with
the same UID, not finished and not being deleted); a pod the cache has not shown yet (kubelet can
see a Binding before our watch) keeps its records for ``unseen_grace_s``, and once shown, they go
with it (a later pod getting the same IDs is a new request). One ledger per plugin process (it
outlives its sessions); after a restart of the plugin itself, consumed entries are not replayed
(the pod's annotations keep the decision, not kubelet's IDs). An answer is recorded as soon as it
is made, before its writes land (``writebehind``). GetPreferredAllocation steers kubelet re-choosing
IDs after a lost checkpoint back to the recorded ones (``preferred_again``). The allocator does not replay when another
pod's next entry waits on the same GPUs (kubelet freed a finished pod's IDs before the cache showed
it finished: the pending pod is the one asking). Init containers that are not restartable are not
recorded: kubelet hands their IDs on to the pod's later containers, whose Allocate is new.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.core import allocation

_FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Served:
    """One container's answer: whose it was, for which IDs, and when."""

    pod_uid: str
    pod: str  # namespace/name, for the log
    container: str
    ids: frozenset[str]
    response: allocation.ContainerAllocation
    at_s: float


def _live(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return not meta.get("deletionTimestamp") and phase not in _FINISHED


class Ledger:
    def __init__(self, *, clock: Callable[[], float], unseen_grace_s: float = 60.0) -> None:
        self._clock = clock
        self._unseen_grace_s = unseen_grace_s
        self._by_ids: dict[frozenset[str], Served] = {}
        self._seen: set[str] = set()  # pod UIDs of records the cache has shown

    def __len__(self) -> int:
        return len(self._by_ids)

    def record(self, served: Served, *, seen: bool) -> None:
        """``seen``: the pod cache shows the pod now (its records then go when it drops it)."""
        self._by_ids[served.ids] = served
        if seen:
            self._seen.add(served.pod_uid)

    def record_answers(
        self,
        pod: Mapping[str, Any],
        *,
        ref: str,
        targets: Sequence[allocation.Target],
        requests: Sequence[Sequence[str]],
        results: Sequence[allocation.ContainerAllocation],
        seen: bool,
        at_s: float,
    ) -> None:
        """Record an Allocate's answers, one per container, by kubelet's IDs; not those of init
        containers that are not restartable (kubelet hands their IDs on to later containers)."""
        for target, ids, result in zip(targets, requests, results, strict=True):
            if allocation.devices_reused_later(pod, target.container):
                continue
            served = Served(target.pod_uid, ref, target.container, frozenset(ids), result, at_s)
            self.record(served, seen=seen)

    def replay(
        self, requests: Sequence[Sequence[str]], *, pods: Iterable[Mapping[str, Any]]
    ) -> list[Served] | None:
        """The recorded answers when every container request repeats one (None: a new request).
        Records of pods that are gone are forgotten first. A request repeating only some
        containers is new (kubelet sends one container per call)."""
        self.prune(pods)
        found = [self._by_ids.get(frozenset(ids)) for ids in requests]
        if any(f is None for f in found):
            return None
        return [f for f in found if f is not None]

    def recorded(self, *, pods: Iterable[Mapping[str, Any]]) -> list[Served]:
        """The live records, in the order they were answered (after ``prune``)."""
        self.prune(pods)
        return list(self._by_ids.values())

    def preferred_again(
        self,
        pending_uid: str | None,
        requests: Sequence[allocation.PreferredRequest],
        *,
        pods: Iterable[Mapping[str, Any]],
    ) -> list[list[str]] | None:
        """kubelet re-admitting a pod it already had answered (its checkpoint lost): the IDs of that
        pod's earliest recorded answer kubelet has free again, so that its Allocate repeats them and
        is replayed. Only for the pending pod's own records (``pending_uid``), or any live pod's
        when none is pending (another pending pod is a new request: its entry decides)."""
        if len(requests) != 1:
            return None
        request = requests[0]
        free = set(request.available) | set(request.must_include)
        for served in self.recorded(pods=pods):
            if pending_uid is not None and served.pod_uid != pending_uid:
                continue
            if (
                len(served.ids) == request.size
                and served.ids <= free
                and set(request.must_include) <= served.ids
            ):
                return [sorted(served.ids)]
        return None

    def prune(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Forget records whose pod is finished, being deleted, replaced or long unseen."""
        by_uid = {str((p.get("metadata") or {}).get("uid", "")): p for p in pods}
        now = self._clock()
        for ids, served in list(self._by_ids.items()):
            pod = by_uid.get(served.pod_uid)
            if pod is not None:
                self._seen.add(served.pod_uid)
                keep = _live(pod)
            else:
                keep = served.pod_uid not in self._seen and now - served.at_s < self._unseen_grace_s
            if not keep:
                del self._by_ids[ids]
        self._seen &= {served.pod_uid for served in self._by_ids.values()}
