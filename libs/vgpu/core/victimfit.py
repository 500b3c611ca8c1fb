"""Whether a preemptor fits on a node once some pods are gone: the fit checks of the victim search.

``vgpu.core.preempt`` tries sets of victims; each try is a ``Checker.fits``: the preemptor is placed
by ``/filter``'s own rules (``vgpu.core.fit``) on the node's usage less the pods' usage. One GPU
container without selectors takes ``simple_fits``, ``fit.scan_simple``'s per-GPU test written out
(a property test keeps the two in step); any other pod without init containers is first held to a
cheap bound (``may_fit``: every container finds GPUs passing its test, and the cores asked fit in
the free cores of the GPUs that pass), and only then placed by the slow ``fit.fit_pod``.

Freeing only adds room: a GPU that passed a container's test still passes once some pods are gone,
with as many free cores or more. So a ``Checker`` scans the node once, and each try tests again
only the GPUs its pods free (``Checker.may_fit``; the whole scan per try was two thirds of a
worst-case node's judging, issue 49).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from vgpu.core import fit
from vgpu.core.config import Policy
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid
from vgpu.core.request import ContainerRequest, PodRequest


class Holder(Protocol):
    """A pod that holds GPUs on the node (``preempt.Resident``)."""

    @property
    def usage(self) -> Mapping[GpuUuid, GpuUsage]: ...


class Checker:
    """Whether the preemptor fits once some pods' usage is taken off the node's."""

    def __init__(self, request: PodRequest, node: fit.NodeGpus, *, gpu_policy: Policy) -> None:
        self._request = request
        self._node = node
        self._policy = gpu_policy
        self._simple = fit.simple_container(request)
        # a pod without init containers: its containers, for the bound checked before a slow fit
        self._app = tuple(c for c in request.containers if c is not None) if request.init_count == 0 else None
        # for that bound, per container, the GPUs passing its test with nothing freed (uuid -> free
        # cores): a check tests again only the GPUs its pods free, since freeing only adds room (a
        # GPU that passed still passes, with as many free cores or more); a whole scan per check
        # was two thirds of a worst-case node's judging
        self._gpus: dict[GpuUuid, Gpu] = {}
        self._base: list[dict[GpuUuid, int]] = []  # built at the first check that needs it
        self._base_cores: dict[GpuUuid, int] = {}
        self.checks = 0  # fit checks made so far

    def fits(self, gone: Iterable[Holder]) -> bool:
        self.checks += 1
        freed: dict[GpuUuid, tuple[int, int, int]] = {}
        for pod in gone:
            for uuid, u in pod.usage.items():
                have = freed.get(uuid)
                freed[uuid] = (
                    (u.slots, u.memory_mib, u.cores)
                    if have is None
                    else (have[0] + u.slots, have[1] + u.memory_mib, have[2] + u.cores)
                )
        node = self._node
        if self._simple is not None:
            return simple_fits(self._simple, node, node.used, freed)
        if self._app is not None and not self.may_fit(freed):
            return False
        used = {
            uuid: u.minus(GpuUsage(*freed[uuid])) if uuid in freed else u for uuid, u in node.used.items()
        }
        # ``fit_pod`` reads the GPUs, usage, cordons and outside use only: the view's summaries for
        # the filter's scan (``open``, ``score``) are left out, built for every check they cost a
        # fifth of it
        view = fit.NodeGpus(node.gpus, used, node.cordoned, outside=node.outside)
        return not isinstance(fit.fit_pod(self._request, view, gpu_policy=self._policy), fit.Miss)

    def may_fit(self, freed: Mapping[GpuUuid, tuple[int, int, int]]) -> bool:
        """``may_fit(containers, node, node.used, freed)``, testing only the GPUs in ``freed``."""
        assert self._app is not None
        node = self._node
        if not self._gpus:
            self._gpus = {gpu.uuid: gpu for gpu in node.gpus}
            self._base = [dict(passing(c, node, node.used, {})) for c in self._app]
            self._base_cores = {uuid: cores for base in self._base for uuid, cores in base.items()}
        cores = self._base_cores
        asked = 0
        for container, base in zip(self._app, self._base, strict=True):
            found = len(base)
            for uuid, gone in freed.items():
                gpu = self._gpus.get(uuid)
                free = None if gpu is None else _gpu_free_cores(container, gpu, node, gone)
                if free is not None:
                    found += uuid not in base
                    if cores is self._base_cores:
                        cores = dict(cores)
                    cores[uuid] = free
            if found < container.count:
                return False
            asked += container.count * min(container.cores, 100)
        return asked <= sum(cores.values())


def _gpu_free_cores(
    container: ContainerRequest, gpu: Gpu, node: fit.NodeGpus, gone: tuple[int, int, int] | None
) -> int | None:
    """The free cores of ``gpu`` when it passes ``simple_fits``' per-GPU test for ``container``
    on the node's usage less ``gone`` (slots, MiB, cores), else None."""
    if not gpu.health or gpu.uuid in node.cordoned:
        return None
    memory = container.memory_mib
    percent = 0 if memory > 0 else (100 if container.memory_percent is None else container.memory_percent)
    cores = min(container.cores, 100)
    u = node.used.get(gpu.uuid, EMPTY_USAGE)
    slots, used_memory, used_cores = u.slots, u.memory_mib, u.cores
    if gone is not None:
        slots = max(0, slots - gone[0])
        used_memory = max(0, used_memory - gone[1])
        used_cores = max(0, used_cores - gone[2])
    if slots >= gpu.count:
        return None
    away = node.outside
    free_memory = gpu.memory_mib - used_memory - (away.get(gpu.uuid, 0) if away else 0)
    if free_memory < (gpu.memory_mib * percent // 100 if percent else memory):
        return None
    free_cores = gpu.cores - used_cores
    if free_cores < cores:
        return None
    if cores == 100 and gpu.cores == 100 and slots > 0:
        return None
    if cores == 0 and gpu.cores and free_cores <= 0:
        return None
    return free_cores


def simple_fits(
    container: ContainerRequest,
    node: fit.NodeGpus,
    used: Mapping[GpuUuid, GpuUsage],
    freed: Mapping[GpuUuid, tuple[int, int, int]] | None = None,
) -> bool:
    """``fit.scan_simple``'s per-GPU test on ``used`` less ``freed`` (slots, MiB, cores per GPU),
    without building a view (a property test checks that they agree)."""
    need = container.count
    memory = container.memory_mib
    percent = 0 if memory > 0 else (100 if container.memory_percent is None else container.memory_percent)
    cores = min(container.cores, 100)
    away = node.outside
    found = 0
    for gpu in node.gpus:
        if not gpu.health or gpu.uuid in node.cordoned:
            continue
        u = used.get(gpu.uuid, EMPTY_USAGE)
        slots, used_memory, used_cores = u.slots, u.memory_mib, u.cores
        gone = freed.get(gpu.uuid) if freed else None
        if gone is not None:
            slots = max(0, slots - gone[0])
            used_memory = max(0, used_memory - gone[1])
            used_cores = max(0, used_cores - gone[2])
        if slots >= gpu.count:
            continue
        free_memory = gpu.memory_mib - used_memory - (away.get(gpu.uuid, 0) if away else 0)
        if free_memory < (gpu.memory_mib * percent // 100 if percent else memory):
            continue
        free_cores = gpu.cores - used_cores
        if free_cores < cores:
            continue
        if cores == 100 and gpu.cores == 100 and slots > 0:
            continue
        if cores == 0 and gpu.cores and free_cores <= 0:
            continue
        found += 1
        if found == need:
            return True
    return False


def passing(
    container: ContainerRequest,
    node: fit.NodeGpus,
    used: Mapping[GpuUuid, GpuUsage],
    freed: Mapping[GpuUuid, tuple[int, int, int]],
) -> Iterator[tuple[GpuUuid, int]]:
    """Each GPU passing ``simple_fits``' per-GPU test for ``container`` on ``used`` less
    ``freed``, and its free cores."""
    view = node if used is node.used else fit.NodeGpus(node.gpus, used, node.cordoned, outside=node.outside)
    for gpu in node.gpus:
        free = _gpu_free_cores(container, gpu, view, freed.get(gpu.uuid))
        if free is not None:
            yield gpu.uuid, free


def may_fit(
    containers: Sequence[ContainerRequest],
    node: fit.NodeGpus,
    used: Mapping[GpuUuid, GpuUsage],
    freed: Mapping[GpuUuid, tuple[int, int, int]],
) -> bool:
    """False only where ``fit.fit_pod`` cannot place a pod of these ``containers`` (no init
    containers) on ``used`` less ``freed``: it places each container on the usage plus the
    containers placed before it (the per-GPU test only gets stricter), so every container needs
    ``count`` GPUs passing its test on the freed usage, and each device takes its cores from a GPU
    that passed, so the cores asked in all cannot exceed the free cores of the GPUs passing any
    container's test (two containers asking a whole GPU each need two idle GPUs). A cheap bound
    checked before the slow fit."""
    passed: dict[GpuUuid, int] = {}
    asked = 0
    for container in containers:
        found = 0
        for uuid, free_cores in passing(container, node, used, freed):
            found += 1
            passed[uuid] = free_cores
        if found < container.count:
            return False
        asked += container.count * min(container.cores, 100)
    return asked <= sum(passed.values())
