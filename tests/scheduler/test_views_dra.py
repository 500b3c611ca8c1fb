"""The scheduler's views of the DRA mode: ``/ui/state`` and ``/metrics`` show the GPUs of our
ResourceSlices and the shares of the claims allocated on them as they show the extender's, fed by
their own watches (``draviews``), which do not touch the state ``/filter`` reads. The slices' watch
is the scheduler's only one (the webhook's GPU sizes are told by it too); readiness waits for its
list unless the API server does not serve the kind or the role does not grant it.

``DraFeed`` serves the slices and claims beside the local cluster's store: a list (or an error)
and a watch fed by ``send``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vgpu.core import errors
from vgpu.core.config import Config
from vgpu.kube import port
from vgpu.kube.port import Kind, ObjectList, WatchEvent
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_scheduler import dashboard, draviews, exposition
from vgpu_scheduler.metrics import Metrics
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.state import ClusterState
from vgpu_scheduler.ui import Dashboard

from tests.cli.test_html_report import CHROMIUM
from tests.core.dra.dra_objects import claim, gpu_device, resource_slice, result
from tests.scheduler.cdp import Browser
from tests.scheduler.scenario import T0, Cluster, FakeClock, gpus
from tests.scheduler.test_dashboard_browser import wait_for

DRA_KINDS = ("resourceslices", "resourceclaims")
DRIVER = "gpu.kube-vgpu.io"


class DraFeed(LocalKubeApi):
    """The local store plus DRA objects: a list of ``objects``, then what ``send`` puts on the watch;
    ``error``: what the lists of ``error_kinds`` answer instead."""

    def __init__(
        self,
        store: Store,
        objects: dict[str, list[dict[str, Any]]],
        error: Exception | None = None,
        error_kinds: tuple[str, ...] = DRA_KINDS,
    ):
        super().__init__(store)
        self.objects = objects
        self.error = error
        self.error_kinds = error_kinds
        self.queues: dict[str, asyncio.Queue[WatchEvent]] = {k: asyncio.Queue() for k in DRA_KINDS}

    async def list(self, kind: Kind, **kwargs: Any) -> ObjectList:
        if kind not in DRA_KINDS:
            return await super().list(kind, **kwargs)
        if self.error is not None and kind in self.error_kinds:
            raise self.error
        return ObjectList([dict(o) for o in self.objects.get(kind, [])], "1")

    async def watch(self, kind: Kind, **kwargs: Any) -> AsyncIterator[WatchEvent]:  # type: ignore[override]
        if kind not in DRA_KINDS:
            async for event in super().watch(kind, **kwargs):
                yield event
            return
        while True:
            event = await self.queues[kind].get()
            yield port.transformed(event, kwargs.get("transform"))

    def send(self, kind: str, etype: str, obj: dict[str, Any]) -> None:
        self.queues[kind].put_nowait(WatchEvent(etype, obj))  # type: ignore[arg-type]


def _objects() -> dict[str, list[dict[str, Any]]]:
    return {
        "resourceslices": [
            resource_slice(
                "dra-1", gpu_device(0, "GPU-d0", memory_mib=16000), gpu_device(1, "GPU-d1", memory_mib=16000)
            ),
            resource_slice("dra-1", gpu_device(0, "GPU-x0"), driver="gpu.nvidia.com", name="nvidia"),
        ],
        "resourceclaims": [
            claim(
                "team", "train-vgpu-0", result("dra-1", 0, memory="4000Mi", cores="30"), reserved=("train",)
            ),
            claim(  # no cores asked: kube-scheduler consumed the 1 % floor, the views show 0
                "team",
                "infer-vgpu-0",
                result("dra-1", 0, memory="2000Mi", cores="1"),
                reserved=("infer",),
                asks={"gpu": None},
            ),
        ],
    }


@contextlib.asynccontextmanager
async def running(feed: DraFeed) -> AsyncIterator[draviews.DraViews]:
    views = draviews.DraViews(feed)
    tasks = [asyncio.create_task(inf.run()) for inf in views.informers]
    try:
        await asyncio.wait_for(asyncio.gather(*(inf.synced.wait() for inf in views.informers)), 5)
        yield views
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _until(predicate: Any, timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` (the watch's events are applied by the loop) until it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


async def test_caches_keep_our_slices_and_slim_claims_and_count_changes() -> None:
    feed = DraFeed(Store(), _objects())
    async with running(feed) as views:
        cap = views.capture()
        assert [s["metadata"]["name"] for s in cap.slices] == ["dra-1-gpu.kube-vgpu.io"]  # not nvidia's
        # slimmed: identity, owners, status, and of the spec only what each request asked
        assert [c["spec"] for c in cap.claims] == [
            {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {"cores": "30"}}},
                        }
                    ]
                }
            },
            {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        ]
        pokes: list[int] = []
        views.on_change = lambda: pokes.append(views.generation)
        before = views.generation
        feed.send("resourceslices", "MODIFIED", resource_slice("x", driver="gpu.nvidia.com", name="nvidia"))
        late = claim(
            "team",
            "late-vgpu-0",
            result("dra-1", 1, memory="1000Mi", cores="1"),
            reserved=("late",),
            asks={"gpu": None},
        )
        feed.send("resourceclaims", "ADDED", late)
        await _until(lambda: views.claims.get("team", "late-vgpu-0") is not None)
        assert views.generation == before + 1 and pokes == [before + 1]  # another driver's slice: no change
        used = views.capture().usage().nodes["dra-1"].used
        assert {u: (g.slots, g.memory_mib, g.cores) for u, g in used.items()} == {
            "GPU-d0": (2, 6000, 30),
            "GPU-d1": (1, 1000, 0),
        }


def _state() -> ClusterState:
    from tests.scheduler.test_dashboard import lease, node

    state = ClusterState(Config(), clock=FakeClock())
    state.apply("nodes", "ADDED", node("n1", n=1))
    state.apply("leases", "ADDED", lease("n1"))
    return state


async def test_dashboard_shows_dra_nodes_beside_the_extenders_and_follows_changes() -> None:
    feed = DraFeed(Store(), _objects())
    async with running(feed) as views:
        board = Dashboard(_state(), FilterReasons(), clock=FakeClock(), dra=views)
        snap = dashboard.build(board.capture())
        assert [(n["name"], n["mode"]) for n in snap["nodes"]] == [("dra-1", "dra"), ("n1", "extender")]
        dra = snap["nodes"][0]
        assert dra["problem"] is None and dra["warnings"] == []
        gpu0, gpu1 = dra["gpus"]
        assert (gpu0["uuid"], gpu0["memoryMib"], gpu0["usedMib"], gpu0["usedCores"]) == (
            "GPU-d0",
            16000,
            6000,
            30,
        )
        assert (gpu0["slots"], gpu0["usedSlots"], gpu0["model"]) == (10, 2, "NVIDIA A100-SXM4-40GB")
        assert gpu0["pods"] == [
            {"namespace": "team", "name": "infer", "memoryMib": 2000, "cores": 0, "binding": False},
            {"namespace": "team", "name": "train", "memoryMib": 4000, "cores": 30, "binding": False},
        ]
        assert gpu1["pods"] == [] and gpu1["usedMib"] == 0
        assert (
            snap["totals"]["gpus"] == 3 and snap["totals"]["usedMib"] == 6000 and snap["totals"]["pods"] == 2
        )
        assert snap["pending"] == [] and snap["warnings"] == []
        first = await board.frame()
        feed.send("resourceclaims", "DELETED", _objects()["resourceclaims"][0])
        await _until(lambda: views.claims.get("team", "train-vgpu-0") is None)
        second = await board.frame()  # the cached frame is not reused: the DRA objects changed
        assert second.shown != first.shown and b'"usedMib":2000' in second.shown


async def test_dashboard_lists_garbage_as_warnings() -> None:
    objects = _objects()
    objects["resourceclaims"] += [
        claim("team", "lost", result("dra-1", 7, memory="1Gi")),
        claim("team", "junk", result("dra-1", 0, memory="lots")),
    ]
    objects["resourceslices"].append(resource_slice("dra-2", {"name": "gpu-0"}))
    async with running(DraFeed(Store(), objects)) as views:
        snap = dashboard.build(dashboard.capture(_state(), FilterReasons(), now=T0, dra=views.capture()))
    rows = {n["name"]: n for n in snap["nodes"]}
    assert rows["dra-1"]["warnings"] == [
        "ResourceClaim team/lost holds gpu-7 on node dra-1, whose ResourceSlice does not publish it "
        "(gone or unhealthy)"
    ]
    assert rows["dra-2"]["gpus"] == [] and rows["dra-2"]["warnings"][0].endswith("no uuid attribute")
    assert len(snap["warnings"]) == 1 and snap["warnings"][0].startswith("ResourceClaim team/junk: ")


def _samples(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


async def test_metrics_give_dra_gpus_and_pods_the_same_series() -> None:
    feed = DraFeed(Store(), _objects())
    async with running(feed) as views:
        metrics = Metrics(_state(), clock=FakeClock(), dra=views)
        body = await metrics.scrape()
        samples = _samples(body)
        gpu = {"device_index": "0", "device_uuid": "GPU-d0", "node": "dra-1", "zone": "vGPU"}
        gpu["device_type"] = "NVIDIA A100-SXM4-40GB"
        assert samples["hami_gpu_memory_limit_bytes", frozenset(gpu.items())] == 16000 * 2**20
        assert samples["hami_gpu_core_allocated_ratio", frozenset(gpu.items())] == 30
        assert samples["hami_gpu_shared_count", frozenset(gpu.items())] == 2
        allocated = frozenset({**gpu, "device_cores": "100"}.items())
        assert samples["hami_gpu_memory_allocated_bytes", allocated] == 6000 * 2**20
        pod = {
            "container_index": "0",
            "device_uuid": "GPU-d0",
            "namespace": "team",
            "node": "dra-1",
            "zone": "vGPU",
        }
        assert (
            samples["hami_vgpu_memory_allocated_bytes", frozenset({**pod, "pod": "train"}.items())]
            == 4000 * 2**20
        )
        assert samples["hami_vgpu_core_allocated_ratio", frozenset({**pod, "pod": "infer"}.items())] == 0
        info = {
            (dict(k[1])["device_uuid"], dict(k[1])["node"])
            for k in samples
            if k[0] == "vgpu_scheduler_dra_gpu_info"
        }
        assert info == {("GPU-d0", "dra-1"), ("GPU-d1", "dra-1")}
        # the extender's node keeps its series, with no mode label
        n1 = {
            "device_index": "0",
            "device_uuid": "GPU-n1-0",
            "node": "n1",
            "zone": "vGPU",
            "device_type": "NVIDIA-Tesla-T4",
        }
        assert ("hami_gpu_memory_limit_bytes", frozenset(n1.items())) in samples
        assert await metrics.scrape() == body  # nothing changed: the same text
        feed.send("resourceclaims", "DELETED", _objects()["resourceclaims"][0])
        await _until(lambda: views.claims.get("team", "train-vgpu-0") is None)
        again = _samples(await metrics.scrape())
        assert again["hami_gpu_memory_allocated_bytes", allocated] == 2000 * 2**20
        assert ("hami_vgpu_memory_allocated_bytes", frozenset({**pod, "pod": "train"}.items())) not in again


def test_without_dra_the_exposition_has_no_dra_family() -> None:
    exp = exposition.GpuExposition(pod_series=True)
    text = exp.render(exp.snapshot(_state(), lambda: draviews.DraCapture(0)))
    assert b"vgpu_scheduler_dra_gpu_info" not in text and b'node="n1"' in text


def test_a_dra_node_named_as_an_extender_node_is_not_exported_twice() -> None:
    cap = draviews.DraCapture(1, [resource_slice("n1", gpu_device(0, "GPU-n1-0"))], [])
    exp = exposition.GpuExposition(pod_series=True)
    text = exp.render(exp.snapshot(_state(), lambda: cap)).decode()
    assert text.count('hami_gpu_memory_limit_bytes{device_index="0",device_type') == 1


@pytest.mark.parametrize(
    ("error", "kinds"),
    [
        (
            errors.KubeError("resourceclaims is forbidden", status=403, reason="Forbidden"),
            ("resourceclaims",),
        ),
        (errors.NotFound("the server could not find the requested resource", status=404), DRA_KINDS),
    ],
    ids=["claims-forbidden", "not-served"],
)
async def test_readiness_and_filters_do_not_wait_for_the_dra_watches(
    error: Exception, kinds: tuple[str, ...]
) -> None:
    """An API server without resource.k8s.io/v1, or a chart without the RBAC for the claims (which
    only the views read; the DRA webhook reads ResourceSlices too, for its templates): the
    scheduler still becomes ready and filters; the views show the extender's nodes only."""
    store = Store(clock=FakeClock().wall)
    cluster = Cluster(api=DraFeed(store, {}, error=error, error_kinds=kinds))
    cluster.store = store
    cluster.add_node("n1", gpus("n1", 1))
    await cluster.start()
    try:
        assert cluster.service is not None
        async with cluster.session.get(f"{cluster.url}/ui/state") as resp:  # type: ignore[union-attr]
            state = await resp.json()
        assert [n["name"] for n in state["nodes"]] == ["n1"]
    finally:
        await cluster.stop()


class CountingFeed(DraFeed):
    """Counts the lists and watches asked of each kind."""

    def __init__(self, store: Store, objects: dict[str, list[dict[str, Any]]]) -> None:
        super().__init__(store, objects)
        self.lists: list[str] = []
        self.watches: list[str] = []

    async def list(self, kind: Kind, **kwargs: Any) -> ObjectList:
        self.lists.append(kind)
        return await super().list(kind, **kwargs)

    async def watch(self, kind: Kind, **kwargs: Any) -> AsyncIterator[WatchEvent]:  # type: ignore[override]
        self.watches.append(kind)
        async for event in super().watch(kind, **kwargs):
            yield event


async def test_the_webhook_and_the_views_share_one_watch_of_the_slices() -> None:
    """One list and one watch of ResourceSlices feed both the views and the webhook's GPU sizes,
    which are known once the scheduler is ready (readiness waits for that list)."""
    store = Store(clock=FakeClock().wall)
    feed = CountingFeed(store, _objects())
    cluster = Cluster(api=feed)
    cluster.store = store
    cluster.add_node("n1", gpus("n1", 1))
    await cluster.start()
    try:
        assert cluster.service is not None
        keeper, views = cluster.service.dra_templates, cluster.service.dra
        assert keeper.memory_sizes_mib() == (16000,)  # the other driver's slice is not ours
        await cluster.until(lambda: "resourceslices" in feed.watches)
        feed.send(
            "resourceslices", "ADDED", resource_slice("dra-2", gpu_device(0, "GPU-e0", memory_mib=40960))
        )
        await cluster.until(lambda: keeper.memory_sizes_mib() == (16000, 40960))
        assert len(views.capture().slices) == 2
        feed.send("resourceslices", "DELETED", _objects()["resourceslices"][0])
        await cluster.until(lambda: keeper.memory_sizes_mib() == (40960,))
        assert (feed.lists.count("resourceslices"), feed.watches.count("resourceslices")) == (1, 1)
    finally:
        await cluster.stop()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@pytest.mark.timeout(120)
async def test_the_page_marks_dra_nodes_and_shows_their_shares(tmp_path: Path) -> None:
    """In headless Chromium: the DRA node's row says DRA, its GPU cell counts shares (no slot
    total) and lists the claims' pods; a claim allocated later appears without a reload."""
    assert CHROMIUM is not None
    store = Store(clock=FakeClock().wall)
    feed = DraFeed(store, _objects())
    cluster = Cluster(api=feed)
    cluster.store = store
    cluster.add_node("n1", gpus("n1", 1))
    await cluster.start()
    try:
        async with Browser.launch(CHROMIUM, tmp_path / "profile") as browser:
            page = await browser.new_page(width=1280, height=620)
            await page.navigate(f"{cluster.url}/ui")
            cell = 'td.gpu[data-node="dra-1"][data-index="0"]'
            text = await wait_for(page, f"document.querySelector('{cell}')?.textContent")
            assert "shares 2/10" in text and "slots" not in text
            assert (
                await page.evaluate("document.querySelector('tr[data-mode=\"dra\"] th').textContent")
                == "dra-1DRA"
            )
            pods = f"[...document.querySelectorAll('{cell} li[data-pod]')].map((li) => li.dataset.pod)"
            assert await page.evaluate(pods) == ["team/infer", "team/train"]
            assert "slots 0/10" in await page.evaluate(
                "document.querySelector('td.gpu[data-node=\"n1\"]').textContent"
            )
            await page.evaluate("window.loadedOnce = true")
            late = claim("team", "late-vgpu-0", result("dra-1", 0, memory="1000Mi"), reserved=("late",))
            feed.send("resourceclaims", "ADDED", late)
            await wait_for(page, f"document.querySelectorAll('{cell} li[data-pod]').length === 3")
            assert await page.evaluate("window.loadedOnce === true"), "the page was reloaded"
            # a claim whose allocation cannot be read is listed, not dropped
            feed.send("resourceclaims", "ADDED", claim("team", "junk", result("dra-1", 0, memory="lots")))
            junk = await wait_for(page, "document.querySelector('#dra-warnings li')?.textContent")
            assert junk.startswith("ResourceClaim team/junk: ")
    finally:
        await cluster.stop()


def test_objects_are_read_again_only_when_the_informer_replaced_them() -> None:
    reads: list[str] = []

    def read(obj: object) -> str:
        assert isinstance(obj, dict)
        reads.append(obj["metadata"]["name"])
        return str(obj["metadata"]["name"])

    memo = draviews.Memo(read)
    a, b = {"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}
    assert memo.all([a, b]) == ["a", "b"]
    b2 = {"metadata": {"name": "b"}}  # the informer's new object for b
    assert memo.all([a, b2]) == ["a", "b"]
    assert reads == ["a", "b", "b"]
    assert memo.all([b2]) == ["b"] and memo.all([a]) == ["a"]  # a was dropped, so read again
    assert reads == ["a", "b", "b", "a"]


async def test_one_build_per_generation_shared_by_the_views() -> None:
    feed = DraFeed(Store(), _objects())
    async with running(feed) as views:
        first = views.capture().usage()
        assert views.capture().usage() is first  # the dashboard's and /metrics' captures share it
        late = claim(
            "team",
            "late-vgpu-0",
            result("dra-1", 1, memory="1000Mi", cores="1"),
            reserved=("late",),
            asks={"gpu": None},
        )
        feed.send("resourceclaims", "ADDED", late)
        await _until(lambda: views.claims.get("team", "late-vgpu-0") is not None)
        again = views.capture().usage()
        assert again is not first and [h.pod for h in again.nodes["dra-1"].holders["GPU-d1"]] == ["late"]
