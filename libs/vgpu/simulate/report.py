"""Simulation results as a terminal report, a side-by-side comparison table, or JSON.

The JSON document (``schemaVersion`` 1) is the machine-readable form of the same numbers::

    {"schemaVersion": 1, "cluster": {"nodes", "draNodes", "gpus"}, "workload": {"pods"},
     "typical": {"cores", "memoryMibByGpuMemoryMib": {"<GPU MiB>": MiB}} | null,
     "runs": [{"nodePolicy", "gpuPolicy", "summary": {...}, "placements": [...],
               "pending": [...], "gpus": [...]}]}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vgpu.core import device
from vgpu.simulate.analysis import Analysis, Totals, Typical

SCHEMA_VERSION = 1
LIST_LIMIT = 50  # placements and pending pods printed per run; --json has them all


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _short_model(model: str) -> str:
    return device.model_name(model)


def typical_text(typical: Typical | None) -> str:
    if typical is None:
        return "no container asks for a GPU"
    sizes = sorted(typical.memory_mib_by_gpu_size.items())
    values = {mib for _, mib in sizes}
    if len(values) == 1:
        memory = f"{values.pop()} MiB"
    else:
        memory = ", ".join(f"{mib} MiB on {size} MiB GPUs" for size, mib in sizes)
    return f"1 GPU, {memory}, {typical.cores}% cores"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _nodes_text(analysis: Analysis) -> str:
    dra = len(analysis.run.dra_usage.nodes)
    return f"{analysis.run.node_count} nodes" + (f" ({dra} in the DRA mode)" if dra else "")


def _dra_problems(analysis: Analysis) -> list[str]:
    """What the run left out of the ``--dra`` file (slices, claims) and why."""
    return list(analysis.run.dra.problems) if analysis.run.dra is not None else []


def render_text(analysis: Analysis) -> str:
    """The report of one run: pods, pending reasons, a per-GPU table, totals and fragmentation."""
    run, t = analysis.run, analysis.totals
    out = [
        f"cluster: {_nodes_text(analysis)}, {t.gpus} GPUs; workload: {t.pods} pods; "
        f"node policy {run.node_policy}, GPU policy {run.gpu_policy}",
        f"typical container (median): {typical_text(analysis.typical)}",
        "",
        f"pods: {t.placed} placed"
        + (f" ({t.placed_dra} by kube-scheduler's DRA allocation)" if t.placed_dra else "")
        + f", {t.pending} pending, {t.rejected} rejected at admission",
    ]
    if run.preemptions:
        evicted = sum(len(p.victims) for p in run.preemptions)
        out.append(f"preemptions: {len(run.preemptions)} ({evicted} lower-priority pods evicted)")
        for p in run.preemptions[:LIST_LIMIT]:
            out.append(f"  {p.preemptor} preempted {', '.join(p.victims)} on {p.node}")
    for placed in run.placed[:LIST_LIMIT]:
        gpus = " | ".join(
            ", ".join(f"{d.uuid} {d.memory_mib} MiB {d.cores}%" for d in container)
            for container in placed.devices
            if container
        )
        mode = " (DRA)" if placed.pod.dra else ""
        out.append(f"  {placed.pod.key} -> {placed.node}{mode}: {gpus or 'no GPU'}")
    if len(run.placed) > LIST_LIMIT:
        out.append(f"  ... {len(run.placed) - LIST_LIMIT} more placed (--json lists all)")
    for pending in run.pending[:LIST_LIMIT]:
        out.append(f"  {pending.pod.key} PENDING: {pending.summary()}")
    if len(run.pending) > LIST_LIMIT:
        out.append(f"  ... {len(run.pending) - LIST_LIMIT} more pending (--json lists all)")
    for rejected in run.rejected:
        out.append(f"  {rejected.pod.key} REJECTED: {rejected.message}")
    out.append("")
    header = ["NODE", "GPU", "MODEL", "HEALTH", "MEMORY MiB", "MEM%", "CORES", "SLOTS", "STRANDED", "PODS"]
    rows = [
        [
            r.node,
            str(r.gpu.index),
            _short_model(r.gpu.type),
            "UNHEALTHY" if not r.gpu.health else ("cordoned" if r.cordoned else "ok"),
            f"{r.used.memory_mib}/{r.gpu.memory_mib}",
            _pct(r.used.memory_mib, r.gpu.memory_mib),
            f"{r.used.cores}/{r.gpu.cores}",
            f"{r.used.slots}/{r.gpu.count}",
            str(r.stranded_mib),
            ",".join(r.pods) or "-",
        ]
        for r in analysis.gpus
    ]
    out.extend(_table(header, rows, right={1, 4, 5, 6, 7, 8}))
    out.extend(f"  ! DRA: {p}" for p in _dra_problems(analysis))
    out.append("")
    out.append(
        f"allocated: memory {t.memory_used_mib}/{t.memory_total_mib} MiB "
        f"({_pct(t.memory_used_mib, t.memory_total_mib)}), cores {t.cores_used}/{t.cores_total} "
        f"({_pct(t.cores_used, t.cores_total)}), slots {t.slots_used}/{t.slots_total}; "
        f"GPUs in use {t.gpus_in_use}/{t.gpus}, nodes in use {t.nodes_in_use}/{run.node_count}"
        + (f", {t.gpus_unhealthy} GPUs unhealthy" if t.gpus_unhealthy else "")
    )
    out.append(
        f"fragmentation: {t.stranded_mib} MiB stranded of {t.free_mib} MiB free "
        f"({100.0 * t.fragmentation:.1f}%): free memory on GPUs that cannot take a typical container"
    )
    return "\n".join(out) + "\n"


COMPARE_ROWS: list[tuple[str, Callable[[Totals, int], str]]] = [
    ("pods placed", lambda t, _: f"{t.placed}/{t.pods}"),
    ("pods pending", lambda t, _: str(t.pending)),
    ("pods rejected", lambda t, _: str(t.rejected)),
    ("preemptions", lambda t, _: str(t.preemptions)),
    ("memory allocated", lambda t, _: _pct(t.memory_used_mib, t.memory_total_mib)),
    ("cores allocated", lambda t, _: _pct(t.cores_used, t.cores_total)),
    ("slots used", lambda t, _: f"{t.slots_used}/{t.slots_total}"),
    ("GPUs in use", lambda t, _: f"{t.gpus_in_use}/{t.gpus}"),
    ("nodes in use", lambda t, nodes: f"{t.nodes_in_use}/{nodes}"),
    ("free memory MiB", lambda t, _: str(t.free_mib)),
    ("stranded memory MiB", lambda t, _: str(t.stranded_mib)),
    ("fragmentation", lambda t, _: f"{100.0 * t.fragmentation:.1f}%"),
]


def render_compare(analyses: Sequence[Analysis]) -> str:
    """One table, one column per run (``node policy/GPU policy``), then each run's pending pods."""
    first = analyses[0]
    nodes = first.run.node_count
    out = [
        f"cluster: {_nodes_text(first)}, {first.totals.gpus} GPUs; workload: {first.totals.pods} pods",
        f"typical container (median): {typical_text(first.typical)}",
        "",
    ]
    header = ["node/GPU policy", *(a.run.label for a in analyses)]
    rows = [[name, *(cell(a.totals, nodes) for a in analyses)] for name, cell in COMPARE_ROWS]
    out.extend(_table(header, rows, right=set(range(1, len(header)))))
    for a in analyses:
        for rejected in a.run.rejected:
            out.append(f"rejected under {a.run.label}: {rejected.pod.key}: {rejected.message}")
        if a.run.pending:
            out.append("")
            out.append(f"pending under {a.run.label}:")
            for pending in a.run.pending[:LIST_LIMIT]:
                out.append(f"  {pending.pod.key}: {pending.summary()}")
            if len(a.run.pending) > LIST_LIMIT:
                out.append(f"  ... {len(a.run.pending) - LIST_LIMIT} more (--json lists all)")
    return "\n".join(out) + "\n"


def _summary(t: Totals, nodes: int) -> dict[str, Any]:
    return {
        "pods": t.pods,
        "podsPlaced": t.placed,
        "podsPlacedDra": t.placed_dra,
        "podsPending": t.pending,
        "podsRejected": t.rejected,
        "preemptions": t.preemptions,
        "nodes": nodes,
        "nodesInUse": t.nodes_in_use,
        "gpus": t.gpus,
        "gpusInUse": t.gpus_in_use,
        "gpusUnhealthy": t.gpus_unhealthy,
        "memoryUsedMib": t.memory_used_mib,
        "memoryTotalMib": t.memory_total_mib,
        "coresUsed": t.cores_used,
        "coresTotal": t.cores_total,
        "slotsUsed": t.slots_used,
        "slotsTotal": t.slots_total,
        "freeMemoryMib": t.free_mib,
        "strandedMemoryMib": t.stranded_mib,
        "fragmentation": round(t.fragmentation, 6),
    }


def _run_json(a: Analysis) -> dict[str, Any]:
    run = a.run
    return {
        "nodePolicy": str(run.node_policy),
        "gpuPolicy": str(run.gpu_policy),
        "summary": _summary(a.totals, run.node_count),
        "placements": [
            {
                "pod": p.pod.key,
                "node": p.node,
                "mode": "dra" if p.pod.dra else "extender",
                "containers": [
                    [{"uuid": d.uuid, "memoryMib": d.memory_mib, "cores": d.cores} for d in c]
                    for c in p.devices
                ],
                **({"claims": list(p.claims)} if p.pod.dra else {}),
            }
            for p in run.placed
        ],
        "pending": [
            {
                "pod": p.pod.key,
                "reason": p.summary(),
                "nodes": {
                    node: {"reason": miss.reason, "unresolvable": miss.unresolvable}
                    for node, miss in sorted(p.reasons.items())
                },
            }
            for p in run.pending
        ],
        "rejected": [{"pod": r.pod.key, "reason": r.message} for r in run.rejected],
        "draProblems": _dra_problems(a),
        "preemptions": [
            {"pod": p.preemptor, "node": p.node, "victims": list(p.victims)} for p in run.preemptions
        ],
        "gpus": [
            {
                "node": r.node,
                "mode": "dra" if r.dra else "extender",
                "index": r.gpu.index,
                "uuid": r.gpu.uuid,
                "model": r.gpu.type,
                "numa": r.gpu.numa,
                "healthy": r.gpu.health,
                "cordoned": r.cordoned,
                "memoryUsedMib": r.used.memory_mib,
                "memoryMib": r.gpu.memory_mib,
                "coresUsed": r.used.cores,
                "cores": r.gpu.cores,
                "slotsUsed": r.used.slots,
                "slots": r.gpu.count,
                "strandedMib": r.stranded_mib,
                "pods": list(r.pods),
            }
            for r in a.gpus
        ],
    }


def to_json(analyses: Sequence[Analysis]) -> dict[str, Any]:
    first = analyses[0]
    typical = first.typical
    return {
        "schemaVersion": SCHEMA_VERSION,
        "cluster": {
            "nodes": first.run.node_count,
            "draNodes": len(first.run.dra_usage.nodes),
            "gpus": first.totals.gpus,
        },
        "workload": {"pods": first.totals.pods},
        "typical": None
        if typical is None
        else {
            "cores": typical.cores,
            "memoryMibByGpuMemoryMib": {str(k): v for k, v in sorted(typical.memory_mib_by_gpu_size.items())},
        },
        "runs": [_run_json(a) for a in analyses],
    }
