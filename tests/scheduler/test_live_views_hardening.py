"""The live views under hostile or unlucky conditions: a dashboard client that stops reading, control
characters in what ``vgpu status`` prints, a pod left holding nothing, a filter reason the pods watch
has not caught up with."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import socket
from typing import Any

from vgpu.core import annotations as hami
from vgpu.core import config
from vgpu.core.config import Config
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu.status import snapshot, table
from vgpu_scheduler import dashboard, routes, ui
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.state import ClusterState

from tests.scheduler.scenario import T0, FakeClock, gpu_container, gpus
from tests.scheduler.test_ui import board_client

KEYS = hami.KEYS
UI_ROUTES = [r for r in routes.SERVICE_ROUTES if r[1].startswith("/ui")]


def big_state() -> ClusterState:
    """About 0.5 MB of snapshot: a few events fill a client's socket buffers."""
    state = ClusterState(Config(), clock=FakeClock())
    for i in range(300):
        register = hami.encode_node_register(gpus(f"n{i}", 8))
        name = f"node-{i:04d}-" + "x" * 200
        state.apply(
            "nodes", "ADDED", {"metadata": {"name": name, "annotations": {KEYS.node_register: register}}}
        )
    return state


async def test_a_client_that_stops_reading_loses_its_stream_and_frees_its_place(aiohttp_client: Any) -> None:
    """A client that keeps its connection open but reads nothing (a stopped process, a sleeping
    laptop behind a port-forward) must not hold one of the ``max_clients`` places forever: the write
    it does not take blocks the handler, so neither the keep-alive nor a new event ever ends it."""
    state = big_state()
    client, board = await board_client(
        aiohttp_client, state, max_clients=1, debounce_s=0, keepalive_s=0.1, write_timeout_s=0.5
    )
    loop = asyncio.get_running_loop()
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.setblocking(False)
    try:
        await loop.sock_connect(stuck, ("127.0.0.1", client.port))
        await loop.sock_sendall(stuck, b"GET /ui/events HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(20):
            assert (await loop.sock_recv(stuck, 12)) == b"HTTP/1.1 200"  # subscribed; reads no more
            assert len(board.feed) == 1
            i = 0
            while not board.feed.idle.is_set():  # new events until the server gives up on it
                i += 1
                state.apply("nodes", "ADDED", {"metadata": {"name": f"extra-{i}", "annotations": {}}})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(board.feed.idle.wait(), 0.05)
        async with client.get("/ui/events") as again:  # its place is free again
            assert again.status == 200
    finally:
        stuck.close()


# --- vgpu status ---------------------------------------------------------------------------------


async def test_status_escapes_control_characters_from_the_api_server() -> None:
    """Annotation values (a pod owner's, a node's device plugin's) reach an operator's terminal:
    escape sequences in them must be shown, not obeyed (cf. kubectl's CVE-2021-25743)."""
    store = Store()
    register = (
        '[{"id":"GPU-a","index":0,"count":10,"devmem":1000,"devcore":100,'
        '"type":"A100\\u001b[2J\\u001b]0;owned\\u0007","numa":0,"health":true}]'
    )
    store.create("nodes", {"metadata": {"name": "gpu-a", "annotations": {KEYS.node_register: register}}})
    store.create(
        "nodes",
        {
            "metadata": {
                "name": "gpu-c",
                "annotations": {KEYS.node_register: "[]", KEYS.node_plugin_error: "x\x1b[1Ay"},
            }
        },
    )
    notes = {
        "p": {KEYS.assigned_node: "gpu-a", KEYS.devices_allocated: "GPU-zz\x1b[1A\r,NVIDIA,10,0:;"},
        "q": {KEYS.assigned_node: "ghost\u202e\x1b[2J", KEYS.devices_allocated: "GPU-x,NVIDIA,10,0:;"},
    }
    for name, ann in notes.items():
        store.create(
            "pods",
            {
                "metadata": {"name": name, "namespace": "default", "annotations": ann},
                "spec": {"containers": [{"name": "c"}]},
            },
            namespace="default",
        )
    when = datetime.datetime(2026, 11, 23, 2, 0, 0, tzinfo=datetime.UTC)
    status = await snapshot.collect(LocalKubeApi(store), config=config.load(None), now=lambda: when)
    text = table.render(status)
    assert not any(ch in text for ch in "\x1b\x07\r\u202e"), repr(text)
    assert "A100\\x1b[2J\\x1b]0;owned\\x07" in text  # shown, escaped
    assert "device plugin has no GPUs: x\\x1b[1Ay" in text
    assert "GPU-zz\\x1b[1A\\r" in text and "ghost\\u202e\\x1b[2J" in text
    lines = text.splitlines()
    assert lines[0].startswith("kube-vgpu status at 2026-11-23 02:00:00 UTC") and lines[-1].startswith(
        "allocated:"
    )


# --- the snapshot ------------------------------------------------------------------------------


def test_a_pod_whose_gpus_were_only_for_its_finished_init_containers_holds_none() -> None:
    """Its charge stays (empty) once its regular init containers are done: the totals' "handed
    out to N pods" must not count it, as no GPU cell lists it."""
    state = ClusterState(Config(), clock=FakeClock())
    register = hami.encode_node_register(gpus("n1", 1))
    state.apply("nodes", "ADDED", {"metadata": {"name": "n1", "annotations": {KEYS.node_register: register}}})
    notes = {
        KEYS.assigned_node: "n1",
        KEYS.devices_allocated: "GPU-n1-0,NVIDIA,4000,30:;;",  # the init container's GPU, the app's none
        KEYS.bind_phase: "success",
    }
    warm_up = {
        "metadata": {"name": "warm-up", "namespace": "team", "uid": "u1", "annotations": notes},
        "spec": {"nodeName": "n1", "initContainers": [{"name": "init"}], "containers": [{"name": "app"}]},
        "status": {
            "phase": "Running",
            "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
        },
    }
    state.apply("pods", "ADDED", warm_up)
    snap = dashboard.snapshot(state, FilterReasons(), now=T0)
    assert [g["pods"] for n in snap["nodes"] for g in n["gpus"]] == [[]]
    assert (snap["totals"]["usedMib"], snap["totals"]["pods"]) == (0, 0)


async def test_showing_the_dashboard_keeps_a_filter_reason_the_pods_watch_has_not_caught_up_with() -> None:
    """The filter reads the pod from kube-scheduler's ExtenderArgs, so its reason may come before
    the pods watch shows the pod. A render in between must not drop it: the page would then say
    "no filter call yet", and retries.py, which reads the same reasons, would not nudge the pod
    when GPUs come free."""
    clock = FakeClock()
    state = ClusterState(Config(), clock=clock)
    reasons = FilterReasons()
    board = ui.Dashboard(state, reasons, clock=clock)
    reasons.failed("u", "0/1 nodes fit: 1 no GPU with 100 MiB free (n)", now=clock())
    clock.now += 1
    await board.frame()  # the page (or its feed) renders before the watch shows the pod
    assert reasons.get("u") is not None
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [gpu_container(mem=100)]},
    }
    state.apply("pods", "ADDED", pod)
    snap = json.loads((await board.frame()).data)
    assert snap["pending"][0]["reason"] == "0/1 nodes fit: 1 no GPU with 100 MiB free (n)"
    clock.now += ui.PRUNE_GRACE_S + 1
    state.apply("pods", "DELETED", pod)
    await board.frame()
    assert reasons.get("u") is None  # a pod that is gone still loses its reason


async def test_sixteen_clients_that_never_read_small_frames_do_not_hold_every_place(
    aiohttp_client: Any,
) -> None:
    """issue 49: small frames never fill the socket buffers, so a write never stalls and the write
    timeout never fires; every stream ends after ``max_stream_s`` and a new client gets a place."""
    client, board = await board_client(
        aiohttp_client, max_clients=16, debounce_s=0, keepalive_s=0.05, max_stream_s=0.5
    )
    loop = asyncio.get_running_loop()
    idle: list[socket.socket] = []
    try:
        async with asyncio.timeout(10):
            for _ in range(16):
                s = socket.socket()
                s.setblocking(False)
                idle.append(s)
                await loop.sock_connect(s, ("127.0.0.1", client.port))
                await loop.sock_sendall(s, b"GET /ui/events HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await loop.sock_recv(s, 12)) == b"HTTP/1.1 200"  # subscribed; reads no more
            assert len(board.feed) == 16
            async with client.get("/ui/events") as full:
                assert full.status == 503  # every place is held now
            await board.feed.idle.wait()  # each stream ended on its own
            async with client.get("/ui/events") as again:
                assert again.status == 200
                assert (await again.content.readuntil(b"\n\n")).startswith(b"retry: ")
    finally:
        for s in idle:
            s.close()
