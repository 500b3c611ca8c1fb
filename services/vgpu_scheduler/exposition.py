"""The per-GPU and per-pod series of ``/metrics``, rendered as text once per change and cached.

At 5,000 nodes x 8 GPUs the scheduler exports about 360,000 samples; building a prometheus_client
object per sample took ~4 s a scrape. Here each node's lines (its GPUs' series and the series of
the pods charged on it) are rendered once per change of that node and kept as bytes, keyed on
``ClusterState.node_generation``; a scrape joins the cached chunks family by family, and when
nothing changed at all (``ClusterState.usage_generation``) it returns the previous text as is.

``snapshot`` runs on the event loop (the only place the state is touched) and copies just the
nodes that changed; ``render`` runs in a worker thread. Callers serialise scrapes (``Metrics.scrape``
holds a lock), so a snapshot always compares against the cache the previous render committed.
The text is the exposition format prometheus_client writes: same names, HELP, label order and
number format (``floatToGoString``); tests compare the two.

The DRA mode's nodes (``draviews``: our ResourceSlices and the claims allocated on them) have the
same series with the same labels, written after the extender's nodes in each family; their pod
series name the pods the claims are reserved for (``container_index`` is ``0``, as for every pod
here). They are rendered again only when a slice or claim changed (``DraViews.generation``), in the
worker thread. One more family, ``vgpu_scheduler_dra_gpu_info`` (1 per DRA GPU, labels
``device_uuid`` and ``node``), tells the modes apart by a join on ``device_uuid``; the existing
families carry no mode label, so no series of theirs changes identity. A DRA node of the same name
as an extender node is left out here (its GPUs would be exported twice).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client.utils import floatToGoString
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid

from vgpu_scheduler.charges import Charge
from vgpu_scheduler.draviews import DraCapture
from vgpu_scheduler.state import ClusterState

MIB = 1 << 20
# prometheus_client's number format (e.g. 1.6777216e+010), typed, memoised: the values repeat
# (card sizes, core shares, slot counts), and formatting is most of a full render's time
_num = cast(Callable[[float], str], functools.lru_cache(maxsize=8192)(floatToGoString))
ZONE = "vGPU"


@dataclass(frozen=True)
class Family:
    name: str
    help: str

    def header(self) -> bytes:
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} gauge\n".encode()


# the order of a node chunk's parts
GPU_FAMILIES = (
    Family("hami_gpu_memory_limit_bytes", "GPU memory (bytes)"),
    Family("hami_gpu_core_limit_ratio", "GPU cores (percent units)"),
    Family("hami_gpu_memory_allocated_bytes", "GPU memory allocated to pods (bytes)"),
    Family("hami_gpu_shared_count", "Containers sharing the GPU"),
    Family("hami_gpu_core_allocated_ratio", "GPU cores allocated (percent units)"),
    Family("hami_node_gpu_memory_allocated_ratio", "Allocated / total GPU memory"),
)
POD_FAMILIES = (
    Family("hami_vgpu_memory_allocated_bytes", "Pod GPU memory (bytes)"),
    Family("hami_vgpu_core_allocated_ratio", "Pod GPU cores (percent units)"),
)
DRA_FAMILY = Family(
    "vgpu_scheduler_dra_gpu_info",
    "GPUs shared through Dynamic Resource Allocation (1 per GPU of a ResourceSlice of "
    "gpu.kube-vgpu.io); join on device_uuid to tell them from the extender's",
)


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@dataclass(frozen=True)
class NodeInput:
    """What the loop copies of a node whose series must be rendered again."""

    name: str
    generation: int
    gpus: tuple[Gpu, ...]
    used: Mapping[GpuUuid, GpuUsage]
    charges: tuple[tuple[str, Charge], ...]  # (pod uid, its charge): replaced by the loop, never mutated
    # DRA: (namespace, pod, GPU, its share) of each pod a claim is reserved for
    shares: tuple[tuple[str, str, GpuUuid, GpuUsage], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """``order``: every node with series, in the order they are written; ``changed``: those to render
    again. ``generation`` None: nothing changed since the last render (reuse its text)."""

    generation: int | None
    order: tuple[str, ...] = ()
    changed: tuple[NodeInput, ...] = ()
    pods: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # .get only (atomic)
    dra: DraCapture | None = None  # None: the DRA objects did not change (reuse their text)
    extender_nodes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Chunk:
    generation: int
    parts: tuple[bytes, ...]  # one per family: GPU_FAMILIES, then POD_FAMILIES when pod series are on


def _node_parts(
    node: NodeInput, pods: Mapping[str, Mapping[str, Any]], *, pod_series: bool
) -> tuple[bytes, ...]:
    lines: list[list[str]] = [[] for _ in range(len(GPU_FAMILIES) + len(POD_FAMILIES))]
    name = _label(node.name)
    # labels in name order, as prometheus_client writes them
    for gpu in node.gpus:
        u = node.used.get(gpu.uuid, EMPTY_USAGE)
        device = (
            f'device_type="{_label(gpu.type)}",device_uuid="{_label(gpu.uuid)}",node="{name}",zone="{ZONE}"'
        )
        labels = f'device_index="{gpu.index}",{device}}} '
        lines[0].append(f"hami_gpu_memory_limit_bytes{{{labels}{_num(gpu.memory_mib * MIB)}\n")
        lines[1].append(f"hami_gpu_core_limit_ratio{{{labels}{_num(gpu.cores)}\n")
        lines[2].append(
            f'hami_gpu_memory_allocated_bytes{{device_cores="{gpu.cores}",device_index="{gpu.index}",'
            f"{device}}} {_num(u.memory_mib * MIB)}\n"
        )
        lines[3].append(f"hami_gpu_shared_count{{{labels}{_num(u.slots)}\n")
        lines[4].append(f"hami_gpu_core_allocated_ratio{{{labels}{_num(u.cores)}\n")
        if gpu.memory_mib > 0:
            ratio = _num(u.memory_mib / gpu.memory_mib)
            lines[5].append(f"hami_node_gpu_memory_allocated_ratio{{{labels}{ratio}\n")
    if pod_series:
        for uid, charge in node.charges:
            pod = str(((pods.get(uid) or {}).get("metadata") or {}).get("name", uid))  # uid until seen
            tail = (
                f'namespace="{_label(charge.namespace)}",node="{name}",pod="{_label(pod)}",zone="{ZONE}"}} '
            )
            for uuid, u in charge.usage.items():
                labels = f'container_index="0",device_uuid="{_label(uuid)}",{tail}'
                lines[6].append(f"hami_vgpu_memory_allocated_bytes{{{labels}{_num(u.memory_mib * MIB)}\n")
                lines[7].append(f"hami_vgpu_core_allocated_ratio{{{labels}{_num(u.cores)}\n")
        for namespace, pod, uuid, u in node.shares:
            labels = (
                f'container_index="0",device_uuid="{_label(uuid)}",namespace="{_label(namespace)}",'
                f'node="{name}",pod="{_label(pod)}",zone="{ZONE}"}} '
            )
            lines[6].append(f"hami_vgpu_memory_allocated_bytes{{{labels}{_num(u.memory_mib * MIB)}\n")
            lines[7].append(f"hami_vgpu_core_allocated_ratio{{{labels}{_num(u.cores)}\n")
    count = len(GPU_FAMILIES) + (len(POD_FAMILIES) if pod_series else 0)
    return tuple("".join(part).encode() for part in lines[:count])


class GpuExposition:
    """The cache of rendered node chunks and of the last whole text."""

    def __init__(self, *, pod_series: bool) -> None:
        self.pod_series = pod_series
        self._chunks: dict[str, _Chunk] = {}
        self._generation: int | None = None  # the state generation ``_text`` shows
        self._dra_generation: int | None = None  # the DRA objects' generation ``_text`` shows
        self._dra_chunks: dict[str, _Chunk] = {}
        self._text = b""

    def snapshot(self, state: ClusterState, dra: Callable[[], DraCapture] | None = None) -> Snapshot:
        """Call on the event loop, with no render running. ``dra``: the DRA views' ``capture``."""
        generation = state.usage_generation
        dra_capture = dra() if dra is not None else None
        dra_changed = dra_capture is not None and dra_capture.generation != self._dra_generation
        if generation == self._generation and not dra_changed:
            return Snapshot(None)
        by_node: dict[str, list[tuple[str, Charge]]] = {}
        stale = {
            name
            for name, g in state.node_generation.items()
            if (chunk := self._chunks.get(name)) is None or chunk.generation != g
        }
        order = list(state.nodes)
        known = set(order)
        for uid, charge in state.charges.items():
            node = charge.node
            if node not in known:
                known.add(node)
                order.append(node)
            if node in stale and self.pod_series:
                by_node.setdefault(node, []).append((uid, charge))
        changed = []
        for name in order:
            if name not in stale:
                continue
            entry = state.nodes.get(name)
            changed.append(
                NodeInput(
                    name=name,
                    generation=state.node_generation.get(name, 0),
                    gpus=entry.gpus if entry is not None else (),
                    used=dict(state.used(name)),
                    charges=tuple(by_node.get(name, ())),
                )
            )
        return Snapshot(
            generation,
            tuple(order),
            tuple(changed),
            state.pods,
            dra=dra_capture if dra_changed else None,
            extender_nodes=frozenset(order),
        )

    def render(self, snapshot: Snapshot) -> bytes:
        """The text of every GPU and pod family; safe in a worker thread."""
        if snapshot.generation is None:
            return self._text
        fresh = {
            node.name: _Chunk(node.generation, _node_parts(node, snapshot.pods, pod_series=self.pod_series))
            for node in snapshot.changed
        }
        chunks: dict[str, _Chunk] = {}
        for name in snapshot.order:
            chunk = fresh.get(name) or self._chunks.get(name)
            if chunk is not None:
                chunks[name] = chunk
        if snapshot.dra is not None:
            self._dra_chunks = self._render_dra(snapshot.dra)
            self._dra_generation = snapshot.dra.generation
        dra_chunks = [c for name, c in self._dra_chunks.items() if name not in snapshot.extender_nodes]
        families = GPU_FAMILIES + (POD_FAMILIES if self.pod_series else ())
        out = bytearray()
        for i, family in enumerate(families):
            out += family.header()
            for chunk in (*chunks.values(), *dra_chunks):
                out += chunk.parts[i]
        if dra_chunks:
            out += DRA_FAMILY.header()
            for chunk in dra_chunks:
                out += chunk.parts[-1]
        self._chunks = chunks
        self._generation = snapshot.generation
        self._text = bytes(out)
        return self._text

    def _render_dra(self, capture: DraCapture) -> dict[str, _Chunk]:
        """Each DRA node's parts (those of ``_node_parts`` and its ``DRA_FAMILY`` lines)."""
        out: dict[str, _Chunk] = {}
        for name, node in capture.usage().nodes.items():
            shares = tuple(
                (h.namespace, h.pod or f"claim:{h.claim}", uuid, GpuUsage(1, h.memory_mib, h.cores))
                for uuid, holders in node.holders.items()
                for h in holders
            )
            entry = NodeInput(
                name=name,
                generation=capture.generation,
                gpus=node.inventory.gpus,
                used=node.used,
                charges=(),
                shares=shares if self.pod_series else (),
            )
            info = "".join(
                f'vgpu_scheduler_dra_gpu_info{{device_uuid="{_label(g.uuid)}",node="{_label(name)}"}} 1.0\n'
                for g in node.inventory.gpus
            )
            out[name] = _Chunk(
                capture.generation, (*_node_parts(entry, {}, pod_series=self.pod_series), info.encode())
            )
        return out
