"""What the live dashboard (``/ui``) shows, as one JSON-able dict built from the scheduler's memory.

``snapshot`` is a pure function of the cluster state, the filter's last reasons and the time: no
I/O, no clock read, nothing changed. It is two steps: ``capture`` (on the event loop, which alone
touches the state: copies of what the loop changes in place, references to what it only ever
replaces, as ``metrics.take_snapshot`` does; a few ms at 5,000 nodes) and ``build`` (anywhere, a
worker thread in ``ui.py``: reads only the capture). It gives, per node (by name) and per GPU (by index), the memory,
cores and slots handed out and which pods hold them (bound pods and decisions still being bound),
the memory used outside kube-vgpu, the node's problem when its GPUs cannot be scheduled now (device
plugin not reporting: no Lease or a stale one, no or a corrupt register annotation), and every
unbound pod that asks for GPUs, what it asks and why it waits (``pendinglist.py``: for an extender
pod the last ``/filter`` failure, for a DRA pod what the cluster says). Memory is in MiB, cores in
percent units (100 = one whole GPU), as everywhere in kube-vgpu.

Nodes in the DRA mode (``mode: "dra"``) are rows of the same list, built from the DRA views'
caches (``draviews``: our ResourceSlices, the allocated ResourceClaims) in the same worker thread:
their GPUs' ``slots`` is 0 (DRA sets no slot limit; ``usedSlots`` counts the shares), their pods
those the claims are reserved for (a claim not reserved yet shows as ``claim:<name>``), their
``warnings`` what of their slice or claims could not be read. kube-scheduler places DRA pods itself;
those still waiting for an allocation are in ``pending`` with ``mode: "dra"``.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from vgpu.core import device
from vgpu.core.config import Config
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid
from vgpu.core.dra import names as dra_names
from vgpu.core.dra import usage as dra_usage

from vgpu_scheduler import pendinglist
from vgpu_scheduler.charges import Charge
from vgpu_scheduler.draviews import DraCapture
from vgpu_scheduler.pending import FilterReasons, Reason
from vgpu_scheduler.state import ClusterState

PendingPod = pendinglist.PendingPod
GpuAsk = pendinglist.GpuAsk
DEFAULT_MAX_PENDING = 500  # pending pods listed (oldest reasons first are not special: by name)


class PodSlice(TypedDict):
    """One pod's share of one GPU. ``binding``: a filter's decision whose bind is not done yet."""

    namespace: str
    name: str
    memoryMib: int
    cores: int
    binding: bool


class GpuCell(TypedDict):
    index: int
    uuid: str
    type: str  # the register annotation's (e.g. "NVIDIA-Tesla T4")
    model: str  # the name every view shows (vgpu.core.device.model_name: "Tesla T4")
    memoryMib: int
    usedMib: int
    outsideMib: int  # used by processes kube-vgpu did not place (when the scheduler subtracts it)
    cores: int
    usedCores: int
    slots: int
    usedSlots: int
    healthy: bool
    cordoned: bool
    pods: list[PodSlice]


class NodeRow(TypedDict):
    name: str
    mode: str  # "extender" or "dra"
    problem: str | None  # why its GPUs cannot be scheduled now (None: schedulable)
    warnings: list[str]  # DRA: what of its ResourceSlice or claims could not be read
    gpus: list[GpuCell]


class PreemptionRow(TypedDict):
    """A decision of the own preemption path (``selfpreempt.Record``)."""

    at: float
    pod: str
    node: str
    victims: list[str]
    outcome: str
    message: str


class Totals(TypedDict):
    nodes: int
    nodesWithProblems: int
    gpus: int
    memoryMib: int
    usedMib: int
    cores: int
    usedCores: int
    pods: int  # pods holding GPUs
    pending: int  # unbound pods asking for GPUs (all of them, also those past the list's cap)


class Snapshot(TypedDict):
    schedulerName: str
    generation: int  # the state's change counter when this was built
    at: float  # unix seconds (``generation`` and ``at`` aside, equal snapshots show the same)
    totals: Totals
    nodes: list[NodeRow]
    pending: list[PendingPod]  # pendinglist.py
    preemptions: list[PreemptionRow]  # the own preemption path's latest decisions, newest first
    warnings: list[str]  # DRA claims or slices that name no node (unreadable ones included)


@dataclass(frozen=True)
class NodeCapture:
    name: str
    gpus: tuple[Gpu, ...]
    used: dict[GpuUuid, GpuUsage]  # a copy: the loop updates the state's in place
    cordoned: frozenset[GpuUuid]
    outside: Mapping[GpuUuid, int]
    problem: str | None


@dataclass(frozen=True)
class Capture:
    """What one snapshot reads, taken on the event loop (see the module docstring)."""

    config: Config
    generation: int
    now: float
    nodes: list[NodeCapture]
    charges: list[tuple[str, Charge]]  # Charges and pod objects are replaced, never changed
    pods: list[tuple[str, Mapping[str, Any]]]
    reasons: dict[str, Reason]
    preemptions: tuple[PreemptionRow, ...] = ()
    dra: DraCapture | None = None


def capture(
    state: ClusterState,
    reasons: FilterReasons,
    *,
    now: float,
    preemptions: Sequence[PreemptionRow] = (),
    dra: DraCapture | None = None,
) -> Capture:
    """Copy what the loop changes in place (per-node usage, the dicts themselves); keep references
    to what it only ever replaces (GPU tuples, charges, pod objects). Per pod only a C-level copy of
    the dict's items: the pending pods are picked out by ``build``."""
    nodes = [
        NodeCapture(
            name, entry.gpus, dict(state.used(name)), entry.cordoned, entry.outside, state.problem(name, now)
        )
        for name, entry in state.nodes.items()
    ]
    return Capture(
        config=state.config,
        generation=state.generation,
        now=now,
        nodes=nodes,
        charges=list(state.charges.items()),
        pods=list(state.pods.items()),
        reasons=reasons.copy(),
        preemptions=tuple(reversed(preemptions)),
        dra=dra,
    )


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _slices(cap: Capture, pods: Mapping[str, Mapping[str, Any]]) -> dict[str, list[PodSlice]]:
    """GPU uuid -> the pods holding a share of it, by namespace and name."""
    out: dict[str, list[PodSlice]] = {}
    for uid, charge in cap.charges:
        meta = _meta(pods.get(uid) or {})
        name = str(meta.get("name") or uid)
        for uuid, used in charge.usage.items():
            out.setdefault(uuid, []).append(
                PodSlice(
                    namespace=charge.namespace,
                    name=name,
                    memoryMib=used.memory_mib,
                    cores=used.cores,
                    binding=charge.reservation or charge.expires_s is not None,
                )
            )
    for slices in out.values():
        slices.sort(key=lambda s: (s["namespace"], s["name"]))
    return out


def _nodes(cap: Capture, pods: Mapping[str, Mapping[str, Any]]) -> list[NodeRow]:
    slices = _slices(cap, pods)
    rows: list[NodeRow] = []
    for entry in sorted(cap.nodes, key=lambda n: n.name):
        used = entry.used
        outside = entry.outside
        gpus: list[GpuCell] = []
        for gpu in sorted(entry.gpus, key=lambda g: (g.index, g.uuid)):
            u = used.get(gpu.uuid, EMPTY_USAGE)
            gpus.append(
                GpuCell(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    type=gpu.type,
                    model=device.model_name(gpu.type),
                    memoryMib=gpu.memory_mib,
                    usedMib=u.memory_mib,
                    outsideMib=outside.get(gpu.uuid, 0),
                    cores=gpu.cores,
                    usedCores=u.cores,
                    slots=gpu.count,
                    usedSlots=u.slots,
                    healthy=gpu.health,
                    cordoned=gpu.uuid in entry.cordoned,
                    pods=slices.get(gpu.uuid, []),
                )
            )
        rows.append(
            NodeRow(
                name=entry.name, mode=dra_names.MODE_EXTENDER, problem=entry.problem, warnings=[], gpus=gpus
            )
        )
    return rows


def _cell(gpu: Gpu, used: GpuUsage, pods: list[PodSlice]) -> GpuCell:
    return GpuCell(
        index=gpu.index,
        uuid=gpu.uuid,
        type=gpu.type,
        model=device.model_name(gpu.type),
        memoryMib=gpu.memory_mib,
        usedMib=used.memory_mib,
        outsideMib=0,
        cores=gpu.cores,
        usedCores=used.cores,
        slots=gpu.count,
        usedSlots=used.slots,
        healthy=gpu.health,
        cordoned=False,
        pods=pods,
    )


def _dra_nodes(found: dra_usage.DraUsage) -> list[NodeRow]:
    """The DRA mode's nodes (see the module docstring)."""
    rows: list[NodeRow] = []
    for name, node in found.nodes.items():
        gpus = [
            _cell(
                gpu,
                node.used.get(gpu.uuid, EMPTY_USAGE),
                [
                    PodSlice(
                        namespace=h.namespace,
                        name=h.pod or f"claim:{h.claim}",
                        memoryMib=h.memory_mib,
                        cores=h.cores,
                        binding=False,
                    )
                    for h in node.holders.get(gpu.uuid, ())
                ],
            )
            for gpu in node.inventory.gpus
        ]
        rows.append(
            NodeRow(name=name, mode=dra_names.MODE_DRA, problem=None, warnings=list(node.problems), gpus=gpus)
        )
    return rows


def snapshot(
    state: ClusterState, reasons: FilterReasons, *, now: float, max_pending: int = DEFAULT_MAX_PENDING
) -> Snapshot:
    """The dashboard's whole content now (see the module docstring); at most ``max_pending``
    pending pods are listed, ``totals.pending`` counts them all."""
    return build(capture(state, reasons, now=now), max_pending=max_pending)


def build(cap: Capture, *, max_pending: int = DEFAULT_MAX_PENDING) -> Snapshot:
    """``snapshot`` from a ``capture`` (reads nothing else: safe in a worker thread)."""
    nodes = _nodes(cap, dict(cap.pods))
    dra = cap.dra.usage() if cap.dra is not None else dra_usage.EMPTY
    nodes.extend(_dra_nodes(dra))
    nodes.sort(key=lambda n: (n["name"], n["mode"] != dra_names.MODE_EXTENDER))
    dra_pods = {
        (h.namespace, h.pod or f"claim:{h.claim}")
        for node in dra.nodes.values()
        for holders in node.holders.values()
        for h in holders
    }
    pending = pendinglist.pending(cap.config, cap.pods, charges=cap.charges, reasons=cap.reasons, dra=cap.dra)
    cells = [g for n in nodes for g in n["gpus"]]
    totals = Totals(
        nodes=len(nodes),
        nodesWithProblems=sum(n["problem"] is not None for n in nodes),
        gpus=len(cells),
        memoryMib=sum(g["memoryMib"] for g in cells),
        usedMib=sum(g["usedMib"] for g in cells),
        cores=sum(g["cores"] for g in cells),
        usedCores=sum(g["usedCores"] for g in cells),
        # not those left with nothing; a DRA pod (or claim not reserved yet) once
        pods=sum(1 for _, charge in cap.charges if charge.usage) + len(dra_pods),
        pending=len(pending),
    )
    return Snapshot(
        schedulerName=cap.config.scheduler.scheduler_name,
        generation=cap.generation,
        at=cap.now,
        totals=totals,
        nodes=nodes,
        pending=pending[:max_pending],
        preemptions=list(cap.preemptions),
        warnings=list(dra.problems),
    )
