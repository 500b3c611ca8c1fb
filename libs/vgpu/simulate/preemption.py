"""Preemption in the simulator: a pod that fits nowhere may evict lower-priority pods (issue 14).

The same choice as the running system: per node, ``vgpu.core.preempt.select_victims`` (what
``/preempt`` answers), then kube-scheduler's ``pickOneNodeForPreemption`` among the nodes that have
an answer: the lowest highest-victim priority, the lowest sum of priorities, the fewest victims,
then the node name (no disruption budgets in a simulation). Pure: no I/O, no clock; "most recently
started" is the placement order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vgpu.core import fit, preempt
from vgpu.core.config import Policy
from vgpu.core.device import NodeName
from vgpu.core.request import PodRequest


@dataclass(frozen=True)
class Preemption:
    """``preemptor`` (a pod key) was placed on ``node`` after evicting ``victims`` (pod keys)."""

    preemptor: str
    node: NodeName
    victims: tuple[str, ...]


def choose(
    ask: PodRequest,
    *,
    priority: int,
    views: Mapping[NodeName, fit.NodeGpus],
    residents: Mapping[NodeName, Sequence[preempt.Resident]],
    gpu_policy: Policy,
) -> tuple[NodeName, tuple[str, ...]] | None:
    """The node and victims (resident uids) kube-scheduler would pick, or None when no node has any."""
    best: tuple[tuple[int, int, int, str], NodeName, tuple[str, ...]] | None = None
    for node in sorted(views):
        on_node = residents.get(node, ())
        if not any(r.priority < priority for r in on_node):
            continue
        got = preempt.select_victims(ask, views[node], on_node, priority=priority, gpu_policy=gpu_policy)
        if isinstance(got, preempt.NoVictims):
            continue
        prios = {r.uid: r.priority for r in on_node}
        chosen = [prios[uid] for uid in got.uids]
        key = (max(chosen), sum(chosen), len(chosen), node)
        if best is None or key < best[0]:
            best = (key, node, got.uids)
    return None if best is None else (best[1], best[2])
