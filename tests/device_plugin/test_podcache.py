"""InformerView: the node watch's changes reach the subscribed listeners (Allocate's late lock release); a pod change wakes GetPreferredAllocation's wait."""

from __future__ import annotations

import asyncio

from vgpu.kube.port import JsonObj
from vgpu_device_plugin.podcache import InformerView

from tests.device_plugin.builders import NODE, cluster


async def test_node_changes_reach_subscribers_until_they_unsubscribe() -> None:
    store, api = cluster()
    store.create("nodes", {"metadata": {"name": "another-node"}})
    view = InformerView(api, node=NODE)
    first: asyncio.Queue[JsonObj] = asyncio.Queue()
    second: asyncio.Queue[JsonObj] = asyncio.Queue()

    async def to_first(node: JsonObj) -> None:
        assert view.node() is node  # the cache already shows what the listener is told
        await first.put(node)

    async def to_second(node: JsonObj) -> None:
        await second.put(node)

    unsubscribe = view.subscribe_node(to_first)
    view.subscribe_node(to_second)
    task = asyncio.create_task(view.run())
    try:
        listed = await asyncio.wait_for(first.get(), 5)  # the first list
        assert listed["metadata"]["name"] == NODE and (await second.get()) is listed
        store.patch("nodes", NODE, {"metadata": {"annotations": {"a": "1"}}})
        changed = await asyncio.wait_for(first.get(), 5)
        assert changed["metadata"]["annotations"]["a"] == "1" and (await second.get()) is changed
        unsubscribe()
        store.patch("nodes", NODE, {"metadata": {"annotations": {"a": "2"}}})
        later = await asyncio.wait_for(second.get(), 5)  # listeners are told in turn: first's is over
        assert later["metadata"]["annotations"]["a"] == "2" and first.empty()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


CONTAINERS = [{"name": "main", "image": "x"}]


async def test_pods_changed_is_set_once_the_cache_shows_a_pod_of_this_node() -> None:
    store, api = cluster()
    view = InformerView(api, node=NODE)
    task = asyncio.create_task(view.run())
    try:
        await asyncio.wait_for(view.wait_synced(), 5)
        changed = view.pods_changed()
        store.create(
            "pods",
            {
                "metadata": {"name": "elsewhere"},
                "spec": {"nodeName": "another-node", "containers": CONTAINERS},
            },
            namespace="default",
        )
        store.create(
            "pods",
            {"metadata": {"name": "here"}, "spec": {"nodeName": NODE, "containers": CONTAINERS}},
            namespace="default",
        )
        await asyncio.wait_for(changed.wait(), 5)
        assert [p["metadata"]["name"] for p in view.pods()] == ["here"]
        assert not view.pods_changed().is_set()  # a fresh event for the next change
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
