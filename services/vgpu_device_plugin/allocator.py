"""HAMi-sharing Allocate (PROTOCOL.md F.8 with our fixes) and GetPreferredAllocation.

Per call, under one asyncio.Lock: find the pod (the node lock's holder when it is pending here,
else the pending pod with the oldest bind time, from the in-memory ``ClusterView``), take the
first non-empty container entry of its to-allocate annotation, build the HAMi-core response,
PATCH the rewritten to-allocate (with ``bind-phase: success`` when no entry is left, then release
the node lock, owner-checked, with a resourceVersion precondition). Any failure: bind phase
``failed``, lock released, and an error naming the pod and why. A request with no container, or a
container with no device IDs, is refused before any pod is looked at (kubelet never sends one).

The lock is judged from the node watch's cache (no API read per Allocate; with the scheduler's
``nodeLock: contended`` most binds write no lock), or from the node read from the API when the
caches were behind the Binding. A lock the cache has not shown yet is released when the watch
delivers it (``node_changed``, ``lockreaper.LateLocks``).

Our own patch answers are kept until the watch catches up, so the next container's Allocate never
reads a stale to-allocate value from the cache.

Idempotent (``ledger``): every answer is recorded by kubelet's device IDs, and a request repeating
them (kubelet restarted before its checkpoint, or re-allocates) gets the recorded answer without
consuming an entry. An Allocate runs as a task the gRPC call only waits for: when kubelet cancels
the call, the work (PATCH included) still finishes and is recorded, or fails and marks the pod
failed, never half; kubelet's next ask is then answered from the record.
"""

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from vgpu.core import allocation, annotations, errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid, physical_uuid
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_device_plugin import hostfs, ledger, lockreaper
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.podcache import ClusterView

log = logging.getLogger(__name__)

_LOCK_RELEASE_ATTEMPTS = 3
_T = TypeVar("_T")


class Offload(Protocol):
    """Runs a blocking call away from the event loop: ``asyncio.to_thread``'s shape."""

    def __call__(self, func: Callable[[], _T], /) -> Awaitable[_T]: ...


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", "0"))
    except (TypeError, ValueError):
        return 0


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata", {})
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


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
        hami_core_missing: Callable[[], None] = lambda: None,
        answers: ledger.Ledger | None = None,
    ) -> None:
        """``hami_core_missing`` is told when Allocate found HAMi-core's files missing
        (``HamiCoreWatch.poke``: the GPUs become unhealthy at once). ``answers``: the process's
        ledger (the manager's, shared by its sessions; a new one by default). ``offload`` runs the blocking host-file work of an Allocate (a worker thread; the
        throughput bench, standing in for 1,000 nodes on one machine, runs it in place).
        Feed ``node_changed`` with the node watch's changes (else a lock the node cache had not
        shown at Allocate waits for the lock reaper)."""
        self._api = api
        self._view = view
        self._node = node
        self._config = config
        self._keys = keys
        self._refs = refs
        self._host = host
        self._new_cache_id = new_cache_id
        self._offload = offload
        self._hami_core_missing = hami_core_missing
        self._lock = asyncio.Lock()
        self._once = asyncio.Lock()  # one Allocate at a time, replay check included
        self._clock = clock
        self._answers = answers if answers is not None else ledger.Ledger(clock=clock)
        self._inflight: set[asyncio.Task[list[allocation.ContainerAllocation]]] = set()
        self._fresh: dict[tuple[str, str], JsonObj] = {}
        self._read_node: JsonObj | None = None  # the node read from the API by this Allocate
        self._late = lockreaper.LateLocks(api=api, node=node, keys=keys, clock=clock)

    # --- finding the pod --------------------------------------------------------------------

    def _current(self, pod: JsonObj) -> JsonObj:
        """The cached pod, or our newer patch answer while the watch has not caught up."""
        key = _key(pod)
        fresh = self._fresh.get(key)
        if fresh is None:
            return pod
        if _rv(pod) >= _rv(fresh):
            del self._fresh[key]
            return pod
        return fresh

    async def _pending_pod(self) -> JsonObj | None:
        found = await self._pending_in(self._view.node(), list(self._view.pods()))
        if found is not None:
            return found
        # kubelet saw the Binding before our watches did (the scheduler writes the decision and the
        # bind phase in the Binding itself): read the node and its pods from the API server once
        try:
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
        by_key = {_key(p): p for p in on_node}
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
                holder: JsonObj | None = self._current(cached) if cached else None
                if holder is None:
                    try:  # the watch may lag behind the scheduler's bind
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
        for gone in [k for k in self._fresh if k not in by_key]:
            del self._fresh[gone]  # deleted pods: forget our patch answers
        pods = [self._current(p) for p in on_node]
        return allocation.oldest_pending(pods, node=self._node, keys=self._keys)

    # --- Allocate -----------------------------------------------------------------------------

    async def allocate(self, requests: list[list[str]]) -> list[allocation.ContainerAllocation]:
        if not requests or not all(requests):
            # garbage (kubelet sends one request per container, each with its IDs): refused before
            # any pod is touched, which would otherwise be marked success with nothing served
            raise errors.AllocationError(
                f"Allocate on node {self._node}: every request must name one or more devices for each "
                f"container; got {requests}"
            )
        work = asyncio.ensure_future(self._allocate_once(requests))
        self._inflight.add(work)
        work.add_done_callback(self._settled)
        return await asyncio.shield(work)  # kubelet's cancel leaves the work whole, recorded or failed

    def _settled(self, work: asyncio.Task[list[allocation.ContainerAllocation]]) -> None:
        self._inflight.discard(work)
        if not work.cancelled() and work.exception() is not None:
            log.debug("node %s: Allocate ended with %s", self._node, work.exception())

    async def settle(self) -> None:
        """Wait for Allocates whose callers went away (tests; a stopping session)."""
        await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _allocate_once(self, requests: list[list[str]]) -> list[allocation.ContainerAllocation]:
        async with self._once:
            replayed = self._answers.replay(requests, pods=self._view.pods())
            if replayed is not None and await self._another_pods_turn(requests, replayed):
                replayed = None
            if replayed is not None:
                for served in replayed:
                    log.info(
                        "Allocate: pod %s container %s asked again for %s on node %s; same answer",
                        served.pod,
                        served.container,
                        sorted(served.ids),
                        self._node,
                    )
                return [served.response for served in replayed]
            return await self._allocate_new(requests)

    async def _another_pods_turn(self, requests: list[list[str]], replayed: list[ledger.Served]) -> bool:
        """Whether IDs a recorded pod had are asked for by another pod: kubelet frees a finished pod's
        IDs before our cache shows it finished, and the pending pod whose next entry is on those
        GPUs is then the one asking. A re-ask comes with no other pod's entry waiting there."""
        async with self._lock:
            self._read_node = None
            pending = await self._pending_pod()
        if pending is None:
            return False
        uid = str(pending.get("metadata", {}).get("uid", ""))
        if all(served.pod_uid == uid for served in replayed):
            return False
        try:
            target = allocation.select_target(pending, keys=self._keys, device_count=len(requests[0]))
        except errors.AllocationError:
            return False
        chosen = sorted(physical_uuid(i, gpus=self._refs) for i in requests[0])
        return sorted(d.uuid for d in target.devices) == chosen

    async def _allocate_new(self, requests: list[list[str]]) -> list[allocation.ContainerAllocation]:
        async with self._lock:
            self._read_node = None
            pod = await self._pending_pod()
            if pod is None:
                raise errors.AllocationError(
                    f"no binding pod found on node {self._node} (no pod with {self._keys.bind_phase}="
                    f"allocating assigned here); devices {requests}"
                )
            ref = allocation.pod_ref(pod)
            try:
                targets: list[allocation.Target] = []  # one per container, in kubelet's order
                remaining: annotations.PodDevices = ()
                for ids in requests:
                    target = allocation.select_target(pod, keys=self._keys, device_count=len(ids))
                    self._check_ids(ref, target, ids)
                    targets.append(target)
                    remaining = target.remaining
                    pod = self._with_to_allocate(pod, remaining)  # the next container's entry
                # host files are blocking I/O (a new directory costs 0.4 ms of CPU on ext4, more on a
                # busy disk): a worker thread, not the event loop that serves kubelet and the watches;
                # one hop for the whole Allocate (each hop hands the GIL over and back)
                facts, host_dirs = await self._offload(functools.partial(self._host_files, targets))
                results = [
                    self._response(pod, target, host_dir=host_dir, facts=facts)
                    for target, host_dir in zip(targets, host_dirs, strict=True)
                ]
                await self._commit(pod, remaining)
                cached = self._view.pod(targets[0].namespace, targets[0].pod)
                seen = cached is not None and cached.get("metadata", {}).get("uid") == targets[0].pod_uid
                for target, ids, result in zip(targets, requests, results, strict=True):
                    if allocation.devices_reused_later(pod, target.container):
                        continue  # kubelet hands an init container's IDs on to later containers
                    self._answers.record(
                        ledger.Served(
                            pod_uid=target.pod_uid,
                            pod=ref,
                            container=target.container,
                            ids=frozenset(ids),
                            response=result,
                            at_s=self._clock(),
                        ),
                        seen=seen,
                    )
            except errors.AllocationError as exc:
                if isinstance(exc, hostfs.HamiCoreMissing):
                    self._hami_core_missing()
                message = str(exc) if str(exc).startswith(f"pod {ref}") else f"pod {ref}: {exc}"
                await self._fail(pod, message)
                raise errors.AllocationError(message) from None
            except errors.KubeError as exc:
                await self._fail(pod, str(exc))
                raise errors.KubeError(
                    f"pod {ref}: writing annotations failed: {exc}", status=exc.status
                ) from None
            except Exception as exc:  # a bug must not leave the pod allocating and the node locked
                log.exception("pod %s: Allocate failed unexpectedly", ref)
                await self._fail(pod, repr(exc))
                raise errors.VgpuError(f"pod {ref}: internal error: {exc!r}") from exc
            return results

    def _host_files(self, targets: list[allocation.Target]) -> tuple[allocation.HostFacts, list[str]]:
        """The host's facts and each container's fresh cache directory (blocking: off the loop).
        HamiCoreMissing first when HAMi-core's files are not regular files: a runtime would make
        each missing one a directory and start the container without its limits."""
        self._host.check_hami_core()
        return self._host.facts(), [self._host.container_dir(t.pod_uid, t.container) for t in targets]

    def _check_ids(self, ref: str, target: allocation.Target, ids: list[str]) -> None:
        assigned = sorted(d.uuid for d in target.devices)
        chosen = sorted(physical_uuid(i, gpus=self._refs) for i in ids)
        if assigned != chosen:
            # the scheduler's choice is what its accounting counts: keep it
            log.warning(
                "pod %s container %s: kubelet picked devices %s on GPUs %s but the scheduler assigned %s; "
                "using the scheduler's GPUs",
                ref,
                target.container,
                ids,
                chosen,
                assigned,
            )

    def _response(
        self, pod: JsonObj, target: allocation.Target, *, host_dir: str, facts: allocation.HostFacts
    ) -> allocation.ContainerAllocation:
        env = allocation.container_env(pod, target.container)  # the spec's env: annotations do not matter
        alloc = allocation.build_response(
            target.devices,
            config=self._config,
            gpus=self._refs,
            cache_id=self._new_cache_id(),
            cache_host_dir=host_dir,
            disable_control=allocation.truthy(env.get("CUDA_DISABLE_CONTROL", "")),
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

    async def _commit(self, pod: JsonObj, remaining: annotations.PodDevices) -> None:
        namespace, name = _key(pod)
        done = not any(remaining)
        notes: dict[str, Any] = {self._keys.devices_to_allocate: annotations.encode_pod_devices(remaining)}
        meta: dict[str, Any] = {"annotations": notes}
        if done:
            notes[self._keys.bind_phase] = annotations.BindPhase.SUCCESS.value
            # the hami.io/vgpu-node label (kubectl get pods -l) rides on this write: no extra round trip
            meta["labels"] = {self._keys.assigned_node: self._node}
        patched = await self._api.merge_patch("pods", name, {"metadata": meta}, namespace=namespace)
        self._fresh[(namespace, name)] = patched
        if done:
            log.info("pod %s/%s: every container allocated; bind phase success", namespace, name)
            await self._release_lock(namespace, name)

    async def _fail(self, pod: JsonObj, reason: str) -> None:
        namespace, name = _key(pod)
        try:
            patched = await self._api.merge_patch(
                "pods",
                name,
                {"metadata": {"annotations": {self._keys.bind_phase: annotations.BindPhase.FAILED.value}}},
                namespace=namespace,
            )
            self._fresh[(namespace, name)] = patched
        except errors.KubeError as exc:
            log.error("pod %s/%s: could not set bind phase failed: %s", namespace, name, exc)
        log.warning("pod %s/%s: Allocate failed, bind phase failed: %s", namespace, name, reason)
        await self._release_lock(namespace, name)

    def _known_node(self) -> JsonObj | None:
        """The newest node this Allocate knows: the watch's, or the one it read from the API."""
        cached, read = self._view.node(), self._read_node
        if read is None or (cached is not None and _rv(cached) >= _rv(read)):
            return cached
        return read

    async def _release_lock(self, namespace: str, name: str) -> None:
        """Remove the node lock if this pod holds it (resourceVersion precondition, re-read on conflict).
        No lock of the pod known: its lock, if the watch delivers one later, is released then."""
        node = self._known_node()
        for _ in range(_LOCK_RELEASE_ATTEMPTS):
            if node is None:
                self._late.remember(namespace, name)
                return
            raw = annotations.of(node).get(self._keys.node_lock)
            try:
                lock = annotations.decode_node_lock(raw, field=self._keys.node_lock) if raw else None
            except errors.AnnotationError:
                lock = None  # not ours to judge; the scheduler clears unreadable locks
            if lock is None or not lock.held_by(namespace, name):
                self._late.remember(namespace, name)  # perhaps the watch has not shown it yet
                return
            patch = {
                "metadata": {
                    "resourceVersion": node["metadata"].get("resourceVersion"),
                    "annotations": {self._keys.node_lock: None},
                }
            }
            try:
                await self._api.merge_patch("nodes", self._node, patch)
                log.info("node %s: lock of pod %s/%s released", self._node, namespace, name)
                return
            except errors.Conflict:
                node = await self._get_node()
            except errors.KubeError as exc:
                log.error("node %s: releasing the lock of %s/%s failed: %s", self._node, namespace, name, exc)
                return
        log.error("node %s: lock of %s/%s not released: kept conflicting", self._node, namespace, name)

    async def node_changed(self, node: JsonObj) -> None:
        """The node watch delivered ``node``: a lock it shows of a pod whose Allocate is over and
        that the cache did not show then is released (an API call only in that case)."""
        await self._late.node_changed(node)

    async def _get_node(self) -> JsonObj | None:
        try:
            return await self._api.get("nodes", self._node)
        except errors.KubeError as exc:
            log.error("node %s: re-reading the node failed: %s", self._node, exc)
            return None

    # --- GetPreferredAllocation ---------------------------------------------------------------

    def _asked_again(
        self, pending: JsonObj | None, requests: list[allocation.PreferredRequest]
    ) -> list[list[str]] | None:
        """kubelet re-admitting a pod it already had answered (its checkpoint lost): prefer the IDs
        of that pod's earliest recorded answer kubelet has free again, so that its Allocate repeats
        them and is replayed. Only for the pending pod's own records, or any live pod's when none is
        pending (another pending pod is a new request: its entry decides)."""
        if len(requests) != 1:
            return None
        request = requests[0]
        uid = str(pending.get("metadata", {}).get("uid", "")) if pending is not None else None
        free = set(request.available) | set(request.must_include)
        for served in self._answers.recorded(pods=self._view.pods()):
            if uid is not None and served.pod_uid != uid:
                continue
            if (
                len(served.ids) == request.size
                and served.ids <= free
                and set(request.must_include) <= served.ids
            ):
                return [sorted(served.ids)]
        return None

    async def preferred(self, requests: list[allocation.PreferredRequest]) -> list[list[str]]:
        async with self._lock:
            pod = await self._pending_pod()
        again = self._asked_again(pod, requests)
        if again is not None:
            return again
        if pod is None:
            return [[] for _ in requests]
        raw = annotations.of(pod).get(self._keys.devices_to_allocate, "")
        try:
            entries = [e for e in annotations.decode_pod_devices(raw) if e]
        except errors.AnnotationError as exc:
            log.warning("pod %s: no preferred allocation: %s", allocation.pod_ref(pod), exc)
            return [[] for _ in requests]
        out = []
        for i, request in enumerate(requests):
            entry = entries[i] if i < len(entries) else ()
            out.append(
                allocation.preferred_ids(
                    entry, available=request.available, must_include=request.must_include, size=request.size
                )
            )
        return out
