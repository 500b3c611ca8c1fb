"""The cluster's PriorityClasses, in memory: a preemptor's priority as the cluster has it (issue 49).

A ``/preempt`` body is kube-scheduler's copy of the pod, but nothing proves who sent it, and its
``spec.priority`` decides what may be evicted. So the preemptor is looked up in our own pod watch by
its UID (an unknown pod preempts nothing) and its priority read from its PriorityClass, fed by a
watch of ``scheduling.k8s.io/v1`` PriorityClasses (``PriorityClasses.apply``). A pod without a
class, or whose class is gone from the cluster, has the ``spec.priority`` the API server's Priority
admission gave it (immutable after creation); ``preemptionPolicy`` alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.kube.port import JsonObj

PREEMPT_LOWER = "PreemptLowerPriority"
NEVER = "Never"


@dataclass(frozen=True)
class Standing:
    """What a pod may do as a preemptor: its priority and its ``preemptionPolicy``."""

    priority: int
    policy: str = PREEMPT_LOWER

    @property
    def may_preempt(self) -> bool:
        return self.policy != NEVER


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class PriorityClasses:
    """name -> (value, preemptionPolicy), from the watch."""

    def __init__(self) -> None:
        self.by_name: dict[str, Standing] = {}

    def apply(self, event_type: str, obj: JsonObj) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        self.by_name.pop(name, None)
        value = _int(obj.get("value"))
        if event_type != "DELETED" and name and value is not None:
            policy = obj.get("preemptionPolicy")
            self.by_name[name] = Standing(
                value, policy if isinstance(policy, str) and policy else PREEMPT_LOWER
            )

    def standing(self, pod: Mapping[str, Any]) -> Standing:
        """``pod``'s (an object from our watch, not a request body) priority and policy."""
        spec = pod.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        name = spec.get("priorityClassName")
        known = self.by_name.get(name) if isinstance(name, str) and name else None
        if known is not None:
            return known
        policy = spec.get("preemptionPolicy")
        return Standing(
            _int(spec.get("priority")) or 0, policy if isinstance(policy, str) and policy else PREEMPT_LOWER
        )
