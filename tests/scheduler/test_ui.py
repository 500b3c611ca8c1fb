"""The dashboard over real HTTP: the page, the JSON snapshot, the event stream and its limits."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import operator
import re
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yarl
from aiohttp import web
from aiohttp.test_utils import TestClient
from vgpu.core.config import Config
from vgpu_scheduler import app as app_mod
from vgpu_scheduler import livefeed, routes, ui
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.state import ClusterState

from tests.scheduler.scenario import Cluster, FakeClock, gpu_container

UI_ROUTES = [r for r in routes.SERVICE_ROUTES if r[1].startswith("/ui")]
REPO = Path(__file__).resolve().parents[2]


async def next_state(resp: aiohttp.ClientResponse, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """The next ``state`` event of an SSE stream (comments and other fields skipped)."""
    event, data = "message", ""
    async with asyncio.timeout(timeout_s):
        while True:
            raw = await resp.content.readline()
            if not raw:
                raise EOFError("the event stream ended")
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                data += line[len("data: ") :]
            elif not line and data:
                if event == "state":
                    got: dict[str, Any] = json.loads(data)
                    return got
                event, data = "message", ""


async def until_state(resp: aiohttp.ClientResponse, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    while not done(snap := await next_state(resp)):
        pass
    return snap


def pods_on(snap: dict[str, Any]) -> dict[str, list[str]]:
    return {
        f"{n['name']}/{g['index']}": [f"{p['namespace']}/{p['name']}" for p in g["pods"]]
        for n in snap["nodes"]
        for g in n["gpus"]
    }


def test_the_page_is_package_data_so_an_installed_wheel_has_it() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    package = REPO / "services" / "vgpu_scheduler"
    shipped = {p for pattern in setuptools["package-data"]["vgpu_scheduler"] for p in package.glob(pattern)}
    assert package / "static" / "dashboard.html" in shipped


# --- the service's own routes (the conftest cluster: node-a, node-b, scheduler over HTTP) ------


async def test_page_is_self_contained_and_its_csp_allows_exactly_its_script(cluster: Cluster) -> None:
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/ui") as resp:
        assert resp.status == 200 and resp.content_type == "text/html"
        page = await resp.text()
        csp = resp.headers["Content-Security-Policy"]
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert page.startswith("<!DOCTYPE html>")
    # nothing fetched from elsewhere: no external scripts, styles, fonts or images
    assert not re.search(r"<script [^>]*src=|<link|@import|url\(|https?://", page)
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.DOTALL)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}';" in csp
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert 'new EventSource("ui/events")' in scripts[0]
    # names and reasons (which can quote raw annotation values) only ever become text, never markup
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(", scripts[0])


async def test_state_is_the_snapshot_and_shows_a_filter_failure_then_a_placement(cluster: Cluster) -> None:
    assert cluster.session is not None
    cluster.add_pod("huge", gpu_container(mem=10_000_000))
    cluster.add_pod("small", gpu_container(mem=3000, cores=20))
    await cluster.synced()
    assert (await cluster.filter("huge"))["NodeNames"] == []
    assert (await cluster.filter("small"))["NodeNames"] != []
    async with cluster.session.get(f"{cluster.url}/ui/state") as resp:
        assert resp.status == 200 and resp.content_type == "application/json"
        snap = await resp.json()
    assert [n["name"] for n in snap["nodes"]] == ["node-a", "node-b"]
    assert all(n["problem"] is None for n in snap["nodes"])
    pending = {p["name"]: p for p in snap["pending"]}
    assert pending["huge"]["reason"].startswith("0/2 nodes fit: ")
    assert pending["huge"]["reasonAt"] == cluster.clock()
    assert pending["small"]["reason"].endswith("waiting for the bind")
    held = [pods for pods in pods_on(snap).values() if pods]
    assert held == [["default/small"]]


async def test_garbage_requests_get_the_same_answer_or_a_clear_refusal(cluster: Cluster) -> None:
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/ui/state") as resp:
        plain = await resp.json()
    garbage = ("?%ff%fe=%00", "?a=b&&&=&;;", "?" + "x" * 4000, "?generation=-1&at=NaN&lastEventId=zz")
    for query in garbage:
        url = yarl.URL(f"{cluster.url}/ui/state{query}", encoded=True)
        async with cluster.session.get(
            url, headers={"Last-Event-ID": '-1;; "zz" é', "Accept": "x/%%"}
        ) as resp:
            assert resp.status == 200, query
            got = await resp.json()
        assert {k: v for k, v in got.items() if k != "at"} == {k: v for k, v in plain.items() if k != "at"}
        async with cluster.session.get(yarl.URL(f"{cluster.url}/ui{query}", encoded=True)) as resp:
            assert resp.status == 200 and "<!DOCTYPE html>" in await resp.text()
    for method in ("POST", "PUT", "DELETE", "PATCH"):  # read-only
        for path in ("/ui", "/ui/state", "/ui/events"):
            async with cluster.session.request(method, f"{cluster.url}{path}", data=b"{}") as resp:
                assert resp.status == 405, (method, path)
    async with cluster.session.get(f"{cluster.url}/ui/nothing") as resp:
        assert resp.status == 404


async def test_events_push_each_change_without_asking(cluster: Cluster) -> None:
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/ui/events") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        first = await next_state(resp)
        assert all(not pods for pods in pods_on(first).values())
        cluster.add_pod("live", gpu_container(mem=5000))
        await cluster.synced()
        await cluster.filter("live")
        snap = await until_state(resp, lambda s: ["default/live"] in pods_on(s).values())
        assert snap["generation"] > first["generation"]
        cluster.add_node("node-c", lease=False)  # a node whose device plugin never reported
        snap = await until_state(resp, lambda s: "node-c" in {n["name"] for n in s["nodes"]})
        assert {n["name"]: n["problem"] for n in snap["nodes"]}["node-c"] == (
            "device plugin not reporting (no lease)"
        )


async def test_stop_ends_open_streams_at_once() -> None:
    c = Cluster()
    c.add_node("node-a")
    await c.start()
    try:
        assert c.session is not None and c.service is not None
        board = c.service.services.dashboard
        assert board is not None
        async with c.session.get(f"{c.url}/ui/events") as resp:
            await next_state(resp)
            started = time.monotonic()
            await c.service.stop()
            stopped_s = time.monotonic() - started
            assert await resp.content.read() == b""  # the stream ended cleanly (EOF), nothing more
        # without ending the streams, aiohttp would wait its shutdown timeout for the handler
        assert stopped_s < app_mod.SHUTDOWN_TIMEOUT_S
        assert len(board.feed) == 0 and board.feed.idle.is_set()
    finally:
        await c.stop()


# --- the limits, on an app holding only the dashboard -----------------------------------------


async def board_client(
    aiohttp_client: Any, state: ClusterState | None = None, **limits: Any
) -> tuple[TestClient[Any, Any], ui.Dashboard]:
    state = state or ClusterState(Config(), clock=FakeClock())
    board = ui.Dashboard(state, FilterReasons(), clock=FakeClock(), **limits)
    app = web.Application()
    app[ui.DASHBOARD] = board
    for method, path, handler in UI_ROUTES:
        app.router.add_route(method, path, handler)

    async def end(_: web.Application) -> None:
        await board.aclose()

    app.on_shutdown.append(end)
    client: TestClient[Any, Any] = await aiohttp_client(app)
    return client, board


async def test_clients_are_capped_and_a_gone_client_frees_its_place(aiohttp_client: Any) -> None:
    client, board = await board_client(aiohttp_client, max_clients=1, keepalive_s=0.05)
    first = await client.get("/ui/events")
    await next_state(first)
    async with client.get("/ui/events") as refused:
        assert refused.status == 503 and refused.headers["Retry-After"] == "10"
        assert "1 clients are connected already" in await refused.text()
    first.close()  # the browser tab goes away: the next keep-alive write fails
    await asyncio.wait_for(board.feed.idle.wait(), 10)
    assert len(board.feed) == 0
    async with client.get("/ui/events") as again:
        assert again.status == 200
        await next_state(again)


async def test_a_burst_of_changes_is_one_event(aiohttp_client: Any) -> None:
    client, board = await board_client(aiohttp_client, debounce_s=0.05, refresh_s=60)
    async with client.get("/ui/events") as resp:
        first = await next_state(resp)
        for i in range(50):  # 50 changes in one go, before the feed's task runs
            board.state.apply("nodes", "ADDED", {"metadata": {"name": f"n{i}", "annotations": {}}})
        snap = await next_state(resp)
        assert len(snap["nodes"]) == 50 and snap["generation"] == first["generation"] + 50
        assert board.feed.renders == 1


# --- the feed itself ----------------------------------------------------------------------------


async def test_feed_debounces_skips_unchanged_values_and_refreshes() -> None:
    values = iter([1, 1, 2])
    rendered = asyncio.Event()

    async def render() -> int:
        rendered.set()
        return next(values)

    feed: livefeed.Feed[int] = livefeed.Feed("t", render, same=operator.eq, debounce_s=0.01, refresh_s=60)
    sub = feed.subscribe(0)
    for _ in range(100):
        feed.poke()
    assert await sub.next(5) == 1 and feed.renders == 1
    rendered.clear()
    feed.poke()
    await rendered.wait()  # rendered 1 again: the offers are made before the task waits again
    await asyncio.sleep(0)
    assert sub.waiting == 0 and feed.renders == 2  # same as the last one sent: nothing sent
    feed.poke()
    assert await sub.next(5) == 2
    await feed.unsubscribe(sub)
    assert feed.idle.is_set()


async def test_feed_refreshes_without_a_poke() -> None:
    counter = iter(range(1, 100))

    async def render() -> int:
        return next(counter)

    feed: livefeed.Feed[int] = livefeed.Feed("t", render, same=operator.eq, refresh_s=0.01)
    sub = feed.subscribe(0)
    assert await sub.next(5) == 1 and await sub.next(5) == 2
    await feed.aclose()
    assert await sub.next(5) is None  # aclose tells the subscriber to stop
    await feed.unsubscribe(sub)


async def test_a_slow_client_loses_the_oldest_messages_not_the_newest() -> None:
    sub: livefeed.Subscriber[int] = livefeed.Subscriber(queue_size=2)
    for value in range(5):
        sub.offer(value)
    assert sub.dropped == 3 and sub.waiting == 2
    assert [await sub.next(1), await sub.next(1)] == [3, 4]
    with pytest.raises(TimeoutError):
        await sub.next(0.01)


async def test_a_failing_render_is_logged_and_the_feed_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0
    failed = asyncio.Event()

    async def render() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            failed.set()
            raise RuntimeError("bug")
        return calls

    feed: livefeed.Feed[int] = livefeed.Feed("t", render, same=operator.eq, debounce_s=0)
    sub = feed.subscribe(0)
    with caplog.at_level(logging.ERROR):
        feed.poke()
        await failed.wait()
        feed.poke()
        assert await sub.next(5) == 2
    assert "live feed t: rendering failed" in caplog.text
    await feed.unsubscribe(sub)


def test_feed_refuses_nonsense_limits() -> None:
    async def render() -> int:
        return 0

    for bad in (
        {"max_subscribers": 0},
        {"queue_size": 0},
        {"debounce_s": -1},
        {"refresh_s": 0},
        {"busy_share": 0},
        {"busy_share": 1.5},
    ):
        with pytest.raises(ValueError, match="max_subscribers"):
            livefeed.Feed("t", render, same=operator.eq, **bad)


async def test_a_slow_render_makes_the_feed_push_less_often() -> None:
    """A render of r seconds is followed by none for r / busy_share (here 20 ms -> 400 ms)."""
    loop = asyncio.get_running_loop()
    began: list[float] = []

    async def render() -> int:
        began.append(loop.time())
        await asyncio.sleep(0.02)  # stands for 20 ms of building a snapshot
        return len(began)

    feed: livefeed.Feed[int] = livefeed.Feed(
        "t", render, same=operator.eq, debounce_s=0, refresh_s=60, busy_share=0.05
    )
    sub = feed.subscribe(0)
    feed.poke()
    assert await sub.next(5) == 1
    feed.poke()
    assert await sub.next(5) == 2
    assert began[1] - began[0] >= 0.4 - 0.005
    await feed.unsubscribe(sub)


async def test_frames_are_shared_until_the_state_or_a_reason_changes() -> None:
    clock = FakeClock()
    state = ClusterState(Config(), clock=clock)
    reasons = FilterReasons()
    board = ui.Dashboard(state, reasons, clock=clock)
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [gpu_container(mem=100)]},
    }
    state.apply("pods", "ADDED", pod)
    first = await board.frame()
    assert await board.frame() is first  # nothing changed: the same bytes for every client
    reasons.failed("u", "0/0 nodes fit: no candidate nodes", now=clock())
    second = await board.frame()
    assert second is not first
    assert json.loads(second.data)["pending"][0]["reason"] == "0/0 nodes fit: no candidate nodes"
    clock.now += ui.REFRESH_S  # what the page shows ages (Lease ages): rebuilt after refresh_s
    assert await board.frame() is not second


async def test_a_new_filter_reason_alone_is_pushed(aiohttp_client: Any) -> None:
    client, board = await board_client(aiohttp_client, debounce_s=0, refresh_s=60)
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [gpu_container(mem=100)]},
    }
    board.state.apply("pods", "ADDED", pod)
    async with client.get("/ui/events") as resp:
        first = await next_state(resp)
        assert first["pending"][0]["reason"].startswith("no filter call yet")
        board.reasons.failed("u", "0/1 nodes fit: 1 no GPU with 100 MiB free (n)", now=0.0)
        snap = await next_state(resp)
        assert snap["pending"][0]["reason"] == "0/1 nodes fit: 1 no GPU with 100 MiB free (n)"
        assert snap["generation"] == first["generation"]  # the state itself did not change
