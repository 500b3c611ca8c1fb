"""Retries kube-scheduler owes a pod whose ``/filter`` raced a deletion (docs/scheduler.md, "Filter
retries").

kube-scheduler retries its unschedulable pods when it sees a pod deleted, and its view and this
scheduler's come from two watches. When its ``/filter`` call for a pending pod arrives before our
watch has shown the deletion, the pod fails against GPUs that are already free, and kube-scheduler
parks it with the unschedulable pods until the next event that moves them, or its periodic retry
of them (v1.20: once a pod has been unschedulable for 60 s, checked every 30 s). So when the state
lets go of a pod's GPUs (the pod deleted or finished, as the watch shows it), each pod whose
``/filter`` failed in the ``WINDOW_S`` before gets a write kube-scheduler sees as an update of the
pod: the annotation ``kube-vgpu.io/filter-retry`` set to the time. kube-scheduler then retries it
at once: v1.20's ``PriorityQueue.Update`` moves an updated pod out of the unschedulable ones, and
adds one that is in its scheduling cycle to activeQ. A pod is nudged at most once per
``MIN_INTERVAL_S``, at most ``MAX_PER_RELEASE`` pods per release and ``MAX_PER_S`` a second in all
(a cluster with many pending pods and many finishing ones stays a few writes a second), the newest
failures first; the writes are fire-and-forget (a failed one is logged, and kube-scheduler's own
retry remains).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
from collections.abc import Callable
from typing import Any

from vgpu.core import errors, goscalars
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_scheduler.pending import FilterReasons

log = logging.getLogger(__name__)

RETRY_ANNOTATION = "kube-vgpu.io/filter-retry"
WINDOW_S = 2.0  # far longer than a watch's lag behind kube-scheduler's, far shorter than its retry
MIN_INTERVAL_S = 5.0
MAX_PER_RELEASE = 20
MAX_PER_S = 20


class FilterRetries:
    """``released(node)``: the state let go of GPUs on ``node``; nudge the pods that just failed."""

    def __init__(
        self,
        *,
        api: KubeApi,
        reasons: FilterReasons,
        pods: Callable[[str], JsonObj | None],
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime.datetime],
    ) -> None:
        self._api = api
        self._reasons = reasons
        self._pods = pods
        self._clock = clock
        self._wall_clock = wall_clock
        self._nudged: dict[str, float] = {}  # uid -> when it was last nudged (``clock``)
        self._last_second: collections.deque[float] = collections.deque()  # nudges in the last second
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0  # nudges the API server took

    def released(self, node: str) -> None:
        now = self._clock()
        self._nudged = {uid: at for uid, at in self._nudged.items() if now - at < MIN_INTERVAL_S}
        while self._last_second and now - self._last_second[0] >= 1.0:
            self._last_second.popleft()
        due: list[JsonObj] = []
        for uid, _ in self._reasons.recent(since=now - WINDOW_S):
            if len(due) >= MAX_PER_RELEASE or len(self._last_second) >= MAX_PER_S:
                break
            pod = self._pods(uid)
            if uid in self._nudged or pod is None or _placed_or_going(pod):
                continue
            self._nudged[uid] = now
            self._last_second.append(now)
            due.append(pod)
        for pod in due:
            task = asyncio.get_running_loop().create_task(self._nudge(pod, node))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _nudge(self, pod: JsonObj, node: str) -> None:
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        stamp = goscalars.format_rfc3339(self._wall_clock())
        patch: dict[str, Any] = {"metadata": {"annotations": {RETRY_ANNOTATION: stamp}}}
        try:
            await self._api.merge_patch("pods", name, patch, namespace=ns)
        except errors.KubeError as exc:
            log.info("pod %s/%s: could not ask kube-scheduler to retry it: %s", ns, name, exc)
            return
        self.sent += 1
        log.info(
            "pod %s/%s: its /filter failed just before GPUs on node %s came free; asking kube-scheduler "
            "to retry it",
            ns,
            name,
            node,
        )

    async def flush(self) -> None:
        """Wait for the nudges under way."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _placed_or_going(pod: JsonObj) -> bool:
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    return bool(spec.get("nodeName") or meta.get("deletionTimestamp"))
