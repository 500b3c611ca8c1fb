"""The PodDisruptionBudgets of the cluster, in memory, for ``/preempt`` (issue 14).

Fed by a watch of ``policy/v1`` PodDisruptionBudgets (``Budgets.apply``); ``for_pods`` gives the
keys of the budgets that select each pod and what every such budget still allows, the inputs of
``vgpu.core.preempt``. A pod without labels is selected by none, even by a ``NotIn`` or
``DoesNotExist`` selector (kube-scheduler skips such pods, and the eviction API guards them with no
budget). A budget whose selector does not parse selects nothing: logged once per distinct object
version.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from vgpu.core import budgets, errors
from vgpu.kube.port import JsonObj

log = logging.getLogger(__name__)


class Budgets:
    """namespace -> name -> Budget."""

    def __init__(self) -> None:
        self.by_namespace: dict[str, dict[str, budgets.Budget]] = {}

    def apply(self, event_type: str, obj: JsonObj) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        in_ns = self.by_namespace.setdefault(namespace, {})
        in_ns.pop(name, None)
        if event_type != "DELETED":
            try:
                in_ns[name] = budgets.decode(obj)
            except errors.ParseError as exc:
                log.warning("PodDisruptionBudget %s/%s selects nothing: %s", namespace, name, exc)
        if not in_ns:
            del self.by_namespace[namespace]

    def for_pods(
        self, pods: Iterable[Mapping[str, Any]]
    ) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
        """(pod uid -> keys of the budgets selecting it, budget key -> disruptions allowed)."""
        selected: dict[str, tuple[str, ...]] = {}
        allowed: dict[str, int] = {}
        if not self.by_namespace:
            return selected, allowed
        for pod in pods:
            meta = pod.get("metadata") or {}
            in_ns = self.by_namespace.get(str(meta.get("namespace") or "default"))
            if not in_ns:
                continue
            labels = meta.get("labels") or {}
            if not labels:
                continue  # kube-scheduler: "A pod with no labels will not match any PDB" (NotIn alike)
            keys = tuple(
                b.key for b in in_ns.values() if b.selects(b.namespace, str(meta.get("name")), labels)
            )
            if keys:
                selected[str(meta.get("uid"))] = keys
                for b in in_ns.values():
                    if b.key in keys:
                        allowed[b.key] = b.disruptions_allowed
        return selected, allowed
