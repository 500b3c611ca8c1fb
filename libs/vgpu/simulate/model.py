"""The simulator's inputs: a cluster YAML (nodes and their GPUs) and a workload YAML (pods, in order).

Cluster (keys camelCase; only ``nodes``, ``name``, ``gpus``, ``model`` and ``memoryMib`` required)::

    splitCount: 10                # default slots per GPU (deviceSplitCount); else the config's
    nodes:
      - name: a100                # with count N > 1 the nodes are a100-0 .. a100-(N-1)
        count: 2                  # alias: replicas
        splitCount: 4             # this node's slots per GPU
        gpus:
          - model: A100-SXM4-40GB # "NVIDIA-" is prefixed as the device plugin does
            memoryMib: 40960      # or memory: 40Gi (a quantity; a bare number is MiB)
            count: 4              # GPUs of this kind; indexes continue across groups
            numa: 0
            cores: 100            # devcore (more than 100 when core scaling oversubscribes)
            splitCount: 10        # overrides the node's
            healthy: true
            cordoned: false       # true: listed in hami.io/device-cordon (takes no new pods)
    quotas:                       # a ResourceQuota's limits.<gpumem> / limits.<gpucores> per namespace
      team-a: {memory: 40000, cores: 200}

GPU UUIDs are ``GPU-<node>-<index>`` so a workload can pin ``nvidia.com/use-gpuuuid``.

Workload: the pods placed in order, in the format ``vgpu demo`` reads too (``vgpu.core.workloadfile``:
Pod manifests as a list or a multi-document file, each may carry ``replicas: N``). Each
pod is parsed by the scheduler's own request parser, so bad requests fail here, naming the pod.
A pod may give a ``priority`` (an integer: ``spec.priority`` in a manifest, ``priority`` in the short
form; default 0): a pod that fits nowhere may then preempt pods of lower priority (issue 14).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors, quantity, request, workloadfile
from vgpu.core.config import Config
from vgpu.core.device import Gpu, GpuUuid, NodeInventory, NodeName
from vgpu.core.quota import Quota
from vgpu.core.request import PodRequest

MAX_REPLICAS = workloadfile.MAX_REPLICAS

_CLUSTER_KEYS = {"nodes", "splitCount", "quotas"}
_QUOTA_KEYS = {"memory", "cores"}
_NODE_KEYS = {"name", "count", "replicas", "splitCount", "gpus"}
_GPU_KEYS = {"model", "memoryMib", "memory", "count", "numa", "cores", "splitCount", "healthy", "cordoned"}


@dataclass(frozen=True)
class Cluster:
    nodes: tuple[NodeInventory, ...]
    cordoned: frozenset[GpuUuid] = frozenset()
    # namespace -> (memory limit in the memory resource's unit, cores limit); None: no limit
    quotas: tuple[tuple[str, int | None, int | None], ...] = ()

    def quota(self, namespace: str) -> Quota | None:
        """The namespace's GPU quota with nothing used yet, or None when it has none."""
        for ns, memory, cores in self.quotas:
            if ns == namespace:
                return Quota(memory_limit_mib=memory, cores_limit=cores)
        return None

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)


@dataclass(frozen=True)
class WorkloadPod:
    """One pod replica: its ``namespace/name``, the pod JSON and the parsed request. Admitted in
    the DRA mode (``dra``): the pod as the webhook converted it, the request as the user asked it
    (before the conversion took it out of the containers), the templates its claims name."""

    key: str
    pod: dict[str, Any]
    request: PodRequest
    dra: bool = False
    templates: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Workload:
    pods: tuple[WorkloadPod, ...]


def _memory_mib(raw: Mapping[str, Any], where: str) -> int:
    if ("memoryMib" in raw) == ("memory" in raw):
        raise workloadfile.bad(where, "give exactly one of memoryMib or memory")
    if "memoryMib" in raw:
        return workloadfile.integer(raw, "memoryMib", where, default=0, minimum=1)
    try:
        mib = quantity.parse_mib(raw["memory"], field=f"{where}.memory")
    except errors.QuantityError as exc:
        raise workloadfile.bad(exc.field, exc.message) from None
    if mib < 1:
        raise workloadfile.bad(f"{where}.memory", f"must be at least 1 MiB, got {raw['memory']!r}")
    return mib


def _model(raw: str) -> str:
    return raw if raw.startswith("NVIDIA") else f"NVIDIA-{raw}"


def load_cluster(raw: Any, *, config: Config) -> Cluster:
    """Build the cluster from parsed YAML. Raises ConfigError naming the bad key."""
    doc = workloadfile.mapping(raw, _CLUSTER_KEYS, "cluster")
    default_split = workloadfile.integer(
        doc, "splitCount", "cluster", default=config.device_plugin.device_split_count, minimum=1
    )
    nodes_raw = doc.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise workloadfile.bad("cluster.nodes", "expected a non-empty list of nodes")
    nodes: list[NodeInventory] = []
    cordon: set[GpuUuid] = set()
    seen: set[str] = set()
    for i, node_raw in enumerate(nodes_raw):
        where = f"cluster.nodes[{i}]"
        spec = workloadfile.mapping(node_raw, _NODE_KEYS, where)
        base = workloadfile.name(spec, "name", where)
        replicas = workloadfile.replicas(spec, where)
        node_split = workloadfile.integer(spec, "splitCount", where, default=default_split, minimum=1)
        groups = spec.get("gpus")
        if not isinstance(groups, list) or not groups:
            raise workloadfile.bad(f"{where}.gpus", "expected a non-empty list of GPU groups")
        names = [base] if replicas == 1 else [f"{base}-{r}" for r in range(replicas)]
        for name in names:
            if name in seen:
                raise workloadfile.bad(f"{where}.name", f"node {name!r} is defined twice")
            seen.add(name)
            nodes.append(NodeInventory(NodeName(name), _gpus(groups, name, node_split, where, cordon)))
    return Cluster(tuple(nodes), frozenset(cordon), _quotas(doc.get("quotas")))


def _quotas(raw: Any) -> tuple[tuple[str, int | None, int | None], ...]:
    """``quotas: {namespace: {memory: 40000, cores: 200}}``: a ResourceQuota's ``limits.<gpumem>``
    (in the memory resource's unit, a quantity) and ``limits.<gpucores>`` per namespace."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise workloadfile.bad(
            "cluster.quotas", f"expected a mapping of namespace to limits, got {type(raw).__name__}"
        )
    out: list[tuple[str, int | None, int | None]] = []
    for ns, limits_raw in raw.items():
        where = f"cluster.quotas.{ns}"
        if not isinstance(ns, str) or not ns.strip():
            raise workloadfile.bad("cluster.quotas", f"namespace names must be non-empty strings, got {ns!r}")
        limits = workloadfile.mapping(limits_raw, _QUOTA_KEYS, where)
        memory: int | None = None
        if "memory" in limits:
            try:
                memory = quantity.parse_mib(limits["memory"], field=f"{where}.memory")
            except errors.QuantityError as exc:
                raise workloadfile.bad(exc.field, exc.message) from None
            if memory < 0:
                raise workloadfile.bad(f"{where}.memory", f"must not be negative, got {limits['memory']!r}")
        cores = workloadfile.integer(limits, "cores", where, default=0) if "cores" in limits else None
        out.append((ns.strip(), memory, cores))
    return tuple(out)


def _bool(raw: Mapping[str, Any], key: str, where: str, *, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise workloadfile.bad(f"{where}.{key}", f"expected true or false, got {value!r}")
    return value


def _gpus(groups: list[Any], node: str, node_split: int, where: str, cordon: set[GpuUuid]) -> tuple[Gpu, ...]:
    gpus: list[Gpu] = []
    for g, group_raw in enumerate(groups):
        gw = f"{where}.gpus[{g}]"
        group = workloadfile.mapping(group_raw, _GPU_KEYS, gw)
        model = _model(workloadfile.name(group, "model", gw))
        memory_mib = _memory_mib(group, gw)
        count = workloadfile.integer(group, "count", gw, default=1, minimum=1)
        if count > 64:
            raise workloadfile.bad(f"{gw}.count", f"at most 64 GPUs per group, got {count}")
        healthy = _bool(group, "healthy", gw, default=True)
        cordoned = _bool(group, "cordoned", gw, default=False)
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                Gpu(
                    uuid=GpuUuid(f"GPU-{node}-{index}"),
                    index=index,
                    count=workloadfile.integer(group, "splitCount", gw, default=node_split, minimum=1),
                    memory_mib=memory_mib,
                    cores=workloadfile.integer(group, "cores", gw, default=100, minimum=1),
                    type=model,
                    numa=workloadfile.integer(group, "numa", gw, default=0),
                    health=healthy,
                )
            )
            if cordoned:
                cordon.add(gpus[-1].uuid)
    return tuple(gpus)


def load_workload(raw: Any, *, config: Config) -> Workload:
    """The pods of a workload file (``vgpu.core.workloadfile``: one parsed document, or the list of a
    multi-document file's), each request parsed as the webhook reads it. Raises ConfigError naming
    the pod."""
    items = workloadfile.expand(raw if isinstance(raw, list) else [raw])
    pods: list[WorkloadPod] = []
    for item in items:
        try:
            parsed = request.parse_pod(item.manifest, config, default_count=True)
        except errors.ParseError as exc:
            raise workloadfile.bad(f"{item.where} ({item.key}): {exc.field}", exc.message) from None
        pods.append(WorkloadPod(item.key, item.manifest, parsed))
    return Workload(tuple(pods))


def priority(pod: Mapping[str, Any]) -> int:
    """The pod's ``spec.priority`` (checked at load), 0 when it gives none."""
    value = (pod.get("spec") or {}).get("priority", 0)
    return value if isinstance(value, int) else 0
