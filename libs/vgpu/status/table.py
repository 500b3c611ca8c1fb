"""The ``vgpu status`` table: a ``ClusterStatus`` as text, one line per GPU, problems under it, totals,
then the pending GPU pods (what each asks and why it waits) and the scheduler's preemptions.

Names, models and problems come from the API server, where pod owners and device plugins write
them: their control characters (a terminal's escape sequences, line breaks, bidi overrides) are
shown as Python escapes (``\\x1b``), never sent to the terminal as they are (kubectl's
CVE-2021-25743).
"""

import datetime
from collections.abc import Sequence

from vgpu.core import device
from vgpu.core.dra import names as dra_names
from vgpu.status import snapshot

PENDING_SHOWN = 50  # pending pods listed (all are counted)


def _shown(text: str) -> str:
    """``text`` with every character that is not printable written as its escape (``\\x1b``)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _plugin(node: snapshot.NodeStatus) -> str:
    if node.mode == dra_names.MODE_DRA:
        return "DRA (ResourceSlice)"  # the mode marker; the kubelet plugin publishes it, no lease
    if node.reporting is None:
        return "no lease"
    if node.lease_age_s is None:
        return "NOT REPORTING (no renew time)"
    age = f"{max(0.0, node.lease_age_s):.0f}s ago"
    return f"reporting ({age})" if node.reporting else f"NOT REPORTING ({age})"


def _health(row: snapshot.GpuStatus) -> str:
    if not row.gpu.health:
        return "UNHEALTHY"
    return "cordoned" if row.cordoned else "ok"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max([len(header[i]), *(len(r[i]) for r in rows)]) for i in range(len(header))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in [header, *rows]
    ]


def render(status: snapshot.ClusterStatus) -> str:
    """The table: one line per GPU (node name and plugin state on its first), problems under it."""
    when = status.taken_at.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    out = [
        f"kube-vgpu status at {when}: {len(status.nodes)} GPU nodes"
        + (f" ({status.other_nodes} other nodes without GPUs registered)" if status.other_nodes else ""),
        "",
    ]
    header = [
        "NODE",
        "PLUGIN",
        "GPU",
        "MODEL",
        "HEALTH",
        "MEMORY MiB",
        "MEM%",
        "OUTSIDE",
        "CORES",
        "SLOTS",
        "PODS",
    ]
    rows: list[list[str]] = []
    notes: list[str] = []
    totals = [
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ]  # memory used/total, cores used/total, slots used/total (extender), GPUs, unhealthy
    away = 0  # MiB used outside kube-vgpu, all GPUs
    dra_shares = 0  # shares handed out by DRA (no slot limit: not in the slots total)
    for node in status.nodes:
        first = True
        if node.problem:  # the reason goes under the table: it is too long for a column
            rows.append([node.name, _plugin(node), "-", "-", "UNREADABLE", "", "", "", "", "", ""])
            notes.append(f"  ! {node.name}: {node.problem}")
            first = False
        for r in node.gpus:
            g, u = r.gpu, r.used
            rows.append(
                [
                    node.name if first else "",
                    _plugin(node) if first else "",
                    str(g.index),
                    device.model_name(g.type),
                    _health(r),
                    f"{u.memory_mib}/{g.memory_mib}",
                    _pct(u.memory_mib, g.memory_mib),
                    str(r.outside_mib) if r.outside_mib else "-",
                    f"{u.cores}/{g.cores}",
                    f"{u.slots}/-"
                    if node.mode == dra_names.MODE_DRA and not g.count
                    else f"{u.slots}/{g.count}",
                    ",".join(r.pods) or "-",
                ]
            )
            first = False
            dra = node.mode == dra_names.MODE_DRA
            dra_shares += u.slots if dra else 0
            slots = (0, 0) if dra else (u.slots, g.count)
            for i, v in enumerate(
                (u.memory_mib, g.memory_mib, u.cores, g.cores, *slots, 1, 0 if g.health else 1)
            ):
                totals[i] += v
            away += r.outside_mib
        notes.extend(f"  ! {node.name}: {w}" for w in node.warnings)
    if rows:
        out.extend(_table(header, [[_shown(c) for c in r] for r in rows], right={2, 5, 6, 7, 8, 9}))
    else:
        out.append("no node registers GPUs")
    out.extend(_shown(n) for n in notes)
    out.extend(_shown(f"  ! {w}") for w in status.warnings)
    mu, mt, cu, ct, su, st, gpus, unhealthy = totals
    shares = [f"slots {su}/{st}"] if st or not dra_shares else []  # no extender GPU: no slots
    shares += [f"{dra_shares} DRA shares"] if dra_shares else []
    out.append("")
    out.append(
        f"allocated: memory {mu}/{mt} MiB ({_pct(mu, mt)}), cores {cu}/{ct} ({_pct(cu, ct)}), "
        + ", ".join(shares)
        + f"; {gpus} GPUs"
        + (f", {unhealthy} unhealthy" if unhealthy else "")
        + (f"; {away} MiB used outside kube-vgpu" if away else "")
    )
    if status.pending:
        out.append("")
        out.append(f"pending GPU pods ({len(status.pending)}):")
        waiting = [
            [
                f"{pod.namespace}/{pod.name}",
                "DRA" if pod.mode == dra_names.MODE_DRA else "extender",
                "; ".join(a.shown for a in pod.asks) or "?",
                pod.reason,
            ]
            for pod in status.pending[:PENDING_SHOWN]
        ]
        header = ["POD", "MODE", "ASKS", "WHY IT WAITS"]
        out.extend(
            "  " + line for line in _table(header, [[_shown(c) for c in r] for r in waiting], right=set())
        )
        if len(status.pending) > PENDING_SHOWN:
            out.append(f"  ... and {len(status.pending) - PENDING_SHOWN} more")
    if status.preemptions:
        out.append("")
        out.append("preemptions by the scheduler (newest first):")
        out.extend(_shown(f"  {when}  {pod}: {message}") for when, pod, message in status.preemptions)
    return "\n".join(out) + "\n"
