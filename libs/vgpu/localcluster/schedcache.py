"""The kube-scheduler emulation's cache: nodes in order, what each node's pods request, assumed pods.

Like kube-scheduler's cache and snapshot: every Node is parsed once per version into
``intree.NodeFacts``; what live pods request is summed per node, kept current per pod change; a pod
the scheduler has just placed is *assumed* on its node (counted at once, before its binding is
written) until the informer shows it bound, or *forgotten* when its binding fails.

``find_feasible`` is kube-scheduler's ``findNodesThatPassFilters``: it runs the in-tree filters
over the nodes starting at ``nextStartNodeIndex`` (which advances by the number of nodes looked
at, so successive pods see different nodes first), and stops once it has found
``numFeasibleNodesToFind`` feasible nodes.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors
from vgpu.localcluster import intree, podresources

PodKey = tuple[str, str]  # (namespace, name)
_EMPTY: Mapping[str, decimal.Decimal] = {}


@dataclass
class Feasible:
    """One search: the feasible nodes in the order found, and why the others were not."""

    nodes: list[str]
    statuses: dict[str, list[str]]


def _changed_for_scheduling(old: intree.NodeFacts, new: intree.NodeFacts) -> bool:
    """kube-scheduler's ``nodeSchedulingPropertiesChange``: spec.unschedulable, allocatable, labels,
    taints, conditions (Ready folds into the not-ready taint). Annotations do not count."""
    return (
        old.unschedulable != new.unschedulable
        or old.allocatable != new.allocatable
        or old.labels != new.labels
        or old.taints != new.taints
    )


class SchedulerCache:
    def __init__(self) -> None:
        self._facts: dict[str, intree.NodeFacts] = {}
        self._order: list[str] = []
        self._next_start = 0
        self._counted: dict[PodKey, tuple[str, dict[str, decimal.Decimal]]] = {}
        self._used: dict[str, dict[str, decimal.Decimal]] = {}
        self._pods_on: dict[str, int] = {}
        self._assumed: dict[PodKey, str] = {}
        self._generation: dict[str, int] = {}  # bumped when a node's facts or usage change
        self._scores: dict[str, tuple[int, tuple[Any, ...], int]] = {}  # node -> (generation, request, score)
        self._fits: dict[
            str, tuple[int, tuple[Any, ...], list[str]]
        ] = {}  # node -> (generation, pod, reasons)

    # ----- nodes -----

    def __len__(self) -> int:
        return len(self._order)

    def node_names(self) -> list[str]:
        """Every node the cache knows, in its search order."""
        return list(self._order)

    def set_node(self, node: Mapping[str, Any]) -> bool:
        """Add or update a Node; True when the change can make a pending pod fit (a move event).
        An update that leaves every field the filters read as it was (an annotation: HAMi's node
        lock is written twice per GPU pod) keeps the parsed facts and the node's remembered
        verdicts, as the scheduler's snapshot does."""
        name = str((node.get("metadata") or {}).get("name") or "")
        inputs = intree.scheduling_inputs(node)
        known = self._facts.get(name)
        if known is not None and known.inputs == inputs:
            return False
        facts = intree.NodeFacts(node, inputs)
        old = self._facts.get(facts.name)
        self._facts[facts.name] = facts
        self._bump(facts.name)
        if old is None:
            self._order.append(facts.name)
            return True
        return _changed_for_scheduling(old, facts)

    def remove_node(self, name: str) -> None:
        if self._facts.pop(name, None) is not None:
            self._order.remove(name)
            self._scores.pop(name, None)
            self._fits.pop(name, None)

    def facts(self, name: str) -> intree.NodeFacts | None:
        return self._facts.get(name)

    def used(self, name: str) -> Mapping[str, decimal.Decimal]:
        return self._used.get(name, _EMPTY)

    # ----- pods -----

    def is_assumed(self, key: PodKey) -> bool:
        return key in self._assumed

    def update_pod(self, key: PodKey, pod: Mapping[str, Any] | None) -> None:
        """Count what ``key`` requests on the node it is on or assumed on (nothing once deleted,
        terminated, or neither bound nor assumed)."""
        previous = self._counted.pop(key, None)
        if previous is not None:
            node, request = previous
            used = self._used[node]
            for name, amount in request.items():
                used[name] -= amount
            self._pods_on[node] -= 1
            self._bump(node)
        if pod is None or podresources.is_terminated(pod):
            return
        node_name = (pod.get("spec") or {}).get("nodeName") or self._assumed.get(key)
        if not node_name:
            return
        try:
            request = podresources.pod_requests(pod)
        except errors.QuantityError:
            request = {}  # the API server would not have admitted it; count nothing
        used = self._used.setdefault(node_name, {})
        for name, amount in request.items():
            used[name] = used.get(name, decimal.Decimal(0)) + amount
        self._pods_on[node_name] = self._pods_on.get(node_name, 0) + 1
        self._counted[key] = (node_name, request)
        self._bump(node_name)

    def _bump(self, node: str) -> None:
        self._generation[node] = self._generation.get(node, 0) + 1

    def score(self, name: str, request: Mapping[str, decimal.Decimal]) -> int:
        """LeastAllocated for ``request`` on ``name``, remembered until the node or its usage changes
        (most nodes do not change between two pods, so the scoring pass is mostly lookups)."""
        facts = self._facts.get(name)
        if facts is None:
            return 0
        generation = self._generation.get(name, 0)
        key = (request.get("cpu"), request.get("memory"))
        memo = self._scores.get(name)
        if memo is not None and memo[0] == generation and memo[1] == key:
            return memo[2]
        got = intree.least_allocated_score(facts, self._used.get(name, _EMPTY), request)
        self._scores[name] = (generation, key, got)
        return got

    def pods_on(self, node: str) -> list[tuple[PodKey, Mapping[str, decimal.Decimal]]]:
        """The pods counted on ``node`` (bound or assumed) and what each requests."""
        return [(key, request) for key, (where, request) in self._counted.items() if where == node]

    def pods_counted(self, node: str) -> int:
        return self._pods_on.get(node, 0)

    def confirm(self, key: PodKey) -> bool:
        """The informer shows the pod bound: it is no longer assumed. True if it was."""
        return self._assumed.pop(key, None) is not None

    def assume(self, key: PodKey, pod: Mapping[str, Any], node: str) -> None:
        self._assumed[key] = node
        self.update_pod(key, pod)

    def forget(self, key: PodKey, pod: Mapping[str, Any] | None) -> None:
        """Its binding failed: stop counting it on the node it was assumed on."""
        self._assumed.pop(key, None)
        self.update_pod(key, pod)

    # ----- the search -----

    def find_feasible(
        self,
        pod: intree.PodFacts,
        *,
        percentage: int,
        extra: Callable[[str], list[str]] | None = None,
    ) -> Feasible:
        """The in-tree filters from the rotating start until enough feasible nodes are found;
        ``extra`` is one more filter (a plugin's, not memoised) run on the nodes that pass them."""
        order = self._order
        total = len(order)
        found = Feasible([], {})
        if total == 0:
            return found
        to_find = intree.num_feasible_nodes_to_find(total, percentage)
        start = self._next_start % total
        facts, used, pods_on, feasible, statuses = (
            self._facts,
            self._used,
            self._pods_on,
            found.nodes,
            found.statuses,
        )
        generations, fits, key = self._generation, self._fits, pod.key
        for name in order[start:] + order[:start]:
            # a node's verdict for pods alike is remembered until the node or its usage changes
            generation = generations.get(name, 0)
            memo = fits.get(name)
            if memo is not None and memo[0] == generation and memo[1] == key:
                reasons = memo[2]
            else:
                reasons = facts[name].reasons(pod, used.get(name, _EMPTY), pods_on_node=pods_on.get(name, 0))
                fits[name] = (generation, key, reasons)
            if not reasons and extra is not None:
                reasons = extra(name)
            if reasons:
                statuses[name] = reasons
            else:
                feasible.append(name)
                if len(feasible) >= to_find:
                    break
        self._next_start = (start + len(feasible) + len(statuses)) % total
        return found
