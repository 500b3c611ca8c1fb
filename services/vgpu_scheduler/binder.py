"""``POST /bind``: the decision, the node lock and the Binding (docs/protocol.md#pod-annotations, #node-lock, #departures-from-hami).

kube-scheduler runs binds concurrently (one goroutine per pod), so this is where the decision is
written, not in ``/filter`` (which runs in the serial scheduling cycle and only reserves in memory).

1. The decision: the reservation the pod's filter made for this node. When none is held for this
   node (the reservation expired because the bind came late, the scheduler restarted between
   filter and bind, or the pod was filtered for another node) the pod is fitted again on the
   node's *current* usage and the bind is refused, with the reason, if it no longer fits: a late
   bind never overcommits a GPU. Once the node is this pod's (the lock or the claim below), the
   GPUs the decision names are checked against the node's usage and health as the watches show
   them now (``ClusterState.over_capacity``): pods bound behind this scheduler's back (a second
   binder, the old leader at a hand-over) or a GPU reported unhealthy since the filter make the
   bind fit the pod again the same way.
2. The node lock, HAMi's ``hami.io/mutex.lock = <RFC3339>,<ns>,<pod>`` (``nodelocks.py``: taken
   by compare-and-swap, waited for in line within ``bind_lock_wait_s``, below the extender's
   httpTimeout, taken over from a holder that no longer needs it); with ``nodeLock: contended``
   the node is claimed in memory instead while no other pod is being handed over on it.
3. The Binding, carrying the decision in its ``metadata.annotations``: kube-apiserver merges a
   Binding's annotations into the pod in the same write that sets ``spec.nodeName``, so the
   device plugin never sees the pod on its node without its devices (vgpu-node, vgpu-time,
   devices-to-allocate, devices-allocated, bind-phase ``allocating``, bind-time). The
   ``hami.io/vgpu-node`` label is set by our device plugin in its bind-phase ``success`` write;
   with ``labelAssignedPods`` (for a tool that needs it at bind time) it follows here in a background patch.

The device plugin releases the lock after Allocate. Any failure undoes everything: the lock is
released (only if still ours), the reservation dropped, and the reply carries the error text; a
Warning ``BindingFailed`` event is recorded, and ``on_failed`` is told (the retries nudge the pod
after a back-off: kube-scheduler v1.20 may park it, retries.py "After a failed bind"). A Binding
whose answer was lost (a timeout) is checked against the pod before anything is undone.

kube-scheduler stops waiting for a bind after its ``httpTimeout`` (then schedules the pod again),
and a kube-scheduler that loses its leadership exits with its binds in flight. Either way it hangs
up, and the extender listener cancels the call (``extender_conn.py``). A bind still
waiting for its node (the claim, the lock) then gives up and is undone like a failure: left to
go on, it would bind the pod later on a decision whose share is no longer reserved, racing the
pod's next bind. A bind whose Binding is already sent is seen through, since the Binding may take
effect. ``vgpu_scheduler_bind_duration_seconds{outcome="abandoned"}`` counts both. Unless the
Binding seen through took effect, ``on_failed`` is told as after a failure: to kube-scheduler the
call failed.
"""

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from vgpu.core import annotations, errors, fit, quota, request
from vgpu.core.config import Config, NodeLock
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.extender import pod_ref
from vgpu_scheduler.nodelocks import NodeLocks
from vgpu_scheduler.state import ClusterState

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# an abandoned bind's roll-back (the lock's release: a node GET and PATCH) gets this long
ROLL_BACK_TIMEOUT_S = 5.0


@dataclass(slots=True)
class _Attempt:
    """One GPU pod's bind: the pod, the node, and how far it has gone (what a roll-back gives back;
    once its Binding is sent it is no longer abandoned)."""

    pod: JsonObj
    ns: str
    name: str
    uid: str
    node: str
    claimed: bool = False
    locked: bool = False
    sending: bool = False
    devices: str | None = None  # the decision it binds with, once known: a roll-back drops only it


def parse_binding_args(raw: Any) -> tuple[str, str, str, str]:
    """(namespace, pod, uid, node) from ExtenderBindingArgs; ``ParseError`` when malformed."""
    if not isinstance(raw, dict):
        raise errors.ParseError("ExtenderBindingArgs", "expected a JSON object")
    lowered = {str(k).lower(): v for k, v in raw.items()}
    out = []
    for key in ("PodNamespace", "PodName", "PodUID", "Node"):
        value = raw.get(key, lowered.get(key.lower()))
        if not isinstance(value, str) or (not value and key != "PodUID"):
            raise errors.ParseError(f"ExtenderBindingArgs.{key}", "expected a non-empty string")
        out.append(value)
    return out[0], out[1], out[2], out[3]


class Binder:
    """The bind verb. ``wall_clock`` gives aware UTC datetimes (lock times), injectable for tests."""

    def __init__(
        self,
        *,
        config: Config,
        state: ClusterState,
        api: KubeApi,
        events: EventRecorder,
        wall_clock: Callable[[], datetime.datetime],
    ) -> None:
        self._config = config
        self._state = state
        self._api = api
        self._events = events
        self._now = wall_clock
        self._keys = state.keys
        self._tasks: set[asyncio.Task[Any]] = set()
        # HAMi's node lock annotation: taken, waited for in line, released
        self.locks = NodeLocks(config=config, state=state, api=api, wall_clock=wall_clock)
        # told the uid of each pod whose GPU bind failed (the retries' nudge after a back-off)
        self.on_failed: Callable[[str], object] | None = None

    async def bind(self, raw: Any) -> str:
        """Bind the pod; returns "" on success or the error text (the reply's ``Error``)."""
        ns, name, uid, node = parse_binding_args(raw)
        pod = self._state.pod(ns, name)
        if pod is None or (uid and str((pod.get("metadata") or {}).get("uid", "")) != uid):
            try:
                pod = await self._api.get("pods", name, namespace=ns)  # the watch may lag
            except errors.KubeError as exc:
                if uid:
                    self._state.release(uid)
                return f"pod {ns}/{name}: {exc}"
        uid = uid or str(pod["metadata"].get("uid", ""))
        if self._state.decision(uid) is None and not self._wants_gpu(pod):  # a decision: /filter parsed it
            return await self._bind_plain(ns, name, uid, node, pod)
        attempt = _Attempt(pod, ns, name, uid, node)
        work = self._background(self._bind_gpu(attempt), name=f"bind-{ns}/{name}")
        try:
            failure = await asyncio.shield(work)
        except asyncio.CancelledError:
            # kube-scheduler stopped waiting: its httpTimeout, or its process ended (a leader
            # hand-over), or this process is stopping. A bind still waiting for its node gives up and
            # releases what it took; a Binding already sent may take effect, so it is seen through.
            if attempt.sending:
                log.info(
                    "pod %s/%s: kube-scheduler stopped waiting for its bind to node %s; the Binding "
                    "is already on its way, seeing it through",
                    ns,
                    name,
                    node,
                )
            else:
                work.cancel()
            await asyncio.wait([work])
            self._tell_if_failed(attempt.uid, work)  # to kube-scheduler the call failed either way
            raise
        self._tell_if_failed(attempt.uid, work)
        return failure

    def _tell_if_failed(self, uid: str, work: asyncio.Task[str]) -> None:
        """``on_failed`` for a bind that ended without its Binding taking effect (an error text,
        abandoned, cancelled): kube-scheduler v1.20 may park the pod (its retry skips a pod bound,
        or tried again, meanwhile)."""
        if self.on_failed is not None and (work.cancelled() or work.exception() or work.result()):
            self.on_failed(uid)

    async def _bind_gpu(self, a: _Attempt) -> str:
        pod, ns, name, uid, node = a.pod, a.ns, a.name, a.uid, a.node
        try:
            devices = a.devices = self._decision(pod, ns, name, uid, node)
            lockless = False
            if self._config.scheduler.node_lock is NodeLock.CONTENDED:
                a.claimed = True  # released owner-checked: harmless when the claim was not made yet
                lockless = await self.locks.claim(node, uid)
            if not lockless:
                a.locked = True  # a lock PATCH cut short may have landed: the release is owner-checked
                deadline = time.monotonic() + self._config.scheduler.bind_lock_wait_s
                async with self.locks.turn(node, deadline):
                    await self.locks.take(node, ns, name, deadline)
            held = self._state.decision(uid)
            if held is None or (held.node, held.devices_raw) != (node, devices):
                # dropped while this bind waited for the node (its TTL ran out and a filter gave its
                # share away, or a re-filter replaced it): what it named may be someone else's now
                devices = a.devices = self._decision(
                    pod,
                    ns,
                    name,
                    uid,
                    node,
                    why="the one held was dropped while the bind waited for the node",
                )
            else:
                # the GPUs it names, checked again just before they are handed out: pods bound behind
                # this scheduler's back (a second binder, a leader hand-over) or a GPU turned unhealthy
                lost = self._state.over_capacity(node, uid)
                if lost is not None:
                    self._state.release(uid)
                    devices = a.devices = self._decision(
                        pod, ns, name, uid, node, why=f"the one held lost its GPUs: {lost}"
                    )
            stamp = str(int(self._now().timestamp()))
            keys = self._keys
            notes = {
                keys.assigned_node: node,
                keys.assigned_time: stamp,
                keys.devices_to_allocate: devices,
                keys.devices_allocated: devices,
                keys.bind_phase: annotations.BindPhase.ALLOCATING.value,
                keys.bind_time: stamp,
            }
            a.sending = True
            self._state.bindings.sent(uid, node)
            try:
                await self._api.bind_pod(ns, name, node=node, uid=uid or None, annotations=notes)
            except errors.KubeError as exc:
                if not await self._bound_anyway(ns, name, node, devices, exc):
                    raise
        except (errors.KubeError, errors.SchedulingError) as exc:
            message = f"binding pod {ns}/{name} to node {node} failed: {exc}"
            log.warning("%s; rolling back", message)
            await self._roll_back(a, message)
            return message
        except asyncio.CancelledError:
            if a.sending:  # only a stop cancels a sent Binding: it may take effect, keep the lock
                log.warning("pod %s/%s: stopping while its Binding to node %s was on its way", ns, name, node)
                raise
            message = (
                f"binding pod {ns}/{name} to node {node} abandoned before its Binding: kube-scheduler "
                "stopped waiting (its httpTimeout, or it stopped) or this scheduler is stopping"
            )
            log.warning("%s; rolling back", message)
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the roll-back's own API calls must run; the bind ends cancelled after it
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._roll_back(a, message), ROLL_BACK_TIMEOUT_S)
            raise
        log.info(
            "bound pod %s/%s to node %s%s: %s",
            ns,
            name,
            node,
            "" if a.locked else " (no lock needed)",
            devices,
        )
        if self._config.scheduler.label_assigned_pods:
            self._background(self._label(ns, name, node), name=f"label-{ns}/{name}")
        self._events.emit(
            pod_ref(pod),
            reason="BindingSucceed",
            message=f"Successfully binding node [{node}] to {ns}/{name}",
        )
        return ""

    async def _roll_back(self, a: _Attempt, message: str) -> None:
        if a.sending:  # its Binding did not take effect (refused, or read back unbound)
            self._state.bindings.drop(a.uid)
        if a.claimed:
            self._state.handoffs.release(a.node, a.uid)
        await self._undo(a.ns, a.name, a.uid, a.node, devices=a.devices, unlock=a.locked)
        self._events.emit(pod_ref(a.pod), reason="BindingFailed", message=message, type="Warning")

    def _decision(
        self,
        pod: JsonObj,
        ns: str,
        name: str,
        uid: str,
        node: str,
        *,
        why: str = "expired or made before a restart",
    ) -> str:
        """The pod's devices on ``node``: the filter's reservation, or a fresh fit (then reserved)
        when none is held for this node (``why``); ``SchedulingError`` when the pod no longer fits."""
        state = self._state
        bound = state.bound_problem(uid, ns, name)
        if bound is not None:  # a Binding of an earlier try took effect or is on its way
            raise errors.SchedulingError(bound)
        state.expire()
        held = state.decision(uid)
        if held is not None and held.node == node:
            return held.devices_raw
        try:
            req = request.parse_pod(pod, self._config)
        except errors.ParseError as exc:
            raise errors.SchedulingError(f"pod {ns}/{name}: {exc}") from exc
        if held is not None:
            state.release(uid)  # a decision for another node: it no longer applies
        over_quota = state.quota.pod_problem(req, namespace=ns, uid=uid)
        if over_quota is not None:  # a re-fit is a placement: the namespace quota holds (issue 13)
            raise errors.SchedulingError(f"no decision held for node {node} and {over_quota}")
        now = self._now().timestamp()
        view = state.inventory.live_view(node, now)
        if view is None:
            raise errors.SchedulingError(f"node {node}: {state.problem(node, now) or 'no schedulable GPUs'}")
        gpu_policy = req.gpu_policy or self._config.scheduler.gpu_policy
        got = fit.fit_pod(req, view, gpu_policy=gpu_policy)
        if isinstance(got, fit.Miss):
            raise errors.SchedulingError(
                f"no decision held for node {node} ({why}) and the pod no longer fits there: {got.reason}"
            )
        if quota.needs_placement_check(req):  # its GPU init container may be charged beside the app
            within = state.quota.placement_within(
                req, view, got, gpu_policy=gpu_policy, namespace=ns, uid=uid
            )
            if isinstance(within, str):
                raise errors.SchedulingError(f"no decision held for node {node} and {within}")
            got = within
        devices = annotations.encode_pod_devices(got.devices)
        state.reserve(uid, namespace=ns, node=node, placement=got, devices_raw=devices)
        log.info(
            "pod %s/%s: no decision held for node %s (%s); fitted again on current usage: %s",
            ns,
            name,
            node,
            why,
            devices,
        )
        return devices

    async def _bound_anyway(self, ns: str, name: str, node: str, devices: str, exc: errors.KubeError) -> bool:
        """After a failed Binding: did it take effect all the same (its answer lost)? A definite
        refusal (4xx) did not; otherwise the pod is read back."""
        if exc.status is not None and 400 <= exc.status < 500:
            return False
        try:
            pod = await self._api.get("pods", name, namespace=ns)
        except errors.KubeError:
            return False
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        bound = (pod.get("spec") or {}).get("nodeName") == node
        if bound and notes.get(self._keys.devices_allocated) == devices:
            log.info("pod %s/%s: the Binding failed (%s) but took effect; keeping it", ns, name, exc)
            return True
        return False

    async def _label(self, ns: str, name: str, node: str) -> None:
        """The ``hami.io/vgpu-node`` label HAMi also sets (for ``kubectl get pods -l``)."""
        patch = {"metadata": {"labels": {self._keys.assigned_node: node}}}
        try:
            await self._api.merge_patch("pods", name, patch, namespace=ns)
        except errors.KubeError as exc:
            log.warning("pod %s/%s: could not set the %s label: %s", ns, name, self._keys.assigned_node, exc)

    def _background(self, work: Coroutine[Any, Any, _T], *, name: str) -> asyncio.Task[_T]:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Cancel the binds and background patches still in flight (shutdown)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _wants_gpu(self, pod: JsonObj) -> bool:
        try:
            return request.parse_pod(pod, self._config).wants_gpu
        except errors.ParseError:
            return True  # the filter refused it; do not bind it around the GPU bookkeeping

    async def _bind_plain(self, ns: str, name: str, uid: str, node: str, pod: JsonObj) -> str:
        """A pod asking for no GPU (an extender with no managedResources sees every pod): no lock."""
        try:
            await self._api.bind_pod(ns, name, node=node, uid=uid or None)
        except errors.KubeError as exc:
            message = f"binding pod {ns}/{name} to node {node} failed: {exc}"
            self._events.emit(pod_ref(pod), reason="BindingFailed", message=message, type="Warning")
            return message
        return ""

    async def _undo(
        self, ns: str, name: str, uid: str, node: str, *, devices: str | None, unlock: bool
    ) -> None:
        """Drop the reservation this bind held (``devices`` on ``node``; not a newer decision made
        meanwhile) and release the lock if it is still ours. Nothing was written to the pod: the
        decision travels only in the Binding, which either took effect or did not."""
        self._state.release(uid, node=node, devices_raw=devices)
        if unlock:
            try:
                await self.locks.release(node, ns, name)
            except errors.KubeError as exc:
                log.warning("node %s: could not release the lock of pod %s/%s: %s", node, ns, name, exc)
