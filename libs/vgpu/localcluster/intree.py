"""kube-scheduler's in-tree filters, the few a local cluster needs, and its "0/N nodes" message.

Filters run per node in kube-scheduler's order and stop at the first that fails:
NodeUnschedulable, TaintToleration (a node whose Ready condition is not True carries the
``node.kubernetes.io/not-ready`` taint), NodeAffinity (``spec.nodeSelector`` only), NodeResourcesFit
(cpu, memory, pods and every extended resource not ignored). Reasons use kube-scheduler 1.24's
words so the FailedScheduling events read like a real cluster's. The LeastAllocated score and
``selectHost``'s choice among the best are here too. Pure functions.
"""

from __future__ import annotations

import contextlib
import decimal
import random
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors, quantity
from vgpu.localcluster import podresources

UNSCHEDULABLE = "node(s) were unschedulable"
SELECTOR_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
TOO_MANY_PODS = "Too many pods"
NO_NODES = "no nodes available to schedule pods"
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
_FIT_CHECKED = ("cpu", "memory", "ephemeral-storage")
_ZERO = decimal.Decimal(0)
_NON_ZERO = (("cpu", decimal.Decimal("0.1")), ("memory", decimal.Decimal(200 * 1024 * 1024)))
MIN_FEASIBLE_NODES = 100  # kube-scheduler's minFeasibleNodesToFind
MIN_FEASIBLE_PERCENTAGE = 5  # and minFeasibleNodesPercentageToFind


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        operator = tol.get("operator") or "Equal"
        key = tol.get("key") or ""
        if operator == "Exists" and (not key or key == taint.get("key")):
            return True
        if (
            operator == "Equal"
            and key == taint.get("key")
            and (tol.get("value") or "") == (taint.get("value") or "")
        ):
            return True
    return False


def _is_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _quantity(node: Mapping[str, Any], name: str, raw: object) -> decimal.Decimal:
    try:
        return quantity.parse(raw, field=f"node {node['metadata']['name']}: allocatable[{name}]")
    except errors.QuantityError:
        return decimal.Decimal(0)


@dataclass(frozen=True)
class PodFacts:
    """What the filters read from a pod, computed once per scheduling cycle."""

    request: tuple[tuple[str, decimal.Decimal], ...]  # the resources NodeResourcesFit checks, > 0
    tolerations: tuple[Mapping[str, Any], ...]
    selector: tuple[tuple[str, str], ...]
    pod: Mapping[str, Any]
    key: tuple[Any, ...] = ()  # equal for pods the filters cannot tell apart (memo key)


def pod_facts(
    pod: Mapping[str, Any], pod_request: Mapping[str, decimal.Decimal], *, ignored: Collection[str]
) -> PodFacts:
    spec = pod.get("spec") or {}
    checked = tuple(
        (name, amount)
        for name, amount in sorted(pod_request.items())
        if amount > 0
        and name not in ignored
        and (name in _FIT_CHECKED or podresources.is_extended_resource_name(name))
    )
    tolerations = tuple(spec.get("tolerations") or ())
    selector = tuple(sorted((spec.get("nodeSelector") or {}).items()))
    return PodFacts(
        request=checked,
        tolerations=tolerations,
        selector=selector,
        pod=pod,
        key=(checked, selector, repr(tolerations)),
    )


def scheduling_inputs(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """The parts of a Node that ``NodeFacts`` reads, as they came (compared before parsing again:
    keep it in step with ``NodeFacts.__init__``)."""
    meta, spec, status = (node.get(k) or {} for k in ("metadata", "spec", "status"))
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    ready = [c.get("status") for c in conditions if c.get("type") == "Ready"]
    return (
        meta.get("labels"),
        spec.get("unschedulable"),
        spec.get("taints"),
        status.get("allocatable"),
        ready,
    )


class NodeFacts:
    """What the filters read from a Node, parsed once per Node version (quantities, taints);
    ``inputs``: what they were parsed from (``scheduling_inputs``)."""

    __slots__ = (
        "_tolerated",
        "allocatable",
        "inputs",
        "labels",
        "max_pods",
        "name",
        "taints",
        "unschedulable",
    )

    def __init__(self, node: Mapping[str, Any], inputs: tuple[Any, ...] | None = None) -> None:
        self.inputs = scheduling_inputs(node) if inputs is None else inputs
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        self.name: str = meta.get("name") or ""
        self.unschedulable = bool(spec.get("unschedulable"))
        taints = [t for t in spec.get("taints") or [] if isinstance(t, Mapping)]
        if not _is_ready(node):
            taints.append(NOT_READY_TAINT)
        self.taints = tuple(t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute"))
        self.labels: Mapping[str, str] = meta.get("labels") or {}
        raw = (node.get("status") or {}).get("allocatable") or {}
        self.allocatable = {name: _quantity(node, name, value) for name, value in raw.items()}
        self.max_pods = self.allocatable.get("pods") if "pods" in raw else None
        self._tolerated: dict[tuple[Mapping[str, Any], ...], str | None] = {}

    def taint_reason(self, tolerations: tuple[Mapping[str, Any], ...]) -> str | None:
        if not self.taints:
            return None
        key = tolerations
        try:
            return self._tolerated[key]
        except (KeyError, TypeError):
            pass
        reason = None
        for taint in self.taints:
            if not _tolerates(tolerations, taint):
                reason = (
                    f"node(s) had taint {{{taint.get('key')}: {taint.get('value') or ''}}}, "
                    "that the pod didn't tolerate"
                )
                break
        with contextlib.suppress(TypeError):  # tolerations as dicts are not hashable: no memo
            if len(self._tolerated) < 16:
                self._tolerated[key] = reason
        return reason

    def reasons(self, pod: PodFacts, used: Mapping[str, decimal.Decimal], *, pods_on_node: int) -> list[str]:
        """Why this node cannot take ``pod`` (empty: it can), filters in kube-scheduler's order."""
        if self.unschedulable:
            return [UNSCHEDULABLE]
        if self.taints:
            taint = self.taint_reason(pod.tolerations)
            if taint:
                return [taint]
        if pod.selector:
            labels = self.labels
            if any(labels.get(k) != v for k, v in pod.selector):
                return [SELECTOR_MISMATCH]
        return self.fit_reasons(pod, used, pods_on_node=pods_on_node)

    def fit_reasons(
        self, pod: PodFacts, used: Mapping[str, decimal.Decimal], *, pods_on_node: int
    ) -> list[str]:
        """NodeResourcesFit: "Too many pods" and one "Insufficient <name>" per short resource."""
        reasons: list[str] = []
        if self.max_pods is not None and pods_on_node + 1 > self.max_pods:
            reasons.append(TOO_MANY_PODS)
        allocatable = self.allocatable
        for name, amount in pod.request:
            if used.get(name, _ZERO) + amount > allocatable.get(name, _ZERO):
                reasons.append(f"Insufficient {name}")
        return reasons


def node_reasons(
    pod: Mapping[str, Any],
    pod_request: Mapping[str, decimal.Decimal],
    node: Mapping[str, Any],
    *,
    used: Mapping[str, decimal.Decimal],
    pods_on_node: int,
    ignored: Collection[str],
) -> list[str]:
    """Why ``node`` cannot take ``pod`` (empty: it can). ``used``: what the node's live pods request."""
    facts = pod_facts(pod, pod_request, ignored=ignored)
    return NodeFacts(node).reasons(facts, used, pods_on_node=pods_on_node)


def num_feasible_nodes_to_find(num_all_nodes: int, percentage: int = 0) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind`` (docs/protocol.md#how-kube-scheduler-calls-it): every node below 100 nodes;
    else ``percentage`` of them (0: adaptive, ``50 - N/125`` with a 5 % floor), at least 100."""
    if num_all_nodes < MIN_FEASIBLE_NODES:
        return num_all_nodes
    if percentage <= 0:
        percentage = max(50 - num_all_nodes // 125, MIN_FEASIBLE_PERCENTAGE)
    if percentage >= 100:
        return num_all_nodes
    return max(num_all_nodes * percentage // 100, MIN_FEASIBLE_NODES)


def least_allocated_score(
    node: NodeFacts, used: Mapping[str, decimal.Decimal], request: Mapping[str, decimal.Decimal]
) -> int:
    """NodeResourcesFit's default score (LeastAllocated, cpu and memory weight 1), 0..100, with
    kube-scheduler's non-zero defaults for a pod that requests no cpu (100m) or memory (200Mi)."""
    total = 0
    for name, default in _NON_ZERO:
        capacity = node.allocatable.get(name, _ZERO)
        requested = used.get(name, _ZERO) + (request.get(name) or default)
        if capacity > 0 and requested <= capacity:
            total += int((capacity - requested) * 100 / capacity)
    return total // len(_NON_ZERO)


def select_host(feasible: Sequence[str], score: Callable[[str], int], rng: random.Random) -> str:
    """The node of ``feasible`` with the best ``score``; ties broken at random, as kube-scheduler's
    selectHost."""
    best_score, best = -1, [feasible[0]]
    for name in feasible:
        got = score(name)
        if got > best_score:
            best_score, best = got, [name]
        elif got == best_score:
            best.append(name)
    return best[0] if len(best) == 1 else rng.choice(best)


def fit_error_message(num_nodes: int, statuses: Mapping[str, list[str]]) -> str:
    """kube-scheduler's FitError text: ``0/N nodes are available: 2 <reason>, 1 <reason>.``"""
    if num_nodes == 0:
        return NO_NODES
    counts: Counter[str] = Counter()
    for reasons in statuses.values():
        counts.update(reasons)
    histogram = sorted(f"{count} {reason}" for reason, count in counts.items())
    return f"0/{num_nodes} nodes are available: {', '.join(histogram)}."
