"""The emulated kubelet's pod admission: device choice, Allocate, PreStartContainer, pod status.

Pods come one at a time, oldest first (``kubeletqueue``). ``PodAdmitter.admit`` walks init
containers then containers; for each limit on a registered resource it picks IDs
(``kubeletdevices``; GetPreferredAllocation first when the plugin offers it), calls ``Allocate``
with exactly one ContainerAllocateRequest and needs at least one response. It then records every
container's answer in the ``localcluster.kube-vgpu.io/allocations`` annotation, calls
PreStartContainer (30 s) where the plugin asked for it, starts the containers on the node's host
root when it has one (``kubeletruntime``), and moves the pod to Running. Any
allocation error fails the pod: ``reason: UnexpectedAdmissionError``, message
``Pod was rejected: Allocate failed due to <err>, which is unexpected`` (kubelet's words).
With ``cdi_spec_dirs`` the runtime is CDI-capable (``cdiruntime``): each container's CDI devices
are resolved against those spec directories (the edits recorded in its entry under ``cdi``); an
unresolvable name fails the container's creation (event ``Failed``, the container waiting with
``CreateContainerError``) and the pod stays Pending, as with containerd and CRI-O.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from vgpu.core import errors
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.kubeletapi.v1beta1 import api_pb2
from vgpu.localcluster import cdiruntime, kubeletdevices, kubeletruntime, podresources, statuswriter

log = logging.getLogger(__name__)

ALLOCATIONS_ANNOTATION = "localcluster.kube-vgpu.io/allocations"
PRE_START_TIMEOUT_S = 30.0
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
_GO_CODE_NAMES = {"OK": "OK", "CANCELLED": "Canceled"}


def go_rpc_error(err: grpc.aio.AioRpcError) -> str:
    """A gRPC error as grpc-go prints it: ``rpc error: code = Unknown desc = ...``."""
    name = err.code().name
    go_name = _GO_CODE_NAMES.get(name) or "".join(p.capitalize() for p in name.split("_"))
    return f"rpc error: code = {go_name} desc = {err.details()}"


def now_text() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Endpoint:
    """A registered plugin: its connection, options and ListAndWatch task."""

    resource: str
    channel: grpc.aio.Channel
    stub: Any  # api_pb2_grpc.DevicePluginStub (the generated module is untyped)
    options: api_pb2.DevicePluginOptions
    task: asyncio.Task[None] | None = None


def response_json(resp: api_pb2.ContainerAllocateResponse) -> dict[str, Any]:
    """One ContainerAllocateResponse as the allocations annotation records it."""
    return {
        "envs": dict(resp.envs),
        "mounts": [
            {"containerPath": m.container_path, "hostPath": m.host_path, "readOnly": m.read_only}
            for m in resp.mounts
        ],
        "devices_specs": [
            {"containerPath": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
            for d in resp.devices
        ],
        "annotations": dict(resp.annotations),
        "cdiDevices": [c.name for c in resp.cdi_devices],
    }


def _merge(entry: dict[str, Any], resource: str, ids: list[str], answer: Mapping[str, Any]) -> None:
    """Fold one resource's answer into a container's entry (several resources add up)."""
    entry.setdefault("devices", []).extend(ids)
    entry.setdefault("resources", {})[resource] = ids
    entry.setdefault("envs", {}).update(answer["envs"])
    entry.setdefault("annotations", {}).update(answer["annotations"])
    for key in ("mounts", "devices_specs", "cdiDevices"):
        entry.setdefault(key, []).extend(answer[key])


TopologyHint = Callable[[JsonObj, str], frozenset[int] | None]
# kubelet's DRA manager: a pod's claims prepared, each container's CDI device ids (kubeletdra)
DraPrepare = Callable[[JsonObj], Awaitable[dict[str, list[str]]]]
DraStatus = Callable[[JsonObj, list[JsonObj]], list[JsonObj]]


class PodAdmitter:
    """Admits one pod at a time against the registered endpoints of one node."""

    def __init__(
        self,
        api: KubeApi,
        status: statuswriter.StatusWriter,
        *,
        node: str,
        devices: kubeletdevices.DeviceBook,
        endpoints: Mapping[str, Endpoint],
        topology_hint: TopologyHint | None = None,
        cdi_spec_dirs: Sequence[Path] | None = None,
        host_root: Path | None = None,
        dra_prepare: DraPrepare | None = None,
        dra_status: DraStatus | None = None,
    ) -> None:
        """``dra_prepare``: prepare the pod's ResourceClaims before its containers start (its
        errors propagate: the pod stays Pending); ``dra_status``: the container statuses with their
        ``allocatedResourcesStatus`` (``kubeletdrahealth``). ``topology_hint``: the TopologyManager's merged NUMA hint for a container (pod, container
        name), or None for no hint (policy ``none``, the default). ``cdi_spec_dirs``: the runtime's
        CDI spec directories, lowest priority first (None: a runtime without CDI). ``host_root``:
        the node's stand-in ``/``; containers are then started on it as containerd does
        (``kubeletruntime``: a missing mount source of the answer becomes a directory)."""
        self._host_root = host_root
        self._api = api
        self._status = status
        self._node = node
        self._devices = devices
        self._endpoints = endpoints
        self._topology_hint = topology_hint
        self._cdi_spec_dirs = cdi_spec_dirs
        self._dra_prepare = dra_prepare
        self._dra_status = dra_status

    async def admit(self, pod: JsonObj) -> None:
        meta = pod["metadata"]
        uid, ns, name = meta["uid"], meta.get("namespace") or "default", meta["name"]
        try:
            recorded = await self._allocate(pod)
        except (errors.AllocationError, errors.QuantityError) as err:  # DeviceUnavailable too
            await self.reject(pod, str(err))
            return
        except grpc.aio.AioRpcError as err:
            await self.reject(pod, go_rpc_error(err))
            return
        if self._dra_prepare is not None:
            try:  # kubelet's SyncPod: PrepareDynamicResources before the sandbox and containers
                for container, ids in (await self._dra_prepare(pod)).items():
                    recorded.setdefault(container, {}).setdefault("cdiDevices", []).extend(ids)
            except errors.VgpuError as err:
                self._devices.release(uid)
                await self._event(
                    pod, "FailedPrepareDynamicResources", f"Failed to prepare dynamic resources: {err}"
                )
                raise
        unresolved = await self._resolve_cdi(recorded)
        if recorded:
            annotations = {ALLOCATIONS_ANNOTATION: json.dumps(recorded, sort_keys=True)}
            await self._api.merge_patch(
                "pods", name, {"metadata": {"annotations": annotations}}, namespace=ns
            )
        failure = await self._pre_start(recorded)
        if failure:
            log.warning("node %s: pod %s/%s: %s", self._node, ns, name, failure)
            await self._event(pod, "Failed", failure)
            return
        if unresolved:
            await self._creation_failed(pod, unresolved)
            return
        if self._host_root is not None:
            mounts = [m for entry in recorded.values() for m in entry.get("mounts", [])]
            await asyncio.to_thread(kubeletruntime.start_container, self._host_root, mounts)
        await self._status.merge_patch_status("pods", name, {"status": self._running(pod)}, namespace=ns)
        devices = {container: entry.get("devices", []) for container, entry in recorded.items()}
        log.info("node %s: admitted pod %s/%s (uid %s), devices %s", self._node, ns, name, uid, devices)

    async def _allocate(self, pod: JsonObj) -> dict[str, dict[str, Any]]:
        uid = pod["metadata"]["uid"]
        recorded: dict[str, dict[str, Any]] = {}
        reusable: dict[str, set[str]] = {}
        try:
            for is_init, container in podresources.containers(pod):
                for resource, amount in sorted(podresources.limits(container).items()):
                    if resource not in self._devices.resources or amount <= 0:
                        continue
                    hint = (
                        self._topology_hint(pod, str(container.get("name", "")))
                        if self._topology_hint
                        else None
                    )
                    ids = await self._choose(resource, int(amount), reusable.get(resource, set()), hint=hint)
                    answer = await self._call_allocate(resource, ids)
                    self._devices.hold(uid, resource, ids)
                    _merge(recorded.setdefault(container.get("name", ""), {}), resource, ids, answer)
                    pool = reusable.setdefault(resource, set())
                    if is_init and container.get("restartPolicy") != "Always":
                        pool.update(ids)
                    else:
                        pool.difference_update(ids)
        except BaseException:
            self._devices.release(uid)
            raise
        return recorded

    async def allocate_again(self, pod: JsonObj) -> dict[str, dict[str, Any]]:
        """What kubelet does for an admitted pod when it restarted before writing its checkpoint (or
        re-allocates): Allocate again for every container, with the device IDs it holds, and the
        answers as the allocations annotation records them (the annotation is not changed)."""
        raw = (pod["metadata"].get("annotations") or {}).get(ALLOCATIONS_ANNOTATION)
        held: dict[str, dict[str, Any]] = json.loads(raw) if raw else {}
        again: dict[str, dict[str, Any]] = {}
        for _, container in podresources.containers(pod):
            name = container.get("name", "")
            for resource, ids in sorted(((held.get(name) or {}).get("resources") or {}).items()):
                answer = await self._call_allocate(resource, list(ids))
                _merge(again.setdefault(name, {}), resource, list(ids), answer)
        return again

    async def _choose(
        self, resource: str, required: int, reusable: set[str], *, hint: frozenset[int] | None = None
    ) -> list[str]:
        chosen = kubeletdevices.take_reusable(required, reusable)
        if len(chosen) == required:
            return chosen
        available = self._devices.available(resource)
        kubeletdevices.check_available(
            resource, required=required, still_needed=required - len(chosen), available=available
        )
        aligned, _, _ = kubeletdevices.filter_by_affinity(
            available, numa_of=self._devices.numa.get(resource, {}), hint=hint
        )
        if required - len(chosen) < len(aligned):  # the plugin may choose among the aligned ones only
            preferred = await self._preferred(resource, sorted(set(aligned) | set(chosen)), chosen, required)
            return kubeletdevices.fill(chosen, required=required, preferred=preferred, available=aligned)
        chosen = kubeletdevices.fill(
            chosen, required=len(chosen) + len(aligned), preferred=[], available=aligned
        )
        if len(chosen) == required:
            return chosen
        preferred = await self._preferred(resource, sorted(set(available) | set(chosen)), chosen, required)
        return kubeletdevices.fill(chosen, required=required, preferred=preferred, available=available)

    async def _preferred(
        self, resource: str, available: list[str], must_include: list[str], required: int
    ) -> list[str]:
        ep = self._endpoints.get(resource)
        if ep is None or not ep.options.get_preferred_allocation_available:
            return []
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must_include,
                    allocation_size=required,
                )
            ]
        )
        answer = await ep.stub.GetPreferredAllocation(request)
        return list(answer.container_responses[0].deviceIDs) if answer.container_responses else []

    async def _call_allocate(self, resource: str, ids: list[str]) -> dict[str, Any]:
        ep = self._endpoints.get(resource)
        if ep is None:
            raise errors.AllocationError(f"endpoint for {resource} has been stopped")
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        resp = await ep.stub.Allocate(request)
        if not resp.container_responses:
            raise errors.AllocationError("no containers return in allocation response")
        return response_json(resp.container_responses[0])

    async def _resolve_cdi(self, recorded: Mapping[str, dict[str, Any]]) -> dict[str, str]:
        """Resolve each container's CDI devices (recording the edits); the containers that cannot be
        created, with the runtime's error."""
        failed: dict[str, str] = {}
        for container, entry in recorded.items():
            names = cdiruntime.requested(entry)
            if self._cdi_spec_dirs is None or not names:
                continue
            try:
                entry["cdi"] = await asyncio.to_thread(
                    cdiruntime.resolve, names, spec_dirs=self._cdi_spec_dirs
                )
            except cdiruntime.Unresolvable as err:
                failed[container] = str(err)
        return failed

    async def _creation_failed(self, pod: JsonObj, failed: Mapping[str, str]) -> None:
        """The runtime could not create these containers: events, waiting statuses; the pod stays Pending."""
        meta = pod["metadata"]
        for container, error in failed.items():
            log.warning(
                "node %s: pod %s/%s container %s: %s",
                self._node,
                meta.get("namespace"),
                meta["name"],
                container,
                error,
            )
            await self._event(pod, "Failed", f"Error: {error}")
        statuses = [
            {
                "name": name,
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "CreateContainerError", "message": failed[name]}},
            }
            for name in failed
        ]
        await self._status.merge_patch_status(
            "pods",
            meta["name"],
            {"status": {"containerStatuses": statuses}},
            namespace=meta.get("namespace") or "default",
        )

    async def _pre_start(self, recorded: Mapping[str, Mapping[str, Any]]) -> str | None:
        for entry in recorded.values():
            for resource, ids in (entry.get("resources") or {}).items():
                ep = self._endpoints.get(resource)
                if ep is None or not ep.options.pre_start_required:
                    continue
                try:
                    await ep.stub.PreStartContainer(
                        api_pb2.PreStartContainerRequest(devices_ids=ids), timeout=PRE_START_TIMEOUT_S
                    )
                except grpc.aio.AioRpcError as err:
                    return f"device plugin PreStartContainer rpc failed with err: {go_rpc_error(err)}"
        return None

    def _running(self, pod: JsonObj) -> dict[str, Any]:
        now = now_text()
        conditions = [
            {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        statuses = [
            {
                "name": c.get("name", ""),
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"localcluster://{pod['metadata']['uid']}/{c.get('name', '')}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for is_init, c in podresources.containers(pod)
            if not is_init
        ]
        if self._dra_status is not None:
            statuses = self._dra_status(pod, statuses)
        return {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "startTime": now,
            "containerStatuses": statuses,
        }

    async def reject(self, pod: JsonObj, cause: str) -> None:
        """Fail ``pod`` as kubelet's admission does: ``UnexpectedAdmissionError`` naming ``cause``."""
        meta = pod["metadata"]
        message = f"Allocate failed due to {cause}, which is unexpected"
        log.warning(
            "node %s: rejected pod %s/%s: %s", self._node, meta.get("namespace"), meta["name"], message
        )
        await self._event(pod, UNEXPECTED_ADMISSION_ERROR, message)
        status = {
            "phase": "Failed",
            "reason": UNEXPECTED_ADMISSION_ERROR,
            "message": f"Pod was rejected: {message}",
        }
        await self._status.merge_patch_status(
            "pods", meta["name"], {"status": status}, namespace=meta.get("namespace") or "default"
        )

    async def _event(self, pod: JsonObj, reason: str, message: str) -> None:
        try:
            await self._api.create_event(
                namespace=pod["metadata"].get("namespace") or "default",
                involved={**pod, "kind": "Pod", "apiVersion": "v1"},
                reason=reason,
                message=message,
                type="Warning",
                component="kubelet",
            )
        except errors.KubeError as err:
            log.warning("node %s: could not record %s event: %s", self._node, reason, err)
