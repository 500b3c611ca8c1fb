"""The simulation as one self-contained HTML page: a per-GPU heat-map per run, totals, pending pods.

No scripts, fonts or images are fetched: the style is inline and the page renders offline. The
heat-map is a grid with one row per node and one cell per GPU index, the cell's background the
GPU's memory utilisation on a pale-green → amber → red scale (``heat_colour``); the cell text gives
memory %, cores and slots, and its tooltip the model, UUID, stranded memory and the pods on it.
Unhealthy GPUs are grey. With ``--compare`` the runs' heat-maps stand side by side.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Sequence

from vgpu.simulate import report
from vgpu.simulate.analysis import Analysis, GpuRow

# (fraction, (r, g, b)) stops of the memory-utilisation scale
SCALE: tuple[tuple[float, tuple[int, int, int]], ...] = (
    (0.0, (232, 245, 233)),
    (0.5, (253, 194, 78)),
    (1.0, (200, 35, 45)),
)
UNHEALTHY_RGB = (128, 128, 128)
CELL_WIDTH_PX = 116
CELL_HEIGHT_PX = 66

_STYLE = f"""
body {{ font-family: sans-serif; margin: 16px; color: #222; background: #fff; }}
h1 {{ font-size: 20px; margin: 0 0 4px 0; }}
h2 {{ font-size: 16px; margin: 12px 0 6px 0; }}
p.meta {{ margin: 2px 0; font-size: 13px; }}
div.runs {{ display: flex; flex-wrap: wrap; gap: 24px; }}
table.heat {{ border-collapse: separate; border-spacing: 4px; }}
table.heat th {{ font-size: 12px; font-weight: normal; text-align: right; padding-right: 6px; }}
table.heat td.gpu {{ width: {CELL_WIDTH_PX}px; height: {CELL_HEIGHT_PX}px; min-width: {CELL_WIDTH_PX}px;
  font-size: 11px; line-height: 14px; text-align: center; vertical-align: middle; padding: 0;
  border-radius: 3px; }}
table.heat td.none {{ width: {CELL_WIDTH_PX}px; }}
td.gpu b {{ font-size: 13px; }}
table.data {{ border-collapse: collapse; font-size: 12px; }}
table.data th, table.data td {{ border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; }}
table.data td.num {{ text-align: right; }}
div.legend {{ display: flex; align-items: center; gap: 6px; font-size: 12px; margin: 6px 0; }}
div.legend span.bar {{ display: inline-block; width: 200px; height: 12px;
  background: linear-gradient(to right, {", ".join(f"rgb{rgb} {int(f * 100)}%" for f, rgb in SCALE)}); }}
ul.pending {{ font-size: 12px; }}
"""


def heat_colour(fraction: float) -> tuple[int, int, int]:
    """The cell colour for a memory utilisation in 0..1 (clamped), linear between the scale stops."""
    f = min(1.0, max(0.0, fraction))
    for (f0, c0), (f1, c1) in itertools.pairwise(SCALE):
        if f <= f1:
            t = (f - f0) / (f1 - f0)
            r, g, b = (round(a + (b_ - a) * t) for a, b_ in zip(c0, c1, strict=True))
            return (r, g, b)
    return SCALE[-1][1]


def _text_colour(rgb: tuple[int, int, int]) -> str:
    r, g, b = rgb
    return "#fff" if (0.299 * r + 0.587 * g + 0.114 * b) < 140 else "#222"


def _cell(row: GpuRow) -> str:
    gpu, used = row.gpu, row.used
    rgb = heat_colour(row.memory_fraction) if gpu.health else UNHEALTHY_RGB
    tooltip = (
        f"{row.node} GPU {gpu.index} {gpu.type} ({gpu.uuid}), NUMA {gpu.numa}\n"
        f"memory {used.memory_mib}/{gpu.memory_mib} MiB, cores {used.cores}/{gpu.cores}, "
        f"slots {used.slots}/{gpu.count}, stranded {row.stranded_mib} MiB\n"
        f"pods: {', '.join(row.pods) or 'none'}"
    )
    state = f"{100.0 * row.memory_fraction:.0f}% mem" if gpu.health else "UNHEALTHY"
    if row.cordoned and gpu.health:
        state += " (cordoned)"
    return (
        f'<td class="gpu" style="background: rgb{rgb}; color: {_text_colour(rgb)}" '
        f'title="{html.escape(tooltip)}"><b>GPU {gpu.index}</b><br>{state}<br>'
        f"cores {used.cores}/{gpu.cores}<br>slots {used.slots}/{gpu.count}</td>"
    )


def heatmap(analysis: Analysis) -> str:
    """The nodes-by-GPUs table of one run."""
    by_node: dict[str, list[GpuRow]] = {}
    for row in analysis.gpus:
        by_node.setdefault(row.node, []).append(row)
    width = max((len(rows) for rows in by_node.values()), default=0)
    lines = ['<table class="heat">']
    for node, rows in by_node.items():
        cells = [_cell(r) for r in rows] + ['<td class="none"></td>'] * (width - len(rows))
        lines.append(f"<tr><th>{html.escape(node)}</th>{''.join(cells)}</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def _totals_table(analyses: Sequence[Analysis]) -> str:
    nodes = analyses[0].run.node_count
    head = "".join(f"<th>{html.escape(a.run.label)}</th>" for a in analyses)
    rows = []
    for name, cell in report.COMPARE_ROWS:
        tds = "".join(f'<td class="num">{html.escape(cell(a.totals, nodes))}</td>' for a in analyses)
        rows.append(f"<tr><th>{html.escape(name)}</th>{tds}</tr>")
    return f'<table class="data"><tr><th>node/GPU policy</th>{head}</tr>{"".join(rows)}</table>'


def _pending(analysis: Analysis) -> str:
    if not analysis.run.pending:
        return '<p class="meta">every pod was placed</p>'
    items = "".join(
        f"<li><b>{html.escape(p.pod.key)}</b>: {html.escape(p.summary())}</li>" for p in analysis.run.pending
    )
    return f'<ul class="pending">{items}</ul>'


def render_html(analyses: Sequence[Analysis], *, title: str = "kube-vgpu capacity simulation") -> str:
    """The whole page. ``analyses`` is one run, or several to compare."""
    first = analyses[0]
    t = first.totals
    runs = "".join(
        f'<div class="run"><h2>node policy {a.run.node_policy}, GPU policy {a.run.gpu_policy}: '
        f"{a.totals.placed}/{a.totals.pods} placed</h2>{heatmap(a)}</div>"
        for a in analyses
    )
    pending = "".join(f"<h2>not placed under {html.escape(a.run.label)}</h2>{_pending(a)}" for a in analyses)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f'<p class="meta">{first.run.node_count} nodes, {t.gpus} GPUs; {t.pods} pods. '
        f"Typical container (median): {html.escape(report.typical_text(first.typical))}.</p>\n"
        '<div class="legend">memory allocated: 0% <span class="bar"></span> 100%; '
        f'<span style="background: rgb{UNHEALTHY_RGB}; color: #fff; padding: 0 4px">unhealthy</span></div>\n'
        f'<div class="runs">{runs}</div>\n'
        f"<h2>totals</h2>{_totals_table(analyses)}\n"
        '<p class="meta">stranded memory: free memory on GPUs that can no longer take a typical '
        "container; fragmentation = stranded / free.</p>\n"
        f"{pending}\n</body></html>\n"
    )
