"""The dashboard in headless Chromium against the in-process local cluster, over HTTPS.

The page is loaded once; a pod is then placed through the whole stack (kube-scheduler emulation →
our extender → bind → kubelet emulation) and the page must show its slice without a reload: in
the DOM (the pod's entry in its GPU's cell, bound; the pending pods: an extender pod with the
filter's reason, a DRA pod with its mode and ask; the node without a device plugin) and in the screenshot's pixels (the cell's background turned from the colour of
its old memory fraction to that of the new one, ``html_report.heat_colour``, the scale the page
shares with ``vgpu simulate --html``). ``VGPU_UPDATE_SCREENSHOT=1`` writes the final screenshot
to ``docs/img/dashboard.png`` (the one docs/operations.md shows). Skips without Chromium.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from vgpu.core import annotations as hami
from vgpu.core.device import Gpu, GpuUuid
from vgpu.core.dra import convert
from vgpu.simulate import html_report

from tests.cli.test_html_report import CHROMIUM, decode_png
from tests.scheduler.cdp import Browser, Page
from tests.scheduler.stack import full_stack
from tests.scheduler.test_dashboard_dra_pending import claim_spec, dra_pod

WIDTH, HEIGHT = 1280, 620
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
NODES = {
    "nodes": [
        {"name": "gpu-node-1", "gpus": [{"model": "NVIDIA A10", "memoryMib": 24576, "count": 2}]},
        {"name": "gpu-node-2", "gpus": [{"model": "NVIDIA L4", "memoryMib": 23034, "count": 2}]},
    ]
}
# JavaScript: resolve when the predicate holds (checked at each DOM change), reject after a while
WAIT_FOR = """
(predicate, timeoutMs) => new Promise((resolve, reject) => {
  const check = () => { const got = predicate(); if (got) { observer.disconnect(); resolve(got); } };
  const observer = new MutationObserver(check);
  observer.observe(document.body, { subtree: true, childList: true, attributes: true, characterData: true });
  setTimeout(() => { observer.disconnect(); reject(new Error("timed out: " + predicate)); }, timeoutMs);
  check();
})
"""


async def wait_for(page: Page, predicate_js: str, timeout_ms: int = 30_000) -> Any:
    return await page.evaluate(f"({WAIT_FOR})(() => {predicate_js}, {timeout_ms})")


def share(rows: list[bytes], rect: list[float], colour: tuple[int, int, int]) -> float:
    """The share of the pixels inside ``rect`` (left, top, right, bottom) within 2 of ``colour``."""
    left, top, right, bottom = (int(v) for v in rect)
    hits = total = 0
    for y in range(top + 2, bottom - 2):
        row = rows[y]
        for x in range(left + 2, right - 2):
            total += 1
            r, g, b = row[3 * x : 3 * x + 3]
            hits += abs(r - colour[0]) <= 2 and abs(g - colour[1]) <= 2 and abs(b - colour[2]) <= 2
    return hits / max(1, total)


def pod_body(name: str, *, mem: int, cores: int, ns: str = "default") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)}
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
        },
    }


def tls() -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


def fraction(snap: dict[str, Any], node: str, index: int) -> float:
    gpu = next(g for n in snap["nodes"] if n["name"] == node for g in n["gpus"] if g["index"] == index)
    return float(gpu["usedMib"]) / float(gpu["memoryMib"])


CELLS_JS = (
    "Object.fromEntries([...document.querySelectorAll('td.gpu')].map((td) => {"
    " const r = td.getBoundingClientRect();"
    " return [td.dataset.node + '/' + td.dataset.index, [r.left, r.top, r.right, r.bottom]]; }))"
)
STATE_JS = "fetch('ui/state').then((r) => r.json())"
NOTEBOOK_CELL_JS = (
    "(() => { const li = document.querySelector('li[data-pod=\"default/notebook\"]:not(.binding)');"
    " const td = li && li.closest('td.gpu'); return td && td.dataset.node + '/' + td.dataset.index; })()"
)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@pytest.mark.timeout(150)
async def test_a_new_slice_appears_live_in_headless_chromium(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    async with full_stack(NODES, ssl_context=tls()) as stack:
        api = stack.cluster.api
        # a node whose device plugin never reported: GPUs registered once, no Lease
        gone = [Gpu(GpuUuid("GPU-5e1d0c4a-0000-4000-8000-00000000dead"), 0, 10, 23034, 100, "NVIDIA L4")]
        ann = {hami.KEYS.node_register: hami.encode_node_register(gone)}
        await api.create("nodes", {"metadata": {"name": "gpu-node-3", "annotations": ann}})
        for name, mem, cores, ns in (
            ("train-0", 12000, 50, "ml"),
            ("infer-0", 6000, 20, "web"),
            ("infer-1", 4000, 20, "web"),
        ):
            await api.create("pods", pod_body(name, mem=mem, cores=cores, ns=ns), namespace=ns)
        await api.create("pods", pod_body("too-big", mem=200_000, cores=10, ns="ml"), namespace="ml")
        # a DRA pod as the webhook's conversion leaves it, whose claim is not made yet
        template = convert.template_body(claim_spec(mem=4096, cores=30), namespace="ml")
        await api.create("resourceclaimtemplates", template, namespace="ml")
        waiting = dra_pod("dra-wait", template["metadata"]["name"], ns="ml")
        await api.create("pods", waiting, namespace="ml")

        async with Browser.launch(CHROMIUM, tmp_path / "profile") as browser:
            page = await browser.new_page(width=WIDTH, height=HEIGHT)
            await page.navigate(f"https://{stack.address}/ui")
            # the first state: every placed pod bound, the pending one with the filter's reason
            await wait_for(
                page,
                "document.querySelectorAll('li[data-pod]:not(.binding)').length === 3 && /0\\/\\d nodes fit/"
                ".test(document.querySelector('tr[data-pod=\"ml/too-big\"]')?.textContent)"
                " && document.querySelector('tr[data-pod=\"ml/dra-wait\"]') !== null",
            )
            # the DRA pod among them: its mode, its ask from the claim, why it waits (this stack's
            # kube-scheduler has no DRA plugin: it stays queued)
            dra_row = await page.evaluate(
                "[...document.querySelectorAll('tr[data-pod=\"ml/dra-wait\"] td')].map((td) => td.textContent)"
            )
            assert dra_row[1:3] == ["DRA", "1 GPU: 4096 MiB, 30 % cores"] and dra_row[4], dra_row
            assert await page.evaluate("document.getElementById('status').textContent") == "live"
            problem = await page.evaluate(
                "document.querySelector('#problem-nodes tr[data-node=\"gpu-node-3\"]').textContent"
            )
            assert problem == "gpu-node-3device plugin not reporting (no lease)"
            await page.evaluate("window.loadedOnce = true")  # a reload would forget it
            before_snap = await page.evaluate(STATE_JS)
            before_cells = await page.evaluate(CELLS_JS)
            _, _, before = decode_png(await page.screenshot())

            await api.create("pods", pod_body("notebook", mem=8000, cores=30), namespace="default")
            cell = await wait_for(page, NOTEBOOK_CELL_JS)
            assert await page.evaluate("window.loadedOnce === true"), "the page was reloaded"
            after_snap = await page.evaluate(STATE_JS)
            after_cells = await page.evaluate(CELLS_JS)
            png = await page.screenshot()

    node, index = cell.split("/")
    old = html_report.heat_colour(fraction(before_snap, node, int(index)))
    new = html_report.heat_colour(fraction(after_snap, node, int(index)))
    assert old != new
    width, height, after = decode_png(png)
    assert (width, height) == (WIDTH, HEIGHT)
    # the cell showed its old fill, and now shows the new one (text covers part of it)
    assert share(before, before_cells[cell], old) > 0.4
    assert share(before, before_cells[cell], new) < 0.02
    assert share(after, after_cells[cell], new) > 0.4
    assert share(after, after_cells[cell], old) < 0.02
    # every other cell kept its colour
    for other, rect in after_cells.items():
        if other != cell and not other.startswith("gpu-node-3/"):
            n, i = other.split("/")
            assert share(after, rect, html_report.heat_colour(fraction(after_snap, n, int(i)))) > 0.4, other
    if os.environ.get("VGPU_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        SCREENSHOT.write_bytes(png)
