"""The GpuBackend port: what the device plugin needs from a GPU driver, as one small Protocol.

Implementations: ``vgpu.gpu.nvml.NvmlBackend`` (the NVIDIA driver through ``pynvml``) and
``vgpu.gpu.fake.FakeGpuBackend`` (GPUs described in YAML, with injectable XID events, vanishing
GPUs and failures). Every method is blocking and may be slow: async callers run them through
``asyncio.to_thread``. Every failure is a ``vgpu.core.errors.GpuBackendError``; foreign errors
(``NVMLError``) never leave the adapter.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from vgpu.core.device import GpuUuid

# XIDs caused by applications, not by the GPU: ignored by default (HAMi and NVIDIA do the same).
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class MigInstance:
    """One MIG device carved out of a GPU (read-only view; we never change MIG layout)."""

    uuid: str
    profile: str  # e.g. "1g.10gb"
    memory_total_bytes: int
    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int = 0
    placement_size: int = 0


@dataclass(frozen=True)
class DeviceInfo:
    """One physical GPU as the driver reports it."""

    uuid: GpuUuid
    index: int
    name: str  # the driver's model name, e.g. "NVIDIA A100-SXM4-40GB"
    memory_total_bytes: int
    minor_number: int
    pci_bus_id: str  # as NVML writes it, e.g. "00000000:3B:00.0"
    numa_node: int | None = None  # None: unknown or not a NUMA machine
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()

    @property
    def memory_mib(self) -> int:
        return self.memory_total_bytes // (1 << 20)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU. ``used_memory_bytes`` None: the driver cannot say (NVML
    reports "not available", e.g. without the permission to see other users' processes)."""

    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class GpuMemoryUsage:
    """What the driver says is used on one GPU now, and by which processes (compute and graphics)."""

    used_bytes: int
    processes: tuple[GpuProcess, ...] = ()


class EventKind(enum.StrEnum):
    XID = "xid"  # an XID critical error on one GPU (``xid`` set)
    LOST = "lost"  # the backend lost track of a GPU (or of all: ``uuid`` None); treat as unhealthy


@dataclass(frozen=True)
class GpuEvent:
    """A health event. ``uuid`` None means it could not be attributed: it concerns every GPU."""

    kind: EventKind
    uuid: GpuUuid | None
    xid: int = 0
    detail: str = ""


class GpuBackend(Protocol):
    """A GPU driver seen through the few calls the device plugin makes (all blocking)."""

    def devices(self) -> list[DeviceInfo]:
        """Every GPU present now, in index order. A GPU that cannot be read (off the bus) is left
        out and logged; GpuBackendError only when the GPUs cannot be listed at all."""
        ...

    def wait_event(self, timeout_s: float) -> GpuEvent | None:
        """Block up to ``timeout_s`` for the next health event; None when none came.
        ``GpuBackendError`` when waiting itself fails (the caller marks every GPU lost and backs off)."""
        ...

    def probe(self, uuid: GpuUuid) -> bool:
        """Whether the GPU answers a cheap query now (False when gone or failing)."""
        ...

    def memory_usage(self, uuid: GpuUuid) -> GpuMemoryUsage:
        """The GPU's used memory and the processes on it now; GpuBackendError when the driver fails
        or answers something that is not a memory reading."""
        ...

    def utilization_percent(self, uuid: GpuUuid) -> int:
        """The GPU's busy time over the driver's last sample period, 0..100 (NVML's ``gpu``
        utilisation rate); GpuBackendError when the driver fails or answers something else."""
        ...

    def interrupt(self) -> None:
        """Wake a ``wait_event`` blocked in another thread (best effort; it returns None)."""
        ...

    def close(self) -> None:
        """Release the driver (idempotent)."""
        ...
