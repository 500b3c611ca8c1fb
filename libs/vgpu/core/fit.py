"""Fitting a pod's GPU request onto one node's GPUs (docs/protocol.md#fit-and-scoring), with reasons.

Regular init containers run one after another before the app containers, so each is fitted against
the node's current usage on its own; app containers run together, so they are fitted one after
another and their usage accumulates. A restartable init container (a sidecar, ``restartPolicy:
Always``) starts in init order and keeps running beside everything after it: its usage accumulates
like an app container's, so a regular init container after it is fitted beside it, and the app
containers beside every sidecar. A container takes ``count`` distinct GPUs (never two slots of one GPU);
on each it needs a free slot, its memory (MiB or percent of that GPU) and its cores. Cores 100 on a
100-core GPU is exclusive use: only an idle GPU qualifies, and a GPU whose cores are all taken
accepts no one else. Unhealthy and cordoned GPUs, and GPUs the pod's type/UUID selectors rule out,
are skipped. With NUMA binding all GPUs of a container come from one NUMA node.

Memory used outside kube-vgpu (``NodeGpus.outside``, from the device plugin's measurement,
vgpu.core.outside) is free for no one: it is taken off each GPU's free memory, the reason says so
("no GPU with 8000 MiB free: best has 6000 (2000 used outside kube-vgpu)"), and a GPU that only
fits once it is gone does not count as fitting on an empty node (evicting our pods cannot free it).

A miss carries a short reason ("no GPU with 8000 MiB free: best has 4096", "3/4 GPUs unhealthy") and
whether it is unresolvable: even an empty node could not take the container, so evicting pods
would not help (kube-scheduler then skips the node for preemption).

``NodeGpus`` is a node's GPUs with their usage and a precomputed summary, rebuilt when the usage
changes, so ``can_fit_simple`` answers the common case (one GPU container, no selectors) in a few
comparisons; ``fit_pod`` is the full algorithm and picks the GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from vgpu.core import policy, reuse, usage
from vgpu.core.annotations import ContainerDevice, ContainerDevices, PodDevices
from vgpu.core.config import Policy
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid
from vgpu.core.request import ContainerRequest, PodRequest, Selectors

# (free memory MiB, free cores, GPU memory MiB, GPU cores, used slots) of an open GPU
_Open = tuple[int, int, int, int, int]


def is_open(gpu: Gpu, used: GpuUsage, cordoned: AbstractSet[GpuUuid]) -> bool:
    """Whether ``gpu`` could take one more pod: healthy, not cordoned, a slot free (the GPUs
    ``NodeGpus.open`` lists, and what puts a node in the filter's score order)."""
    return gpu.health and gpu.uuid not in cordoned and used.slots < gpu.count


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPUs, what is used on them, the cordoned UUIDs, and summaries for fast checks."""

    gpus: tuple[Gpu, ...]
    used: Mapping[GpuUuid, GpuUsage]
    cordoned: frozenset[GpuUuid] = frozenset()
    # healthy, uncordoned GPUs with a free slot, most free memory first
    open: tuple[_Open, ...] = field(default=(), compare=False)
    score: float = field(default=0.0, compare=False)
    # misses already computed on this very view (it is rebuilt whenever the usage changes), keyed by
    # (PodRequest, GPU policy): replicas of a pending job are answered without refitting every node
    misses: dict[object, Miss] = field(default_factory=dict, compare=False, repr=False)
    # MiB per GPU used outside kube-vgpu (the device plugin's measurement): not free for anyone
    outside: Mapping[GpuUuid, int] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        gpus: tuple[Gpu, ...],
        used: Mapping[GpuUuid, GpuUsage],
        cordoned: frozenset[GpuUuid] = frozenset(),
        *,
        outside: Mapping[GpuUuid, int] | None = None,
    ) -> NodeGpus:
        away = dict(outside or {})
        opened: list[_Open] = []
        for gpu in gpus:
            u = used.get(gpu.uuid, EMPTY_USAGE)
            if is_open(gpu, u, cordoned):
                free = gpu.memory_mib - u.memory_mib - away.get(gpu.uuid, 0)
                opened.append((free, gpu.cores - u.cores, gpu.memory_mib, gpu.cores, u.slots))
        opened.sort(reverse=True)
        score = policy.node_score(gpus, used)
        return cls(gpus, dict(used), cordoned, tuple(opened), score, outside=away)


@dataclass(frozen=True)
class Placement:
    """The pod fits: the GPUs per container (index-aligned, init first) and its collapsed footprint."""

    devices: PodDevices
    usage: dict[GpuUuid, GpuUsage]


@dataclass(frozen=True)
class Miss:
    """The pod does not fit; ``unresolvable`` when even an empty node could not take it."""

    reason: str
    unresolvable: bool = False


def simple_container(request: PodRequest) -> ContainerRequest | None:
    """The one GPU container of a pod that ``can_fit_simple`` can decide, else None."""
    sel = request.selectors
    if sel.use_types or sel.nouse_types or sel.use_uuids or sel.nouse_uuids or sel.numa_bind:
        return None
    found: ContainerRequest | None = None
    for container in request.containers:
        if container is not None:
            if found is not None:
                return None
            found = container
    return found


def can_fit_simple(node: NodeGpus, container: ContainerRequest) -> bool:
    """Whether ``fit_pod`` would succeed for a pod whose only GPU container is ``container``."""
    return simple_check(container)(node)


def simple_check(container: ContainerRequest) -> Callable[[NodeGpus], bool]:
    """``can_fit_simple`` for one ``container`` over many nodes, its needs worked out once."""
    need, memory, percent, cores = _simple_need(container)

    def check(node: NodeGpus) -> bool:
        return _fits(node.open, need, memory, percent, cores)

    return check


@dataclass(frozen=True)
class Scan:
    """One pass over candidate nodes: the best fitting one (index, -1 if none), how many fit, and
    the indices of nodes that do not fit (their reasons come from ``fit_pod``)."""

    best: int
    fitting: int
    misses: list[int]


def _simple_need(container: ContainerRequest) -> tuple[int, int, int, int]:
    """(GPUs, MiB, percent of a GPU's memory, cores) that ``_fits`` checks for ``container``."""
    memory = container.memory_mib
    percent = 0 if memory > 0 else (100 if container.memory_percent is None else container.memory_percent)
    return container.count, memory, percent, container.cores if container.cores < 100 else 100


def _fits(opened: tuple[_Open, ...], need: int, memory: int, percent: int, cores: int) -> bool:
    """Whether ``need`` of a node's open GPUs (``NodeGpus.open``) each take ``memory`` MiB (or
    ``percent`` of the GPU's memory) and ``cores``: what ``fit_pod`` decides for one container."""
    if need == 1 and not percent and opened:
        # most nodes are decided by their GPU with the most free memory: the loop's first step
        free_memory, free_cores, _, gpu_cores, slots = opened[0]
        if (
            free_memory >= memory
            and free_cores >= cores
            and not (cores == 100 and gpu_cores == 100 and slots > 0)
            and not (cores == 0 and gpu_cores and free_cores <= 0)
        ):
            return True
    if need > len(opened):
        return False
    found = 0
    for free_memory, free_cores, gpu_memory, gpu_cores, slots in opened:
        if percent:
            if free_memory < gpu_memory * percent // 100:
                continue
        elif free_memory < memory:
            break  # sorted by free memory: no later GPU has more
        if free_cores < cores:
            continue
        if cores == 100 and gpu_cores == 100 and slots > 0:
            continue
        if cores == 0 and gpu_cores and free_cores <= 0:
            continue
        found += 1
        if found == need:
            return True
    return False


def scan_simple(
    nodes: Sequence[NodeGpus | None],
    names: Sequence[str],
    container: ContainerRequest,
    *,
    binpack: bool,
    busy: AbstractSet[str] = frozenset(),
) -> Scan:
    """The filter's loop over every candidate for a pod whose only GPU container is ``container``:
    decide every node from its precomputed open-GPU summary and pick the best by node score
    (``binpack``: highest; else lowest; ties to the name that sorts first, as ``policy.pick_node``).
    A node in ``busy`` is picked only when no other node fits (``better_node``). None entries
    (nodes without schedulable GPUs) are skipped. Same answer as ``fit_pod`` per node, without
    allocating."""
    need, memory, percent, cores = _simple_need(container)
    best = best_busy = -1
    best_score = best_busy_score = 0.0
    fitting = 0
    misses: list[int] = []
    for index, node in enumerate(nodes):
        if node is None:
            continue
        if not _fits(node.open, need, memory, percent, cores):
            misses.append(index)
            continue
        fitting += 1
        score = node.score
        if busy and names[index] in busy:
            if best_busy < 0 or better_node(
                score, names[index], best_busy_score, names[best_busy], binpack=binpack
            ):
                best_busy, best_busy_score = index, score
            continue
        if (
            best < 0
            or (score > best_score if binpack else score < best_score)
            or (score == best_score and names[index] < names[best])
        ):
            best, best_score = index, score
    return Scan(best if best >= 0 else best_busy, fitting, misses)


def better_node(score: float, name: str, best_score: float, best_name: str, *, binpack: bool) -> bool:
    """Node policy order: ``binpack`` prefers the higher node score, spread the lower; ties go to
    the name that sorts first."""
    if score != best_score:
        return score > best_score if binpack else score < best_score
    return name < best_name


@dataclass
class _Tally:
    """Why GPUs were turned down for one container."""

    total: int
    unhealthy: int = 0
    cordoned: int = 0
    wrong_type: int = 0
    wrong_uuid: int = 0
    no_slot: int = 0
    short_memory: int = 0
    memory_need: int = 0
    memory_best: int = -1
    memory_best_outside: int = 0  # MiB used outside kube-vgpu on the GPU with the most free memory
    short_cores: int = 0
    cores_best: int = -1
    busy_for_exclusive: int = 0
    cores_taken: int = 0
    could_ever_fit: int = 0  # GPUs that would take the container if nothing else ran on them

    def parts(self, fitting: int, cores_need: int) -> list[str]:
        t = self.total
        out = []
        if self.unhealthy:
            out.append(f"{self.unhealthy}/{t} GPUs unhealthy")
        if self.cordoned:
            out.append(f"{self.cordoned}/{t} GPUs cordoned")
        if self.wrong_type:
            out.append(f"{self.wrong_type}/{t} GPUs of another type")
        if self.wrong_uuid:
            out.append(f"{self.wrong_uuid}/{t} GPUs excluded by UUID")
        if self.no_slot:
            out.append(f"{self.no_slot}/{t} GPUs have no free slot")
        if self.short_memory:
            if fitting == 0 and self.short_memory + self.short_cores + self.busy_for_exclusive > 0:
                away = self.memory_best_outside
                note = f" ({away} used outside kube-vgpu)" if away else ""
                out.append(f"no GPU with {self.memory_need} MiB free: best has {self.memory_best}{note}")
            else:
                out.append(f"{self.short_memory}/{t} GPUs without {self.memory_need} MiB free")
        if self.short_cores:
            out.append(
                f"{self.short_cores}/{t} GPUs without {cores_need}% cores free: best has {self.cores_best}"
            )
        if self.busy_for_exclusive:
            out.append(f"{self.busy_for_exclusive}/{t} GPUs busy (exclusive use needs an idle GPU)")
        if self.cores_taken:
            out.append(f"{self.cores_taken}/{t} GPUs have all cores taken")
        return out


def _fit_container(
    container: ContainerRequest,
    node: NodeGpus,
    used: Mapping[GpuUuid, GpuUsage],
    *,
    selectors: Selectors,
    gpu_policy: Policy,
    prefer: AbstractSet[GpuUuid] = frozenset(),
    require: AbstractSet[GpuUuid] = frozenset(),
    within: AbstractSet[GpuUuid] | None = None,
) -> ContainerDevices | Miss:
    """``count`` GPUs for ``container`` on ``used``, in ``gpu_policy`` order (the GPUs in ``prefer``
    first, whatever the policy says), or why not. ``require``: GPUs it must be given (kubelet hands
    it an init container's devices there); ``within``: the only GPUs it may be given."""
    need = container.count
    total = len(node.gpus)
    if need > total:
        return Miss(f"asks for {need} GPUs, node has {total}", unresolvable=True)
    if within is not None and need > len(within):
        return Miss(f"asks for {need} GPUs, {len(within)} allowed")
    cores = min(container.cores, 100)
    tally = _Tally(total if within is None else len(within))
    candidates: list[tuple[tuple[float, float, int], Gpu, int]] = []
    for gpu in node.gpus:
        if within is not None and gpu.uuid not in within:
            continue
        if not gpu.health:
            tally.unhealthy += 1
            continue
        if gpu.uuid in node.cordoned:
            tally.cordoned += 1
            continue
        if not selectors.type_ok(gpu.type):
            tally.wrong_type += 1
            continue
        if not selectors.uuid_ok(gpu.uuid):
            tally.wrong_uuid += 1
            continue
        memory = container.memory_on(gpu.memory_mib)
        away = node.outside.get(gpu.uuid, 0)  # evicting our pods cannot free it
        if gpu.count > 0 and memory <= gpu.memory_mib - away and cores <= gpu.cores:
            tally.could_ever_fit += 1
        u = used.get(gpu.uuid, EMPTY_USAGE)
        if u.slots >= gpu.count:
            tally.no_slot += 1
            continue
        free_memory = gpu.memory_mib - u.memory_mib - away
        if free_memory < memory:
            tally.short_memory += 1
            if free_memory > tally.memory_best:
                tally.memory_best, tally.memory_need = free_memory, memory
                tally.memory_best_outside = away
            continue
        free_cores = gpu.cores - u.cores
        if free_cores < cores:
            tally.short_cores += 1
            tally.cores_best = max(tally.cores_best, free_cores)
            continue
        if cores == 100 and gpu.cores == 100 and u.slots > 0:
            tally.busy_for_exclusive += 1
            continue
        if cores == 0 and gpu.cores and free_cores <= 0:
            tally.cores_taken += 1
            continue
        score = policy.gpu_score_after(gpu, u, memory_mib=memory, cores=cores)
        key = policy.gpu_sort_key(score, gpu, gpu_policy, numa_bind=selectors.numa_bind)
        candidates.append((key, gpu, memory))
    if require:
        refused = sorted(require - {gpu.uuid for _, gpu, _ in candidates})
        if refused:
            return Miss(f"{', '.join(refused)} cannot take it")
        prefer = require
    if prefer:
        candidates.sort(key=lambda c: (c[1].uuid not in prefer, c[0]))
    else:
        candidates.sort(key=lambda c: c[0])
    if selectors.numa_bind:
        got = _pick_numa(candidates, need, cores, tally)
        if isinstance(got, tuple) and not require <= {d.uuid for d in got}:
            return Miss(f"{', '.join(sorted(require))} and the rest of its GPUs are on different NUMA nodes")
        return got
    if len(candidates) < need:
        return _miss(tally, len(candidates), need, cores, selectors)
    return tuple(ContainerDevice(gpu.uuid, memory, cores) for _, gpu, memory in candidates[:need])


def _pick_numa(
    candidates: list[tuple[tuple[float, float, int], Gpu, int]], need: int, cores: int, tally: _Tally
) -> ContainerDevices | Miss:
    groups: dict[int, list[tuple[Gpu, int]]] = {}
    for _, gpu, memory in candidates:  # in preference order: the first full group wins
        group = groups.setdefault(gpu.numa, [])
        group.append((gpu, memory))
        if len(group) == need:
            return tuple(ContainerDevice(g.uuid, m, cores) for g, m in group)
    best = max((len(g) for g in groups.values()), default=0)
    parts = tally.parts(len(candidates), cores)
    text = f"no NUMA node with {need} fitting GPUs: best has {best}"
    return Miss(", ".join([text, *parts]), unresolvable=tally.could_ever_fit < need)


def _miss(tally: _Tally, fitting: int, need: int, cores: int, selectors: Selectors) -> Miss:
    if tally.wrong_type == tally.total:
        wanted = ",".join(selectors.use_types) or "other than " + ",".join(selectors.nouse_types)
        return Miss(f"no GPU of type {wanted}", unresolvable=True)
    parts = tally.parts(fitting, cores)
    if need > 1 or fitting:
        parts.insert(0, f"needs {need} GPUs, {fitting} fit")
    return Miss(", ".join(parts) or "no GPU fits", unresolvable=tally.could_ever_fit < need)


def fit_pod(
    request: PodRequest, node: NodeGpus, *, gpu_policy: Policy, init_beside_app: bool = False
) -> Placement | Miss:
    """Place every container of ``request`` on ``node`` (init containers first), or say why not.

    A container that reuses a regular init container's devices (its heir, ``reuse.links``) is given
    every GPU of that init container, as kubelet will. Two orders are tried: the init containers
    placed first (by the GPU policy) and each heir on their GPUs plus what else it needs; or, with
    ``init_beside_app`` first, the containers that keep running (sidecars, app containers) placed
    first and each regular init container within its heir's GPUs. The first that fits is taken; the
    namespace quota asks for the other where the first breaks it (``quota.fit_within``)."""
    found = reuse.links(request)
    if isinstance(found, str):
        return Miss(found, unresolvable=True)
    first = _place(request, node, gpu_policy=gpu_policy, links=found, beside=init_beside_app)
    if isinstance(first, Placement) or not found.heir:
        return first
    second = _place(request, node, gpu_policy=gpu_policy, links=found, beside=not init_beside_app)
    if isinstance(second, Placement):
        return second
    free = _place(request, node, gpu_policy=gpu_policy, links=reuse.Links({}), beside=False)
    if isinstance(free, Miss):
        return free  # the pod does not fit here however kubelet hands devices on
    empty = NodeGpus.build(node.gpus, {}, node.cordoned, outside=node.outside)
    ever = any(
        isinstance(_place(request, empty, gpu_policy=gpu_policy, links=found, beside=b), Placement)
        for b in (False, True)
    )
    return Miss(f"{first.reason}; nor {second.reason}", unresolvable=not ever)


def _place(
    request: PodRequest, node: NodeGpus, *, gpu_policy: Policy, links: reuse.Links, beside: bool
) -> Placement | Miss:
    """One order of ``fit_pod``: ``beside`` places each regular init container after the rest,
    within its heir's GPUs (or, without an heir, on the rest's GPUs where it fits)."""
    # the node's usage plus the containers of the pod that keep running once started: the sidecars
    # started so far, then the app containers
    running = dict(node.used)
    named = sum(1 for c in request.containers if c is not None) > 1
    devices: list[ContainerDevices] = []
    later: dict[int, dict[GpuUuid, GpuUsage]] = {}  # beside: the usage each init container meets
    source = links.source

    def name(index: int) -> str:
        container = request.containers[index]
        assert container is not None
        return container.name

    def missed(container: ContainerRequest, got: Miss, why: str = "") -> Miss:
        return Miss(f"container {container.name}{why}: {got.reason}", got.unresolvable) if named else got

    for index, container in enumerate(request.containers):
        if container is None:
            devices.append(())
            continue
        keeps = index >= request.init_count or index in request.sidecars  # runs on beside the rest
        if beside and not keeps:
            later[index] = dict(running)
            devices.append(())
            continue
        held = frozenset(d.uuid for d in devices[source[index]]) if index in source else frozenset()
        got = _fit_container(
            container, node, running, selectors=request.selectors, gpu_policy=gpu_policy, require=held
        )
        if isinstance(got, Miss):
            why = (
                f" (kubelet gives it the devices of init container {name(source[index])} first)"
                if held
                else ""
            )
            return missed(container, got, why)
        if keeps:
            for device in got:
                have = running.get(device.uuid, EMPTY_USAGE)
                running[device.uuid] = have.plus(memory_mib=device.memory_mib, cores=device.cores)
        devices.append(got)
    if later:
        rest = frozenset(d.uuid for i, placed in enumerate(devices) if i not in later for d in placed)
        for index in sorted(later, reverse=True):  # an init container's heir is placed before it
            container = request.containers[index]
            assert container is not None
            heir = links.heir.get(index)
            within = None if heir is None else frozenset(d.uuid for d in devices[heir])
            got = _fit_container(
                container,
                node,
                later[index],
                selectors=request.selectors,
                gpu_policy=gpu_policy,
                prefer=rest,
                within=within,
            )
            if isinstance(got, Miss):
                why = "" if heir is None else f" (kubelet hands its devices on to container {name(heir)})"
                return missed(container, got, why)
            devices[index] = got
    placed = tuple(devices)
    return Placement(
        placed, usage.pod_usage(placed, init_count=request.init_count, sidecars=request.sidecars)
    )
