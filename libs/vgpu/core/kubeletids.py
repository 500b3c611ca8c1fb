"""kubelet's device IDs against the GPUs the scheduler assigned: they must name the same GPUs.

kubelet records the IDs it passed to Allocate as the container's devices: the PodResources API
(monitoring tools), its per-pod device health, and its re-admission check after a restart
("previously allocated devices are no longer healthy") all read them. An ID is ``<uuid>-<slot>``
(``device.virtual_device_id``); its GPU is ``device.physical_uuid``. kubelet can pick IDs on other
GPUs than the scheduler's in three ways:

* it reuses an init container's IDs for the next containers of the pod (``devicesToAllocate``
  takes the reusable devices first, without asking the plugin); the scheduler places each pod so
  that the container reusing them is given the init container's GPUs (``vgpu.core.reuse``), so
  this happens only with entries another scheduler (or an older version) wrote;
* GetPreferredAllocation had no answer (the pod still not known after its bounded wait for the
  pod watch, or the entry does not fit);
* with ``enableNumaTopology`` and a TopologyManager policy, kubelet offers only the IDs on the
  NUMA node(s) its merged hint chose, and falls back to those when the scheduler's GPU is not
  among them.

Serving the scheduler's GPU then leaves kubelet's records pointing at another GPU (and a CPU set
pinned to another NUMA node); serving kubelet's GPU would use a GPU the scheduler did not count.
Neither is safe, so the Allocate is refused with the reason ``mismatch_reason`` gives.
"""

from collections import Counter
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from vgpu.core import annotations
from vgpu.core.device import GpuUuid, physical_uuid


@dataclass(frozen=True)
class Mismatch:
    kubelet_gpus: tuple[GpuUuid, ...]  # the GPUs kubelet's IDs name, in its order
    scheduler_gpus: tuple[GpuUuid, ...]  # the GPUs the scheduler assigned, in its order


def mismatch(
    entry: annotations.ContainerDevices, ids: Sequence[str], *, gpus: Container[str]
) -> Mismatch | None:
    """None when kubelet's ``ids`` name exactly the entry's GPUs (as many IDs on each)."""
    kubelet = tuple(physical_uuid(i, gpus=gpus) for i in ids)
    scheduler = tuple(d.uuid for d in entry)
    if Counter(kubelet) == Counter(scheduler):
        return None
    return Mismatch(kubelet, scheduler)


def _numa_text(uuids: Sequence[GpuUuid], numa: Mapping[GpuUuid, int | None]) -> str:
    return ", ".join(f"{u} (NUMA {numa.get(u) if numa.get(u) is not None else 'unknown'})" for u in uuids)


def mismatch_reason(
    found: Mismatch,
    *,
    container: str,
    ids: Sequence[str],
    numa: Mapping[GpuUuid, int | None],
    numa_sent: bool,
    reused: bool,
) -> str:
    """Why the Allocate is refused, with the likely cause. ``reused``: an earlier container of the
    pod (an init container) was served kubelet's IDs on the GPUs kubelet names now."""
    kubelet_numa = {numa.get(u) for u in found.kubelet_gpus}
    scheduler_numa = {numa.get(u) for u in found.scheduler_gpus}
    if reused:
        cause = (
            "kubelet reused the devices of the pod's init container, which the scheduler placed on "
            "another GPU than this container"
        )
    elif numa_sent and None not in kubelet_numa and kubelet_numa != scheduler_numa:
        cause = (
            "kubelet's TopologyManager aligned the container to another NUMA node than the scheduler's GPU "
            "(enableNumaTopology); serving the scheduler's GPU would silently misalign it with the CPUs "
            "kubelet pinned"
        )
    else:
        cause = "kubelet did not take the preferred allocation"
    return (
        f"container {container}: kubelet's devices {list(ids)} are on GPU(s) "
        f"{_numa_text(found.kubelet_gpus, numa)}, but the scheduler assigned "
        f"{_numa_text(found.scheduler_gpus, numa)}: {cause}; refused, since kubelet's records "
        f"(PodResources, device health) must name the GPU served and the scheduler counted only its own"
    )
