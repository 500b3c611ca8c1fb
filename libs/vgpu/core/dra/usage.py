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
  the whole device when it does not allow multiple allocations). kube-scheduler 1.36 itself names
  every capacity, the defaulted ones included; the rule is for other writers. kube-scheduler counts a claim's
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
        # API JSON is dicts: ``type(...) is dict`` first skips the ABC check, which is slow
        if not (type(obj) is dict or isinstance(obj, Mapping)):
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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SliceGpus:
    """One ResourceSlice of our driver, read: its pool (``""``: unreadable, see ``problems``), the
    pool's generation, its GPUs and the devices skipped, with reasons."""

    name: str
    pool: str
    generation: int
    gpus: tuple[tuple[str, PublishedGpu], ...]  # (device name, GPU)
    problems: tuple[str, ...] = ()


def read_slice(obj: object) -> SliceGpus | None:
    """``obj`` read as one of our ResourceSlices; None when it is not one (another driver's)."""
    if not isinstance(obj, Mapping) or _get(obj, "spec", "driver") != names.DRIVER:
        return None
    name = _name(obj)
    pool = _get(obj, "spec", "pool", "name")
    generation = _get(obj, "spec", "pool", "generation")
    generation = 0 if generation is None else generation
    if not isinstance(pool, str) or not pool or not isinstance(generation, int):
        problem = f"ResourceSlice {name}: no readable spec.pool (name, generation)"
        return SliceGpus(name=name, pool="", generation=0, gpus=(), problems=(problem,))
    gpus: list[tuple[str, PublishedGpu]] = []
    problems: list[str] = []
    listed = _get(obj, "spec", "devices")
    for i, dev in enumerate(listed if isinstance(listed, list) else []):
        where = f"ResourceSlice {name} spec.devices[{i}]"
        try:
            gpu = _published(dev, where=where)
        except (errors.VgpuError, ValueError) as exc:
            problems.append(f"{where}: {exc}")
            continue
        gpus.append((names.device_name(gpu.gpu.index), gpu))
    return SliceGpus(name=name, pool=pool, generation=generation, gpus=tuple(gpus), problems=tuple(problems))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimUse:
    """One claim, read: who uses it and its shares of our GPUs, or why it cannot be read."""

    namespace: str
    name: str
    pods: tuple[str, ...] = ()
    shares: tuple[allocation.DeviceShare, ...] = ()
    problem: str | None = None


def read_claim(obj: object) -> ClaimUse | None:
    """``obj`` read as a ResourceClaim; None when it holds nothing of ours (or is not an object)."""
    if not isinstance(obj, Mapping):
        return None
    namespace = _get(obj, "metadata", "namespace")
    namespace = namespace if isinstance(namespace, str) else ""
    name = _name(obj)
    try:
        shares = allocation.shares(obj)
    except errors.VgpuError as exc:
        return ClaimUse(namespace=namespace, name=name, problem=f"ResourceClaim {namespace}/{name}: {exc}")
    if not shares:
        return None
    return ClaimUse(namespace=namespace, name=name, pods=tuple(_holder_pods(obj)), shares=tuple(shares))


def _pools(slices: Iterable[SliceGpus | None], loose: list[str]) -> dict[str, list[SliceGpus]]:
    """pool → its slices at the pool's highest generation (a pool being rewritten has stale ones)."""
    pools: dict[str, tuple[int, list[SliceGpus]]] = {}
    for found in slices:
        if found is None:
            continue
        if not found.pool:
            loose.extend(found.problems)
            continue
        have = pools.get(found.pool)
        if have is None or found.generation > have[0]:
            pools[found.pool] = (found.generation, [found])
        elif found.generation == have[0]:
            have[1].append(found)
    return {pool: found for pool, (_, found) in pools.items()}


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
    return combine((read_slice(s) for s in slices), (read_claim(c) for c in claims))


def combine(slices: Iterable[SliceGpus | None], claims: Iterable[ClaimUse | None]) -> DraUsage:
    """``build`` from slices and claims already read (a caller keeps what it read of an object
    until the object changes: ``read_slice`` and ``read_claim`` are the costly part)."""
    loose: list[str] = []
    problems: dict[str, list[str]] = {}
    gpus: dict[str, dict[str, PublishedGpu]] = {}
    for pool, pool_slices in sorted(_pools(slices, loose).items()):
        devices = gpus.setdefault(pool, {})
        for one in pool_slices:
            problems.setdefault(pool, []).extend(one.problems)
            for name, gpu in one.gpus:
                if name in devices:
                    problems[pool].append(f"ResourceSlice {one.name}: {name} published twice")
                else:
                    devices[name] = gpu
    sums: dict[str, dict[GpuUuid, list[int]]] = {pool: {} for pool in gpus}  # slots, MiB, cores
    holders: dict[str, dict[GpuUuid, list[Holder]]] = {pool: {} for pool in gpus}
    for claim in claims:
        if claim is None:
            continue
        if claim.problem is not None:
            loose.append(claim.problem)
            continue
        pods: Sequence[str | None] = claim.pods or (None,)
        for share in claim.shares:
            published = gpus.get(share.pool, {}).get(share.device)
            if published is None:
                where = (
                    f"node {share.pool}, whose ResourceSlice does not publish it (gone or unhealthy)"
                    if share.pool in gpus
                    else f"pool {share.pool}, which no ResourceSlice of {names.DRIVER} publishes"
                )
                key = f"ResourceClaim {claim.namespace}/{claim.name}"
                problems.setdefault(share.pool, []).append(f"{key} holds {share.device} on {where}")
                continue
            memory, cores = _consumed(share, published)
            uuid = published.gpu.uuid
            total = sums[share.pool].setdefault(uuid, [0, 0, 0])
            total[0] += 1
            total[1] += memory
            total[2] += cores
            for pod in pods:
                holders[share.pool].setdefault(uuid, []).append(
                    Holder(
                        namespace=claim.namespace, pod=pod, claim=claim.name, memory_mib=memory, cores=cores
                    )
                )
    nodes: dict[str, DraNode] = {}
    for pool, devices in gpus.items():
        inventory = NodeInventory(
            NodeName(pool), tuple(sorted((p.gpu for p in devices.values()), key=lambda g: g.index))
        )
        nodes[pool] = DraNode(
            inventory=inventory,
            used={uuid: GpuUsage(*total) for uuid, total in sums[pool].items()},
            holders={
                uuid: tuple(sorted(found, key=lambda h: (h.namespace, h.pod or "", h.claim)))
                for uuid, found in holders[pool].items()
            },
            problems=tuple(problems.get(pool, ())),
        )
    for pool, reasons in sorted(problems.items()):
        if pool not in nodes:
            loose.extend(reasons)
    return DraUsage(nodes=nodes, problems=tuple(loose))
