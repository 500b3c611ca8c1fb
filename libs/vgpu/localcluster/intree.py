"""kube-scheduler's in-tree filters, the few a local cluster needs, and its "0/N nodes" message.

Filters run per node in kube-scheduler's order and stop at the first that fails:
NodeUnschedulable, TaintToleration (a node whose Ready condition is not True carries the
``node.kubernetes.io/not-ready`` taint), NodeAffinity (``spec.nodeSelector`` only), NodeResourcesFit
(cpu, memory, pods and every extended resource not ignored). Reasons use kube-scheduler 1.24's
words so the FailedScheduling events read like a real cluster's. Pure functions.
"""

from __future__ import annotations

import decimal
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from vgpu.core import errors, quantity
from vgpu.localcluster import podresources

UNSCHEDULABLE = "node(s) were unschedulable"
SELECTOR_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
TOO_MANY_PODS = "Too many pods"
NO_NODES = "no nodes available to schedule pods"
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
_FIT_CHECKED = ("cpu", "memory", "ephemeral-storage")


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


def _taint_reason(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    taints = list((node.get("spec") or {}).get("taints") or [])
    if not _is_ready(node):
        taints.append(NOT_READY_TAINT)
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not _tolerates(tolerations, taint):
            return f"node(s) had taint {{{taint.get('key')}: {taint.get('value') or ''}}}, that the pod didn't tolerate"
    return None


def _allocatable(node: Mapping[str, Any], name: str) -> decimal.Decimal:
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(name)
    if raw is None:
        return decimal.Decimal(0)
    try:
        return quantity.parse(raw, field=f"node {node['metadata']['name']}: allocatable[{name}]")
    except errors.QuantityError:
        return decimal.Decimal(0)


def fit_reasons(
    pod_request: Mapping[str, decimal.Decimal],
    node: Mapping[str, Any],
    used: Mapping[str, decimal.Decimal],
    *,
    pods_on_node: int,
    ignored: Collection[str],
) -> list[str]:
    """NodeResourcesFit: "Too many pods" and one "Insufficient <name>" per short resource."""
    reasons: list[str] = []
    if pods_on_node + 1 > _allocatable(node, "pods") and "pods" in (
        (node.get("status") or {}).get("allocatable") or {}
    ):
        reasons.append(TOO_MANY_PODS)
    for name, amount in sorted(pod_request.items()):
        if amount <= 0 or name in ignored:
            continue
        if name not in _FIT_CHECKED and not podresources.is_extended_resource_name(name):
            continue
        if used.get(name, decimal.Decimal(0)) + amount > _allocatable(node, name):
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
    if (node.get("spec") or {}).get("unschedulable"):
        return [UNSCHEDULABLE]
    taint = _taint_reason(pod, node)
    if taint:
        return [taint]
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return [SELECTOR_MISMATCH]
    return fit_reasons(pod_request, node, used, pods_on_node=pods_on_node, ignored=ignored)


def fit_error_message(num_nodes: int, statuses: Mapping[str, list[str]]) -> str:
    """kube-scheduler's FitError text: ``0/N nodes are available: 2 <reason>, 1 <reason>.``"""
    if num_nodes == 0:
        return NO_NODES
    counts: Counter[str] = Counter()
    for reasons in statuses.values():
        counts.update(reasons)
    histogram = sorted(f"{count} {reason}" for reason, count in counts.items())
    return f"0/{num_nodes} nodes are available: {', '.join(histogram)}."
