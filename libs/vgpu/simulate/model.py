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

Workload: ``pods`` is a list placed in order. Each item is either a Kubernetes Pod manifest
(``metadata`` + ``spec``) or the short form ``{name, namespace, annotations, containers,
initContainers}``; either may carry ``replicas: N`` (pods ``<name>-0 .. <name>-(N-1)``). Each
pod is parsed by the scheduler's own request parser, so bad requests fail here, naming the pod.
A pod may give a ``priority`` (an integer: ``spec.priority`` in a manifest, ``priority`` in the short
form; default 0): a pod that fits nowhere may then preempt pods of lower priority (issue 14).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors, quantity, request
from vgpu.core.config import Config
from vgpu.core.device import Gpu, GpuUuid, NodeInventory, NodeName
from vgpu.core.quota import Quota
from vgpu.core.request import PodRequest

MAX_REPLICAS = 100_000

_CLUSTER_KEYS = {"nodes", "splitCount", "quotas"}
_QUOTA_KEYS = {"memory", "cores"}
_NODE_KEYS = {"name", "count", "replicas", "splitCount", "gpus"}
_GPU_KEYS = {"model", "memoryMib", "memory", "count", "numa", "cores", "splitCount", "healthy", "cordoned"}
_WORKLOAD_KEYS = {"pods"}
_SHORT_POD_KEYS = {
    "name",
    "namespace",
    "replicas",
    "annotations",
    "labels",
    "containers",
    "initContainers",
    "priority",
}
_MANIFEST_KEYS = {"apiVersion", "kind", "metadata", "spec", "status", "replicas"}


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
    """One pod replica: its ``namespace/name``, the pod JSON and the parsed request."""

    key: str
    pod: dict[str, Any]
    request: PodRequest


@dataclass(frozen=True)
class Workload:
    pods: tuple[WorkloadPod, ...]


def _bad(where: str, message: str) -> errors.ConfigError:
    return errors.ConfigError(where, message)


def _mapping(raw: Any, allowed: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise _bad(where, f"expected a mapping, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise _bad(where, f"unknown keys {unknown} (known keys: {', '.join(sorted(allowed))})")
    return raw


def _int(raw: Mapping[str, Any], key: str, where: str, *, default: int, minimum: int = 0) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{where}.{key}", f"expected an integer, got {value!r}")
    if value < minimum:
        raise _bad(f"{where}.{key}", f"must be at least {minimum}, got {value}")
    return value


def _name(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _bad(f"{where}.{key}", f"expected a non-empty string, got {value!r}")
    return value.strip()


def _replicas(raw: Mapping[str, Any], where: str) -> int:
    if "count" in raw and "replicas" in raw:
        raise _bad(where, "give count or replicas, not both")
    key = "replicas" if "replicas" in raw else "count"
    n = _int(raw, key, where, default=1, minimum=1)
    if n > MAX_REPLICAS:
        raise _bad(f"{where}.{key}", f"at most {MAX_REPLICAS}, got {n}")
    return n


def _memory_mib(raw: Mapping[str, Any], where: str) -> int:
    if ("memoryMib" in raw) == ("memory" in raw):
        raise _bad(where, "give exactly one of memoryMib or memory")
    if "memoryMib" in raw:
        return _int(raw, "memoryMib", where, default=0, minimum=1)
    try:
        mib = quantity.parse_mib(raw["memory"], field=f"{where}.memory")
    except errors.QuantityError as exc:
        raise _bad(exc.field, exc.message) from None
    if mib < 1:
        raise _bad(f"{where}.memory", f"must be at least 1 MiB, got {raw['memory']!r}")
    return mib


def _model(raw: str) -> str:
    return raw if raw.startswith("NVIDIA") else f"NVIDIA-{raw}"


def load_cluster(raw: Any, *, config: Config) -> Cluster:
    """Build the cluster from parsed YAML. Raises ConfigError naming the bad key."""
    doc = _mapping(raw, _CLUSTER_KEYS, "cluster")
    default_split = _int(
        doc, "splitCount", "cluster", default=config.device_plugin.device_split_count, minimum=1
    )
    nodes_raw = doc.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise _bad("cluster.nodes", "expected a non-empty list of nodes")
    nodes: list[NodeInventory] = []
    cordon: set[GpuUuid] = set()
    seen: set[str] = set()
    for i, node_raw in enumerate(nodes_raw):
        where = f"cluster.nodes[{i}]"
        spec = _mapping(node_raw, _NODE_KEYS, where)
        base = _name(spec, "name", where)
        replicas = _replicas(spec, where)
        node_split = _int(spec, "splitCount", where, default=default_split, minimum=1)
        groups = spec.get("gpus")
        if not isinstance(groups, list) or not groups:
            raise _bad(f"{where}.gpus", "expected a non-empty list of GPU groups")
        names = [base] if replicas == 1 else [f"{base}-{r}" for r in range(replicas)]
        for name in names:
            if name in seen:
                raise _bad(f"{where}.name", f"node {name!r} is defined twice")
            seen.add(name)
            nodes.append(NodeInventory(NodeName(name), _gpus(groups, name, node_split, where, cordon)))
    return Cluster(tuple(nodes), frozenset(cordon), _quotas(doc.get("quotas")))


def _quotas(raw: Any) -> tuple[tuple[str, int | None, int | None], ...]:
    """``quotas: {namespace: {memory: 40000, cores: 200}}``: a ResourceQuota's ``limits.<gpumem>``
    (in the memory resource's unit, a quantity) and ``limits.<gpucores>`` per namespace."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise _bad("cluster.quotas", f"expected a mapping of namespace to limits, got {type(raw).__name__}")
    out: list[tuple[str, int | None, int | None]] = []
    for ns, limits_raw in raw.items():
        where = f"cluster.quotas.{ns}"
        if not isinstance(ns, str) or not ns.strip():
            raise _bad("cluster.quotas", f"namespace names must be non-empty strings, got {ns!r}")
        limits = _mapping(limits_raw, _QUOTA_KEYS, where)
        memory: int | None = None
        if "memory" in limits:
            try:
                memory = quantity.parse_mib(limits["memory"], field=f"{where}.memory")
            except errors.QuantityError as exc:
                raise _bad(exc.field, exc.message) from None
            if memory < 0:
                raise _bad(f"{where}.memory", f"must not be negative, got {limits['memory']!r}")
        cores = _int(limits, "cores", where, default=0) if "cores" in limits else None
        out.append((ns.strip(), memory, cores))
    return tuple(out)


def _bool(raw: Mapping[str, Any], key: str, where: str, *, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise _bad(f"{where}.{key}", f"expected true or false, got {value!r}")
    return value


def _gpus(groups: list[Any], node: str, node_split: int, where: str, cordon: set[GpuUuid]) -> tuple[Gpu, ...]:
    gpus: list[Gpu] = []
    for g, group_raw in enumerate(groups):
        gw = f"{where}.gpus[{g}]"
        group = _mapping(group_raw, _GPU_KEYS, gw)
        model = _model(_name(group, "model", gw))
        memory_mib = _memory_mib(group, gw)
        count = _int(group, "count", gw, default=1, minimum=1)
        if count > 64:
            raise _bad(f"{gw}.count", f"at most 64 GPUs per group, got {count}")
        healthy = _bool(group, "healthy", gw, default=True)
        cordoned = _bool(group, "cordoned", gw, default=False)
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                Gpu(
                    uuid=GpuUuid(f"GPU-{node}-{index}"),
                    index=index,
                    count=_int(group, "splitCount", gw, default=node_split, minimum=1),
                    memory_mib=memory_mib,
                    cores=_int(group, "cores", gw, default=100, minimum=1),
                    type=model,
                    numa=_int(group, "numa", gw, default=0),
                    health=healthy,
                )
            )
            if cordoned:
                cordon.add(gpus[-1].uuid)
    return tuple(gpus)


def load_workload(raw: Any, *, config: Config) -> Workload:
    """Expand replicas and parse every pod's request. Raises ConfigError naming the pod."""
    doc = _mapping(raw, _WORKLOAD_KEYS, "workload")
    items = doc.get("pods")
    if not isinstance(items, list) or not items:
        raise _bad("workload.pods", "expected a non-empty list of pods")
    pods: list[WorkloadPod] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"workload.pods[{i}]"
        if isinstance(item, Mapping) and "spec" in item:
            template, replicas = _from_manifest(item, where)
        else:
            template, replicas = _from_short(item, where)
        meta = template["metadata"]
        base = meta["name"]
        for r in range(replicas):
            pod = copy.deepcopy(template) if replicas > 1 else template
            name = base if replicas == 1 else f"{base}-{r}"
            pod["metadata"]["name"] = name
            key = f"{meta['namespace']}/{name}"
            if key in seen:
                raise _bad(f"{where}.name", f"pod {key!r} is defined twice")
            seen.add(key)
            try:
                parsed = request.parse_pod(pod, config, default_count=True)  # as the webhook reads it
            except errors.ParseError as exc:
                raise _bad(f"{where} ({key}): {exc.field}", exc.message) from None
            pods.append(WorkloadPod(key, pod, parsed))
    return Workload(tuple(pods))


def _from_manifest(item: Mapping[str, Any], where: str) -> tuple[dict[str, Any], int]:
    spec_raw = _mapping(item, _MANIFEST_KEYS, where)
    kind = spec_raw.get("kind", "Pod")
    if kind != "Pod":
        raise _bad(f"{where}.kind", f"only Pod manifests are simulated, got {kind!r}")
    meta = spec_raw.get("metadata")
    if not isinstance(meta, Mapping):
        raise _bad(f"{where}.metadata", "expected a mapping")
    spec = spec_raw["spec"]
    if not isinstance(spec, Mapping):
        raise _bad(f"{where}.spec", "expected a mapping")
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **copy.deepcopy(dict(meta)),
            "name": _name(meta, "name", f"{where}.metadata"),
            "namespace": _namespace(meta, f"{where}.metadata"),
        },
        "spec": copy.deepcopy(dict(spec)),
    }
    _check_containers(pod["spec"], f"{where}.spec")
    return pod, _replicas(spec_raw, where)


def _from_short(item: Any, where: str) -> tuple[dict[str, Any], int]:
    short = _mapping(item, _SHORT_POD_KEYS, where)
    meta: dict[str, Any] = {"name": _name(short, "name", where), "namespace": _namespace(short, where)}
    for key in ("annotations", "labels"):
        if key in short:
            value = short[key]
            if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
                raise _bad(f"{where}.{key}", "expected a mapping of strings")
            meta[key] = {str(k): v for k, v in value.items()}
    spec: dict[str, Any] = {"containers": copy.deepcopy(short.get("containers"))}
    if "priority" in short:
        spec["priority"] = short["priority"]
    if "initContainers" in short:
        spec["initContainers"] = copy.deepcopy(short["initContainers"])
    _check_containers(spec, where)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}, _replicas(short, where)


def _namespace(raw: Mapping[str, Any], where: str) -> str:
    if "namespace" not in raw:
        return "default"
    return _name(raw, "namespace", where)


def priority(pod: Mapping[str, Any]) -> int:
    """The pod's ``spec.priority`` (checked at load), 0 when it gives none."""
    value = (pod.get("spec") or {}).get("priority", 0)
    return value if isinstance(value, int) else 0


def _check_containers(spec: Mapping[str, Any], where: str) -> None:
    value = spec.get("priority", 0)
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > 2_000_000_000:
        raise _bad(f"{where}.priority", f"expected an integer priority, got {value!r}")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise _bad(f"{where}.containers", "expected a non-empty list of containers")
    init = spec.get("initContainers", [])
    if not isinstance(init, list):
        raise _bad(f"{where}.initContainers", "expected a list of containers")
    for key, items in (("initContainers", init), ("containers", containers)):
        for i, c in enumerate(items):
            if not isinstance(c, Mapping):
                raise _bad(f"{where}.{key}[{i}]", "expected a mapping")
