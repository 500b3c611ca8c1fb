"""Quantities stored as kube-apiserver stores them: in canonical form (``2000`` -> ``2k``,
``2048Mi`` -> ``2Gi``, ``0.5`` -> ``500m``: ``vgpu.core.quantity.canonical``), in every field
of the kinds served here that is a ``resource.Quantity`` in the Kubernetes API. A string there
that is not a quantity is refused as kube-apiserver refuses it when it decodes the body (400).
Code that reads a quantity back must parse it as Kubernetes does, never with ``int()``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vgpu.core import errors, quantity
from vgpu.localcluster.validation import bad_request


def _lists(obj: Any, *path: str) -> Iterable[Any]:
    """Each element of the list at ``path`` (an absent or non-list value gives none)."""
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj if isinstance(obj, list) else ()


def _section(obj: dict[str, Any], name: str) -> dict[str, Any]:
    value = obj.get(name)
    return value if isinstance(value, dict) else {}


def _maps(plural: str, obj: dict[str, Any]) -> Iterable[tuple[str, Any]]:
    """(where, the name -> quantity map) for every quantity map of an object of ``plural``."""
    if plural == "pods":
        for group in ("initContainers", "containers"):
            for i, container in enumerate(_lists(obj, "spec", group)):
                resources = container.get("resources") if isinstance(container, dict) else None
                for field in ("limits", "requests"):
                    if isinstance(resources, dict):
                        yield f"spec.{group}[{i}].resources.{field}", resources.get(field)
        yield "spec.overhead", _section(obj, "spec").get("overhead")
    elif plural == "nodes":
        for field in ("capacity", "allocatable"):
            yield f"status.{field}", _section(obj, "status").get(field)
    elif plural == "resourcequotas":
        for part, fields in (("spec", ("hard",)), ("status", ("hard", "used"))):
            for field in fields:
                yield f"{part}.{field}", _section(obj, part).get(field)
    elif plural == "limitranges":
        for i, item in enumerate(_lists(obj, "spec", "limits")):
            for field in ("max", "min", "default", "defaultRequest", "maxLimitRequestRatio"):
                if isinstance(item, dict):
                    yield f"spec.limits[{i}].{field}", item.get(field)


def _requests(devices: Any, where: str) -> Iterable[tuple[str, Any]]:
    """The ``capacity.requests`` maps of a DeviceClaim's requests and subrequests."""
    for i, request in enumerate(_lists(devices, "requests")):
        if not isinstance(request, dict):
            continue
        subs = [(f"{where}.requests[{i}].exactly", request.get("exactly"))]
        subs += [
            (f"{where}.requests[{i}].firstAvailable[{j}]", sub)
            for j, sub in enumerate(_lists(request, "firstAvailable"))
        ]
        for at, sub in subs:
            capacity = sub.get("capacity") if isinstance(sub, dict) else None
            if isinstance(capacity, dict):
                yield f"{at}.capacity.requests", capacity.get("requests")


def _dra_maps(plural: str, obj: dict[str, Any]) -> Iterable[tuple[str, Any]]:
    """(where, a name -> quantity map) of the DRA claims and templates: capacity requests and
    allocated ``consumedCapacity``."""
    if plural == "resourceclaims":
        yield from _requests(_section(obj, "spec").get("devices"), "spec.devices")
        allocation = _section(obj, "status").get("allocation")
        for i, result in enumerate(_lists(allocation, "devices", "results")):
            if isinstance(result, dict):
                yield (
                    f"status.allocation.devices.results[{i}].consumedCapacity",
                    result.get("consumedCapacity"),
                )
    elif plural == "resourceclaimtemplates":
        yield from _requests(_section(_section(obj, "spec"), "spec").get("devices"), "spec.spec.devices")


def _slice_fields(obj: dict[str, Any]) -> Iterable[tuple[str, Any, Any]]:
    """(where, holder, key) of each quantity of a ResourceSlice: every device capacity's ``value``
    and its ``requestPolicy``'s ``default``, ``validRange.min/max/step`` and ``validValues``."""
    for i, device in enumerate(_lists(obj, "spec", "devices")):
        capacity = device.get("capacity") if isinstance(device, dict) else None
        for name, cap in capacity.items() if isinstance(capacity, dict) else ():
            if not isinstance(cap, dict):
                continue
            at = f"spec.devices[{i}].capacity[{name}]"
            yield f"{at}.value", cap, "value"
            policy = cap.get("requestPolicy")
            if not isinstance(policy, dict):
                continue
            yield f"{at}.requestPolicy.default", policy, "default"
            rng = policy.get("validRange")
            if isinstance(rng, dict):
                for key in ("min", "max", "step"):
                    yield f"{at}.requestPolicy.validRange.{key}", rng, key
            for j, _ in enumerate(_lists(policy, "validValues")):
                yield f"{at}.requestPolicy.validValues[{j}]", policy["validValues"], j


def _canonical(value: Any, *, field: str) -> str:
    try:
        return quantity.canonical(value, field=field)
    except errors.QuantityError as exc:
        raise bad_request(str(exc)) from None


def canonicalize(plural: str, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with its quantities in canonical form (in place), or 400 for one that does not parse."""
    if plural == "resourceslices":
        for where, holder, key in _slice_fields(obj):
            if (holder[key] if isinstance(holder, list) else holder.get(key)) is not None:
                holder[key] = _canonical(holder[key], field=where)
    for where, values in [*_maps(plural, obj), *_dra_maps(plural, obj)]:
        if not isinstance(values, dict):
            continue
        for name, value in values.items():
            values[name] = _canonical(value, field=f"{where}[{name}]")
    return obj
