"""The HTML report: self-contained, and its heat-map seen in a real browser (headless Chromium).

The screenshot is decoded with the standard library (PNG: zlib + the five row filters) and the
heat-map is found by colour: each GPU cell's background is ``html_report.heat_colour`` of its memory
utilisation, so a cell with 100 %, one with 50 %, one with 0 % and an unhealthy one must each show
as a large block of exactly that colour, laid out as nodes (rows) by GPU index (columns).
Skips when ``/usr/bin/chromium`` (Debian's ``chromium``) is absent; CI installs it.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest
from vgpu.core import config
from vgpu.core.config import Policy
from vgpu.simulate import analysis, engine, html_report, model

from tests.scheduler import cdp

CFG = config.load(None)
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
WIDTH, HEIGHT = 1200, 900


def case() -> analysis.Analysis:
    """n1: 3 GPUs x 10000 MiB; n2: 1 unhealthy GPU. ``full`` (10000 MiB) goes to n1 GPU 0 (all tie:
    lower index), ``half`` (5000 MiB, GPU binpack) cannot join GPU 0 and ties GPU 1 and 2 -> GPU 1.
    Heat-map: n1 = [100 %, 50 %, 0 %], n2 = [unhealthy]."""
    cluster = model.load_cluster(
        {
            "nodes": [
                {"name": "n1", "gpus": [{"model": "A10", "memoryMib": 10000, "count": 3}]},
                {"name": "n2", "gpus": [{"model": "A10", "memoryMib": 10000, "healthy": False}]},
            ]
        },
        config=CFG,
    )

    def pod(name: str, memory: int) -> dict[str, Any]:
        limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory, "nvidia.com/gpucores": 10}
        return {"name": name, "containers": [{"name": "m", "resources": {"limits": limits}}]}

    workload = model.load_workload({"pods": [pod("full", 10000), pod("half", 5000)]}, config=CFG)
    return analysis.analyse(
        engine.simulate(cluster, workload, config=CFG, node_policy=Policy.BINPACK, gpu_policy=Policy.BINPACK)
    )


def test_heat_colour_scale() -> None:
    assert html_report.heat_colour(0.0) == html_report.SCALE[0][1]
    assert html_report.heat_colour(0.5) == html_report.SCALE[1][1]
    assert html_report.heat_colour(1.0) == html_report.SCALE[2][1]
    assert html_report.heat_colour(7.0) == html_report.SCALE[2][1]
    assert html_report.heat_colour(-1.0) == html_report.SCALE[0][1]
    a, b = html_report.heat_colour(0.25), html_report.heat_colour(0.75)
    assert a not in (html_report.SCALE[0][1], html_report.SCALE[1][1])
    assert b not in (html_report.SCALE[1][1], html_report.SCALE[2][1])


def test_page_is_self_contained_and_escapes_names() -> None:
    a = case()
    page = html_report.render_html([a], title="<cap & plan>")
    assert page.startswith("<!DOCTYPE html>")
    assert "&lt;cap &amp; plan&gt;" in page and "<cap & plan>" not in page
    # nothing fetched: no scripts, links, imports or URLs
    assert not re.search(r"<script|<link|@import|url\(|https?://|src=", page)
    assert page.count('class="gpu"') == 4
    assert "rgb(200, 35, 45)" in page and "UNHEALTHY" in page
    assert "default/full" in page  # in the tooltip of n1 GPU 0


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB or RGBA non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = prev[i]
            upleft = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - upleft
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - upleft)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else upleft)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line) if bpp == 3 else bytes(b for j, b in enumerate(line) if j % 4 != 3))
        prev = line
    return width, height, rows


def blobs(rows: list[bytes], colour: tuple[int, int, int]) -> tuple[int, float, float]:
    """(pixel count, mean x, mean y) of the pixels within 2 of ``colour`` on every channel."""
    count, sx, sy = 0, 0, 0
    r0, g0, b0 = colour
    for y, row in enumerate(rows):
        for x in range(0, len(row), 3):
            if abs(row[x] - r0) <= 2 and abs(row[x + 1] - g0) <= 2 and abs(row[x + 2] - b0) <= 2:
                count += 1
                sx += x // 3
                sy += y
    return count, (sx / count if count else -1.0), (sy / count if count else -1.0)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_heatmap_in_headless_chromium(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(html_report.render_html([case()]), encoding="utf-8")
    shot = tmp_path / "shot.png"
    assert CHROMIUM is not None
    subprocess.run(
        [
            CHROMIUM,
            *cdp.HEADLESS,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            f"--window-size={WIDTH},{HEIGHT}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=50,
    )
    width, height, rows = decode_png(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    assert len(set(rows)) > 20, "the screenshot is blank"
    cell_px = html_report.CELL_WIDTH_PX * html_report.CELL_HEIGHT_PX
    full = blobs(rows, html_report.heat_colour(1.0))
    half = blobs(rows, html_report.heat_colour(0.5))
    empty = blobs(rows, html_report.heat_colour(0.0))
    sick = blobs(rows, html_report.UNHEALTHY_RGB)
    for name, (count, _, _) in {"100%": full, "50%": half, "0%": empty}.items():
        assert count > cell_px * 0.6, f"the {name} cell is missing ({count} px)"
    assert sick[0] > cell_px * 0.6
    # one row per node, one column per GPU index: n1 GPU 0 < GPU 1 < GPU 2 left to right, same row
    assert full[1] < half[1] < empty[1]
    assert abs(full[2] - half[2]) < 3 and abs(half[2] - empty[2]) < 3
    # n2's unhealthy GPU 0 sits under n1's GPU 0 (the legend's small grey label shifts it a little)
    assert sick[2] > full[2] + html_report.CELL_HEIGHT_PX / 2
