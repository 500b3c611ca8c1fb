"""PodDisruptionBudgets as preemption counts them (issue 14): which budgets select a pod.

kube-scheduler's ``filterPodsWithPDBViolation``: a budget applies to a pod of its namespace whose
labels its ``spec.selector`` matches (an empty or missing selector matches nothing), unless the
pod is already listed in ``status.disruptedPods``; ``status.disruptionsAllowed`` is what victims
may use up (``vgpu.core.preempt.pdb_violations``). ``decode`` reads a PodDisruptionBudget object;
a selector that does not parse makes the budget select nothing (logged by the caller). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors

_OPS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class Expression:
    key: str
    op: str
    values: frozenset[str]


@dataclass(frozen=True)
class Budget:
    """One budget: ``namespace/name``, its selector, what it still allows, pods already disrupted."""

    namespace: str
    name: str
    match_labels: tuple[tuple[str, str], ...]
    expressions: tuple[Expression, ...]
    disruptions_allowed: int
    disrupted: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        if namespace != self.namespace or name in self.disrupted:
            return False
        if not self.match_labels and not self.expressions:
            return False  # an empty selector selects nothing here, as kube-scheduler treats it
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        for e in self.expressions:
            have = e.key in labels
            if e.op == "In" and (not have or labels[e.key] not in e.values):
                return False
            if e.op == "NotIn" and have and labels[e.key] in e.values:
                return False
            if (e.op == "Exists" and not have) or (e.op == "DoesNotExist" and have):
                return False
        return True


def _strings(raw: Any, field: str) -> Mapping[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
        raise errors.ParseError(field, "expected a map of strings")
    return raw


def decode(obj: Mapping[str, Any]) -> Budget:
    """A PodDisruptionBudget object; ``ParseError`` naming the field when its selector is malformed."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    selector = spec.get("selector") if isinstance(spec, Mapping) else None
    labels: Mapping[str, str] = {}
    expressions: list[Expression] = []
    if selector is not None:
        if not isinstance(selector, Mapping):
            raise errors.ParseError("spec.selector", "expected a LabelSelector")
        labels = _strings(selector.get("matchLabels"), "spec.selector.matchLabels")
        raw_expressions = selector.get("matchExpressions") or []
        if not isinstance(raw_expressions, list):
            raise errors.ParseError("spec.selector.matchExpressions", "expected a list")
        for i, e in enumerate(raw_expressions):
            field = f"spec.selector.matchExpressions[{i}]"
            if (
                not isinstance(e, Mapping)
                or not isinstance(e.get("key"), str)
                or e.get("operator") not in _OPS
            ):
                raise errors.ParseError(field, f"expected key and an operator of {', '.join(_OPS)}")
            values = e.get("values") or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise errors.ParseError(f"{field}.values", "expected a list of strings")
            expressions.append(Expression(e["key"], e["operator"], frozenset(values)))
    allowed = status.get("disruptionsAllowed", 0) if isinstance(status, Mapping) else 0
    disrupted = status.get("disruptedPods") if isinstance(status, Mapping) else None
    return Budget(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        match_labels=tuple(sorted(labels.items())),
        expressions=tuple(expressions),
        disruptions_allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
        disrupted=frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset(),
    )
