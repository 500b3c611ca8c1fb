"""The emulated kubelet's admission order: pods bound to the node, oldest first.

``AdmissionQueue`` orders pods by creation time (arrival breaks ties) and hands them out one at a
time, as kubelet's ``HandlePodAdditions`` sorts its additions; ``kubeletadmit`` admits each.
"""

from __future__ import annotations

import asyncio
import heapq

from vgpu.kube.port import JsonObj


class AdmissionQueue:
    """Pods waiting for admission, oldest creationTimestamp first, arrival order among equals."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[str, int], str]] = []
        self._pods: dict[str, JsonObj] = {}
        self._changed = asyncio.Event()

    def put(self, uid: str, pod: JsonObj, order: tuple[str, int]) -> None:
        if uid not in self._pods:
            heapq.heappush(self._heap, (order, uid))
        self._pods[uid] = pod
        self._changed.set()

    def discard(self, uid: str) -> None:
        self._pods.pop(uid, None)

    async def next(self) -> JsonObj:
        while True:
            while self._heap:
                _, uid = heapq.heappop(self._heap)
                pod = self._pods.pop(uid, None)
                if pod is not None:
                    return pod
            self._changed.clear()
            await self._changed.wait()
