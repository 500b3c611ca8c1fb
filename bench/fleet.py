"""A fleet of GPU nodes as the scheduler's watches deliver it, for the in-process benchmarks.

``objects`` yields, node by node, the Node (8 GPUs of 16 GiB, 10 slots each, in the register
annotation), its device plugin's fresh Lease and the pods already placed there (bound, ``success``,
Running); ``feed`` applies them to a ``ClusterState`` as the informers would.
"""

import datetime
from collections.abc import Iterator
from dataclasses import dataclass

from vgpu.core import annotations, lease
from vgpu.core.device import Gpu, GpuUuid
from vgpu.kube.port import JsonObj
from vgpu_scheduler.state import ClusterState

GPUS_PER_NODE = 8
KEYS = annotations.KEYS


@dataclass(frozen=True)
class Placed:
    """The pods already on every node: ``per_node`` of them (pod ``p`` on GPU ``p % 8``)."""

    per_node: int = GPUS_PER_NODE
    memory_mib: int = 2000
    cores: int = 10
    namespace: str = "default"


def node_name(n: int) -> str:
    return f"node-{n:05d}"


def gpus(n: int, *, gpu_type: str = "NVIDIA-A100") -> list[Gpu]:
    return [
        Gpu(GpuUuid(f"GPU-{n:05d}-{i}"), i, 10, 16384, 100, gpu_type, numa=i // 4)
        for i in range(GPUS_PER_NODE)
    ]


def placed_pod(n: int, p: int, gpu: GpuUuid, placed: Placed) -> JsonObj:
    """Pod ``p`` of node ``n``, bound and running on ``gpu``."""
    node = node_name(n)
    return {
        "metadata": {
            "name": f"placed-{n}-{p}",
            "namespace": placed.namespace,
            "uid": f"uid-{n}-{p}",
            "annotations": {
                KEYS.assigned_node: node,
                KEYS.devices_allocated: f"{gpu},NVIDIA,{placed.memory_mib},{placed.cores}:;",
                KEYS.bind_phase: "success",
            },
        },
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def objects(
    nodes: int, now: float, *, placed: Placed = Placed(), gpu_type: str = "NVIDIA-A100"
) -> Iterator[tuple[str, JsonObj]]:
    """(kind, object) for every node, its Lease (renewed at ``now``) and its placed pods."""
    stamp = lease.format_micro_time(datetime.datetime.fromtimestamp(now, datetime.UTC))
    for n in range(nodes):
        name = node_name(n)
        node_gpus = gpus(n, gpu_type=gpu_type)
        register = annotations.encode_node_register(node_gpus)
        yield "nodes", {"metadata": {"name": name, "annotations": {KEYS.node_register: register}}}
        yield "leases", {"metadata": {"name": lease.name(name)}, "spec": {"renewTime": stamp}}
        for p in range(placed.per_node):
            yield "pods", placed_pod(n, p, node_gpus[p % GPUS_PER_NODE].uuid, placed)


def feed(
    state: ClusterState,
    nodes: int,
    now: float,
    *,
    placed: Placed = Placed(),
    gpu_type: str = "NVIDIA-A100",
) -> None:
    """Apply ``objects`` to ``state`` as ADDED events."""
    for kind, obj in objects(nodes, now, placed=placed, gpu_type=gpu_type):
        state.apply(kind, "ADDED", obj)


def renew(state: ClusterState, nodes: int, now: float) -> None:
    """Every node's device plugin renews its Lease at ``now`` (a bench running past the 40 s a
    Lease is trusted for, on a busy machine, keeps its nodes)."""
    stamp = lease.format_micro_time(datetime.datetime.fromtimestamp(now, datetime.UTC))
    for n in range(nodes):
        state.apply(
            "leases",
            "MODIFIED",
            {"metadata": {"name": lease.name(node_name(n))}, "spec": {"renewTime": stamp}},
        )
