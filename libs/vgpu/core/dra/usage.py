"""Per-node, per-GPU usage of kube-vgpu's DRA mode, from our ResourceSlices and the ResourceClaims
allocated on them: the same ``NodeInventory`` / ``GpuUsage`` values the extender path's views build
from the register and ``devices-allocated`` annotations, so ``vgpu status``, the dashboard and
``/metrics`` show both modes alike.

* A node's GPUs come from the ResourceSlices of :data:`names.DRIVER`: pool ``spec.pool.name`` (the
  node's name), the newest pool generation only (a pool being rewritten has stale slices for a
  while), one :class:`~vgpu.core.device.Gpu` per device ``gpu-<index>`` with the attributes ``uuid``
  and ``model`` and the capacities ``memory`` (bytes) and ``cores`` (percent). A device with the
  taint :data:`names.UNHEALTHY_TAINT_KEY` is unhealthy. A DRA GPU has no slot limit: its ``count``
  is 0 (views show the slots taken without a total).
* Each allocated claim's results for our driver (:func:`allocation.shares`) are shares of one GPU:
  one slot each, the consumed memory and cores. A capacity the result does not name was consumed as
  kube-scheduler consumes it: the device's ``requestPolicy.default``, else the whole capacity (and
  the whole device when it does not allow multiple allocations). kube-scheduler counts a claim's
  allocation until the claim is deallocated, whether or not a pod still uses it, and so does this.
* Who holds a share: the claim's ``status.reservedFor`` pods (the claim's namespace), else the pod
  in its ``ownerReferences`` (a claim made from a pod's template), else nobody yet (shown by the
  claim's name).

API data is not trusted: a slice device without a readable uuid or capacity, a claim whose
allocation cannot be read or names a device no slice publishes, is left out with a reason in
``problems``; nothing here raises on garbage.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vgpu.core import device, errors, quantity
from vgpu.core.device import Gpu, GpuUsage, GpuUuid, NodeInventory, NodeName
from vgpu.core.dra import allocation, names

_DEVICE_NAME = re.compile(r"^gpu-(0|[1-9][0-9]{0,5})$")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Holder:
    """One claim's share of one GPU and who holds it."""

    namespace: str
    pod: str | None
    """The pod using the claim (``reservedFor``, else the owner pod); None: not reserved yet."""
    claim: str
    memory_mib: int
    cores: int

    @property
    def shown(self) -> str:
        """``namespace/pod``, or ``namespace/claim:<claim>`` while no pod holds it."""
        return f"{self.namespace}/{self.pod}" if self.pod else f"{self.namespace}/claim:{self.claim}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PublishedGpu:
    """A device of a slice: the GPU and its capacities' request-policy defaults."""

    gpu: Gpu
    default_memory_mib: int
    default_cores: int
    shared: bool  # allowMultipleAllocations


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DraNode:
    """One node's DRA GPUs, what is allocated on each and to whom."""

    inventory: NodeInventory
    used: Mapping[GpuUuid, GpuUsage]
    holders: Mapping[GpuUuid, tuple[Holder, ...]]
    problems: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DraUsage:
    """Every node our driver publishes GPUs on (by name), and what could not be placed on one."""

    nodes: Mapping[str, DraNode]
    problems: tuple[str, ...] = ()


EMPTY = DraUsage(nodes={})


def _get(obj: object, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _name(obj: object) -> str:
    name = _get(obj, "metadata", "name")
    return name if isinstance(name, str) else "?"


def _attribute(dev: Mapping[str, Any], name: str) -> object:
    """The value of a device attribute (``{"string": ...}``, ``{"int": ...}``, ...), or None."""
    attr = _get(dev, "attributes", name)
    if not isinstance(attr, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in attr:
            return attr[kind]
    return None


def _capacity(dev: Mapping[str, Any], name: str, *, where: str) -> tuple[int, int]:
    """(total, request-policy default) of capacity ``name``, memory in MiB, cores in percent."""
    cap = _get(dev, "capacity", name)
    if not isinstance(cap, Mapping):
        raise errors.QuantityError(f"{where}.capacity.{name}", "missing")

    def parse(value: object, field: str) -> int:
        if name == names.CAPACITY_MEMORY:
            return allocation.memory_mib(value, field=field)
        parsed = quantity.parse_int(value, field=field)
        if parsed < 0:
            raise errors.QuantityError(field, f"invalid quantity {value!r}: negative")
        return parsed

    total = parse(cap.get("value"), f"{where}.capacity.{name}.value")
    default = _get(cap, "requestPolicy", "default")
    if default is None:
        return total, total
    return total, parse(default, f"{where}.capacity.{name}.requestPolicy.default")


def _published(dev: object, *, where: str) -> PublishedGpu:
    """One slice device as a GPU; ``QuantityError`` / ``ValueError`` for what cannot be read."""
    if not isinstance(dev, Mapping):
        raise ValueError("not an object")
    name = dev.get("name")
    match = _DEVICE_NAME.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"name {name!r} is not gpu-<index>")
    uuid = _attribute(dev, names.ATTR_UUID)
    if not isinstance(uuid, str) or not uuid:
        raise ValueError("no uuid attribute")
    model = _attribute(dev, names.ATTR_MODEL)
    memory, default_memory = _capacity(dev, names.CAPACITY_MEMORY, where=where)
    cores, default_cores = _capacity(dev, names.CAPACITY_CORES, where=where)
    taints = dev.get("taints")
    unhealthy = isinstance(taints, list) and any(
        isinstance(t, Mapping) and t.get("key") == names.UNHEALTHY_TAINT_KEY for t in taints
    )
    numa = _attribute(dev, names.ATTR_NUMA)
    gpu = Gpu(
        uuid=GpuUuid(uuid),
        index=int(match[1]),
        count=0,
        memory_mib=memory,
        cores=cores,
        type=gpu_type(model if isinstance(model, str) else ""),
        numa=numa if isinstance(numa, int) and not isinstance(numa, bool) else 0,
        health=not unhealthy,
    )
    return PublishedGpu(
        gpu=gpu,
        default_memory_mib=min(default_memory, memory),
        default_cores=min(default_cores, cores),
        shared=dev.get("allowMultipleAllocations") is True,
    )


def gpu_type(model: str) -> str:
    """The register annotation's ``type`` for a published ``model`` (``Tesla T4`` → ``NVIDIA-Tesla
    T4``), as the device plugin writes it, so both modes carry the same ``device_type``."""
    if not model:
        return device.MODEL_PREFIX + "unknown"
    return model if model.upper().startswith("NVIDIA") else device.MODEL_PREFIX + model


def _newest(slices: Iterable[object], problems: list[str]) -> dict[str, list[Mapping[str, Any]]]:
    """pool → the slices of our driver at that pool's highest generation."""
    pools: dict[str, tuple[int, list[Mapping[str, Any]]]] = {}
    for obj in slices:
        if _get(obj, "spec", "driver") != names.DRIVER or not isinstance(obj, Mapping):
            continue
        pool = _get(obj, "spec", "pool", "name")
        generation = _get(obj, "spec", "pool", "generation")
        generation = 0 if generation is None else generation
        if not isinstance(pool, str) or not pool or not isinstance(generation, int):
            problems.append(f"ResourceSlice {_name(obj)}: no readable spec.pool (name, generation)")
            continue
        have = pools.get(pool)
        if have is None or generation > have[0]:
            pools[pool] = (generation, [obj])
        elif generation == have[0]:
            have[1].append(obj)
    return {pool: found for pool, (_, found) in pools.items()}


def published(slices: Iterable[object]) -> tuple[dict[str, dict[str, PublishedGpu]], dict[str, list[str]]]:
    """node → device name → its GPU, and node (or ``""``) → what was skipped, from ``slices``."""
    loose: list[str] = []
    pools = _newest(slices, loose)
    out: dict[str, dict[str, PublishedGpu]] = {}
    problems: dict[str, list[str]] = {"": loose} if loose else {}
    for pool, found in sorted(pools.items()):
        devices = out.setdefault(pool, {})
        for obj in found:
            listed = _get(obj, "spec", "devices")
            for i, dev in enumerate(listed if isinstance(listed, list) else []):
                where = f"ResourceSlice {_name(obj)} spec.devices[{i}]"
                try:
                    gpu = _published(dev, where=where)
                except (errors.VgpuError, ValueError) as exc:
                    problems.setdefault(pool, []).append(f"{where}: {exc}")
                    continue
                name = names.device_name(gpu.gpu.index)
                if name in devices:
                    problems.setdefault(pool, []).append(f"{where}: {name} published twice")
                    continue
                devices[name] = gpu
    return out, problems


def _holder_pods(claim: Mapping[str, Any]) -> list[str]:
    """Names of the pods using ``claim``: ``reservedFor`` pods, else its owner pod."""
    reserved = _get(claim, "status", "reservedFor")
    pods = [
        str(e["name"])
        for e in (reserved if isinstance(reserved, list) else [])
        if isinstance(e, Mapping) and e.get("resource") == "pods" and isinstance(e.get("name"), str)
    ]
    if pods:
        return pods
    owners = _get(claim, "metadata", "ownerReferences")
    return [
        str(o["name"])
        for o in (owners if isinstance(owners, list) else [])
        if isinstance(o, Mapping) and o.get("kind") == "Pod" and isinstance(o.get("name"), str)
    ][:1]


def _consumed(share: allocation.DeviceShare, gpu: PublishedGpu) -> tuple[int, int]:
    if not gpu.shared:  # a device without allowMultipleAllocations is allocated whole
        return gpu.gpu.memory_mib, gpu.gpu.cores
    memory = gpu.default_memory_mib if share.memory_mib is None else share.memory_mib
    cores = gpu.default_cores if share.cores_percent is None else share.cores_percent
    return memory, cores


def build(slices: Iterable[object], claims: Iterable[object]) -> DraUsage:
    """The DRA usage of every node from ``slices`` and ``claims`` (all namespaces); see the module
    docstring. Pure; never raises on what the API server returned."""
    gpus, problems = published(slices)
    loose = list(problems.pop("", []))
    used: dict[str, dict[GpuUuid, GpuUsage]] = {pool: {} for pool in gpus}
    holders: dict[str, dict[GpuUuid, list[Holder]]] = {pool: {} for pool in gpus}
    for claim in claims:
        if not isinstance(claim, Mapping):
            continue
        namespace = _get(claim, "metadata", "namespace")
        namespace = namespace if isinstance(namespace, str) else ""
        key = f"ResourceClaim {namespace}/{_name(claim)}"
        try:
            shares = allocation.shares(claim)
        except errors.VgpuError as exc:
            loose.append(f"{key}: {exc}")
            continue
        if not shares:
            continue
        pods: Sequence[str | None] = _holder_pods(claim)
        for share in shares:
            gpu = gpus.get(share.pool, {}).get(share.device)
            if gpu is None:
                where = (
                    f"node {share.pool}, whose ResourceSlice does not publish it (gone or unhealthy)"
                    if share.pool in gpus
                    else f"pool {share.pool}, which no ResourceSlice of {names.DRIVER} publishes"
                )
                problems.setdefault(share.pool, []).append(f"{key} holds {share.device} on {where}")
                continue
            memory, cores = _consumed(share, gpu)
            uuid = gpu.gpu.uuid
            used[share.pool][uuid] = (
                used[share.pool].get(uuid, device.EMPTY_USAGE).plus(memory_mib=memory, cores=cores)
            )
            for pod in pods or (None,):
                holders[share.pool].setdefault(uuid, []).append(
                    Holder(namespace=namespace, pod=pod, claim=_name(claim), memory_mib=memory, cores=cores)
                )
    nodes: dict[str, DraNode] = {}
    for pool, devices in sorted(gpus.items()):
        inventory = NodeInventory(
            NodeName(pool), tuple(sorted((p.gpu for p in devices.values()), key=lambda g: g.index))
        )
        nodes[pool] = DraNode(
            inventory=inventory,
            used=used[pool],
            holders={
                uuid: tuple(sorted(found, key=lambda h: (h.namespace, h.pod or "", h.claim)))
                for uuid, found in holders[pool].items()
            },
            problems=tuple(problems.get(pool, ())),
        )
    for pool, found in sorted(problems.items()):
        if pool not in nodes:
            loose.extend(found)
    return DraUsage(nodes=nodes, problems=tuple(loose))
