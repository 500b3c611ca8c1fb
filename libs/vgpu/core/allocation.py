"""Device-plugin Allocate decisions, pure (docs/protocol.md#allocate, issue 9 options).

Which pod a kubelet ``Allocate`` is for, which container entry of its
``vgpu-devices-to-allocate`` annotation it consumes, the preferred device IDs, and the env,
mounts, device nodes, annotations and CDI names of the response. The caller reads the host
(which files exist) and the cluster; this module only decides.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vgpu.core import annotations, errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid, physical_uuid

CONTAINER_DEVICES_DIR = "/var/run/nvidia-container-devices"
CDI_KIND = "nvidia.com/gpu"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/vgpu-device-plugin_"
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
VGPU_LOCK_DIR = "/tmp/vgpulock"  # where HAMi-core looks for its lock directory, in the container


def hami_core_dir(hook_path: str) -> str:
    """The host directory of HAMi-core's files (``<hook>/vgpu``; the installer's target)."""
    return f"{hook_path.rstrip('/')}/vgpu"


def hami_core_files(hook_path: str) -> tuple[str, str]:
    """The host files every HAMi-core response mounts: the library and the preload list naming it.
    Each must be a regular file: a container runtime makes a missing mount source a directory."""
    core = hami_core_dir(hook_path)
    return (f"{core}/libvgpu.so", f"{core}/ld.so.preload")


def vgpu_lock_host_dir(hook_path: str) -> str:
    """The host directory mounted at ``/tmp/vgpulock``: inside root's ``<hook>/vgpu``, never the
    world-writable host ``/tmp`` (where anyone could plant a symlink in its place)."""
    return f"{hami_core_dir(hook_path)}/vgpulock"


PodObj = Mapping[str, Any]
P = TypeVar("P", bound=Mapping[str, Any])


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAllocation:
    """One ``ContainerAllocateResponse``, as plain values."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreferredRequest:
    """One ``ContainerPreferredAllocationRequest``."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


@dataclass(frozen=True)
class GpuRef:
    """What the response needs to know about a physical GPU besides its UUID."""

    uuid: GpuUuid
    index: int
    minor_number: int
    numa_node: int | None = None  # the GPU's NUMA node (a kubelet/scheduler mismatch names it)


@dataclass(frozen=True)
class SharedEdits:
    """HAMi-core's container edits that are the same for every container of the node, as a CDI
    spec the plugin wrote carries them (``vgpu.core.cdispec``); ``device`` is that spec's qualified
    device name, which the answers then name instead of repeating the edits."""

    device: str
    envs: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()


@dataclass(frozen=True)
class HostFacts:
    """What the caller found on the host: optional files and control device nodes present, and
    the shared edits of the CDI spec written at start (CDI strategies only; None: none written)."""

    license_present: bool = False
    control_devices: tuple[str, ...] = ()
    cdi: SharedEdits | None = None


@dataclass(frozen=True)
class Target:
    """The container an Allocate serves: its pod, its name and its place in the to-allocate string."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    entry_index: int
    devices: annotations.ContainerDevices
    remaining: annotations.PodDevices  # the to-allocate value with this entry erased

    @property
    def done(self) -> bool:
        """True when no container of the pod is still waiting for devices."""
        return not any(self.remaining)


def pod_ref(pod: PodObj) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _bind_time(pod: PodObj, keys: annotations.Keys) -> int:
    raw = annotations.of(pod).get(keys.bind_time, "")
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0  # present but unparsable: sorts first, as the oldest (it is pending too)


def is_pending_on(pod: PodObj, *, node: str, keys: annotations.Keys) -> bool:
    """Assigned to ``node`` by the scheduler, bound, and waiting for Allocate. The phase must say
    ``Pending``: a pod without one (or a status that is not an object) is not taken as pending,
    as HAMi reads an absent phase as empty."""
    notes = annotations.of(pod)
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return (
        phase == "Pending"
        and keys.bind_time in notes
        and notes.get(keys.bind_phase) == annotations.BindPhase.ALLOCATING
        and notes.get(keys.assigned_node) == node
    )


def oldest_pending(pods: Iterable[P], *, node: str, keys: annotations.Keys) -> P | None:
    """The pending pod with the oldest bind time (then creation time, then name)."""
    candidates = [p for p in pods if is_pending_on(p, node=node, keys=keys)]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda p: (
            _bind_time(p, keys),
            p.get("metadata", {}).get("creationTimestamp", ""),
            pod_ref(p),
        ),
    )


def container_names(pod: PodObj) -> list[str]:
    """Init containers first, then regular containers: the order of to-allocate entries."""
    spec = pod.get("spec", {})
    return [c.get("name", "") for c in (spec.get("initContainers") or [])] + [
        c.get("name", "") for c in (spec.get("containers") or [])
    ]


def devices_reused_later(pod: PodObj, name: str) -> bool:
    """Whether kubelet may hand container ``name``'s device IDs on to the pod's later containers:
    an init container that is not restartable (a sidecar keeps its devices)."""
    spec = pod.get("spec", {})
    return any(
        c.get("name") == name and c.get("restartPolicy") != "Always" for c in spec.get("initContainers") or []
    )


def select_target(pod: PodObj, *, keys: annotations.Keys, device_count: int) -> Target:
    """Take the first non-empty container entry of the pod's to-allocate annotation.

    Raises AllocationError (naming the pod) when the annotation is missing or garbage, when no
    entry is left, or when the entry's device count differs from kubelet's request.
    """
    ref = pod_ref(pod)
    meta = pod.get("metadata", {})
    raw = annotations.of(pod).get(keys.devices_to_allocate)
    if raw is None:
        raise errors.AllocationError(f"pod {ref}: annotation {keys.devices_to_allocate} is missing")
    try:
        decoded = annotations.decode_pod_devices(raw, field=keys.devices_to_allocate)
    except errors.AnnotationError as exc:
        raise errors.AllocationError(f"pod {ref}: {exc}") from None
    index = next((i for i, entry in enumerate(decoded) if entry), None)
    if index is None:
        raise errors.AllocationError(f"pod {ref}: no container is waiting for devices in {raw!r}")
    entry = decoded[index]
    if len(entry) != device_count:
        raise errors.AllocationError(
            f"pod {ref}: device number not matched: kubelet asked for {device_count}, "
            f"the scheduler assigned {len(entry)} to container entry {index}"
        )
    names = container_names(pod)
    if index >= len(names):
        raise errors.AllocationError(
            f"pod {ref}: container entry {index} of {keys.devices_to_allocate} has no container "
            f"(the pod has {len(names)})"
        )
    remaining = (*decoded[:index], (), *decoded[index + 1 :])
    return Target(
        namespace=str(meta.get("namespace", "")),
        pod=str(meta.get("name", "")),
        pod_uid=str(meta.get("uid", "")),
        container=names[index],
        entry_index=index,
        devices=entry,
        remaining=remaining,
    )


def preferred_ids(
    entry: annotations.ContainerDevices,
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """For each assigned GPU, the first available virtual ID on it (must-include IDs first).

    Returns [] (no preference) when the entry does not fit the request.
    """
    if len(entry) != size:
        return []
    chosen: list[str] = []
    ordered = list(must_include) + [i for i in available if i not in set(must_include)]
    assigned = {device.uuid for device in entry}
    for device in entry:
        pick = next(
            (i for i in ordered if i not in chosen and physical_uuid(i, gpus=assigned) == device.uuid), None
        )
        if pick is None:
            return []
        chosen.append(pick)
    return chosen


def _device_id(gpu: GpuRef, strategy: str) -> str:
    return str(gpu.index) if strategy == "index" else gpu.uuid


def shared_edits(config: DevicePluginConfig) -> tuple[dict[str, str], tuple[Mount, ...]]:
    """HAMi-core's env and mounts that are the same for every container on this node: the library,
    the lock directory and ``/etc/ld.so.preload`` (always: the pod's own env, HAMi's
    ``CUDA_DISABLE_CONTROL``, never switches HAMi-core off), and the env the config sets. The
    lock directory's host side is root's ``vgpu_lock_host_dir``, never the host's ``/tmp``."""
    envs: dict[str, str] = {}
    if config.device_memory_scaling > 1:
        envs["CUDA_OVERSUBSCRIBE"] = "true"
    if config.lib_cuda_log_level:
        envs["LIBCUDA_LOG_LEVEL"] = config.lib_cuda_log_level
    if config.disable_core_limit:
        envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    library, preload = hami_core_files(config.hook_path)
    mounts = (
        Mount(library, library, True),
        Mount(VGPU_LOCK_DIR, vgpu_lock_host_dir(config.hook_path), False),
        Mount("/etc/ld.so.preload", preload, True),
    )
    return envs, mounts


def build_response(
    devices: annotations.ContainerDevices,
    *,
    config: DevicePluginConfig,
    gpus: Mapping[GpuUuid, GpuRef],
    cache_id: str,
    cache_host_dir: str,
    host: HostFacts = HostFacts(),
) -> ContainerAllocation:
    """The response for one container given its devices (HAMi-core env and mounts).

    ``cache_id`` names the shared cache file; ``cache_host_dir`` is the per-container host dir
    mounted at ``<hook>/vgpu``. Unknown UUIDs raise AllocationError.
    """
    refs: list[GpuRef] = []
    for device in devices:
        ref = gpus.get(device.uuid)
        if ref is None:
            raise errors.AllocationError(f"GPU {device.uuid} is not on this node")
        refs.append(ref)
    ids = [_device_id(ref, config.device_id_strategy) for ref in refs]
    hook = config.hook_path.rstrip("/") or ""
    base = passthrough_response(ids, refs, config=config, response_id=cache_id, host=host)
    envs = dict(base.envs)
    mounts = list(base.mounts)
    for i, device in enumerate(devices):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.memory_mib}m"
    if devices:
        envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].cores)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{hook}/vgpu/{cache_id}.cache"
    shared_env, shared_mounts = shared_edits(config)
    envs.update(shared_env)
    mounts += [*shared_mounts[:1], Mount(f"{hook}/vgpu", cache_host_dir, False), *shared_mounts[1:]]
    if host.license_present:
        mounts += [
            Mount("/tmp/license", f"{hook}/vgpu/license", True),
            Mount("/usr/bin/vgpuvalidator", f"{hook}/vgpu/vgpuvalidator", True),
        ]
    alloc = ContainerAllocation(
        envs=envs,
        mounts=tuple(mounts),
        devices=base.devices,
        annotations=base.annotations,
        cdi_devices=base.cdi_devices,
    )
    return with_shared_cdi(alloc, shared=host.cdi, strategy=config.device_list_strategy)


def with_shared_cdi(
    alloc: ContainerAllocation, *, shared: SharedEdits | None, strategy: str
) -> ContainerAllocation:
    """With a CDI strategy and a written spec: the answer names the spec's device next to the GPUs
    and leaves out the edits it carries; otherwise ``alloc`` as it is (every edit in the answer)."""
    if shared is None or strategy not in ("cdi-annotations", "cdi-cri"):
        return alloc
    carried = set(shared.envs)
    envs = {k: v for k, v in alloc.envs.items() if (k, v) not in carried}
    mounts = tuple(m for m in alloc.mounts if m not in shared.mounts)
    notes = dict(alloc.annotations)
    cdi = alloc.cdi_devices
    if strategy == "cdi-annotations":
        for key, value in notes.items():
            if key.startswith(CDI_ANNOTATION_PREFIX):
                notes[key] = f"{value},{shared.device}" if value else shared.device
    else:
        cdi = (*cdi, shared.device)
    return ContainerAllocation(
        envs=envs, mounts=mounts, devices=alloc.devices, annotations=notes, cdi_devices=cdi
    )


def passthrough_response(
    ids: Sequence[str],
    refs: Sequence[GpuRef],
    *,
    config: DevicePluginConfig,
    response_id: str,
    host: HostFacts = HostFacts(),
) -> ContainerAllocation:
    """What NVIDIA's plugin answers for whole devices ``ids`` (on GPUs ``refs``): the device list
    per strategy, GDS/MOFED/GDRCOPY switches and device nodes. No HAMi-core limits."""
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    notes: dict[str, str] = {}
    cdi: tuple[str, ...] = ()
    strategy = config.device_list_strategy
    if strategy == "envvar":
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
    elif strategy == "volume-mounts":
        envs["NVIDIA_VISIBLE_DEVICES"] = CONTAINER_DEVICES_DIR
        mounts += [Mount(f"{CONTAINER_DEVICES_DIR}/{i}", "/dev/null", False) for i in ids]
    elif strategy == "cdi-annotations":
        notes[CDI_ANNOTATION_PREFIX + response_id] = ",".join(f"{CDI_KIND}={i}" for i in ids)
    else:  # cdi-cri
        cdi = tuple(f"{CDI_KIND}={i}" for i in ids)
    for enabled, name in (
        (config.gds_enabled, "NVIDIA_GDS"),
        (config.mofed_enabled, "NVIDIA_MOFED"),
        (config.gdrcopy_enabled, "NVIDIA_GDRCOPY"),
    ):
        if enabled:
            envs[name] = "enabled"
    specs: tuple[DeviceSpec, ...] = ()
    if config.pass_device_specs:
        present = [p for p in CONTROL_DEVICE_NODES if p in host.control_devices]
        minors = sorted({ref.minor_number for ref in refs})
        specs = tuple(DeviceSpec(p, p) for p in present) + tuple(
            DeviceSpec(f"/dev/nvidia{m}", f"/dev/nvidia{m}") for m in minors
        )
    return ContainerAllocation(
        envs=envs, mounts=tuple(mounts), devices=specs, annotations=notes, cdi_devices=cdi
    )
