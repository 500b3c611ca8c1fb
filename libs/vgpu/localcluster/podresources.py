"""Resource names and a pod's resource amounts, computed the way kube-scheduler and kubelet do.

Shared by the scheduler emulation (NodeResourcesFit, the extender's ``IsInterested`` test) and the
kubelet emulation (which containers need which device-plugin resource). Pure functions over plain
pod JSON; quantities are parsed with ``vgpu.core.quantity`` so "4Gi" and "500m" are exact.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterator, Mapping
from typing import Any

from vgpu.core import names, quantity

is_extended_resource_name = names.is_extended_resource_name  # kubelet's Register check


def containers(pod: Mapping[str, Any]) -> Iterator[tuple[bool, Mapping[str, Any]]]:
    """``(is_init, container)`` for the init containers, then the app containers, in spec order."""
    spec = pod.get("spec") or {}
    for key, is_init in (("initContainers", True), ("containers", False)):
        for container in spec.get(key) or []:
            if isinstance(container, Mapping):
                yield is_init, container


def _resource_map(container: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    value = resources.get(key) if isinstance(resources, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def limits(container: Mapping[str, Any]) -> dict[str, decimal.Decimal]:
    """The container's limits; an unparsable quantity raises ``QuantityError`` naming the field."""
    name = container.get("name", "?")
    return {
        res: quantity.parse(raw, field=f"container {name}: limits[{res}]")
        for res, raw in _resource_map(container, "limits").items()
    }


def requests(container: Mapping[str, Any]) -> dict[str, decimal.Decimal]:
    """The container's requests, defaulted from limits as the API server does for unset requests."""
    name = container.get("name", "?")
    merged = dict(limits(container))
    for res, raw in _resource_map(container, "requests").items():
        merged[res] = quantity.parse(raw, field=f"container {name}: requests[{res}]")
    return merged


def mentions(pod: Mapping[str, Any]) -> set[str]:
    """Every resource name in the requests or limits of any container or init container."""
    names: set[str] = set()
    for _, container in containers(pod):
        names.update(_resource_map(container, "requests"))
        names.update(_resource_map(container, "limits"))
    return names


def pod_requests(pod: Mapping[str, Any]) -> dict[str, decimal.Decimal]:
    """The pod's effective request: max(sum of app containers, each init container) plus overhead."""
    total: dict[str, decimal.Decimal] = {}
    init_max: dict[str, decimal.Decimal] = {}
    for is_init, container in containers(pod):
        for res, amount in requests(container).items():
            if is_init:
                init_max[res] = max(init_max.get(res, decimal.Decimal(0)), amount)
            else:
                total[res] = total.get(res, decimal.Decimal(0)) + amount
    for res, amount in init_max.items():
        total[res] = max(total.get(res, decimal.Decimal(0)), amount)
    overhead = (pod.get("spec") or {}).get("overhead") or {}
    for res, raw in overhead.items():
        total[res] = total.get(res, decimal.Decimal(0)) + quantity.parse(raw, field=f"overhead[{res}]")
    return total


def is_terminated(pod: Mapping[str, Any]) -> bool:
    """A pod that no longer holds node resources: Succeeded or Failed."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
