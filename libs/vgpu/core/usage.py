"""GPU usage from pods' ``devices-allocated`` annotations (PROTOCOL.md F.4, F.5, H.3.1).

A pod's device string has one entry per container, init containers first. Init containers run one
after another before the app containers, so a pod's footprint on one GPU is collapsed HAMi's way:
memory and cores are the larger of the biggest init container and the sum of the app containers;
slots are the number of app containers on that GPU, at least 1. Once every init container has
finished, only the app containers count. A node's usage is the sum of its pods' footprints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vgpu.core.annotations import PodDevices
from vgpu.core.device import GpuUsage, GpuUuid


@dataclass
class _Peak:
    init_memory_mib: int = 0
    init_cores: int = 0
    app_memory_mib: int = 0
    app_cores: int = 0
    app_slots: int = 0


def pod_usage(devices: PodDevices, *, init_count: int, init_done: bool = False) -> dict[GpuUuid, GpuUsage]:
    """The pod's collapsed footprint per GPU. ``init_done``: every init container has finished."""
    peaks: dict[GpuUuid, _Peak] = {}
    for index, container in enumerate(devices):
        is_init = index < init_count
        if is_init and init_done:
            continue
        for device in container:
            peak = peaks.setdefault(device.uuid, _Peak())
            if is_init:
                peak.init_memory_mib = max(peak.init_memory_mib, device.memory_mib)
                peak.init_cores = max(peak.init_cores, device.cores)
            else:
                peak.app_memory_mib += device.memory_mib
                peak.app_cores += device.cores
                peak.app_slots += 1
    return {
        uuid: GpuUsage(
            slots=max(1, p.app_slots),
            memory_mib=max(p.init_memory_mib, p.app_memory_mib),
            cores=max(p.init_cores, p.app_cores),
        )
        for uuid, p in peaks.items()
    }


def add(total: dict[GpuUuid, GpuUsage], usage: Mapping[GpuUuid, GpuUsage], *, sign: int = 1) -> None:
    """Add (``sign=1``) or take back (``sign=-1``) one pod's footprint, in place and exactly.

    Entries that reach zero are removed so that a node's usage map returns to ``{}`` when all of
    its pods are gone.
    """
    for uuid, used in usage.items():
        have = total.get(uuid)
        slots = (have.slots if have else 0) + sign * used.slots
        memory = (have.memory_mib if have else 0) + sign * used.memory_mib
        cores = (have.cores if have else 0) + sign * used.cores
        if slots == 0 and memory == 0 and cores == 0:
            total.pop(uuid, None)
        else:
            total[uuid] = GpuUsage(slots, memory, cores)


def node_usage(pods: Iterable[Mapping[GpuUuid, GpuUsage]]) -> dict[GpuUuid, GpuUsage]:
    """Sum of several pods' footprints (rebuilding from scratch; the scheduler keeps it incrementally)."""
    total: dict[GpuUuid, GpuUsage] = {}
    for usage in pods:
        add(total, usage)
    return total
