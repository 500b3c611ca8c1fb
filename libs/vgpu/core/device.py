"""The device model: physical GPUs, their virtual devices, a node's inventory and per-GPU usage."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NewType

GpuUuid = NewType("GpuUuid", str)
VirtualDeviceId = NewType("VirtualDeviceId", str)
NodeName = NewType("NodeName", str)

COMMON_TYPE = "NVIDIA"  # the backend word HAMi writes in pod device strings


class Mode(enum.StrEnum):
    """How a GPU is shared on its node."""

    HAMI_CORE = "hami-core"
    MIG = "mig"
    MPS = "mps"


@dataclass(frozen=True)
class MigPlacement:
    start: int
    size: int


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile a GPU can host, as HAMi's register annotation carries it."""

    name: str
    memory_mib: int
    cores: int
    slice_count: int
    placements: tuple[MigPlacement, ...] = ()


@dataclass(frozen=True)
class Gpu:
    """A physical GPU as the register annotation describes it (memory and cores after scaling)."""

    uuid: GpuUuid
    index: int
    count: int  # slots: how many containers may share it (deviceSplitCount)
    memory_mib: int
    cores: int  # 100 = the whole GPU; more when core scaling oversubscribes
    type: str  # the model, e.g. "NVIDIA-A100-SXM4-40GB"
    numa: int = 0
    mode: Mode = Mode.HAMI_CORE
    health: bool = True
    mig_profiles: tuple[MigProfile, ...] = ()


@dataclass(frozen=True)
class NodeInventory:
    """All GPUs of one node, in index order."""

    node: NodeName
    gpus: tuple[Gpu, ...]

    def by_uuid(self) -> dict[GpuUuid, Gpu]:
        return {gpu.uuid: gpu for gpu in self.gpus}


@dataclass(frozen=True)
class GpuUsage:
    """What is allocated on one GPU: slots taken, memory and cores handed out."""

    slots: int = 0
    memory_mib: int = 0
    cores: int = 0

    def plus(self, *, memory_mib: int, cores: int, slots: int = 1) -> GpuUsage:
        return GpuUsage(self.slots + slots, self.memory_mib + memory_mib, self.cores + cores)

    def minus(self, other: GpuUsage) -> GpuUsage:
        return GpuUsage(
            max(0, self.slots - other.slots),
            max(0, self.memory_mib - other.memory_mib),
            max(0, self.cores - other.cores),
        )


EMPTY_USAGE = GpuUsage()


def virtual_device_ids(gpu: Gpu) -> list[VirtualDeviceId]:
    """The IDs kubelet sees for one GPU: ``<uuid>-0 .. <uuid>-(count-1)``."""
    return [VirtualDeviceId(f"{gpu.uuid}-{i}") for i in range(gpu.count)]


def physical_uuid(device_id: str) -> GpuUuid:
    """The GPU UUID behind a virtual device ID (strips ``-N`` or ``::N``)."""
    if "::" in device_id:
        return GpuUuid(device_id.split("::", 1)[0])
    head, sep, tail = device_id.rpartition("-")
    if sep and tail.isdigit() and head:
        return GpuUuid(head)
    return GpuUuid(device_id)


def total_usage(usages: Iterable[Mapping[GpuUuid, GpuUsage]]) -> dict[GpuUuid, GpuUsage]:
    """Sum several per-GPU usage maps."""
    out: dict[GpuUuid, GpuUsage] = {}
    for usage in usages:
        for uuid, used in usage.items():
            have = out.get(uuid, EMPTY_USAGE)
            out[uuid] = GpuUsage(
                have.slots + used.slots, have.memory_mib + used.memory_mib, have.cores + used.cores
            )
    return out


def with_health(gpu: Gpu, healthy: bool) -> Gpu:
    return dataclasses.replace(gpu, health=healthy)
