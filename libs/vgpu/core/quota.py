"""Namespace GPU quota arithmetic, shared by the admission webhook, the filter and the simulator.

A namespace's quota is the ResourceQuota ``spec.hard`` keys ``limits.<memory resource>`` and
``limits.<cores resource>`` (PROTOCOL.md H.4). The memory limit is written in the memory resource's
own unit, so it is multiplied by the memory factor, as requests are when they are parsed. What a pod
would hold is counted the way the scheduler charges it: app containers together, an init container
on its own (the largest wins), ``count`` GPUs each; a percentage of GPU memory is counted at the
largest GPU in the cluster, the most it can take (HAMi counts it as 0, PROTOCOL.md I.16).

The webhook checks a new pod against the namespace's live usage; the filter checks it again at
placement against live usage plus the reservations of decisions in flight, so a pod admitted while
there was room (or while the webhook was down, or before the quota was lowered) is not placed once
the namespace is full. Both use ``problem`` and say it in the same words::

    namespace team-a: GPU memory quota exceeded (used 6000 of 8000, requested 3000)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from vgpu.core.request import ContainerRequest, PodRequest


@dataclass(frozen=True)
class Quota:
    """A namespace's GPU quota (None: no limit on that resource) and what it already holds.

    ``memory_limit_mib`` is the ResourceQuota's ``limits.<memory>`` as written (before the memory
    factor); ``used_memory_mib`` is live usage with the factor applied, like requests are.
    """

    memory_limit_mib: int | None = None
    cores_limit: int | None = None
    used_memory_mib: int = 0
    used_cores: int = 0


def container_totals(ask: ContainerRequest, *, largest_gpu_memory_mib: int) -> tuple[int, int]:
    """(memory MiB, cores) one container holds over all its GPUs."""
    if ask.memory_mib > 0:
        memory = ask.memory_mib
    else:
        percent = 100 if ask.memory_percent is None else ask.memory_percent
        memory = math.ceil(largest_gpu_memory_mib * percent / 100)
    return memory * ask.count, ask.cores * ask.count


def pod_totals(
    asks: Sequence[ContainerRequest | None], *, init_count: int, largest_gpu_memory_mib: int
) -> tuple[int, int]:
    """(memory MiB, cores) a pod holds at once; ``asks`` are init containers first (``init_count``
    of them), then app containers; None is a container that asks for no GPU."""
    each = [
        (i < init_count, container_totals(a, largest_gpu_memory_mib=largest_gpu_memory_mib))
        for i, a in enumerate(asks)
        if a is not None
    ]
    app = [t for init, t in each if not init]
    init = [t for is_init, t in each if is_init]
    memory = max(sum(m for m, _ in app), max((m for m, _ in init), default=0))
    cores = max(sum(c for _, c in app), max((c for _, c in init), default=0))
    return memory, cores


def problem(namespace: str, quota: Quota, *, memory_mib: int, cores: int, memory_factor: int) -> str | None:
    """Why a pod holding ``memory_mib`` and ``cores`` would break the namespace's quota, or None."""
    if quota.memory_limit_mib is not None and memory_mib > 0:
        limit = quota.memory_limit_mib * max(memory_factor, 1)
        if quota.used_memory_mib + memory_mib > limit:
            return (
                f"namespace {namespace}: GPU memory quota exceeded "
                f"(used {quota.used_memory_mib} of {limit}, requested {memory_mib})"
            )
    if quota.cores_limit is not None and cores > 0 and quota.used_cores + cores > quota.cores_limit:
        return (
            f"namespace {namespace}: GPU cores quota exceeded "
            f"(used {quota.used_cores} of {quota.cores_limit}, requested {cores})"
        )
    return None


def pod_problem(
    ask: PodRequest, *, namespace: str, quota: Quota, largest_gpu_memory_mib: int, memory_factor: int
) -> str | None:
    """``problem`` for a parsed pod (the filter's and the simulator's check at placement)."""
    memory_mib, cores = pod_totals(
        ask.containers, init_count=ask.init_count, largest_gpu_memory_mib=largest_gpu_memory_mib
    )
    return problem(namespace, quota, memory_mib=memory_mib, cores=cores, memory_factor=memory_factor)
