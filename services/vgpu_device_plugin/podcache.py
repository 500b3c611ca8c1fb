"""The device plugin's view of the cluster: this node's pods and this node, kept in memory by watches.

``ClusterView`` is the seam Allocate reads through (no API call on the hot path);
``InformerView`` implements it with two ``vgpu.kube.informer.Informer``s (pods with field
selector ``spec.nodeName=<node>``, the node with ``metadata.name=<node>``). ``NodeFeed`` is the
seam that tells a listener (the Allocate handler) of each node the watch delivers; ``PodFeed`` the
one that wakes a waiter (GetPreferredAllocation) when the watch delivers a pod change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from vgpu.kube.informer import Change, Informer
from vgpu.kube.port import JsonObj, KubeApi


class ClusterView(Protocol):
    def pods(self) -> Iterable[JsonObj]:
        """Every pod on this node (cached objects: do not modify)."""
        ...

    def pod(self, namespace: str, name: str) -> JsonObj | None: ...

    def node(self) -> JsonObj | None: ...


NodeListener = Callable[[JsonObj], Awaitable[None]]


class NodeFeed(Protocol):
    def subscribe_node(self, listener: NodeListener) -> Callable[[], None]:
        """Call ``listener`` with this node each time the watch delivers it (added or changed),
        after ``node()`` shows it; returns the call that unsubscribes."""
        ...


class PodFeed(Protocol):
    def pods_changed(self) -> asyncio.Event:
        """An event set when the watch next delivers a change of a pod on this node, after
        ``pods()`` shows it. Take it before reading ``pods()``, then wait on it: no change is missed."""
        ...


class InformerView:
    """ClusterView fed by watches. Run ``run()`` in a task; ``synced`` once both have listed."""

    def __init__(self, api: KubeApi, *, node: str) -> None:
        self.node_name = node
        self._pods = Informer(api, "pods", field_selector=f"spec.nodeName={node}", on_event=self._pod_changed)
        self._pod_event = asyncio.Event()
        self._nodes = Informer(
            api, "nodes", field_selector=f"metadata.name={node}", on_event=self._node_changed
        )
        self._node_listeners: list[NodeListener] = []

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._pods.run())
            tg.create_task(self._nodes.run())

    async def wait_synced(self) -> None:
        await self._pods.synced.wait()
        await self._nodes.synced.wait()

    def pods(self) -> Iterable[JsonObj]:
        return self._pods.items()

    def pod(self, namespace: str, name: str) -> JsonObj | None:
        return self._pods.get(namespace, name)

    def node(self) -> JsonObj | None:
        return self._nodes.get(None, self.node_name)

    def pods_changed(self) -> asyncio.Event:
        return self._pod_event

    def _pod_changed(self, change: Change) -> None:
        event, self._pod_event = self._pod_event, asyncio.Event()
        event.set()

    def subscribe_node(self, listener: NodeListener) -> Callable[[], None]:
        self._node_listeners.append(listener)
        return lambda: self._node_listeners.remove(listener)

    async def _node_changed(self, change: Change) -> None:
        if change.type == "DELETED":
            return
        for listener in list(self._node_listeners):
            await listener(change.object)
