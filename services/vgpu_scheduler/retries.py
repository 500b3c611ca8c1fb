"""Retries kube-scheduler owes a pending pod when GPUs it fits come free or come back
(docs/scheduler.md, "Filter retries").

kube-scheduler does not count GPU slices (the extender's resources are ignored by it), so it learns
that a pod ``/filter`` turned away may fit now only from events it schedules by:

- A pod that goes (deleted, or finished: its informer leaves out Succeeded and Failed pods) makes
  it retry its unschedulable pods, but its view and this scheduler's come from two watches: when
  its ``/filter`` call for a pending pod arrives before our watch has shown the change, the pod fails
  against GPUs that are already free. Our watch is usually milliseconds behind.
- GPUs that come back on a node change annotations and Leases only, which it does not schedule by
  (it moves its unschedulable pods for a node's labels, taints, allocatable and conditions): a GPU
  healthy again or uncordoned, a node's register annotation repaired, less memory used outside
  kube-vgpu, a device plugin reporting again after its Lease went stale.

Either way the pod waits with the unschedulable ones until the next event that moves them, or the
periodic retry of them (v1.20: once a pod has been unschedulable for 60 s, checked every 30 s; later
versions: 5 minutes, ``podMaxInUnschedulablePodsDuration``). So whenever the state says GPUs on a
node may have come free (``ClusterState.on_freed``), the pending pods whose last ``/filter`` failed
and whose request fits on that node now (its GPUs, and its namespace's GPU quota) get a write
kube-scheduler sees as an update of the pod: the annotation ``kube-vgpu.io/filter-retry`` set to the
time. After a pod went, only those that failed in the ``WINDOW_S`` before (kube-scheduler retries
the others itself); after GPUs came back, every one, however long ago it failed. kube-scheduler then
retries it: v1.20's ``PriorityQueue.Update`` moves an updated pod out of the unschedulable ones, and
adds one that is in its scheduling cycle to activeQ; later versions requeue it after its back-off,
since no in-tree plugin rejected it. A pod is nudged at most once per ``MIN_INTERVAL_S``, at most
``MAX_PER_RELEASE`` pods per release and ``MAX_PER_S`` a second in all, the highest priority first,
then the latest failure; only the ``MAX_EXAMINED`` latest failures are looked at per release. The
writes are fire-and-forget (a failed one is logged, and kube-scheduler's own retry remains).

Every pod that fits is nudged, not just as many as the freed GPUs could take: kube-scheduler can
rule a pod out of the node for reasons this scheduler does not see (a node selector, taints), and
the pod left out could be the one that fits there.

**After a start** (``sweep``, once the state has synced) the scheduler knows no pod's last failure:
the reasons live in memory. The pods kube-scheduler parked meanwhile (``PodScheduled=False``, kept
by the pods' watch for unbound pods) include every GPU pod it tried while this scheduler was down or
restarting: their ``/filter`` failed with a refused connection, an error that v1.20 parks at once
for as long as any unschedulable pod (checked against the real v1.20; later versions may retry
errors with back-off instead; the emulation parks a pod after five errors in a row). Until the state
has synced, ``/filter`` and ``/bind`` answer with an error (an empty or half-listed state would put
pods on GPUs that are full), which kube-scheduler parks alike. So each pending GPU pod of ours that
kube-scheduler has marked ``PodScheduled=False``, or whose call was refused that way, is nudged
once, ``SWEEP_PER_S`` a second (the highest priority first, then the oldest), skipping those that a
``/filter`` has seen since the start: a pod that fits runs now, and one that does not fails again,
which gives it its reason back for the retries above.

**After a failed bind** (``bind_failed``: the node's lock not released in ``bindLockWaitS``, the
pod no longer fitting there, an API error on the Binding) kube-scheduler v1.20 puts the pod among
the unschedulable ones unless some cluster event came during its cycle (later versions, by their
code, move their queue when they forget the pod and so back it off; not run here). Its first
failure writes the pod's ``PodScheduled`` condition, and that write (the managedFields it changes)
counts as an update of the pod, so v1.20 retries it at once; a second failure with the same message
writes nothing, and the pod waits 60-90 s though the cause (a lock released, a GPU back) may be
gone in a second: neither is an event it moves pods for (checked against the real v1.20). So each
failed bind is followed by a nudge after a back-off, as later versions retry it:
``BIND_RETRY_INITIAL_S`` doubled per failure in a row, at most ``BIND_RETRY_MAX_S``
(kube-scheduler's default pod back-off); a failure more than ``BIND_FAILURES_FORGOTTEN_S`` after
the one before starts the count again. The nudge is skipped when kube-scheduler has tried the pod
again meanwhile (a ``/filter`` since the failure, a decision held) or the pod is bound or gone, and
it waits for the next second when ``MAX_PER_S`` is spent.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import itertools
import logging
from collections.abc import Awaitable, Callable, Container, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vgpu.core import errors, fit, goscalars, quota
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_scheduler import nominated
from vgpu_scheduler.pending import Ask, FilterReasons

if TYPE_CHECKING:
    from vgpu_scheduler.state import ClusterState

log = logging.getLogger(__name__)

RETRY_ANNOTATION = "kube-vgpu.io/filter-retry"
WINDOW_S = 2.0  # after a pod went: far longer than our watch's lag behind kube-scheduler's
MIN_INTERVAL_S = 5.0
MAX_PER_RELEASE = 20
MAX_PER_S = 20
MAX_EXAMINED = 200  # the latest failures looked at per release: bounds what one release costs
SWEEP_PER_S = 10  # the sweep after a start: half of MAX_PER_S, the rest left to releases
BIND_RETRY_INITIAL_S = 1.0  # after a failed bind: kube-scheduler's podInitialBackoffSeconds
BIND_RETRY_MAX_S = 10.0  # its podMaxBackoffSeconds
BIND_FAILURES_FORGOTTEN_S = 60.0  # a bind failure this long after the last one counts as the first


@dataclass
class _BindFailures:
    """One pod's bind failures in a row: how many, the last one's time, and the nudge waiting for
    its back-off to pass."""

    count: int
    last_s: float
    timer: asyncio.Task[None]


class FilterRetries:
    """``freed(node)``: GPUs on ``node`` came free or came back; nudge the pending pods that fit there
    now. ``sweep``: once after a start. ``bind_failed(uid)``: a nudge after the pod's back-off."""

    def __init__(
        self,
        *,
        api: KubeApi,
        reasons: FilterReasons,
        state: ClusterState,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime.datetime],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._api = api
        self._reasons = reasons
        self._state = state
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._nudged: dict[str, float] = {}  # uid -> when it was last nudged (``clock``)
        self._last_second: collections.deque[float] = collections.deque()  # nudges in the last second
        self._tasks: set[asyncio.Task[None]] = set()
        self._bind_failures: dict[str, _BindFailures] = {}  # uid -> its failures in a row
        self.sent = 0  # nudges the API server took
        self.failed = 0  # nudges it did not

    def freed(self, node: str, pod_went: bool = False) -> None:
        """GPUs on ``node`` came free or came back. ``pod_went``: a pod there went (deleted or
        finished), which kube-scheduler sees too and retries its parked pods for; then only the
        pods that failed in the ``WINDOW_S`` before may have raced it, and only those are nudged."""
        now = self._clock()
        self._nudged = {uid: at for uid, at in self._nudged.items() if now - at < MIN_INTERVAL_S}
        budget = min(MAX_PER_RELEASE, self._left_this_second(now))
        if budget <= 0 or not len(self._reasons):
            return
        view = self._state.inventory.live_view(node, now)
        if view is None:
            return  # no schedulable GPUs there (no Lease, a corrupt annotation): nothing to offer
        fits: dict[Ask, bool] = {}  # the full fit, once per distinct request (replicas ask alike)
        pods, nudged = self._state.pods, self._nudged
        due: list[tuple[int, int, str, JsonObj, Ask]] = []  # (-priority, latest failure first, ...)
        since = now - WINDOW_S if pod_went else float("-inf")
        for order, (uid, reason) in enumerate(itertools.islice(self._reasons.newest(), MAX_EXAMINED)):
            ask = reason.ask
            if ask is None or reason.at_s < since or uid in nudged:
                continue
            if ask.simple is not None:
                if not ask.simple(view):  # the common case: a few comparisons
                    continue
            else:
                ok = fits.get(ask)
                if ok is None:
                    ok = fits[ask] = ask.fits(view)
                if not ok:
                    continue
            pod = pods.get(uid)
            if pod is None or _placed_or_going(pod):
                continue
            due.append((-nominated.priority(pod), order, uid, pod, ask))
        due.sort(key=lambda d: d[:2])
        taken = 0
        for _, _, uid, pod, ask in due:
            if taken >= budget:
                break
            ns = str((pod.get("metadata") or {}).get("namespace") or "default")
            if self._state.quota.pod_problem(ask.request, namespace=ns, uid=uid) is not None:
                continue
            if quota.needs_placement_check(ask.request) and not self._within_quota(ask, view, ns, uid):
                continue  # what the filter would find: no placement here keeps the namespace's quota
            taken += 1
            self._spawn(
                uid, pod, f"node {node} has room for it now, which it did not have at its last /filter", now
            )

    def ask_retry(self, uid: str, pod: JsonObj, why: str) -> bool:
        """Nudge ``pod`` now (the own preemption path freed a node for it), unless it was nudged in
        the last ``MIN_INTERVAL_S`` or this second's nudges are spent; whether it was sent."""
        now = self._clock()
        last = self._nudged.get(uid)
        if (last is not None and now - last < MIN_INTERVAL_S) or self._left_this_second(now) <= 0:
            return False
        self._spawn(uid, pod, why, now)
        return True

    def _within_quota(self, ask: Ask, view: fit.NodeGpus, ns: str, uid: str) -> bool:
        placed = fit.fit_pod(ask.request, view, gpu_policy=ask.gpu_policy)
        if isinstance(placed, fit.Miss):
            return False
        within = self._state.quota.placement_within(
            ask.request, view, placed, gpu_policy=ask.gpu_policy, namespace=ns, uid=uid
        )
        return not isinstance(within, str)

    def _left_this_second(self, now: float) -> int:
        """How many more nudges ``MAX_PER_S`` allows in the second up to ``now``."""
        while self._last_second and now - self._last_second[0] >= 1.0:
            self._last_second.popleft()
        return MAX_PER_S - len(self._last_second)

    def _spawn(self, uid: str, pod: JsonObj, why: str, now: float) -> None:
        self._nudged[uid] = now
        self._last_second.append(now)
        self._track(self._nudge(pod, why))

    def _track(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def bind_failed(self, uid: str) -> float:
        """The pod's ``/bind`` failed: nudge it once its back-off has passed, unless kube-scheduler
        has tried it again by then (see the module docstring); returns the back-off in seconds."""
        now = self._clock()
        for old_uid in [u for u, f in self._bind_failures.items() if f.timer.done()]:
            if now - self._bind_failures[old_uid].last_s >= BIND_FAILURES_FORGOTTEN_S:
                del self._bind_failures[old_uid]
        before = self._bind_failures.pop(uid, None)
        count = 1
        if before is not None:
            before.timer.cancel()  # superseded: the back-off starts from this failure
            if now - before.last_s < BIND_FAILURES_FORGOTTEN_S:
                count = before.count + 1
        delay = min(BIND_RETRY_INITIAL_S * 2.0 ** min(count - 1, 30), BIND_RETRY_MAX_S)
        timer = self._track(self._after_bind_failure(uid, count, now, delay))
        self._bind_failures[uid] = _BindFailures(count, now, timer)
        return delay

    async def _after_bind_failure(self, uid: str, count: int, failed_at: float, delay: float) -> None:
        await self._sleep(delay)
        while True:
            pod = self._state.pods.get(uid)
            if pod is None or _placed_or_going(pod) or self._state.decision(uid) is not None:
                return  # bound, gone, or kube-scheduler's next attempt is under way
            reason = self._reasons.get(uid)
            if reason is not None and reason.at_s >= failed_at:
                return  # its /filter ran since and failed: the retries on GPUs freed take it from here
            now = self._clock()
            if self._left_this_second(now) > 0:
                break
            await self._sleep(1.0)
        times = "once" if count == 1 else f"{count} times in a row"
        self._spawn(uid, pod, f"its bind failed {times} (back-off {delay:g} s)", now)

    async def sweep(self, wants: Callable[[JsonObj], bool], refused: Container[str] = ()) -> int:
        """Once after a start: nudge every pending pod that ``wants`` says is ours and that
        kube-scheduler has marked ``PodScheduled=False`` or whose uid is in ``refused`` (its call
        answered with an error before the state synced), ``SWEEP_PER_S`` a second (see the module
        docstring); returns how many were nudged. ``wants`` (a parse of the pod's request) is asked
        as each pod's turn comes, so a long list of parked pods costs the loop little at a time."""
        started = self._clock()

        def due_now(uid: str, pod: JsonObj) -> bool:
            return (parked(pod) or uid in refused) and not _placed_or_going(pod)

        due = sorted(
            (-nominated.priority(pod), str(_meta(pod).get("creationTimestamp") or ""), uid)
            for uid, pod in self._state.pods.items()
            if due_now(uid, pod)
        )
        if not due:
            return 0
        log.info(
            "after the start: %d pending pods were marked unschedulable by kube-scheduler or refused "
            "before the sync; asking it to retry those asking for GPUs, once each, %d a second",
            len(due),
            SWEEP_PER_S,
        )
        taken, spent = 0, False
        for _, _, uid in due:
            if spent:  # this second's share is nudged: the next after a second
                await self._sleep(1.0)
                spent = False
            pod = self._state.pods.get(uid)
            if pod is None or not due_now(uid, pod):
                continue  # gone, or bound meanwhile
            reason = self._reasons.get(uid)
            if (reason is not None and reason.at_s >= started) or self._state.decision(uid) is not None:
                continue  # kube-scheduler has tried it since the start
            now = self._clock()
            if now - self._nudged.get(uid, float("-inf")) < MIN_INTERVAL_S or not wants(pod):
                continue  # nudged already, or not a GPU pod of ours
            taken += 1
            spent = taken % SWEEP_PER_S == 0
            why = "it was marked unschedulable" if parked(pod) else "its call was refused"
            self._spawn(uid, pod, f"{why} before this scheduler had synced", now)
        return taken

    async def _nudge(self, pod: JsonObj, why: str) -> None:
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        stamp = goscalars.format_rfc3339(self._wall_clock())
        patch: dict[str, Any] = {"metadata": {"annotations": {RETRY_ANNOTATION: stamp}}}
        try:
            await self._api.merge_patch("pods", name, patch, namespace=ns)
        except errors.KubeError as exc:
            self.failed += 1
            log.info("pod %s/%s: could not ask kube-scheduler to retry it: %s", ns, name, exc)
            return
        self.sent += 1
        log.info("pod %s/%s: %s; asking kube-scheduler to retry it", ns, name, why)

    async def flush(self) -> None:
        """Wait for the nudges under way, and for those waiting on a failed bind's back-off."""
        while pending := [task for task in self._tasks if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def parked(pod: JsonObj) -> bool:
    """kube-scheduler has tried the pod and set ``PodScheduled=False``: no node fitted, or its
    attempt failed (an extender unreachable); it waits among the unschedulable pods."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return isinstance(conditions, list) and any(
        isinstance(c, dict) and c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in conditions
    )


def _meta(obj: JsonObj) -> JsonObj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _placed_or_going(pod: JsonObj) -> bool:
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    return bool(spec.get("nodeName") or meta.get("deletionTimestamp"))
