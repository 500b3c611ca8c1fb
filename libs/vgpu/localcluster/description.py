"""The small YAML description of a local cluster: its nodes, their labels and their fake GPUs.

::

    nodes:
      - name: gpu-node-a            # a DNS-1123 name, unique
        labels: {zone: a}           # optional
        cpu: "32"                   # optional allocatable; defaults below
        memory: 128Gi
        pods: 110
        gpus:                       # fake GPUs (``vgpu.gpu.fake`` keys, camelCase)
          - model: NVIDIA A100-SXM4-40GB   # or ``name``, as the fake backend calls it
            memoryMib: 40960
            numa: 0                 # optional
            uuid: GPU-...           # optional: derived from the node name and the index
            count: 2                # optional: this many identical GPUs (no uuid then)

``load`` validates everything (the GPU entries through the fake backend's own parser) and fills in
every GPU's uuid, so ``NodeSpec.fake_gpus`` is a complete document to hand to the device plugin's
fake backend on that node. Errors are ``ConfigError`` with the dotted field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vgpu.core import errors, quantity
from vgpu.core.names import is_dns_subdomain
from vgpu.gpu import fake

DEFAULT_ALLOCATABLE = {"cpu": "32", "memory": "128Gi", "pods": "110"}
_NODE_KEYS = {"name", "labels", "cpu", "memory", "pods", "gpus"}


@dataclass(frozen=True)
class NodeSpec:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ALLOCATABLE))
    gpus: tuple[Mapping[str, Any], ...] = ()

    @property
    def fake_gpus(self) -> dict[str, Any]:
        """The fake backend's YAML document for this node (``vgpu.gpu.fake``), uuids filled in."""
        return {"gpus": [dict(g) for g in self.gpus]}


@dataclass(frozen=True)
class ClusterDescription:
    nodes: tuple[NodeSpec, ...]

    def node(self, name: str) -> NodeSpec:
        for spec in self.nodes:
            if spec.name == name:
                return spec
        raise KeyError(name)


def _gpus(raw: Any, where: str, node: str) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise errors.ConfigError(where, f"expected a list of GPUs, got {raw!r}")
    expanded: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise errors.ConfigError(at, f"expected a mapping, got {item!r}")
        entry = dict(item)
        count = entry.pop("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise errors.ConfigError(f"{at}.count", f"expected a positive integer, got {count!r}")
        if count > 1 and "uuid" in entry:
            raise errors.ConfigError(f"{at}.uuid", "cannot be set together with count > 1")
        if "model" in entry:
            if "name" in entry:
                raise errors.ConfigError(f"{at}.model", "give model or name, not both")
            entry["name"] = entry.pop("model")
        expanded.extend(dict(entry) for _ in range(count))
    try:
        devices, _ = fake.parse_devices({"gpus": expanded}, seed=node)
    except errors.GpuBackendError as err:
        raise errors.ConfigError(where, str(err)) from err
    for entry, device in zip(expanded, devices, strict=True):
        entry["uuid"] = str(device.uuid)
    return tuple(expanded)


def _node(raw: Any, where: str) -> NodeSpec:
    if not isinstance(raw, Mapping):
        raise errors.ConfigError(where, f"expected a mapping, got {raw!r}")
    unknown = sorted(str(k) for k in raw if k not in _NODE_KEYS)
    if unknown:
        raise errors.ConfigError(where, f"unknown keys {unknown} (known: {sorted(_NODE_KEYS)})")
    name = raw.get("name")
    if not isinstance(name, str) or not is_dns_subdomain(name, max_len=63):
        raise errors.ConfigError(f"{where}.name", f"expected a lowercase DNS-1123 name, got {name!r}")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise errors.ConfigError(f"{where}.labels", f"expected a mapping of strings, got {labels!r}")
    allocatable = dict(DEFAULT_ALLOCATABLE)
    for key in ("cpu", "memory", "pods"):
        if key in raw:
            value = raw[key]
            try:
                quantity.parse(value, field=f"{where}.{key}")
            except errors.QuantityError as err:
                raise errors.ConfigError(err.field, err.message) from err
            allocatable[key] = str(value)
    return NodeSpec(name, dict(labels), allocatable, _gpus(raw.get("gpus"), f"{where}.gpus", name))


def load(source: str | Path | Mapping[str, Any]) -> ClusterDescription:
    """A description from a YAML file path or an already-loaded mapping."""
    if isinstance(source, str | Path):
        try:
            raw: Any = yaml.safe_load(Path(source).read_text())
        except (OSError, yaml.YAMLError) as err:
            raise errors.ConfigError(str(source), f"cannot read the cluster description: {err}") from err
    else:
        raw = source
    if not isinstance(raw, Mapping):
        raise errors.ConfigError("description", f"expected a mapping with nodes, got {raw!r}")
    nodes = raw.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise errors.ConfigError("nodes", f"expected a non-empty list of nodes, got {nodes!r}")
    specs = tuple(_node(item, f"nodes[{i}]") for i, item in enumerate(nodes))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise errors.ConfigError("nodes", f"duplicate node names in {names}")
    uuids = [g["uuid"] for s in specs for g in s.gpus]
    if len(set(uuids)) != len(uuids):
        raise errors.ConfigError("nodes", "duplicate GPU uuids across nodes")
    return ClusterDescription(specs)
