"""Namespace GPU quota arithmetic, shared by the admission webhook, the filter and the simulator.

A namespace's quota is the ResourceQuota ``spec.hard`` keys ``limits.<memory resource>`` and
``limits.<cores resource>`` (docs/protocol.md#namespace-quota). The memory limit is written in the memory resource's
own unit, so it is multiplied by the memory factor, as requests are when they are parsed. What a pod
would hold is counted the way the scheduler charges it: app containers and sidecars (restartable
init containers) together, a regular init container on its own beside the sidecars started before
it (the largest wins), ``count`` GPUs each; a percentage of GPU memory is counted at the largest GPU
in the cluster, the most it can take (HAMi counts it as 0, docs/protocol.md#departures-from-hami).

The webhook checks a new pod against the namespace's live usage; the filter checks it again at
placement against live usage plus the reservations of decisions in flight, so a pod admitted while
there was room (or while the webhook was down, or before the quota was lowered) is not placed once
the namespace is full. Both use ``problem`` and say it in the same words::

    namespace team-a: GPU memory quota exceeded (used 6000 of 8000, requested 3000)

That pod-level total is what the pod holds at least. The scheduler charges a namespace the sum over
GPUs of the pod's collapsed footprint (``vgpu.core.usage``), and a regular init container collapses
into the app containers only on the GPUs they share. kubelet hands an init container's devices on
to the next GPU container (``vgpu.core.reuse``), so ``fit.fit_pod`` always gives that one the init
container's GPUs; but when it asks for more GPUs, or another app container runs elsewhere, the
footprint's sum can still exceed the pod-level total (an init container of 8,000 MiB on one GPU and
an app container of 1,000 on each of two GPUs: 9,000 charged, 8,000 held at once). So for a pod where that can
happen (``needs_placement_check``) the filter and the bind's re-fit also check each node's actual
placement (``placement_problem``) before taking it, and where the usual placement breaks the quota
they try ``fit_pod``'s other order (``fit_within``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from vgpu.core import fit
from vgpu.core.config import Policy
from vgpu.core.device import GpuUsage, GpuUuid
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
    asks: Sequence[ContainerRequest | None],
    *,
    init_count: int,
    largest_gpu_memory_mib: int,
    sidecars: AbstractSet[int] = frozenset(),
) -> tuple[int, int]:
    """(memory MiB, cores) a pod holds at once; ``asks`` are init containers first (``init_count``
    of them, ``sidecars`` the indices of the restartable ones), then app containers; None is a
    container that asks for no GPU."""
    running_memory = running_cores = 0  # the sidecars started so far, then the app containers too
    init_memory = init_cores = 0  # the largest regular init container with the sidecars before it
    for index, ask in enumerate(asks):
        if ask is None:
            continue
        memory, cores = container_totals(ask, largest_gpu_memory_mib=largest_gpu_memory_mib)
        if index < init_count and index not in sidecars:
            init_memory = max(init_memory, running_memory + memory)
            init_cores = max(init_cores, running_cores + cores)
        else:
            running_memory += memory
            running_cores += cores
    return max(init_memory, running_memory), max(init_cores, running_cores)


def needs_placement_check(ask: PodRequest) -> bool:
    """Whether a placement of ``ask`` may be charged more than ``pod_totals`` (then the filter and
    the bind check ``placement_problem`` per node): a regular init container asking for a GPU and
    another GPU container, which a placement may put on other GPUs than it."""
    gpu_containers = sum(1 for c in ask.containers if c is not None)
    return gpu_containers > 1 and any(
        c is not None and i not in ask.sidecars for i, c in enumerate(ask.containers[: ask.init_count])
    )


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
        ask.containers,
        init_count=ask.init_count,
        sidecars=ask.sidecars,
        largest_gpu_memory_mib=largest_gpu_memory_mib,
    )
    return problem(namespace, quota, memory_mib=memory_mib, cores=cores, memory_factor=memory_factor)


def placement_problem(
    namespace: str, quota: Quota, footprint: Mapping[GpuUuid, GpuUsage], *, memory_factor: int
) -> str | None:
    """``problem`` for a pod placed with ``footprint`` (``fit.Placement.usage``): what the namespace
    is then charged, the sum over its GPUs."""
    memory_mib = sum(u.memory_mib for u in footprint.values())
    cores = sum(u.cores for u in footprint.values())
    return problem(namespace, quota, memory_mib=memory_mib, cores=cores, memory_factor=memory_factor)


def fit_within(
    ask: PodRequest,
    node: fit.NodeGpus,
    first: fit.Placement,
    *,
    gpu_policy: Policy,
    problem: Callable[[Mapping[GpuUuid, GpuUsage]], str | None],
) -> fit.Placement | str:
    """A placement of ``ask`` on ``node`` within the namespace's quota, or why there is none.

    ``first`` (``fit.fit_pod``'s usual placement) when ``problem`` finds nothing wrong with its
    footprint; otherwise the placement with the containers that keep running placed first and each
    regular init container within the GPUs of the container that reuses its devices
    (``fit_pod(..., init_beside_app=True)``), when that one is within the quota; else ``first``'s
    problem."""
    over = problem(first.usage)
    if over is None:
        return first
    other = fit.fit_pod(ask, node, gpu_policy=gpu_policy, init_beside_app=True)
    if isinstance(other, fit.Placement) and problem(other.usage) is None:
        return other
    return over
