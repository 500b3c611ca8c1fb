"""HAMi-sharing Allocate (docs/protocol.md#allocate with our fixes) and GetPreferredAllocation.

Per call, under one asyncio.Lock: find the pod (the node lock's holder when it is pending here,
else the pending pod with the oldest bind time, from the in-memory ``ClusterView``), take the
first non-empty container entry of its to-allocate annotation, build the HAMi-core response and
answer. The writes come after the answer (``allocwrites`` through ``writebehind``): PATCH the
rewritten to-allocate (with ``bind-phase: success`` when no entry is left), then release the node
lock. Any failure: bind phase ``failed``, lock released (also written after), and an error naming
the pod and why. A request with no container, or a container with no device IDs, is refused
before any pod is looked at (kubelet never sends one). The whole call is bounded by
``allocateTimeoutS``: kubelet waits for it in its pod loop with no deadline of its own, so past it
the call fails, naming what it was waiting for, and the pod it was serving is marked failed.

What this plugin decided is kept in memory (``PodOverlay``: the pod as its pending write will
leave it, then our own patch answers until the watch catches up), so the next container's
Allocate never reads a stale to-allocate value from the cache, written yet or not.

Idempotent (``ledger``): every answer is recorded by kubelet's device IDs, and a request repeating
them (kubelet restarted before its checkpoint, or re-allocates) gets the recorded answer without
consuming an entry. An Allocate runs as a task the gRPC call only waits for: when kubelet cancels
the call, the work still finishes (answer recorded, writes queued) or fails and marks the pod
failed, never half; kubelet's next ask is then answered from the record.
"""

import asyncio
import collections
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

from vgpu.core import allocation, annotations, errors, kubeletids
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid, physical_uuid
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_device_plugin import allocwrites, hostfs, ledger, writebehind
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.podcache import ClusterView, PodFeed
from vgpu_device_plugin.podoverlay import PodOverlay, key

log = logging.getLogger(__name__)

_REMEMBERED_PODS = 256  # pods whose earlier containers' kubelet IDs are kept (init-container reuse)
PREFERRED_WAIT_S = 2.0  # GetPreferredAllocation waits so long for the watch to show a pod it can serve
_T = TypeVar("_T")
Answers = list[allocation.ContainerAllocation]


class Offload(Protocol):
    """Runs a blocking call away from the event loop: ``asyncio.to_thread``'s shape."""

    def __call__(self, func: Callable[[], _T], /) -> Awaitable[_T]: ...


class HamiAllocator:
    """The AllocateHandler of the shared resource (``nvidia.com/gpu``)."""

    def __init__(
        self,
        *,
        api: KubeApi,
        view: ClusterView,
        node: str,
        config: DevicePluginConfig,
        keys: annotations.Keys,
        refs: Mapping[GpuUuid, allocation.GpuRef],
        host: HostFs,
        new_cache_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        offload: Offload = asyncio.to_thread,
        clock: Callable[[], float] = time.monotonic,
        writes: writebehind.Writes | None = None,
        overlay: PodOverlay | None = None,
        pod_feed: PodFeed | None = None,
        preferred_wait_s: float = PREFERRED_WAIT_S,
        hami_core_missing: Callable[[], None] = lambda: None,
        answers: ledger.Ledger | None = None,
    ) -> None:
        """``offload`` runs the blocking host-file work of an Allocate (a worker thread; the
        throughput bench, standing in for 1,000 nodes on one machine, runs it in place).
        Feed ``node_changed`` with the node watch's changes (else a lock the node cache had not
        shown at Allocate waits for the lock reaper). ``writes``: where the writes after each answer
        go (the manager's queue, shared by its sessions; one of its own by default), ``overlay``
        what they will leave and ``answers`` the ledger of answers (both shared likewise).
        ``hami_core_missing`` is told when Allocate found HAMi-core's files missing
        (``HamiCoreWatch.poke``: the GPUs become unhealthy at once). ``pod_feed``: the pod watch's
        changes, which GetPreferredAllocation waits on (up to ``preferred_wait_s``) when it has no
        answer yet; without it, it answers at once."""
        self._api = api
        self._view = view
        self._node = node
        self._config = config
        self._keys = keys
        self._refs = refs
        self._host = host
        self._new_cache_id = new_cache_id
        self._offload = offload
        self._clock = clock
        self._hami_core_missing = hami_core_missing
        self._lock = asyncio.Lock()  # the pod search, shared with GetPreferredAllocation
        self._once = asyncio.Lock()  # one Allocate at a time, replay check included
        self._overlay = overlay if overlay is not None else PodOverlay()
        self._answers = answers if answers is not None else ledger.Ledger(clock=clock)
        self._inflight: set[asyncio.Task[Answers]] = set()
        # the IDs kubelet passed for each pod's earlier containers (its init containers' reused IDs)
        self._kubelet_ids: collections.OrderedDict[str, set[str]] = collections.OrderedDict()
        self._read_node: JsonObj | None = None  # the node read from the API by this Allocate
        self._waiting_on = ""  # what the current call waits for (named when it runs out of time)
        self._writes = allocwrites.AllocationWrites(
            api=api,
            view=view,
            node=node,
            keys=keys,
            writes=writes if writes is not None else writebehind.WriteQueue(),
            overlay=self._overlay,
            clock=clock,
        )
        self._pod_feed = pod_feed
        self._preferred_wait_s = preferred_wait_s

    @property
    def writes(self) -> writebehind.Writes:
        """Where the writes after each answer go."""
        return self._writes.writes

    # --- finding the pod --------------------------------------------------------------------

    async def _pending_pod(self, *, read_api: bool = True) -> JsonObj | None:
        found = await self._pending_in(self._view.node(), list(self._view.pods()))
        if found is not None or not read_api:
            return found
        # kubelet saw the Binding before our watches did (the scheduler writes the decision and the
        # bind phase in the Binding itself): read the node and its pods from the API server once
        try:
            self._waiting_on = "the API server (no pending pod in the watch caches yet)"
            node = await self._api.get("nodes", self._node)
            listed = await self._api.list("pods", field_selector=f"spec.nodeName={self._node}")
        except errors.KubeError as exc:
            log.warning("node %s: no pending pod cached and reading the API failed: %s", self._node, exc)
            return None
        log.info("node %s: no pending pod in the watch caches yet; read the API server", self._node)
        self._read_node = node  # newer than the cache: the lock release judges it too
        return await self._pending_in(node, listed.items)

    async def _pending_in(self, node: JsonObj | None, on_node: list[JsonObj]) -> JsonObj | None:
        """The pod this Allocate is for, from ``node`` (its lock) and the pods ``on_node``."""
        raw = annotations.of(node).get(self._keys.node_lock) if node else None
        by_key = {key(p): p for p in on_node}
        if raw:
            try:
                lock: annotations.NodeLock | None = annotations.decode_node_lock(
                    raw, field=self._keys.node_lock
                )
            except errors.AnnotationError as exc:
                log.warning("node %s: ignoring unreadable lock: %s", self._node, exc)
                lock = None
            if lock is not None and not lock.legacy:
                cached = by_key.get((lock.namespace, lock.pod))
                holder: JsonObj | None = self._overlay.current(cached) if cached else None
                if holder is None:
                    try:  # the watch may lag behind the scheduler's bind
                        self._waiting_on = f"the API server (reading lock holder {lock.namespace}/{lock.pod})"
                        holder = await self._api.get("pods", lock.pod, namespace=lock.namespace)
                    except errors.NotFound:
                        holder = None
                if holder is not None and allocation.is_pending_on(holder, node=self._node, keys=self._keys):
                    return holder
                log.info(
                    "node %s: lock holder %s/%s is not pending here; using the oldest pending pod",
                    self._node,
                    lock.namespace,
                    lock.pod,
                )
        self._overlay.keep_only(by_key)  # deleted pods: forget what we wrote or will write
        pods = [self._overlay.current(p) for p in on_node]
        return allocation.oldest_pending(pods, node=self._node, keys=self._keys)

    # --- Allocate -----------------------------------------------------------------------------

    async def allocate(self, requests: list[list[str]]) -> Answers:
        if not requests or not all(requests):
            # garbage (kubelet sends one request per container, each with its IDs): refused before
            # any pod is touched, which would otherwise be marked success with nothing served
            raise errors.AllocationError(
                f"Allocate on node {self._node}: every request must name one or more devices for each "
                f"container; got {requests}"
            )
        work = asyncio.ensure_future(self._bounded(requests))
        self._inflight.add(work)
        work.add_done_callback(self._settled)
        return await asyncio.shield(work)  # kubelet's cancel leaves the work whole, recorded or failed

    def _settled(self, work: asyncio.Task[Answers]) -> None:
        self._inflight.discard(work)
        if not work.cancelled() and work.exception() is not None:
            log.debug("node %s: Allocate ended with %s", self._node, work.exception())

    async def settle(self) -> None:
        """Wait for Allocates whose callers went away (tests; a stopping session)."""
        await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _bounded(self, requests: list[list[str]]) -> Answers:
        """One Allocate (replayed or new) within ``allocateTimeoutS``, its wait for another included."""
        limit_s = self._config.allocate_timeout_s
        self._waiting_on = "another Allocate"
        serving: list[JsonObj] = []  # the pod, once known (marked failed if time runs out)
        try:
            async with asyncio.timeout(limit_s):
                async with self._once:
                    replayed = await self._replayed(requests)
                    if replayed is not None:
                        return replayed
                    async with self._lock:
                        return await self._allocate(requests, serving)
        except TimeoutError:
            message = (
                f"Allocate on node {self._node} took longer than {limit_s:g} s (allocateTimeoutS) waiting "
                f"for {self._waiting_on}; devices {requests}"
            )
            if serving:
                message = f"pod {allocation.pod_ref(serving[0])}: {message}"
                await self._writes.failed(serving[0], message, read=self._read_node)
            log.error("%s", message)
            raise errors.AllocationError(message) from None

    async def _replayed(self, requests: list[list[str]]) -> Answers | None:
        """The recorded answers when the same containers ask again (``ledger``), else None."""
        replayed = self._answers.replay(requests, pods=self._view.pods())
        if replayed is None or await self._another_pods_turn(requests, replayed):
            return None
        for served in replayed:
            log.info(
                "Allocate: pod %s container %s asked again for %s on node %s; same answer",
                served.pod,
                served.container,
                sorted(served.ids),
                self._node,
            )
        return [served.response for served in replayed]

    async def _another_pods_turn(self, requests: list[list[str]], replayed: list[ledger.Served]) -> bool:
        """Whether IDs a recorded pod had are asked for by another pod: kubelet frees a finished pod's
        IDs before our cache shows it finished, and the pending pod whose next entry is on those
        GPUs is then the one asking. A re-ask comes with no other pod's entry waiting there."""
        async with self._lock:
            self._read_node = None
            self._waiting_on = "the watch caches"
            pending = await self._pending_pod()
        if pending is None:
            return False
        uid = str(pending.get("metadata", {}).get("uid", ""))
        if all(served.pod_uid == uid for served in replayed):
            return False
        try:
            target = allocation.select_target(pending, keys=self._keys, device_count=len(requests[0]))
            chosen = sorted(physical_uuid(i, gpus=self._refs) for i in requests[0])
        except errors.VgpuError:
            return False
        return sorted(d.uuid for d in target.devices) == chosen

    async def _allocate(self, requests: list[list[str]], serving: list[JsonObj]) -> Answers:
        self._read_node = None
        self._waiting_on = "the watch caches"
        pod = await self._pending_pod()
        if pod is None:
            raise errors.AllocationError(
                f"no binding pod found on node {self._node} (no pod with {self._keys.bind_phase}="
                f"allocating assigned here); devices {requests}"
            )
        serving.append(pod)
        ref = allocation.pod_ref(pod)
        try:
            targets: list[allocation.Target] = []  # one per container, in kubelet's order
            remaining: annotations.PodDevices = ()
            served = pod
            for ids in requests:
                target = allocation.select_target(served, keys=self._keys, device_count=len(ids))
                self._check_ids(ref, target, ids)
                targets.append(target)
                remaining = target.remaining
                served = self._with_to_allocate(served, remaining)  # the next container's entry
            # host files are blocking I/O (a new directory costs 0.4 ms of CPU on ext4, more on a
            # busy disk): a worker thread, not the event loop that serves kubelet and the watches;
            # one hop for the whole Allocate (each hop hands the GIL over and back)
            self._waiting_on = "the host's files (per-container directories)"
            facts, host_dirs = await self._offload(functools.partial(self._host_files, targets))
            results = [
                self._response(target, host_dir=host_dir, facts=facts)
                for target, host_dir in zip(targets, host_dirs, strict=True)
            ]
        except errors.AllocationError as exc:
            if isinstance(exc, hostfs.HamiCoreMissing):
                self._hami_core_missing()
            message = str(exc) if str(exc).startswith(f"pod {ref}") else f"pod {ref}: {exc}"
            await self._writes.failed(pod, message, read=self._read_node)
            raise errors.AllocationError(message) from None
        except Exception as exc:  # a bug must not leave the pod allocating and the node locked
            log.exception("pod %s: Allocate failed unexpectedly", ref)
            await self._writes.failed(pod, repr(exc), read=self._read_node)
            raise errors.VgpuError(f"pod {ref}: internal error: {exc!r}") from exc
        serving.clear()  # answered: time running out now is not this pod's failure
        cached = self._view.pod(targets[0].namespace, targets[0].pod)
        seen = cached is not None and cached.get("metadata", {}).get("uid") == targets[0].pod_uid
        self._answers.record_answers(
            pod, ref=ref, targets=targets, requests=requests, results=results, seen=seen, at_s=self._clock()
        )
        await self._writes.served(pod, remaining, read=self._read_node)
        return results

    def _host_files(self, targets: list[allocation.Target]) -> tuple[allocation.HostFacts, list[str]]:
        """The host's facts and each container's fresh cache directory (blocking: off the loop).
        HamiCoreMissing first when HAMi-core's files are not regular files: a runtime would make
        each missing one a directory and start the container without its limits."""
        self._host.check_hami_core()
        return self._host.facts(), [self._host.container_dir(t.pod_uid, t.container) for t in targets]

    def _check_ids(self, ref: str, target: allocation.Target, ids: list[str]) -> None:
        """kubelet's IDs must name the scheduler's GPUs (``kubeletids``): else refused, with why."""
        for device in target.devices:
            if device.uuid not in self._refs:
                raise errors.AllocationError(f"GPU {device.uuid} is not on this node")
        found = kubeletids.mismatch(target.devices, ids, gpus=self._refs)
        earlier = self._kubelet_ids.setdefault(target.pod_uid, set())
        self._kubelet_ids.move_to_end(target.pod_uid)
        while len(self._kubelet_ids) > _REMEMBERED_PODS:
            self._kubelet_ids.popitem(last=False)
        if found is None:
            earlier.update(ids)
            return
        raise errors.AllocationError(
            f"pod {ref}: "
            + kubeletids.mismatch_reason(
                found,
                container=target.container,
                ids=ids,
                numa={u: r.numa_node for u, r in self._refs.items()},
                numa_sent=self._config.enable_numa_topology,
                reused=any(i in earlier for i in ids),
            )
        )

    def _response(
        self, target: allocation.Target, *, host_dir: str, facts: allocation.HostFacts
    ) -> allocation.ContainerAllocation:
        alloc = allocation.build_response(
            target.devices,
            config=self._config,
            gpus=self._refs,
            cache_id=self._new_cache_id(),
            cache_host_dir=host_dir,
            host=facts,
        )
        log.info(
            "Allocate: pod %s/%s container %s on node %s: GPUs %s",
            target.namespace,
            target.pod,
            target.container,
            self._node,
            ",".join(f"{d.uuid}({d.memory_mib}MiB,{d.cores}%)" for d in target.devices),
        )
        return alloc

    def _with_to_allocate(self, pod: JsonObj, remaining: annotations.PodDevices) -> JsonObj:
        meta = dict(pod.get("metadata", {}))
        notes = dict(annotations.of(pod))
        notes[self._keys.devices_to_allocate] = annotations.encode_pod_devices(remaining)
        meta["annotations"] = notes
        return {**pod, "metadata": meta}

    async def node_changed(self, node: JsonObj) -> None:
        """The node watch delivered ``node``: a lock it shows of a pod whose Allocate is over and
        that the cache did not show then is released (an API call only in that case)."""
        await self._writes.node_changed(node)

    # --- GetPreferredAllocation ---------------------------------------------------------------

    async def preferred(self, requests: list[allocation.PreferredRequest]) -> list[list[str]]:
        """For each request, the IDs on the pending pod's next entry's GPUs. When no pending pod
        with entries of the requests' sizes is known yet (not to the watch caches, nor to the API
        server's reply: kubelet would then pick arbitrary IDs, and the Allocate be refused), wait up
        to ``preferred_wait_s`` for the pod watch to show one, re-reading the cache at each pod
        change. A known pod whose GPUs kubelet does not offer is answered at once (no preference)."""
        feed = self._pod_feed
        changed = feed.pods_changed() if feed is not None else None  # before reading: none missed
        answer, known = await self._preferred_once(requests, read_api=True)
        if feed is None or changed is None or known:
            return answer
        try:
            async with asyncio.timeout(self._preferred_wait_s):
                while not known:
                    await changed.wait()
                    changed = feed.pods_changed()
                    answer, known = await self._preferred_once(requests, read_api=False)
        except TimeoutError:
            log.info(
                "node %s: GetPreferredAllocation: no pending pod with entries of %s device(s) after %g s; "
                "no preference",
                self._node,
                [r.size for r in requests],
                self._preferred_wait_s,
            )
        return answer

    async def _preferred_once(
        self, requests: list[allocation.PreferredRequest], *, read_api: bool
    ) -> tuple[list[list[str]], bool]:
        """The answer, and whether a pending pod with entries of the requests' sizes was found."""
        none: list[list[str]] = [[] for _ in requests]
        try:  # kubelet waits for this one in its pod loop too
            async with asyncio.timeout(self._config.allocate_timeout_s):
                async with self._lock:
                    self._read_node = None
                    pod = await self._pending_pod(read_api=read_api)
        except TimeoutError:
            raise errors.AllocationError(
                f"GetPreferredAllocation on node {self._node} took longer than "
                f"{self._config.allocate_timeout_s:g} s (allocateTimeoutS)"
            ) from None
        uid = str(pod.get("metadata", {}).get("uid", "")) if pod is not None else None
        again = self._answers.preferred_again(uid, requests, pods=self._view.pods())
        if again is not None:  # kubelet re-choosing answered IDs: steered back to them, no wait
            return again, True
        if pod is None:
            return none, False
        raw = annotations.of(pod).get(self._keys.devices_to_allocate, "")
        try:
            entries = [e for e in annotations.decode_pod_devices(raw) if e]
        except errors.AnnotationError as exc:
            log.warning("pod %s: no preferred allocation: %s", allocation.pod_ref(pod), exc)
            return none, True  # its Allocate will say why; waiting would not change the annotation
        out = []
        known = True
        for i, request in enumerate(requests):
            entry = entries[i] if i < len(entries) else ()
            known = known and len(entry) == request.size
            out.append(
                allocation.preferred_ids(
                    entry, available=request.available, must_include=request.must_include, size=request.size
                )
            )
        return out, known
