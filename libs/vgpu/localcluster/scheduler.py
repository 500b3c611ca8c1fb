"""kube-scheduler emulation: pending pods of one scheduler name, in-tree filters, extenders, bind.

``SchedulerEmulator`` follows pods and nodes with list+watch into memory. Pods without
``spec.nodeName`` whose ``spec.schedulerName`` is ours enter a FIFO queue. One pod at a time it runs
the in-tree filters (``intree``), then each interested extender's filter in config order on the
survivors (``extender``; PROTOCOL.md D.3), takes the first surviving node, and binds through the
first interested extender with a ``bindVerb`` or else ``KubeApi.bind_pod``. A pod that cannot be
placed gets a ``FailedScheduling`` Warning event and ``PodScheduled=False`` and is retried with a
per-pod back-off (1 s doubling to 10 s by default); any node change, or an assigned pod going away,
retries waiting pods at once. Not emulated: prioritize/preempt verbs, scoring, async binding,
``percentageOfNodesToScore`` (every feasible node is sent).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import decimal
import logging
from collections.abc import Mapping
from typing import Any

from vgpu.core import errors
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster import extender, intree, podresources, statuswriter

log = logging.getLogger(__name__)

PodKey = tuple[str, str]  # (namespace, name)


def _key(pod: Mapping[str, Any]) -> PodKey:
    meta = pod.get("metadata") or {}
    return (meta.get("namespace") or "default", meta.get("name") or "")


class _Queue:
    """FIFO of pods to try, plus pods backing off until a time (loop clock) or a cluster change."""

    def __init__(self, *, initial_backoff_s: float, max_backoff_s: float) -> None:
        self._active: collections.OrderedDict[PodKey, None] = collections.OrderedDict()
        self._waiting: dict[PodKey, float] = {}
        self._attempts: dict[PodKey, int] = {}
        self._initial_s = initial_backoff_s
        self._max_s = max_backoff_s
        self._wake = asyncio.Event()

    def add(self, key: PodKey) -> None:
        if key not in self._active and key not in self._waiting:
            self._active[key] = None
            self._wake.set()

    def forget(self, key: PodKey) -> None:
        self._active.pop(key, None)
        self._waiting.pop(key, None)
        self._attempts.pop(key, None)

    def backoff(self, key: PodKey, now: float) -> float:
        """Park ``key`` after a failed attempt; returns the delay (initial * 2^(n-1), capped)."""
        attempts = self._attempts.get(key, 0) + 1
        self._attempts[key] = attempts
        delay = min(self._initial_s * 2.0 ** (attempts - 1), self._max_s)
        self._waiting[key] = now + delay
        return delay

    def retry_all(self) -> None:
        """A cluster change: everything waiting is tried again now (attempt counts are kept)."""
        for key in sorted(self._waiting, key=self._waiting.__getitem__):
            self._active[key] = None
        self._waiting.clear()
        self._wake.set()

    async def pop(self) -> PodKey:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            for key in sorted(
                (k for k, t in self._waiting.items() if t <= now), key=self._waiting.__getitem__
            ):
                del self._waiting[key]
                self._active[key] = None
            if self._active:
                key, _ = self._active.popitem(last=False)
                return key
            self._wake.clear()
            timeout = min(self._waiting.values()) - now if self._waiting else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)


class SchedulerEmulator:
    """Schedules pods whose ``spec.schedulerName`` is ``scheduler_name``; see the module docstring."""

    def __init__(
        self,
        api: KubeApi,
        *,
        scheduler_config: Mapping[str, Any] | None,
        scheduler_name: str,
        status_writer: statuswriter.StatusWriter | None = None,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._api = api
        self._status = statuswriter.resolve(api, status_writer)
        self.scheduler_name = scheduler_name
        self.extenders = extender.parse_config(scheduler_config)
        self._ignored = {
            m.name for ext in self.extenders for m in ext.managed_resources if m.ignored_by_scheduler
        }
        self._client = extender.ExtenderClient(self.extenders)
        self._queue = _Queue(initial_backoff_s=initial_backoff_s, max_backoff_s=max_backoff_s)
        self._pods = informer.Informer(api, "pods", on_event=self._on_pod)
        self._nodes = informer.Informer(api, "nodes", on_event=self._on_node)
        self._assumed: dict[PodKey, str] = {}  # bound by us, not yet seen bound by the informer
        # what each live pod holds on its node, kept current per pod change (the filters read it)
        self._counted: dict[PodKey, tuple[str, dict[str, decimal.Decimal]]] = {}
        self._used: dict[str, dict[str, decimal.Decimal]] = collections.defaultdict(dict)
        self._pods_on: collections.Counter[str] = collections.Counter()
        self._stop = asyncio.Event()
        self._running = asyncio.Lock()

    # ----- the in-memory view (informers) -----

    def _wanted(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        return (
            not spec.get("nodeName")
            and spec.get("schedulerName") == self.scheduler_name
            and not podresources.is_terminated(pod)
            and _key(pod) not in self._assumed
        )

    def _recount(self, key: PodKey, pod: Mapping[str, Any] | None) -> None:
        """Move what ``key`` requests to the node it is on now (none once deleted or terminated)."""
        previous = self._counted.pop(key, None)
        if previous is not None:
            node, request = previous
            used = self._used[node]
            for name, amount in request.items():
                used[name] -= amount
            self._pods_on[node] -= 1
        if pod is None or podresources.is_terminated(pod):
            return
        node_name = (pod.get("spec") or {}).get("nodeName") or self._assumed.get(key)
        if not node_name:
            return
        try:
            request = podresources.pod_requests(pod)
        except errors.QuantityError:
            request = {}  # the API server would not have admitted it; count nothing
        used = self._used[node_name]
        for name, amount in request.items():
            used[name] = used.get(name, decimal.Decimal(0)) + amount
        self._pods_on[node_name] += 1
        self._counted[key] = (node_name, request)

    def _on_pod(self, change: informer.Change) -> None:
        pod = change.object
        key = _key(pod)
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        if change.type == "DELETED":
            self._queue.forget(key)
            self._recount(key, None)
            if self._assumed.pop(key, None) is not None or bound:
                self._queue.retry_all()  # its resources are free again
            return
        if bound:
            self._assumed.pop(key, None)
        self._recount(key, pod)
        if self._wanted(pod):
            self._queue.add(key)
            return
        self._queue.forget(key)
        old = change.old
        if old is not None and podresources.is_terminated(pod) and not podresources.is_terminated(old):
            self._queue.retry_all()

    def _on_node(self, change: informer.Change) -> None:
        self._queue.retry_all()

    # ----- lifecycle -----

    async def run(self) -> None:
        """Follow pods and nodes and schedule until ``stop()`` (or cancellation)."""
        async with self._running:
            self._stop.clear()
            tasks = [
                asyncio.create_task(self._nodes.run()),
                asyncio.create_task(self._pods.run()),
                asyncio.create_task(self._loop()),
            ]
            try:
                await self._stop.wait()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self._client.close()

    async def stop(self) -> None:
        """Ask ``run()`` to finish and wait until it has cleaned up."""
        self._stop.set()
        async with self._running:
            pass

    async def _loop(self) -> None:
        await self._nodes.synced.wait()  # never judge a pod against a node list not yet read
        await self._pods.synced.wait()
        while True:
            key = await self._queue.pop()
            try:
                await self.schedule_one(key)
            except errors.KubeError as err:
                log.warning("scheduling %s/%s: API error %s; backing off", *key, err)
                self._queue.backoff(key, asyncio.get_running_loop().time())
            except Exception:  # a bug must not stop the scheduler: log it, retry the pod later
                log.exception("scheduling %s/%s failed unexpectedly; backing off", *key)
                self._queue.backoff(key, asyncio.get_running_loop().time())

    # ----- one scheduling cycle -----

    async def schedule_one(self, key: PodKey) -> None:
        """Try to place the pod ``key`` once; on failure record why and park it in back-off."""
        pod = self._pods.get(*key)
        if pod is None or not self._wanted(pod):
            self._queue.forget(key)
            return
        try:
            node = await self._find_node(pod)
        except (errors.SchedulingError, errors.QuantityError) as err:
            await self._fail(pod, str(err), reason="SchedulerError")
            return
        if isinstance(node, dict):
            await self._fail(pod, intree.fit_error_message(len(self._nodes), node), reason="Unschedulable")
            return
        try:
            await self._bind(pod, node)
        except (errors.SchedulingError, errors.KubeError) as err:
            await self._fail(pod, f"binding rejected: {err}", reason="SchedulerError")
            return
        self._queue.forget(key)
        current = self._pods.get(*key)
        if current is not None and not (current.get("spec") or {}).get("nodeName"):
            self._assumed[key] = node  # until the informer sees the binding, as kube-scheduler assumes
            self._recount(key, current)
        log.info("scheduled pod %s/%s to node %s", key[0], key[1], node)
        await self._event(pod, "Scheduled", f"Successfully assigned {key[0]}/{key[1]} to {node}", "Normal")

    async def _find_node(self, pod: JsonObj) -> str | dict[str, list[str]]:
        """The chosen node's name, or every node's reasons when none is feasible."""
        request = podresources.pod_requests(pod)
        statuses: dict[str, list[str]] = {}
        feasible: list[JsonObj] = []
        for node in sorted(self._nodes.items(), key=lambda n: str(n["metadata"]["name"])):
            name = node["metadata"]["name"]
            reasons = intree.node_reasons(
                pod,
                request,
                node,
                used=self._used[name],
                pods_on_node=self._pods_on[name],
                ignored=self._ignored,
            )
            if reasons:
                statuses[name] = reasons
            else:
                feasible.append(node)
        for ext in self.extenders:
            if not feasible:
                break
            if not ext.is_interested(pod):
                continue
            try:
                result = await self._client.filter(ext, pod, feasible)
            except errors.SchedulingError as err:
                if ext.ignorable:
                    log.info("skipping ignorable extender %s for %s/%s: %s", ext.url_prefix, *_key(pod), err)
                    continue
                raise
            for name, message in result.unresolvable.items():
                statuses[name] = [*statuses.get(name, []), message]
            for name, message in result.failed.items():
                if name not in result.unresolvable:
                    statuses[name] = [*statuses.get(name, []), message]
            passed = set(result.passed)
            feasible = [n for n in feasible if n["metadata"]["name"] in passed]
            feasible.sort(key=lambda n: result.passed.index(n["metadata"]["name"]))
        if not feasible:
            return statuses
        return str(feasible[0]["metadata"]["name"])

    async def _bind(self, pod: JsonObj, node: str) -> None:
        for ext in self.extenders:
            if ext.bind_verb and ext.is_interested(pod):
                await self._client.bind(ext, pod, node)
                return
        meta = pod["metadata"]
        await self._api.bind_pod(
            meta.get("namespace") or "default", meta["name"], node=node, uid=meta.get("uid")
        )

    async def _fail(self, pod: JsonObj, message: str, *, reason: str) -> None:
        key = _key(pod)
        delay = self._queue.backoff(key, asyncio.get_running_loop().time())
        log.info("pod %s/%s unschedulable (%s), retry in %.1fs: %s", *key, reason, delay, message)
        await self._event(pod, "FailedScheduling", message, "Warning")
        conditions = [
            c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"
        ]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": reason,
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": now,
            }
        )
        try:
            await self._status.merge_patch_status(
                "pods", key[1], {"status": {"conditions": conditions}}, namespace=key[0]
            )
        except errors.NotFound:
            self._queue.forget(key)

    async def _event(self, pod: JsonObj, reason: str, message: str, type_: str) -> None:
        involved = {**pod, "kind": "Pod", "apiVersion": "v1"}
        try:
            await self._api.create_event(
                namespace=_key(pod)[0],
                involved=involved,
                reason=reason,
                message=message,
                type="Warning" if type_ == "Warning" else "Normal",
                component=self.scheduler_name,
            )
        except errors.KubeError as err:
            log.warning("could not record %s event for %s/%s: %s", reason, *_key(pod), err)
