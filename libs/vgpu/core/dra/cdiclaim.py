"""What the kubelet plugin's NodePrepareResources makes of one ResourceClaim: the devices it answers
and the CDI spec that carries HAMi-core's container edits. Pure: the caller reads the claim and the
host, makes the per-request cache directories and writes the file.

:func:`plan` reads the claim's allocation (:func:`vgpu.core.dra.allocation.shares`), keeps the
results of this node's pool, maps each ``gpu-<index>`` to the GPU this plugin has at that index,
and groups the results by request: one CDI device per (claim, request), named
:func:`vgpu.core.dra.names.cdi_device` (``<claim uid>-<request>``) of kind
:data:`~vgpu.core.dra.names.CDI_KIND`. A result that consumed no stated memory got its request
policy's default, the whole GPU; one with no stated cores got ``0`` (no SM limit, as HAMi's
``gpucores`` absent). The answer names the CDI device on the request's first result only: kubelet
hands a container the CDI IDs of every device of the requests it uses, so one is enough.

:func:`document` gives each CDI device exactly the edits the extender path's Allocate answers
(``vgpu.core.allocation.build_response``): the device list as ``deviceListStrategy`` says
(``envvar``, the default: ``NVIDIA_VISIBLE_DEVICES=<uuids>``; ``volume-mounts``: its mounts; a CDI
strategy: none in the spec, the answer's devices name ``nvidia.com/gpu=<id>`` instead), ``CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`` per GPU,
``CUDA_DEVICE_SM_LIMIT`` (when above 0), ``CUDA_DEVICE_MEMORY_SHARED_CACHE=<hook>/vgpu/vgpu.cache``
with the request's own cache directory (:func:`cache_host_dir`) mounted at ``<hook>/vgpu``, the
``libvgpu.so``, ``/etc/ld.so.preload`` and lock-directory mounts, the config's env, the GDS/MOFED
switches and, with ``passDeviceSpecs``, the device nodes. ``cdiVersion`` is 0.5.0: a claim UID may
start with a digit, which CDI device names allow from 0.5.0 on (``vgpu.core.cdispec``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from vgpu.core import allocation as hami
from vgpu.core import cdispec, poddevices
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid
from vgpu.core.dra import allocation, names
from vgpu.core.errors import VgpuError

CDI_VERSION = "0.5.0"
CACHE_ID = "vgpu"  # the shared cache file: <hook>/vgpu/vgpu.cache in the container
_INDEX = re.compile(rf"^{re.escape(names.DEVICE_PREFIX)}(0|[1-9][0-9]{{0,5}})$")
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")


class ClaimError(VgpuError):
    """A claim this node cannot prepare; the message says why (it goes into kubelet's answer)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    """One GPU of this plugin's inventory, as Prepare needs it."""

    ref: hami.GpuRef
    memory_mib: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PreparedDevice:
    """One ``Device`` of the answer (kubelet's message of the same name)."""

    request: str
    """The claim's request, without a ``firstAvailable`` subrequest (kubelet matches containers'
    ``resources.claims[].request`` against it)."""
    pool: str
    device: str
    share_id: str | None
    cdi_device_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RequestPlan:
    """One request of the claim on this node: its CDI device and the GPUs it got, in result order."""

    request: str
    cdi_name: str
    devices: poddevices.ContainerDevices


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    claim_uid: str
    requests: tuple[RequestPlan, ...]
    devices: tuple[PreparedDevice, ...]


def base_request(request: str) -> str:
    """``<request>`` of a result's ``<request>/<subrequest>``."""
    return request.split("/", 1)[0]


def qualified(cdi_name: str) -> str:
    """The CDI device ID kubelet hands the runtime: ``kube-vgpu.io/claim=<name>``."""
    return f"{names.CDI_KIND}={cdi_name}"


def spec_file_name(claim_uid: str) -> str:
    """The spec file of one claim: ``kube-vgpu.io-claim_<uid>.json`` (``<vendor>-<class>`` first,
    as the CDI library names its own; its extension is what makes a runtime load it)."""
    return f"{names.CDI_KIND.replace('/', '-')}_{claim_uid}.json"


def cache_host_dir(hook_path: str, cdi_name: str) -> str:
    """The host directory of one request's HAMi-core cache (mounted at ``<hook>/vgpu``)."""
    return f"{hami.hami_core_dir(hook_path)}/claims/{cdi_name}"


def check_uid(uid: str) -> str:
    """``uid`` when it is safe in a file and CDI device name; ClaimError otherwise."""
    if not _UID.match(uid):
        raise ClaimError(f"claim UID {uid!r} is not a Kubernetes UID")
    return uid


def gpu_index(device: str) -> int | None:
    """The index of a published device name ``gpu-<index>``, or None for any other name."""
    match = _INDEX.match(device)
    return int(match.group(1)) if match else None


def gpu_cdi_id(gpu: hami.GpuRef, *, config: DevicePluginConfig) -> str | None:
    """NVIDIA's CDI device of ``gpu`` (``nvidia.com/gpu=<uuid or index>``, the toolkit's spec) under
    a CDI ``deviceListStrategy``; None under the others (the spec's env names the GPUs)."""
    if config.device_list_strategy not in cdispec.STRATEGIES:
        return None
    device = str(gpu.index) if config.device_id_strategy == "index" else gpu.uuid
    return f"{hami.CDI_KIND}={device}"


def plan(
    claim: Mapping[str, Any],
    *,
    node: str,
    gpus: Mapping[int, Gpu],
    config: DevicePluginConfig,
) -> Plan:
    """The devices of ``claim`` this node prepares; ClaimError naming why it cannot. Under a CDI
    ``deviceListStrategy`` each device also names its GPU's CDI device (:func:`gpu_cdi_id`)."""
    meta = claim.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if not isinstance(uid, str):
        raise ClaimError("the claim has no metadata.uid")
    check_uid(uid)
    try:
        everything = allocation.results(claim)
        shares = allocation.shares(claim)
    except allocation.AllocationError as exc:
        raise ClaimError(f"unreadable allocation: {exc}") from None
    if not everything:
        raise ClaimError("the claim is not allocated")
    here = [s for s in shares if s.pool == node]
    if not here:
        pools = sorted({s.pool for s in shares})
        if pools:
            raise ClaimError(
                f"no device of driver {names.DRIVER} on node {node}: allocated in pool(s) {pools}"
            )
        raise ClaimError(f"the allocation has no device of driver {names.DRIVER}")
    grouped: dict[str, list[tuple[allocation.DeviceShare, poddevices.ContainerDevice]]] = {}
    for share in here:
        grouped.setdefault(share.request, []).append((share, _device(share, gpus=gpus)))
    requests: list[RequestPlan] = []
    devices: list[PreparedDevice] = []
    for request, entries in grouped.items():
        cdi_name = names.cdi_device(uid, request)
        requests.append(RequestPlan(request=request, cdi_name=cdi_name, devices=tuple(d for _, d in entries)))
        for i, (share, _) in enumerate(entries):
            index = gpu_index(share.device)
            nvidia = gpu_cdi_id(gpus[index].ref, config=config) if index is not None else None
            ids = ((qualified(cdi_name),) if i == 0 else ()) + ((nvidia,) if nvidia else ())
            devices.append(
                PreparedDevice(
                    request=base_request(request),
                    pool=share.pool,
                    device=share.device,
                    share_id=share.share_id,
                    cdi_device_ids=ids,
                )
            )
    return Plan(claim_uid=uid, requests=tuple(requests), devices=tuple(devices))


def _device(share: allocation.DeviceShare, *, gpus: Mapping[int, Gpu]) -> poddevices.ContainerDevice:
    index = gpu_index(share.device)
    gpu = gpus.get(index) if index is not None else None
    if gpu is None:
        raise ClaimError(f"device {share.device!r} (request {share.request}) is not a GPU of this node")
    memory = gpu.memory_mib if share.memory_mib is None else share.memory_mib
    if not 0 < memory <= gpu.memory_mib:
        raise ClaimError(
            f"device {share.device} (request {share.request}): {memory} MiB consumed, "
            f"the GPU has {gpu.memory_mib} MiB"
        )
    cores = 0 if share.cores_percent is None else share.cores_percent
    if not 0 <= cores <= 100:
        raise ClaimError(f"device {share.device} (request {share.request}): cores {cores} is not 0-100")
    return poddevices.ContainerDevice(uuid=gpu.ref.uuid, memory_mib=memory, cores=cores)


def edits(
    request: RequestPlan,
    *,
    config: DevicePluginConfig,
    gpus: Mapping[GpuUuid, hami.GpuRef],
    host: hami.HostFacts,
) -> hami.ContainerAllocation:
    """The extender's Allocate answer for ``request``'s GPUs (its annotations and CDI names are
    left out: a claim's devices carry NVIDIA's CDI names, :func:`plan`)."""
    answer = hami.build_response(
        request.devices,
        config=config,
        gpus=gpus,
        cache_id=CACHE_ID,
        cache_host_dir=cache_host_dir(config.hook_path, request.cdi_name),
        host=dataclasses.replace(host, cdi=None),
    )
    if all(d.cores == 0 for d in request.devices):
        envs = {k: v for k, v in answer.envs.items() if k != "CUDA_DEVICE_SM_LIMIT"}
        answer = dataclasses.replace(answer, envs=envs)
    return answer


def _container_edits(answer: hami.ContainerAllocation) -> dict[str, Any]:
    out: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(answer.envs.items())]}
    if answer.mounts:
        out["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for m in answer.mounts
        ]
    if answer.devices:
        out["deviceNodes"] = [
            {"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
            for d in answer.devices
        ]
    return out


def document(
    prepared: Plan,
    *,
    config: DevicePluginConfig,
    gpus: Mapping[GpuUuid, hami.GpuRef],
    host: hami.HostFacts,
) -> dict[str, Any]:
    """The CDI spec of ``prepared``: one device per request; ClaimError when it would be invalid."""
    devices: list[dict[str, Any]] = []
    for request in prepared.requests:
        try:
            answer = edits(request, config=config, gpus=gpus, host=host)
        except VgpuError as exc:
            raise ClaimError(f"request {request.request}: {exc}") from None
        devices.append({"name": request.cdi_name, "containerEdits": _container_edits(answer)})
    doc: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": names.CDI_KIND, "devices": devices}
    problems = cdispec.validate(doc)
    if problems:
        raise ClaimError(f"the CDI spec would be invalid: {'; '.join(problems)}")
    return doc


def cache_dirs(prepared: Plan, *, hook_path: str) -> list[str]:
    """The host cache directories ``prepared``'s spec mounts, one per request."""
    return [cache_host_dir(hook_path, r.cdi_name) for r in prepared.requests]


def gpus_by_index(refs: Sequence[Gpu]) -> dict[int, Gpu]:
    """``refs`` keyed by their NVML index, as :func:`plan` takes them."""
    return {g.ref.index: g for g in refs}
