"""kubelet emulation for one node: the device manager and pod admission (docs/protocol.md#how-kubelet-uses-them).

``KubeletEmulator`` serves ``v1beta1.Registration`` on ``<socket_dir>/kubelet.sock`` and behaves like
a newer kubelet (``kubeletregistration``): ``Register`` is validated (version ``v1beta1``, an
extended resource name), then kubelet dials ``<socket_dir>/<endpoint>`` (10 s), calls
``GetDevicePluginOptions`` and keeps that answer, and consumes ``ListAndWatch`` in a task. Every message replaces the resource's devices and
is written to the Node at once (``status.capacity`` = all, ``status.allocatable`` = healthy); when
the stream ends allocatable drops to 0. A new Register for a resource replaces the old endpoint.

Pods bound to the node are admitted one at a time in creation order (``admission_delay_s`` before
each): for init containers, then containers, every limit on a registered resource gets device IDs
(``kubeletdevices``) and one ``Allocate`` with one ContainerAllocateRequest. The responses are
recorded on the pod as the annotation ``localcluster.kube-vgpu.io/allocations``; PreStartContainer
runs when the plugin asks for it; the pod becomes Running. An Allocate failure fails the pod with
``UnexpectedAdmissionError``. Devices are freed when a pod is deleted or terminates.
``restart()`` emulates a kubelet restart: the socket directory is wiped and kubelet.sock re-created;
device assignments survive (the checkpoint) and capacity reads 0 until plugins register again.
``readmit_delay_s`` after kubelet.sock is back (its pod sources are ready) every pod it runs is
admitted again as kubelet ≥ 1.27 does (``kubeletreadmit``): a container that is not running (a
finished init container) on a resource with no healthy devices yet fails its pod with
``UnexpectedAdmissionError`` (``readmit_delay_s=None``: no re-admission, as kubelet < 1.27).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import grpc

from vgpu.core import errors
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.kubeletapi.v1beta1 import api_pb2, api_pb2_grpc
from vgpu.localcluster import (
    kubeletadmit,
    kubeletdevices,
    kubeletdra,
    kubeletdrahealth,
    kubeletqueue,
    kubeletreadmit,
    kubeletregistration,
    podresources,
    statuswriter,
)

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
# kubelet admits the pods it runs again right after its restart: its pod sources list them within
# milliseconds of kubelet.sock being created (kubernetes #133382)
READMIT_DELAY_S = 0.05
ALLOCATIONS_ANNOTATION = kubeletadmit.ALLOCATIONS_ANNOTATION


class KubeletEmulator:
    """One node's kubelet (device manager and admission); see the module docstring."""

    def __init__(
        self,
        api: KubeApi,
        *,
        node: str,
        socket_dir: Path,
        admission_delay_s: float = 0.0,
        status_writer: statuswriter.StatusWriter | None = None,
        dial_timeout_s: float = kubeletregistration.DIAL_TIMEOUT_S,
        termination_s: float = 0.0,
        readmit_delay_s: float | None = READMIT_DELAY_S,
        topology_hint: kubeletadmit.TopologyHint | None = None,
        cdi_spec_dirs: Sequence[Path] | None = None,
        host_root: Path | None = None,
        plugins_registry_dir: Path | None = None,
        dra_retry_s: float = 0.5,
        dra_health_retry_s: float = kubeletdrahealth.RETRY_S,
    ) -> None:
        """``termination_s``: how long a pod marked for deletion takes to stop before this kubelet
        deletes it for good (its containers' exit, emulated), at most its grace period.
        ``readmit_delay_s``: after a ``restart()``, when the pods it runs are admitted again.
        ``topology_hint``: the TopologyManager's NUMA hint per container (None: no policy).
        ``cdi_spec_dirs``: the runtime resolves CDI devices against these (None: no CDI).
        ``host_root``: the node's stand-in ``/``, where containers' mount sources are prepared as a
        real runtime does (a missing one becomes a directory: ``kubeletruntime``).
        ``plugins_registry_dir``: where DRA plugins register (``kubeletdra``; None: no DRA);
        ``dra_retry_s``: how soon a pod whose claims could not be prepared is tried again;
        ``dra_health_retry_s``: how soon a DRA plugin's ended health stream is opened again."""
        self.host_root = host_root
        self._api = api
        self._status = statuswriter.resolve(api, status_writer)
        self.node = node
        self.socket_dir = Path(socket_dir)
        self.admission_delay_s = admission_delay_s
        self.dial_timeout_s = dial_timeout_s
        self.devices = kubeletdevices.DeviceBook()
        self.options: dict[str, api_pb2.DevicePluginOptions] = {}
        self._endpoints: dict[str, kubeletadmit.Endpoint] = {}
        self._server: grpc.aio.Server | None = None
        self._queue = kubeletqueue.AdmissionQueue()
        self.dra: kubeletdra.DraManager | None = None
        self.dra_health: kubeletdrahealth.PodHealth | None = None
        if plugins_registry_dir is not None:
            registry = kubeletdra.PluginRegistry(plugins_registry_dir, health_retry_s=dra_health_retry_s)
            self.dra = kubeletdra.DraManager(api, registry)
            self.dra_health = kubeletdrahealth.PodHealth(
                api,
                self._status,
                cache=registry.health.cache,
                claims=self.dra.claims,
                claim_name=kubeletdra.claim_name_or_none,
                pod_by_uid=self._pod_by_uid,
                spawn=self._spawn,
            )
            registry.health.on_change = self.dra_health.changed
        self.dra_retry_s = dra_retry_s
        self._admitter = kubeletadmit.PodAdmitter(
            api,
            self._status,
            node=node,
            devices=self.devices,
            endpoints=self._endpoints,
            topology_hint=topology_hint,
            cdi_spec_dirs=cdi_spec_dirs,
            host_root=host_root,
            dra_prepare=self.dra.prepare if self.dra is not None else None,
            dra_status=self.dra_health.statuses if self.dra_health is not None else None,
        )
        self._admitted: set[str] = set()
        self._pods = informer.Informer(
            api, "pods", field_selector=f"spec.nodeName={node}", on_event=self._on_pod
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()  # DRA unprepare and retries
        self._seq = itertools.count()
        self.termination_s = termination_s
        self._terminating: dict[str, asyncio.Task[None]] = {}
        self.readmit_delay_s = readmit_delay_s
        self.readmissions = 0  # completed re-admission rounds (for tests)
        self.readmitted = asyncio.Event()  # set when a restart's re-admission is over

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / KUBELET_SOCKET

    # ----- lifecycle -----

    async def start(self) -> None:
        """Clean the socket dir as kubelet does, serve Registration, and follow this node's pods."""
        self.socket_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        self._wipe_dir()
        await self._serve()
        self._tasks = [
            asyncio.create_task(self._pods.run()),
            asyncio.create_task(self._admit_loop()),
        ]
        if self.dra is not None:
            self._tasks.append(asyncio.create_task(self.dra.registry.run()))

    async def restart(self) -> None:
        """A kubelet restart: connections die, the dir is wiped, kubelet.sock comes back empty-handed."""
        await self._stop_server()
        await self._close_endpoints()
        self._wipe_dir()
        if self.dra is not None:
            await self.dra.registry.forget()  # plugins register again; prepared claims are checkpointed
        for resource in list(self.devices.resources):
            await self._publish(resource, self.devices.forget_devices(resource))
        await self._serve()
        log.info("node %s: kubelet restarted; %s re-created", self.node, self.socket_path)
        if self.readmit_delay_s is not None:
            self.readmitted.clear()
            self._tasks.append(asyncio.create_task(self._readmit(self.readmit_delay_s)))

    async def _readmit(self, delay_s: float) -> None:
        """kubelet ≥ 1.27 at start: admit every pod it runs again (``kubeletreadmit``)."""
        await asyncio.sleep(delay_s)  # the emulated time until kubelet's pod sources are ready
        for pod in list(self._pods.items()):
            meta = pod["metadata"]
            if meta["uid"] not in self._admitted or podresources.is_terminated(pod):
                continue
            if meta.get("deletionTimestamp"):
                continue
            cause = kubeletreadmit.readmission_error(
                pod, self.devices, allocations_annotation=ALLOCATIONS_ANNOTATION
            )
            if cause is not None:
                try:
                    await self._admitter.reject(pod, cause)
                except errors.KubeError as err:
                    log.warning("node %s: rejecting pod %s: API error %s", self.node, meta["uid"], err)
        self.readmissions += 1
        self.readmitted.set()

    async def stop(self) -> None:
        """Stop serving, end every task and connection, remove kubelet.sock."""
        running = [*self._tasks, *self._terminating.values(), *self._background]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        self._tasks = []
        self._terminating = {}
        await self._stop_server()
        await self._close_endpoints()
        self.socket_path.unlink(missing_ok=True)

    async def allocate_again(self, pod: JsonObj) -> dict[str, dict[str, Any]]:
        """Call Allocate again for an admitted pod's containers with the IDs they hold, as kubelet
        does after a restart that lost its checkpoint; returns the answers (``kubeletadmit``)."""
        return await self._admitter.allocate_again(pod)

    def _wipe_dir(self) -> None:
        for entry in self.socket_dir.iterdir():
            if not entry.is_dir() or entry.is_symlink():
                entry.unlink(missing_ok=True)

    async def _serve(self) -> None:
        server = grpc.aio.server()
        servicer = kubeletregistration.RegistrationServicer(node=self.node, register=self.register)
        api_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server

    async def _stop_server(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def _close_endpoints(self) -> None:
        endpoints = list(self._endpoints.values())
        self._endpoints.clear()  # the admitter shares this dict
        for ep in endpoints:
            await self._close_endpoint(ep)

    @staticmethod
    async def _close_endpoint(ep: kubeletadmit.Endpoint) -> None:
        if ep.task is not None:
            ep.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ep.task
        await ep.channel.close(None)

    # ----- registration and ListAndWatch -----

    async def register(self, request: api_pb2.RegisterRequest) -> None:
        """Validate, dial, read options, replace any old endpoint, start ListAndWatch."""
        ep = await kubeletregistration.connect(
            request, socket_dir=self.socket_dir, dial_timeout_s=self.dial_timeout_s
        )
        resource, options = ep.resource, ep.options
        old = self._endpoints.pop(resource, None)
        if old is not None:
            await self._close_endpoint(old)
        self._endpoints[resource] = ep
        self.options[resource] = options
        ep.task = asyncio.create_task(self._list_and_watch(ep))
        log.info(
            "node %s: registered %s at %s (pre_start_required=%s, get_preferred_allocation_available=%s)",
            self.node,
            resource,
            self.socket_dir / request.endpoint,
            options.pre_start_required,
            options.get_preferred_allocation_available,
        )

    async def _list_and_watch(self, ep: kubeletadmit.Endpoint) -> None:
        try:
            async for resp in ep.stub.ListAndWatch(api_pb2.Empty()):
                numa = {
                    d.ID: frozenset(n.ID for n in d.topology.nodes) for d in resp.devices if d.topology.nodes
                }
                state = self.devices.report(ep.resource, ((d.ID, d.health) for d in resp.devices), numa=numa)
                await self._publish(ep.resource, state)
            log.info("node %s: ListAndWatch of %s ended", self.node, ep.resource)
        except grpc.aio.AioRpcError as err:
            log.info(
                "node %s: ListAndWatch of %s failed: %s",
                self.node,
                ep.resource,
                kubeletadmit.go_rpc_error(err),
            )
        if self._endpoints.get(ep.resource) is ep:
            await self._publish(ep.resource, self.devices.mark_unhealthy(ep.resource))

    async def _publish(self, resource: str, state: kubeletdevices.ResourceDevices) -> None:
        patch = {
            "status": {
                "capacity": {resource: str(state.capacity)},
                "allocatable": {resource: str(state.allocatable)},
            }
        }
        try:
            await self._status.merge_patch_status("nodes", self.node, patch)
        except errors.KubeError as err:
            log.warning("node %s: could not write %s capacity: %s", self.node, resource, err)

    # ----- pods -----

    def _on_pod(self, change: informer.Change) -> None:
        pod = change.object
        uid = pod["metadata"]["uid"]
        if change.type == "DELETED" or podresources.is_terminated(pod):
            self._forget(uid)
            return
        if pod["metadata"].get("deletionTimestamp"):
            if uid not in self._terminating:  # graceful deletion: stop it, then delete it for good
                self._queue.discard(uid)
                self._terminating[uid] = asyncio.create_task(self._terminate(pod))
            return
        if uid in self._admitted:
            return
        if (pod.get("status") or {}).get("phase") == "Running":
            self._restore(pod)  # admitted by an earlier kubelet: re-read its devices
            return
        self._queue.put(uid, pod, (pod["metadata"].get("creationTimestamp") or "", next(self._seq)))

    async def _terminate(self, pod: JsonObj) -> None:
        """A pod marked for deletion: its containers stop (``termination_s``), its devices stay held
        until then, then the pod is deleted with grace 0, as kubelet's status manager does."""
        meta = pod["metadata"]
        uid = meta["uid"]
        grace = meta.get("deletionGracePeriodSeconds")
        stop_s = min(self.termination_s, grace) if isinstance(grace, int) else self.termination_s
        try:
            if stop_s > 0:
                await asyncio.sleep(stop_s)  # emulated container shutdown, not a sync point
            await self._api.delete("pods", meta["name"], namespace=meta.get("namespace"), grace_period_s=0)
            log.info(
                "node %s: pod %s/%s terminated and deleted", self.node, meta.get("namespace"), meta["name"]
            )
        except errors.NotFound:
            pass
        except errors.KubeError as err:
            log.warning("node %s: deleting terminated pod %s: %s", self.node, uid, err)
        finally:
            self._terminating.pop(uid, None)

    def _forget(self, uid: str) -> None:
        self._queue.discard(uid)
        self._admitted.discard(uid)
        if self.devices.release(uid):
            log.info("node %s: freed the devices of pod %s", self.node, uid)
        if self.dra is not None:
            self._spawn(self._unprepare(uid))

    def _pod_by_uid(self, uid: str) -> JsonObj | None:
        return next((p for p in self._pods.items() if p["metadata"]["uid"] == uid), None)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _unprepare(self, uid: str) -> None:
        """kubelet's UnprepareDynamicResources for a pod that is gone, retried until it succeeds."""
        assert self.dra is not None
        while True:
            try:
                await self.dra.unprepare(uid)
                return
            except kubeletdra.DraError as err:
                log.warning("node %s: pod %s: %s; retrying", self.node, uid, err)
            await asyncio.sleep(self.dra_retry_s)  # kubelet's pod worker back-off, emulated

    def _restore(self, pod: JsonObj) -> None:
        """A Running pod this kubelet did not admit: hold the devices its annotation records."""
        uid = pod["metadata"]["uid"]
        self._admitted.add(uid)
        raw = (pod["metadata"].get("annotations") or {}).get(ALLOCATIONS_ANNOTATION)
        if raw is None:
            return
        try:
            recorded = json.loads(raw)
            for entry in recorded.values():
                for resource, ids in (entry.get("resources") or {}).items():
                    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                        raise TypeError(f"{resource}: expected a list of device IDs, got {ids!r}")
                    self.devices.hold(uid, resource, ids)
        except (ValueError, AttributeError, TypeError, KeyError) as err:
            log.warning(
                "node %s: pod %s has an unreadable %s (%s); its devices are not held",
                self.node,
                uid,
                ALLOCATIONS_ANNOTATION,
                err,
            )
            self.devices.release(uid)

    async def _retry(self, pod: JsonObj) -> None:
        """Queue ``pod`` again after ``dra_retry_s`` (the pod worker's back-off), with its latest state."""
        await asyncio.sleep(self.dra_retry_s)
        meta = pod["metadata"]
        current = self._pods.get(meta.get("namespace"), meta["name"])
        if (
            current is not None
            and current["metadata"]["uid"] == meta["uid"]
            and meta["uid"] not in self._admitted
        ):
            order = (meta.get("creationTimestamp") or "", next(self._seq))
            self._queue.put(meta["uid"], current, order)

    async def _admit_loop(self) -> None:
        while True:
            pod = await self._queue.next()
            uid = pod["metadata"]["uid"]
            self._admitted.add(uid)  # from now on later events of this pod do not queue it again
            if self.admission_delay_s > 0:
                await asyncio.sleep(self.admission_delay_s)
                if uid not in self._admitted:  # deleted while waiting
                    continue
            try:
                await self._admitter.admit(pod)
            except kubeletdra.DraError as err:
                log.info("node %s: pod %s: %s; retrying", self.node, uid, err)
                self._admitted.discard(uid)
                self._spawn(self._retry(pod))
            except errors.KubeError as err:
                log.warning("node %s: admitting pod %s: API error %s", self.node, uid, err)
            except Exception:  # a bug must not stop admission on this node
                log.exception("node %s: admitting pod %s failed unexpectedly", self.node, uid)
            if uid not in self._admitted:  # deleted while being admitted
                self.devices.release(uid)
