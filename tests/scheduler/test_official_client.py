"""The extender over the production adapter: the official kubernetes client against the emulated API
server (HTTP). Filter, bind with the lock's compare-and-swap, lock contention, restart and rebuild."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from vgpu.core import annotations
from vgpu.kube.client import OfficialKubeApi
from vgpu.kube.kubeconfig import write_kubeconfig
from vgpu.localcluster.apiserver import ApiServer

from tests.scheduler.scenario import Cluster, gpu_container

KEYS = annotations.KEYS


@pytest.fixture
async def http_cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster()
    server = ApiServer(c.store, host="127.0.0.1", port=0)
    await server.start()
    api = OfficialKubeApi.from_kubeconfig(str(write_kubeconfig(tmp_path / "kubeconfig", server=server.url)))
    c.api = api
    c.add_node("node-a")
    try:
        await c.start()
        yield c
    finally:
        await c.stop()
        await api.close()
        await server.stop()


@pytest.mark.slow
async def test_schedule_contend_bind_and_rebuild_over_http(http_cluster: Cluster) -> None:
    c = http_cluster
    for name in ("p1", "p2"):
        c.add_pod(name, gpu_container(mem=6000, cores=10))
    await c.synced()
    assert (await c.filter("p1"))["NodeNames"] == ["node-a"]
    assert (await c.filter("p2"))["NodeNames"] == ["node-a"]
    await c.synced()
    assert await c.bind("p1", "node-a") == ""
    await c.synced()
    second = asyncio.ensure_future(c.bind("p2", "node-a"))
    await c.until(lambda: bool(c.state._waiters.get("node-a")))
    assert not second.done()
    # the device plugin's part: success, lock deleted
    c.store.patch(
        "pods", "p1", {"metadata": {"annotations": {KEYS.bind_phase: "success"}}}, namespace="default"
    )
    c.store.patch("nodes", "node-a", {"metadata": {"annotations": {KEYS.node_lock: None}}})
    assert await asyncio.wait_for(second, 20) == ""
    assert c.pod("p2")["spec"]["nodeName"] == "node-a"
    await c.synced()
    before = dict(c.state.used("node-a"))
    assert sum(u.memory_mib for u in before.values()) == 12000
    await c.stop()
    await c.start()
    assert dict(c.state.used("node-a")) == before
