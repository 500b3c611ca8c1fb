"""``NodeLocks``: HAMi's node lock annotation, taken, waited for and released by the binds.

The lock, ``hami.io/mutex.lock = <RFC3339>,<ns>,<pod>`` (docs/protocol.md#node-lock), is taken by
compare-and-swap (``take``): a merge patch carrying ``metadata.resourceVersion``; a Conflict
re-reads the node and tries again. A lock held by another pod is waited for, woken by the node
and pod watches (no polling), within ``bind_lock_wait_s``; the binds of this process waiting for
one node line up (``turn``), so only one tries to take its lock at each release. A lock is taken
over at once when its holder pod is gone, finished, running (kubelet admitted it, so its Allocate
is over), or already has bind phase ``success``/``failed``, and when it does not parse. One older
than ``node_lock_timeout_s``, or dated more than ``LOCK_CLOCK_SKEW_S`` in the future (a skewed
clock), is taken over too, unless its holder is bound to the node and still waits for its
Allocate: the device plugin will read the lock to find that pod (``_stale``). ``release`` drops
the lock only while it is still the pod's. With ``nodeLock: contended`` a bind first ``claim``s
the node in memory (``handoffs.py``) and takes the annotation only where one is there already.
"""

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from vgpu.core import allocation, annotations, errors
from vgpu.core.config import Config
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.waits import wait_at_most

from vgpu_scheduler.state import ClusterState

log = logging.getLogger(__name__)

# a lock dated further ahead than this was written by a skewed clock: not trusted, taken over
LOCK_CLOCK_SKEW_S = 30.0


@dataclass(slots=True)
class _Line:
    """The binds lining up for one node's lock: ``turn`` is held by the one trying to take it."""

    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0


class NodeLocks:
    """The node locks this process's binds take; ``wall_clock`` gives aware UTC datetimes (lock
    times), injectable for tests."""

    def __init__(
        self,
        *,
        config: Config,
        state: ClusterState,
        api: KubeApi,
        wall_clock: Callable[[], datetime.datetime],
    ) -> None:
        self._config = config
        self._state = state
        self._api = api
        self._now = wall_clock
        self._keys = state.keys
        self._lines: dict[str, _Line] = {}  # node -> the binds lining up for its lock

    async def claim(self, node: str, uid: str) -> bool:
        """``nodeLock: contended``: wait (woken by the watches, within ``bind_lock_wait_s``) until no
        other pod is being handed over on ``node``, then claim it in memory. Returns True when the
        bind may go without the lock annotation, False when it must take it (one is on the node
        already: HAMi's scheduler, or an upgrade from ``always``). A pod still ``allocating`` there
        is waited for however long it has been: its Allocate may yet come, and its device plugin
        must then find it and no other. The claim is made either way: a bind that goes on to take
        the annotation holds the node in memory too, so another bind of this process cannot go
        lock-less beside it before the watch shows the lock or the Binding."""
        sched = self._config.scheduler
        deadline = time.monotonic() + sched.bind_lock_wait_s
        while True:
            now = self._now().timestamp()
            waiting = self._state.handoffs.others(
                node, uid, now=now, claim_timeout_s=sched.node_lock_timeout_s
            )
            if not waiting:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.SchedulingError(
                    f"node {node} is still handing GPUs to pod {self._pod_name(waiting[0])}; "
                    f"waited {sched.bind_lock_wait_s:g} s"
                )
            await wait_at_most(self._state.changed(node).wait(), min(remaining, 1.0))
        self._state.handoffs.claim(node, uid, now=now)
        obj = self._state.inventory.node_object(node) or {}
        return not ((obj.get("metadata") or {}).get("annotations") or {}).get(self._keys.node_lock)

    def _pod_name(self, uid: str) -> str:
        meta = (self._state.pods.get(uid) or {}).get("metadata") or {}
        return f"{meta.get('namespace', '?')}/{meta.get('name', uid)}"

    def waiting(self, node: str) -> int:
        """How many binds are in line for ``node``'s lock (the one trying to take it included)."""
        line = self._lines.get(node)
        return 0 if line is None else line.waiting

    @contextlib.asynccontextmanager
    async def turn(self, node: str, deadline: float) -> AsyncIterator[None]:
        """This bind's turn at ``node``'s lock: the binds of this process for one node try to take it
        one at a time, first come first served. Otherwise every bind waiting for the node would wake
        at each release and PATCH at once, and all but one would get a Conflict and re-read the
        node: n(n+1)/2 writes for n binds in a burst on a small cluster, where n will do."""
        line = self._lines.get(node)
        if line is None:
            line = self._lines[node] = _Line()
        line.waiting += 1
        try:
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                    await line.turn.acquire()
            except TimeoutError:
                wait_s = self._config.scheduler.bind_lock_wait_s
                raise errors.SchedulingError(
                    f"node {node}: still in line for its lock behind other binds of this scheduler "
                    f"({line.waiting - 1} in line besides this one); waited {wait_s:g} s"
                ) from None
            try:
                yield
            finally:
                line.turn.release()
        finally:
            line.waiting -= 1
            if not line.waiting:
                del self._lines[node]

    async def take(self, node: str, ns: str, pod: str, deadline: float) -> None:
        key = self._keys.node_lock
        wait_s = self._config.scheduler.bind_lock_wait_s
        fresh: JsonObj | None = None
        while True:
            obj = fresh or self._state.inventory.node_object(node) or await self._api.get("nodes", node)
            fresh = None
            meta = obj.get("metadata") or {}
            raw = (meta.get("annotations") or {}).get(key)
            if raw:
                lock: annotations.NodeLock | None
                try:
                    lock = annotations.decode_node_lock(raw, field=key)
                except errors.AnnotationError:
                    lock = None
                if lock is not None and lock.held_by(ns, pod):
                    return
                stale = await self._stale(node, lock, raw)
                if stale is None:
                    assert lock is not None
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise errors.SchedulingError(
                            f"node {node} is locked by {lock.namespace}/{lock.pod or '?'} "
                            f"since {annotations.format_rfc3339(lock.time)}; waited {wait_s:g} s"
                        )
                    # woken by the watches, or when the lock expires (unless its holder still
                    # waits for its Allocate here: then only a change of the holder ends the wait)
                    expires_in = self._config.scheduler.node_lock_timeout_s - self._age_s(lock)
                    nap_s = min(remaining, expires_in) if expires_in > 0 else remaining
                    await wait_at_most(self._state.changed(node).wait(), nap_s + 0.001)
                    continue
                log.info("node %s: taking over lock %r: %s", node, raw, stale)
            value = annotations.encode_node_lock(annotations.NodeLock(self._now(), ns, pod))
            patch = {
                "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {key: value}}
            }
            try:
                await self._api.merge_patch("nodes", node, patch)
                return
            except errors.Conflict:
                fresh = await self._api.get("nodes", node)

    def _age_s(self, lock: annotations.NodeLock) -> float:
        return (self._now() - lock.time).total_seconds()

    async def _stale(self, node: str, lock: annotations.NodeLock | None, raw: str) -> str | None:
        """Why the lock may be taken over now, or None when its holder may still need it. A holder
        bound to ``node`` and still waiting for its Allocate keeps the lock however old it is:
        kubelet names no pod to the device plugin, so the plugin reads the lock to learn which pod
        it serves, and a lock naming another pod would hand that pod's GPUs to the holder (HAMi
        issue #3096). Kubernetes ends that wait: kubelet admits the pod, or fails it, or the pod
        is deleted with its node."""
        if lock is None:
            return f"lock value {raw!r} does not parse"
        if not lock.legacy:
            holder = self._state.pod(lock.namespace, lock.pod)
            if holder is None:
                try:
                    holder = await self._api.get("pods", lock.pod, namespace=lock.namespace)
                except errors.NotFound:
                    return f"holder pod {lock.namespace}/{lock.pod} is gone"
            holder_phase = (holder.get("status") or {}).get("phase")
            if holder_phase in ("Succeeded", "Failed"):
                return f"holder pod {lock.namespace}/{lock.pod} has finished"
            if holder_phase == "Running":  # kubelet admitted it: Allocate is behind it
                return f"holder pod {lock.namespace}/{lock.pod} is running"
            phase = annotations.of(holder).get(self._keys.bind_phase)
            if phase in (annotations.BindPhase.SUCCESS.value, annotations.BindPhase.FAILED.value):
                return f"holder pod {lock.namespace}/{lock.pod} has bind phase {phase}"
            if allocation.is_pending_on(holder, node=node, keys=self._keys):
                return None
        age = self._age_s(lock)
        if age > self._config.scheduler.node_lock_timeout_s:
            return f"expired ({int(age)} s old)"
        if age < -LOCK_CLOCK_SKEW_S:
            return f"dated {int(-age)} s in the future (a skewed clock)"
        return None

    async def release(self, node: str, ns: str, pod: str) -> None:
        key = self._keys.node_lock
        for _ in range(5):
            obj = await self._api.get("nodes", node)
            meta = obj.get("metadata") or {}
            raw = (meta.get("annotations") or {}).get(key)
            if not raw or not raw.endswith(f",{ns},{pod}"):
                return  # released already, or someone else's now
            patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {key: None}}}
            try:
                await self._api.merge_patch("nodes", node, patch)
                return
            except errors.Conflict:
                continue
