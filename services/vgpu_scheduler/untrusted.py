"""Node objects in an ExtenderArgs body are names, nothing more (issue 16).

In ``Nodes`` mode (an extender not ``nodeCacheCapable``) kube-scheduler sends whole Node objects.
Their annotations must not decide anything: a caller could claim any GPU inventory. Before the
filter runs, ``names_only`` swaps each Node object in the body for the one in our own watch cache
(a bare name when the node is unknown to us, which then has no GPUs); ``restore`` puts the
caller's objects back into the reply, which kube-scheduler matches by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vgpu.kube.port import JsonObj

from vgpu_scheduler import bodies

Originals = dict[str, JsonObj]


def _node_list_key(raw: Mapping[str, Any]) -> str | None:
    """The key holding the NodeList when the body is in Nodes mode (Go's case-insensitive keys)."""
    if bodies.go_field(raw, "NodeNames") is not None:
        return None
    return bodies.go_key(raw, "Nodes")


def _name(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def names_only(raw: Any, cached: Callable[[str], JsonObj | None]) -> tuple[Any, Originals]:
    """``raw`` with every named Node object replaced by ``cached(name)`` (or a bare name), and the
    caller's objects by name. Anything malformed is left as it is, for the parser to refuse."""
    if not isinstance(raw, dict):
        return raw, {}
    key = _node_list_key(raw)
    node_list = raw.get(key) if key is not None else None
    items = node_list.get("items") if isinstance(node_list, dict) else None
    if key is None or not isinstance(node_list, dict) or not isinstance(items, list):
        return raw, {}
    names = [_name(obj) for obj in items]
    if any(name is None for name in names):
        return raw, {}
    originals: Originals = {}
    trusted: list[JsonObj] = []
    for name, obj in zip(names, items, strict=True):
        assert name is not None
        originals[name] = obj
        trusted.append(cached(name) or {"metadata": {"name": name}})
    return {**raw, key: {**node_list, "items": trusted}}, originals


def restore(body: dict[str, Any], originals: Originals) -> dict[str, Any]:
    """The reply with the caller's own Node objects in ``Nodes.items`` again."""
    node_list = body.get("Nodes")
    if not originals or not isinstance(node_list, dict):
        return body
    items = [originals.get(_name(obj) or "", obj) for obj in node_list.get("items") or []]
    return {**body, "Nodes": {**node_list, "items": items}}
