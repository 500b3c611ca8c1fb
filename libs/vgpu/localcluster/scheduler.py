"""kube-scheduler emulation: pending pods of our profiles, in-tree filters, extenders, async binding.

``SchedulerEmulator`` follows pods and nodes with list+watch into memory (``schedcache``,
``schedhandlers``). Pods without ``spec.nodeName`` whose ``spec.schedulerName`` is one of its
profiles (``profiles[]`` of the KubeSchedulerConfiguration, ``schedconfig``, plus
``scheduler_name``) enter the scheduling queue (``schedqueue``).
As kube-scheduler does:

* the **scheduling cycle is serial**, one pod at a time: the in-tree filters over the nodes from the
  rotating start index until ``numFeasibleNodesToFind`` feasible ones are found
  (``percentageOfNodesToScore``, docs/protocol.md#how-kube-scheduler-calls-it), then each interested extender's filter in config
  order on the survivors, then, when more than one node is left, the LeastAllocated score with a
  random choice among the best (``selectHost``);
* the pod is then **assumed** on the node (its requests count at once) and its **binding cycle runs
  concurrently** in a task of its own (kube-scheduler's goroutine per pod): the first interested
  extender with a ``bindVerb`` binds, else the ``pods/binding`` subresource. The next pod's
  scheduling cycle starts immediately;
* a binding that fails (extender ``Error``, HTTP or API error) **forgets** the pod from the cache,
  counts as a cluster event (its resources are free again) and puts the pod back with back-off;
* a pod no node can take gets a ``FailedScheduling`` Warning event and ``PodScheduled=False`` (not
  re-written when unchanged) and waits among the unschedulable pods for a cluster event: a node
  added, a node change that matters to scheduling (not annotations), an assigned pod deleted or
  finished, a failed binding, or an update of the pod itself.

A pod no node can take then goes through PostFilter: DefaultPreemption with the extenders'
``preemptVerb`` (``preemption``, as the chosen kube-scheduler ``version`` does it), which may
delete lower-priority victims and nominate the pod; the FailedScheduling message then ends with
"preemption under way: ...".

Each bound pod's log line says where its scheduling time went: its wait in the active queue, its
scheduling cycle and its binding cycle (``bench/throughput_figures.py`` reads them). Events are
written in the background, as kube-scheduler's event broadcaster does. Not emulated:
the prioritize verb, score plugins other than LeastAllocated, PodDisruptionBudgets.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster import (
    dynamicresources,
    extender,
    intree,
    podresources,
    preemption,
    schedcache,
    schedconfig,
    schedhandlers,
    schedqueue,
    schedreport,
    statuswriter,
)

log = logging.getLogger(__name__)

CYCLE_REPORT = 500  # scheduling cycles per timing line in the log

PodKey = schedcache.PodKey


@dataclass(frozen=True, slots=True)
class _Timing:
    """Where a pod's scheduling time went before its binding cycle: its wait in activeQ, then its
    scheduling cycle (the in-tree search, the extenders' filters, the choice)."""

    queued_s: float
    cycle_s: float
    dra: dynamicresources.CycleState | None = None  # the pod's claims and their allocations


class SchedulerEmulator:
    """Schedules the pods of its profiles; see the module docstring."""

    def __init__(
        self,
        api: KubeApi,
        *,
        scheduler_config: Mapping[str, Any] | None,
        scheduler_name: str,
        status_writer: statuswriter.StatusWriter | None = None,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
        unschedulable_timeout_s: float = 300.0,
        rng: random.Random | None = None,
        version: str = preemption.DEFAULT_VERSION,
    ) -> None:
        """``version``: the kube-scheduler whose preemption is emulated (``preemption.Behaviour``)."""
        self.version = preemption.Behaviour.of(version)
        self._api = api
        self._status = statuswriter.resolve(api, status_writer)
        self.scheduler_name = scheduler_name
        self.profiles = frozenset([scheduler_name, *schedconfig.profile_names(scheduler_config)])
        self.percentage = schedconfig.percentage_of_nodes_to_score(scheduler_config)
        self.extenders = extender.parse_config(scheduler_config)
        self._ignored = {
            m.name for ext in self.extenders for m in ext.managed_resources if m.ignored_by_scheduler
        }
        self._client = extender.ExtenderClient(self.extenders)
        self._queue: schedqueue.SchedulingQueue[PodKey] = schedqueue.SchedulingQueue(
            initial_backoff_s=initial_backoff_s,
            max_backoff_s=max_backoff_s,
            unschedulable_timeout_s=unschedulable_timeout_s,
        )
        self.cache = schedcache.SchedulerCache()
        self._handlers = schedhandlers.EventHandlers(
            profiles=self.profiles, cache=self.cache, queue=self._queue
        )
        self._pods = informer.Informer(api, "pods", on_event=self._handlers.on_pod)
        self._nodes = informer.Informer(api, "nodes", on_event=self._handlers.on_node)
        self.dra = dynamicresources.DynamicResources(api, status_writer=self._status)
        self.dra.on_change = self._queue.move_all
        self._dra_state: dynamicresources.CycleState | None = None  # this cycle's
        self._prefilter_message: str | None = None  # a PreFilter rejection (every node), this cycle
        self._rng = rng or random.Random()
        self._background: set[asyncio.Task[None]] = set()  # binding cycles and event writes
        self._unresolvable: set[str] = set()  # nodes an extender called unresolvable, this cycle
        # where the serial cycle's time goes: logged every CYCLE_REPORT cycles (the throughput bench)
        self._cycles = 0
        self._cycle_s = 0.0
        self._filter_wait_s = 0.0
        self._preemption = preemption.Preemption(
            api,
            cache=self.cache,
            pods=self._pods,
            extenders=self.extenders,
            client=self._client,
            ignored=self._ignored,
            status=self._status,
            emit=self._event,
            behaviour=self.version,
        )
        self._stop = asyncio.Event()
        self._running = asyncio.Lock()
        self.synced = asyncio.Event()

    @property
    def queue(self) -> schedqueue.SchedulingQueue[PodKey]:
        return self._queue

    @property
    def binding(self) -> int:
        """How many binding cycles are running now."""
        return sum(1 for t in self._background if t.get_name().startswith("bind "))

    # ----- lifecycle -----

    async def run(self) -> None:
        """Follow pods and nodes and schedule until ``stop()`` (or cancellation)."""
        async with self._running:
            self._stop.clear()
            tasks = [
                asyncio.create_task(self._nodes.run()),
                asyncio.create_task(self._pods.run()),
                *(asyncio.create_task(i.run()) for i in self.dra.informers),
                asyncio.create_task(self._loop()),
            ]
            try:
                await self._stop.wait()
            finally:
                for task in [*tasks, *self._background]:
                    task.cancel()
                await asyncio.gather(*tasks, *self._background, return_exceptions=True)
                await self._client.close()

    async def stop(self) -> None:
        """Ask ``run()`` to finish and wait until it has cleaned up (binding cycles cancelled)."""
        self._stop.set()
        async with self._running:
            pass

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _loop(self) -> None:
        await self._nodes.synced.wait()  # never judge a pod against a node list not yet read
        await self._pods.synced.wait()
        for dra_informer in self.dra.informers:
            await dra_informer.synced.wait()
        self.synced.set()
        while True:
            key, cycle = await self._queue.pop()
            started = time.perf_counter()
            try:
                await self.schedule_one(key, cycle)
            except errors.KubeError as err:
                log.warning("scheduling %s/%s: API error %s; backing off", *key, err)
                self._queue.failed(key, cycle, unschedulable=False)
            except Exception:  # a bug must not stop the scheduler: log it, retry the pod later
                log.exception("scheduling %s/%s failed unexpectedly; backing off", *key)
                self._queue.failed(key, cycle, unschedulable=False)
            self._count_cycle(time.perf_counter() - started)

    def _count_cycle(self, spent_s: float) -> None:
        self._cycles += 1
        self._cycle_s += spent_s
        if self._cycles == CYCLE_REPORT:
            log.info(
                "last %d scheduling cycles: %.2f ms each on average, %.2f ms of it waiting for extender filters",
                self._cycles,
                self._cycle_s / self._cycles * 1000,
                self._filter_wait_s / self._cycles * 1000,
            )
            self._cycles, self._cycle_s, self._filter_wait_s = 0, 0.0, 0.0

    # ----- the scheduling cycle (serial) -----

    async def schedule_one(self, key: PodKey, cycle: int) -> None:
        """One scheduling cycle for ``key``: place it and start its binding cycle, or park it."""
        started = time.perf_counter()
        pod = self._pods.get(*key)
        if pod is None or not self._handlers.wanted(pod) or self.cache.is_assumed(key):
            self._queue.forget(key)
            return
        if self.dra.has_claims(pod) and (gated := self.dra.pre_enqueue(pod)) is not None:
            # DynamicResources' PreEnqueue: not tried, no event, until one of its claims changes
            self._queue.failed(key, cycle, unschedulable=True)
            log.info("pod %s/%s not tried (PreEnqueue): %s", *key, gated)
            return
        try:
            node = await self._find_node(pod)
        except (errors.SchedulingError, errors.QuantityError) as err:
            await self._fail(pod, cycle, str(err), reason="SchedulerError", unschedulable=False)
            return
        if isinstance(node, dict):
            message = intree.fit_error_message(len(self.cache), node)
            if self._prefilter_message is not None:  # FitError with a PreFilter rejection
                message = f"0/{len(self.cache)} nodes are available: {self._prefilter_message}."
            outcome = await self._preemption.post_filter(pod, node, self._unresolvable)
            post = [dynamicresources.STILL_NOT_SCHEDULABLE] if self.dra.has_claims(pod) else []
            post += [outcome] if outcome is not None else []
            if post:  # the PostFilter plugins' messages, joined as a Status joins its reasons
                message = f"{message} {', '.join(post)}"
            await self._fail(pod, cycle, message, reason="Unschedulable", unschedulable=True)
            return
        current = self._pods.get(*key) or pod
        self.cache.assume(key, current, node)
        if self._dra_state is not None:
            self.dra.reserve(self._dra_state, node)
        timing = _Timing(self._queue.queued_s(key), time.perf_counter() - started, self._dra_state)
        self._spawn(self._binding_cycle(key, current, node, cycle, timing), name=f"bind {key[0]}/{key[1]}")
        # kube-scheduler's binding goroutine starts at once, on another core, and takes the extender
        # connection this cycle's filter has just given back before the next cycle's filter asks
        # for one (ExtenderClient keeps them as Go does): let the binding task take its step first
        await asyncio.sleep(0)

    async def _find_node(self, pod: JsonObj) -> str | dict[str, list[str]]:
        """The chosen node's name, or every node's reasons when none is feasible."""
        request = podresources.pod_requests(pod)
        self._unresolvable = set()
        self._dra_state, self._prefilter_message, extra = None, None, None
        if self.dra.has_claims(pod):
            state = self.dra.pre_filter(pod)
            if isinstance(state, str):  # PreFilter: UnschedulableAndUnresolvable on every node
                self._prefilter_message = state
                self._unresolvable = set(self.cache.node_names())
                return {name: [state] for name in self._unresolvable}
            self._dra_state = state
            extra = self._dra_filter
        found = self.cache.find_feasible(
            intree.pod_facts(pod, request, ignored=self._ignored), percentage=self.percentage, extra=extra
        )
        feasible, statuses = found.nodes, found.statuses
        for ext in self.extenders:
            if not feasible:
                break
            if not ext.is_interested(pod):
                continue
            objects = [] if ext.node_cache_capable else [self._nodes.get(None, n) or {} for n in feasible]
            asked = time.perf_counter()
            try:
                result = await self._client.filter(ext, pod, feasible, objects)
            except errors.SchedulingError as err:
                self._filter_wait_s += time.perf_counter() - asked
                if ext.ignorable:
                    log.info(
                        "skipping ignorable extender %s for %s/%s: %s",
                        ext.url_prefix,
                        *schedhandlers.pod_key(pod),
                        err,
                    )
                    continue
                raise
            self._filter_wait_s += time.perf_counter() - asked
            for name, message in result.unresolvable.items():
                statuses[name] = [*statuses.get(name, []), message]
                self._unresolvable.add(name)
            for name, message in result.failed.items():
                if name not in result.unresolvable:
                    statuses[name] = [*statuses.get(name, []), message]
            passed = set(result.passed)
            feasible = [n for n in feasible if n in passed]
        if not feasible:
            return statuses
        if len(feasible) == 1:
            return feasible[0]
        return intree.select_host(feasible, lambda name: self.cache.score(name, request), self._rng)

    def _dra_filter(self, node: str) -> list[str]:
        """The DynamicResources plugin's Filter on ``node`` (UnschedulableAndUnresolvable)."""
        assert self._dra_state is not None
        reasons = self.dra.filter(self._dra_state, node)
        if reasons:
            self._unresolvable.add(node)
        return reasons

    # ----- the binding cycle (one task per pod) -----

    async def _binding_cycle(self, key: PodKey, pod: JsonObj, node: str, cycle: int, timing: _Timing) -> None:
        started = time.perf_counter()
        try:
            if timing.dra is not None:
                await self.dra.pre_bind(timing.dra, pod, node)
            await self._bind(pod, node)
        except (errors.SchedulingError, errors.KubeError) as err:
            message = f"binding rejected: {err}"
        except Exception as err:  # a bug in a binder must not lose the pod
            log.exception("binding %s/%s to %s failed unexpectedly", *key, node)
            message = f"binding rejected: {err!r}"
        else:
            self._queue.forget(key)
            log.info(
                "scheduled pod %s/%s to node %s (queued %.1f ms, cycle %.1f ms, binding %.1f ms)",
                key[0],
                key[1],
                node,
                timing.queued_s * 1000,
                timing.cycle_s * 1000,
                (time.perf_counter() - started) * 1000,
            )
            self._event(pod, "Scheduled", f"Successfully assigned {key[0]}/{key[1]} to {node}", "Normal")
            return
        if timing.dra is not None:
            await self.dra.unreserve(timing.dra, pod)
        current = self._pods.get(*key)
        self.cache.forget(key, current)
        if current is not None and (current.get("spec") or {}).get("nodeName"):
            log.info("pod %s/%s: bind reported %r but the pod is bound; keeping it", *key, message)
            return  # kube-scheduler's error handler: "Pod has been assigned to node. Abort adding it back"
        self._queue.move_all()  # forgetting an assumed pod frees resources: kube-scheduler's AssignedPodDelete
        await self._fail(pod, cycle, message, reason="SchedulerError", unschedulable=False)

    async def _bind(self, pod: JsonObj, node: str) -> None:
        for ext in self.extenders:
            if ext.bind_verb and ext.is_interested(pod):
                await self._client.bind(ext, pod, node)
                return
        meta = pod["metadata"]
        await self._api.bind_pod(
            meta.get("namespace") or "default", meta["name"], node=node, uid=meta.get("uid")
        )

    # ----- failures and events -----

    async def _fail(
        self, pod: JsonObj, cycle: int, message: str, *, reason: str, unschedulable: bool
    ) -> None:
        key = schedhandlers.pod_key(pod)
        delay = self._queue.failed(key, cycle, unschedulable=unschedulable)
        where = self._queue.where(key)
        log.info(
            "pod %s/%s not scheduled (%s), %s, back-off %.1fs: %s",
            *key,
            reason,
            where.value if where else "gone",
            delay,
            message,
        )
        self._event(pod, "FailedScheduling", message, "Warning")
        current = self._pods.get(*key) or pod
        conditions = schedreport.unschedulable_conditions(current, reason=reason, message=message)
        if conditions is None:
            return
        try:
            await self._status.merge_patch_status(
                "pods", key[1], {"status": {"conditions": conditions}}, namespace=key[0]
            )
        except errors.NotFound:
            self._queue.forget(key)

    def _event(self, pod: JsonObj, reason: str, message: str, type_: str) -> None:
        """Record an event in the background (kube-scheduler's event broadcaster never blocks)."""
        self._spawn(
            schedreport.write_event(
                self._api, pod, reason=reason, message=message, type_=type_, component=self.scheduler_name
            ),
            name=f"event {reason}",
        )
