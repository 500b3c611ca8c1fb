"""Scoring: which GPU a container gets and which node a pod goes to (docs/protocol.md#fit-and-scoring, #departures-from-hami).

GPU score counts the request (HAMi's does not): ``10 * (slots/count + cores/total + memory/total)``
after this container would be placed. ``binpack`` tries the GPU that ends fullest first, ``spread``
the one that ends emptiest; ties go to the lower NUMA node, then the lower index. For a
``nvidia.com/numa-bind`` pod the NUMA node is the first key (binpack: lowest first; spread: highest
first), then the score, as HAMi orders it.

Node score is HAMi's, over the node's existing usage: ``10 * (Σslots/Σcount + Σcores/Σtotal +
Σmemory/Σtotal)``. ``binpack`` picks the highest (fullest node), ``spread`` the lowest; ties go to
the node whose name sorts first, so a decision never depends on dict order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from vgpu.core.config import Policy
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid


def gpu_score_after(gpu: Gpu, used: GpuUsage, *, memory_mib: int, cores: int) -> float:
    """How full ``gpu`` is once a container taking ``memory_mib`` and ``cores`` is added (0..30)."""
    score = 0.0
    if gpu.count:
        score += (used.slots + 1) / gpu.count
    if gpu.cores:
        score += (used.cores + cores) / gpu.cores
    if gpu.memory_mib:
        score += (used.memory_mib + memory_mib) / gpu.memory_mib
    return 10.0 * score


def gpu_sort_key(
    score: float, gpu: Gpu, policy: Policy, *, numa_bind: bool = False
) -> tuple[float, float, int]:
    """Sort ascending by this key: the first GPU is the one to take first.

    With ``numa_bind`` (``nvidia.com/numa-bind``) the NUMA node comes first regardless of score, as
    in HAMi: ``binpack`` tries the lowest NUMA node first, ``spread`` the highest; the score orders
    the GPUs within a NUMA node (docs/protocol.md#fit-and-scoring; HAMi sorts the other way and walks from the end).
    """
    binpack = policy is Policy.BINPACK
    if numa_bind:
        return (gpu.numa if binpack else -gpu.numa, -score if binpack else score, gpu.index)
    return (-score if binpack else score, gpu.numa, gpu.index)


def node_score(gpus: Sequence[Gpu], used: Mapping[GpuUuid, GpuUsage]) -> float:
    """HAMi's node score over existing usage; 0 when a node reports no capacity at all."""
    count = slots = total_cores = cores = total_memory = memory = 0
    for gpu in gpus:
        u = used.get(gpu.uuid, EMPTY_USAGE)
        count += gpu.count
        slots += u.slots
        total_cores += gpu.cores
        cores += u.cores
        total_memory += gpu.memory_mib
        memory += u.memory_mib
    if not count or not total_cores or not total_memory:
        return 0.0
    return 10.0 * (slots / count + cores / total_cores + memory / total_memory)


def pick_node(scores: Iterable[tuple[str, float]], policy: Policy) -> str | None:
    """The best node of ``(name, score)`` pairs, or None when there are none."""
    best: str | None = None
    best_score = 0.0
    binpack = policy is Policy.BINPACK
    for name, score in scores:
        if best is None:
            best, best_score = name, score
            continue
        better = score > best_score if binpack else score < best_score
        if better or (score == best_score and name < best):
            best, best_score = name, score
    return best
