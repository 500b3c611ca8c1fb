"""What a simulation run means: per-GPU utilisation, totals, and fragmentation.

Fragmentation is free GPU memory that the workload cannot use any more. The yardstick is the
*typical container*: one GPU with the median (``statistics.median_low``, so a value that occurs)
memory and the median cores over every GPU-requesting container of every admitted pod replica
(as the webhook left it: a bare ``nvidia.com/gpu: 1`` asks for the whole GPU and 100 % cores). Memory is taken per GPU, so a container asking for a percentage counts with that
percentage of the GPU being judged. A healthy GPU on which the scheduler's own fit
(``vgpu.core.fit.fit_pod``) rejects the typical container (no free slot, too little memory or
cores, exclusive use taken, cordoned) *strands* all its free memory. ``fragmentation`` = stranded MiB /
free MiB over healthy GPUs (0 when nothing is free). Unhealthy GPUs are reported apart and
count neither as free nor as stranded.

GPUs of the DRA mode (``run.dra``: the ``--dra`` file's ResourceSlices) are rows too, their usage
what the file's and the run's claims hold (``vgpu.core.dra.usage``, as ``vgpu status`` counts it);
on them the yardstick is the DRA allocator's: a GPU strands its free memory when kube-scheduler's
allocation could not give a claim of the typical container (``convert.claim_spec``) a share of it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from vgpu.core import fit
from vgpu.core.config import Policy
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid, NodeName
from vgpu.core.dra import convert, names
from vgpu.core.request import ContainerRequest, PodRequest, Selectors
from vgpu.simulate.engine import Run
from vgpu.simulate.model import WorkloadPod


@dataclass(frozen=True)
class Typical:
    """The workload's median container: memory per GPU memory size (MiB) and cores percent."""

    memory_mib_by_gpu_size: dict[int, int]
    cores: int

    def request_on(self, gpu: Gpu) -> ContainerRequest:
        return ContainerRequest(
            name="typical",
            count=1,
            memory_mib=max(1, self.memory_mib_by_gpu_size[gpu.memory_mib]),
            cores=self.cores,
        )


@dataclass(frozen=True)
class GpuRow:
    node: NodeName
    gpu: Gpu
    used: GpuUsage
    pods: tuple[str, ...]
    stranded_mib: int  # free memory this GPU can no longer give a typical container
    cordoned: bool = False
    dra: bool = False  # a GPU of the DRA mode (a ResourceSlice device)

    @property
    def free_mib(self) -> int:
        return max(0, self.gpu.memory_mib - self.used.memory_mib) if self.gpu.health else 0

    @property
    def memory_fraction(self) -> float:
        return self.used.memory_mib / self.gpu.memory_mib if self.gpu.memory_mib else 0.0


@dataclass(frozen=True)
class Totals:
    pods: int
    placed: int
    pending: int
    placed_dra: int
    rejected: int
    gpus: int
    gpus_in_use: int
    gpus_unhealthy: int
    nodes_in_use: int
    memory_used_mib: int
    memory_total_mib: int
    cores_used: int
    cores_total: int
    slots_used: int
    slots_total: int
    free_mib: int
    stranded_mib: int
    preemptions: int = 0  # pods placed by evicting lower-priority ones

    @property
    def fragmentation(self) -> float:
        return self.stranded_mib / self.free_mib if self.free_mib else 0.0


@dataclass(frozen=True)
class Analysis:
    run: Run
    typical: Typical | None  # None when no container asks for a GPU
    gpus: tuple[GpuRow, ...]
    totals: Totals


def typical_container(pods: Sequence[WorkloadPod], gpu_sizes: set[int]) -> Typical | None:
    """The median container over ``pods`` (see the module docstring), or None without GPU asks."""
    containers = [c for p in pods for c in p.request.containers if c is not None]
    if not containers:
        return None
    by_size = {size: statistics.median_low(c.memory_on(size) for c in containers) for size in gpu_sizes}
    return Typical(by_size, statistics.median_low(min(c.cores, 100) for c in containers))


def _takes_typical(gpu: Gpu, used: GpuUsage, typical: Typical, cordoned: frozenset[GpuUuid]) -> bool:
    request = PodRequest(containers=(typical.request_on(gpu),), init_count=0)
    view = fit.NodeGpus.build((gpu,), {gpu.uuid: used}, cordoned & {gpu.uuid})
    return isinstance(fit.fit_pod(request, view, gpu_policy=Policy.SPREAD), fit.Placement)


def _dra_takes_typical(run: Run, node: str, gpu: Gpu, typical: Typical) -> bool:
    spec = convert.claim_spec(
        typical.request_on(gpu), chosen=Selectors(), memory_sizes_mib=(), exclusive=False, field="typical"
    )
    return run.dra is not None and run.dra.takes(node, names.device_name(gpu.index), spec)


def _stranded(gpu: Gpu, used: GpuUsage, refuses_typical: bool) -> int:
    """The memory left on a healthy ``gpu`` that the typical container cannot use: all of its free
    memory when the GPU refuses that container, else 0."""
    free = max(0, gpu.memory_mib - used.memory_mib)
    return free if gpu.health and free and refuses_typical else 0


def analyse(run: Run) -> Analysis:
    """Rows per GPU (node order, then GPU index; the DRA nodes after the cluster file's) and the
    totals of ``run``."""
    dra = run.dra_usage
    sizes = {g.memory_mib for n in run.cluster.nodes for g in n.gpus}
    sizes |= {g.memory_mib for n in dra.nodes.values() for g in n.inventory.gpus}
    admitted = [p.pod for p in run.placed] + [p.pod for p in run.pending]
    typical = typical_container(admitted, sizes)
    pods_on: dict[GpuUuid, list[str]] = {}
    for placed in run.placed:
        for container in placed.devices:
            for device in container:
                keys = pods_on.setdefault(device.uuid, [])
                if placed.pod.key not in keys:
                    keys.append(placed.pod.key)
    rows: list[GpuRow] = []
    for inventory in run.cluster.nodes:
        node_used = run.used[inventory.node]
        for gpu in inventory.gpus:
            used = node_used.get(gpu.uuid, EMPTY_USAGE)
            takes = typical is not None and _takes_typical(gpu, used, typical, run.cluster.cordoned)
            stranded = _stranded(gpu, used, typical is not None and not takes)
            pods = tuple(pods_on.get(gpu.uuid, ()))
            rows.append(GpuRow(inventory.node, gpu, used, pods, stranded, gpu.uuid in run.cluster.cordoned))
    for name, node in dra.nodes.items():
        for gpu in node.inventory.gpus:
            used = node.used.get(gpu.uuid, EMPTY_USAGE)
            takes = typical is not None and _dra_takes_typical(run, name, gpu, typical)
            stranded = _stranded(gpu, used, typical is not None and not takes)
            pods = tuple(dict.fromkeys(h.shown for h in node.holders.get(gpu.uuid, ())))
            rows.append(GpuRow(NodeName(name), gpu, used, pods, stranded, dra=True))
    return Analysis(run, typical, tuple(rows), _totals(run, rows))


def _totals(run: Run, rows: list[GpuRow]) -> Totals:
    return Totals(
        pods=len(run.placed) + len(run.pending) + len(run.rejected),
        placed=len(run.placed),
        pending=len(run.pending),
        placed_dra=sum(1 for p in run.placed if p.pod.dra),
        rejected=len(run.rejected),
        gpus=len(rows),
        gpus_in_use=sum(1 for r in rows if r.used.slots > 0),
        gpus_unhealthy=sum(1 for r in rows if not r.gpu.health),
        nodes_in_use=len({r.node for r in rows if r.used.slots > 0}),
        memory_used_mib=sum(r.used.memory_mib for r in rows),
        memory_total_mib=sum(r.gpu.memory_mib for r in rows),
        cores_used=sum(r.used.cores for r in rows),
        cores_total=sum(r.gpu.cores for r in rows),
        slots_used=sum(r.used.slots for r in rows),
        slots_total=sum(r.gpu.count for r in rows),
        free_mib=sum(r.free_mib for r in rows),
        stranded_mib=sum(r.stranded_mib for r in rows),
        preemptions=len(run.preemptions),
    )
