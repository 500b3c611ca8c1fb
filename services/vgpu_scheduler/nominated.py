"""Nominated pods: a preemptor's slice is held on its node while its victims terminate (issue 14).

After ``/preempt`` kube-scheduler deletes the victims (with their grace period) and writes the
preemptor's ``status.nominatedNodeName``; the preemptor is scheduled again once they are gone.
The own preemption path (``selfpreempt.py``) holds the node it evicted victims on the same way
(``Nominations.hold``). Until it is bound, ``/filter`` for any *other* pod of equal or lower
priority (kube-scheduler's own rule for nominated pods) treats the nominated pod as placed on that node: its slice is added to
the node's usage when it fits there already, and while it does not fit yet (its victims still
hold their GPUs: a terminating pod keeps its charge until it is gone) the node is held for it
entirely, so a third pod cannot take capacity freed by a partial deletion.

``Nominations`` is the index (fed by ``ClusterState`` from the pod watch); ``hold`` adjusts the
filter's views; ``note`` is the preemptor's own "preemption under way" line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from vgpu.core import errors, fit, request
from vgpu.core.config import Config, Policy
from vgpu.core.device import GpuUsage, GpuUuid
from vgpu.kube.port import JsonObj

if TYPE_CHECKING:
    from vgpu_scheduler.state import ClusterState

_FINISHED = ("Succeeded", "Failed")

# (the nominated pod, its node): called once when a pod is first seen nominated to a node
OnNominated = Callable[[JsonObj, str], None]


def priority(pod: Mapping[str, Any]) -> int:
    """``spec.priority`` (set by the Priority admission plugin from the PriorityClass), 0 if unset."""
    spec = pod.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def nominated_node(pod: Mapping[str, Any]) -> str | None:
    """The node a pending pod is nominated to, or None (bound, finished, deleting, not nominated)."""
    status = pod.get("status")
    spec = pod.get("spec")
    meta = pod.get("metadata")
    if not isinstance(status, Mapping) or not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        return None
    node = status.get("nominatedNodeName")
    if not isinstance(node, str) or not node or spec.get("nodeName") or meta.get("deletionTimestamp"):
        return None
    return None if status.get("phase") in _FINISHED else node


class Nominations:
    """Which pods are nominated to which node (uid -> node, node -> uids): kube-scheduler's
    nominations from the pod watch, and the nodes the own preemption path holds (``held``); a
    pod's watched nomination wins over a hold."""

    def __init__(self) -> None:
        self.by_uid: dict[str, str] = {}
        self.by_node: dict[str, set[str]] = {}
        self.on_nominated: OnNominated | None = None
        self._watched: dict[str, str] = {}
        self.held: dict[str, str] = {}  # preemptor uid -> node, by the own preemption path

    def pod(self, uid: str, obj: JsonObj, *, deleted: bool) -> None:
        node = None if deleted else nominated_node(obj)
        if self._watched.get(uid) == node:
            return
        if node is None:
            self._watched.pop(uid, None)
        else:
            self._watched[uid] = node
        if deleted:
            self.held.pop(uid, None)
        self._settle(uid)
        if node is not None and self.on_nominated is not None:
            self.on_nominated(obj, node)

    def hold(self, uid: str, node: str) -> None:
        """Hold ``node`` for pod ``uid`` (the own preemption path evicted victims there for it)."""
        self.held[uid] = node
        self._settle(uid)

    def release(self, uid: str) -> None:
        if self.held.pop(uid, None) is not None:
            self._settle(uid)

    def _settle(self, uid: str) -> None:
        node = self._watched.get(uid) or self.held.get(uid)
        old = self.by_uid.get(uid)
        if old == node:
            return
        if old is not None:
            del self.by_uid[uid]
            left = self.by_node[old]
            left.discard(uid)
            if not left:
                del self.by_node[old]
        if node is not None:
            self.by_uid[uid] = node
            self.by_node.setdefault(node, set()).add(uid)


def _waiting(state: ClusterState, node: str, *, below: int, exclude: str) -> list[JsonObj]:
    """Pods nominated to ``node`` of priority ``below`` or more, other than ``exclude``, whose slice
    is not yet charged (a pod our filter already placed is counted in the usage)."""
    out = []
    for uid in state.nominations.by_node.get(node, ()):
        pod = state.pods.get(uid)
        if uid != exclude and pod is not None and uid not in state.charges and priority(pod) >= below:
            out.append(pod)
    return out


def hold(
    state: ClusterState,
    config: Config,
    names: Sequence[str],
    views: list[fit.NodeGpus | None],
    problems: MutableMapping[str, str | None],
    *,
    pod_priority: int,
    uid: str,
) -> None:
    """Add the slices of pods nominated to the candidate nodes to their views, in place; a node
    whose nominated pod does not fit yet gets view None and a reason in ``problems``."""
    by_node = state.nominations.by_node
    for index, name in enumerate(names):
        view = views[index]
        if view is None or name not in by_node:
            continue
        for pod in _waiting(state, name, below=pod_priority, exclude=uid):
            meta = pod.get("metadata") or {}
            who = f"{meta.get('namespace')}/{meta.get('name')}"
            try:
                ask = request.parse_pod(pod, config)
            except errors.ParseError:
                continue  # its own filter reports it
            if not ask.wants_gpu:
                continue
            placed = fit.fit_pod(ask, view, gpu_policy=policy_of(ask, config))
            if isinstance(placed, fit.Miss):
                views[index] = None
                problems[name] = (
                    f"held for pod {who} (priority {priority(pod)}), nominated here by preemption"
                )
                break
            used: dict[GpuUuid, GpuUsage] = dict(view.used)
            for gpu_uuid, u in placed.usage.items():
                have = used.get(gpu_uuid, GpuUsage())
                used[gpu_uuid] = GpuUsage(
                    have.slots + u.slots, have.memory_mib + u.memory_mib, have.cores + u.cores
                )
            view = fit.NodeGpus.build(view.gpus, used, view.cordoned, outside=view.outside)
            views[index] = view


def note(state: ClusterState, uid: str) -> str | None:
    """For a nominated pod's failed filter: preemption is under way, and what it waits for."""
    node = state.nominations.by_uid.get(uid)
    if node is None:
        return None
    going = sum(
        1
        for other in state.charged_on(node)
        if ((state.pods.get(other) or {}).get("metadata") or {}).get("deletionTimestamp")
    )
    return f"preemption under way: nominated to node {node}, waiting for {going} victim(s) to terminate"


def policy_of(ask: request.PodRequest, config: Config) -> Policy:
    return ask.gpu_policy or config.scheduler.gpu_policy
