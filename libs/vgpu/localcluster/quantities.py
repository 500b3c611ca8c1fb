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


def canonicalize(plural: str, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with its quantities in canonical form (in place), or 400 for one that does not parse."""
    for where, values in _maps(plural, obj):
        if not isinstance(values, dict):
            continue
        for name, value in values.items():
            try:
                values[name] = quantity.canonical(value, field=f"{where}[{name}]")
            except errors.QuantityError as exc:
                raise bad_request(str(exc)) from None
    return obj
