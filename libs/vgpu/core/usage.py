"""GPU usage from pods' ``devices-allocated`` annotations (docs/protocol.md#pod-annotations, #the-pod-device-string, #fit-and-scoring).

A pod's device string has one entry per container, init containers first. Regular init containers
run one after another before the app containers, so a pod's footprint on one GPU is collapsed HAMi's
way: memory and cores are the larger of the biggest init container and the sum of the app
containers; slots are the number of app containers on that GPU, at least 1. Once every regular init
container has finished, only the app containers count. A node's usage is the sum of its pods'
footprints.

Restartable init containers (``restartPolicy: Always``, Kubernetes 1.29+ sidecars) start in init
order and then run for the pod's whole life: they count with the app containers (summed, a slot
each), and a regular init container that comes after one runs beside it, so its peak on a GPU is its
own need plus the sidecars started before it there. Finished init containers drop only the regular
ones; sidecars keep counting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from vgpu.core import request
from vgpu.core.annotations import PodDevices
from vgpu.core.device import GpuUsage, GpuUuid


@dataclass
class _Peak:
    # the largest regular init container, with the sidecars started before it on this GPU
    init_memory_mib: int = 0
    init_cores: int = 0
    init_slots: int = 0
    # the sidecars and the app containers, which run together (while the init containers run, the
    # sidecars started so far)
    memory_mib: int = 0
    cores: int = 0
    slots: int = 0


def pod_usage(
    devices: PodDevices,
    *,
    init_count: int,
    sidecars: AbstractSet[int] = frozenset(),
    init_done: bool = False,
) -> dict[GpuUuid, GpuUsage]:
    """The pod's collapsed footprint per GPU. ``sidecars``: indices of the restartable init
    containers (``request.sidecar_indices``); ``init_done``: every regular init container has
    finished (``regular_init_done``)."""
    peaks: dict[GpuUuid, _Peak] = {}
    for index, container in enumerate(devices):
        regular_init = index < init_count and index not in sidecars
        if regular_init and init_done:
            continue
        for device in container:
            peak = peaks.setdefault(device.uuid, _Peak())
            if regular_init:  # app containers come after every init container: only sidecars so far
                peak.init_memory_mib = max(peak.init_memory_mib, peak.memory_mib + device.memory_mib)
                peak.init_cores = max(peak.init_cores, peak.cores + device.cores)
                peak.init_slots = max(peak.init_slots, peak.slots + 1)
            else:
                peak.memory_mib += device.memory_mib
                peak.cores += device.cores
                peak.slots += 1
    return {
        uuid: GpuUsage(
            slots=max(1, p.init_slots, p.slots),
            memory_mib=max(p.init_memory_mib, p.memory_mib),
            cores=max(p.init_cores, p.cores),
        )
        for uuid, p in peaks.items()
    }


def regular_init_done(pod: Mapping[str, Any]) -> bool:
    """Whether every regular (not restartable) init container of ``pod`` has exited 0, read from
    ``status.initContainerStatuses`` by container name. A sidecar's status is running, or
    terminated and restarting: it says nothing. False when the pod has no regular init container or
    a status is missing or not readable."""
    spec = pod.get("spec")
    status = pod.get("status")
    init = spec.get("initContainers") if isinstance(spec, Mapping) else None
    statuses = status.get("initContainerStatuses") if isinstance(status, Mapping) else None
    if not isinstance(init, list) or not isinstance(statuses, list):
        return False
    sidecars = request.sidecar_indices(init)
    regular = [
        c.get("name") if isinstance(c, Mapping) else None for i, c in enumerate(init) if i not in sidecars
    ]
    by_name = {s.get("name"): s for s in statuses if isinstance(s, Mapping)}
    return bool(regular) and all(name in by_name and _exited_zero(by_name[name]) for name in regular)


def _exited_zero(status: object) -> bool:
    state = status.get("state") if isinstance(status, Mapping) else None
    terminated = state.get("terminated") if isinstance(state, Mapping) else None
    return isinstance(terminated, Mapping) and terminated.get("exitCode") == 0


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
