"""The device model: physical GPUs, their virtual devices, a node's inventory and per-GPU usage."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import NewType

GpuUuid = NewType("GpuUuid", str)
VirtualDeviceId = NewType("VirtualDeviceId", str)
NodeName = NewType("NodeName", str)

COMMON_TYPE = "NVIDIA"  # the backend word HAMi writes in pod device strings
MODEL_PREFIX = "NVIDIA-"  # what the device plugin puts before an NVML name not starting with NVIDIA


def model_name(gpu_type: str) -> str:
    """The model as NVML and nvidia-smi name it ("Tesla T4", "NVIDIA A100-SXM4-40GB"), from the register
    annotation's ``type`` ("NVIDIA-Tesla T4"): the one name every view shows."""
    return gpu_type.removeprefix(MODEL_PREFIX)


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


def virtual_device_id(uuid: GpuUuid, slot: int) -> VirtualDeviceId:
    """The ID kubelet sees for slot ``slot`` of GPU ``uuid``: ``<uuid>-<slot>``."""
    return VirtualDeviceId(f"{uuid}-{slot}")


def virtual_device_ids(gpu: Gpu) -> list[VirtualDeviceId]:
    """The IDs kubelet sees for one GPU: ``<uuid>-0 .. <uuid>-(count-1)``."""
    return [virtual_device_id(gpu.uuid, i) for i in range(gpu.count)]


def physical_uuid(device_id: str, *, gpus: Container[str]) -> GpuUuid:
    """The GPU UUID behind a device ID kubelet hands us, given the UUIDs of the GPUs we serve.

    Only an ID we generated (``virtual_device_id``: one of ``gpus``, a dash, a slot number) has a
    suffix to strip. Any other ID is returned unchanged, so a plain GPU or MIG UUID whose last group
    happens to be all digits (``GPU-...-123456789012``) is never cut short.
    """
    if device_id in gpus:
        return GpuUuid(device_id)
    head, sep, tail = device_id.rpartition("-")
    if sep and tail.isascii() and tail.isdigit() and str(int(tail)) == tail and head in gpus:
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
