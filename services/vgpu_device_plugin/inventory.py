"""What this node advertises: physical GPUs split into virtual devices, per resource and MIG strategy.

Built once per plugin start from the backend's ``DeviceInfo`` list and the node's config:
filtering by UUID/index, splitting each GPU into ``deviceSplitCount`` IDs ``<uuid>-<i>``, memory
and core scaling for the register annotation, and under MIG strategies ``single``/``mixed`` the MIG
devices as their own (unsplit) devices. A GPU with MIG enabled is never split into HAMi slots.

Under ``mixed`` each MIG profile is a resource ``<domain>/mig-<profile>``, its name cleaned as
NVIDIA's plugin does: ``+`` becomes ``.`` (``1g.10gb+me`` → ``mig-1g.10gb.me``), and any other
character kubelet refuses in a resource name becomes ``-``. A profile that still gives no valid
name, or the name of another profile, is not advertised (logged).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vgpu.core import allocation, device, names
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import Gpu, GpuUuid, Mode
from vgpu.gpu.port import DeviceInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VirtualDevice:
    """One device ID kubelet sees, and the physical GPU behind it."""

    id: str
    gpu: GpuUuid
    numa: int | None = None


@dataclass(frozen=True)
class Resource:
    """One extended resource served by one plugin socket."""

    name: str  # e.g. nvidia.com/gpu or nvidia.com/mig-1g.10gb
    devices: tuple[VirtualDevice, ...]
    shared: bool  # True: HAMi-core sharing (Allocate reads the pod's annotations)

    @property
    def socket_name(self) -> str:
        """``nvidia-gpu.sock`` for ``nvidia.com/gpu`` (HAMi's name: ``nvidia-`` + suffix)."""
        return f"nvidia-{self.name.rsplit('/', 1)[-1]}.sock"


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[DeviceInfo, ...]  # after filtering
    resources: tuple[Resource, ...]
    shared_gpus: tuple[DeviceInfo, ...] = ()  # the GPUs split into HAMi slots
    refs: Mapping[GpuUuid, allocation.GpuRef] = field(default_factory=dict)

    def resource(self, name: str) -> Resource:
        return next(r for r in self.resources if r.name == name)


def model_type(name: str) -> str:
    """HAMi's register ``type``: the model, prefixed ``NVIDIA-`` unless it starts with NVIDIA."""
    return name if name.upper().startswith("NVIDIA") else f"NVIDIA-{name}"


_REFUSED = re.compile(r"[^A-Za-z0-9_.-]")


def mig_resource_name(domain: str, profile: str) -> str | None:
    """``<domain>/mig-<profile>`` as kubelet accepts it, or None (see the module docstring)."""
    cleaned = _REFUSED.sub("-", profile.replace("+", ".")).strip("-_.")
    name = f"{domain}/mig-{cleaned}"
    return name if cleaned and names.is_extended_resource_name(name) else None


def _filtered(devices: Sequence[DeviceInfo], config: DevicePluginConfig) -> list[DeviceInfo]:
    hidden_uuids = set(config.filter_device_uuids)
    hidden_indexes = set(config.filter_device_indexes)
    out = []
    for d in devices:
        if d.uuid in hidden_uuids or d.index in hidden_indexes:
            log.info("GPU %s (index %d) hidden by device filter", d.uuid, d.index)
            continue
        out.append(d)
    return out


def _split(gpu: DeviceInfo, config: DevicePluginConfig) -> list[VirtualDevice]:
    numa = gpu.numa_node if config.enable_numa_topology else None
    return [
        VirtualDevice(device.virtual_device_id(GpuUuid(gpu.uuid), i), gpu.uuid, numa)
        for i in range(config.device_split_count)
    ]


def build(devices: Sequence[DeviceInfo], config: DevicePluginConfig) -> Inventory:
    """The resources to serve for these devices under the node's config."""
    gpus = _filtered(devices, config)
    plain = [g for g in gpus if not g.mig_enabled]
    mig = [g for g in gpus if g.mig_enabled]
    base = config.resource_name
    domain = base.rsplit("/", 1)[0]
    resources: list[Resource] = []
    shared: list[DeviceInfo] = []
    if config.mig_strategy == "single":
        if plain:
            log.warning(
                "MIG strategy single: %d GPU(s) without MIG are not advertised: %s",
                len(plain),
                ", ".join(g.uuid for g in plain),
            )
        devs = [VirtualDevice(m.uuid, g.uuid, g.numa_node) for g in mig for m in g.mig_instances]
        resources.append(Resource(base, tuple(devs), shared=False))
    else:
        if mig and config.mig_strategy == "none":
            log.warning(
                "GPU(s) with MIG enabled are not shared under MIG strategy none: %s",
                ", ".join(g.uuid for g in mig),
            )
        shared = plain
        resources.append(Resource(base, tuple(v for g in plain for v in _split(g, config)), shared=True))
        if config.mig_strategy == "mixed":
            by_profile: dict[str, list[VirtualDevice]] = {}
            for g in mig:
                for m in g.mig_instances:
                    by_profile.setdefault(m.profile, []).append(VirtualDevice(m.uuid, g.uuid, g.numa_node))
            taken = {base}
            for profile in sorted(by_profile):
                name = mig_resource_name(domain, profile)
                if name is None or name in taken:
                    log.error(
                        "MIG profile %r: %s; its %d device(s) are not advertised",
                        profile,
                        "no valid resource name" if name is None else f"its name {name} is taken",
                        len(by_profile[profile]),
                    )
                    continue
                taken.add(name)
                resources.append(Resource(name, tuple(by_profile[profile]), shared=False))
    refs = {g.uuid: allocation.GpuRef(g.uuid, g.index, g.minor_number, g.numa_node) for g in gpus}
    for g in mig:
        for m in g.mig_instances:  # MIG devices are addressed by their own UUID
            refs[GpuUuid(m.uuid)] = allocation.GpuRef(GpuUuid(m.uuid), g.index, g.minor_number)
    return Inventory(gpus=tuple(gpus), resources=tuple(resources), shared_gpus=tuple(shared), refs=refs)


def register_gpus(
    inventory: Inventory, config: DevicePluginConfig, healthy: Mapping[GpuUuid, bool]
) -> list[Gpu]:
    """The register annotation's devices (docs/protocol.md#the-register-annotation): shared GPUs with scaled memory/cores."""
    out = []
    for d in inventory.shared_gpus:
        memory_mib = d.memory_mib or config.preconfigured_device_memory_mib
        if config.device_memory_scaling != 1:
            memory_mib = int(memory_mib * config.device_memory_scaling)
        out.append(
            Gpu(
                uuid=d.uuid,
                index=d.index,
                count=config.device_split_count,
                memory_mib=memory_mib,
                cores=int(config.device_core_scaling * 100),
                type=model_type(d.name),
                numa=d.numa_node or 0,
                mode=Mode.HAMI_CORE,
                health=healthy.get(d.uuid, True),
            )
        )
    return out


def with_missing(
    listed: list[DeviceInfo], previous: list[DeviceInfo], *, node: str
) -> tuple[list[DeviceInfo], list[DeviceInfo]]:
    """The GPUs to serve: those listed now plus those an earlier session served that are missing
    now (off the bus), in index order; and the missing ones (logged). A GPU is never dropped by a
    restart."""
    seen = {d.uuid for d in listed}
    missing = [d for d in previous if d.uuid not in seen]
    for gone in missing:
        log.warning(
            "node %s: GPU %d %s not listed by the driver; kept as Unhealthy until it answers again",
            node,
            gone.index,
            gone.uuid,
        )
    return sorted([*listed, *missing], key=lambda d: d.index), missing


def log_gpus(inv: Inventory, *, node: str) -> None:
    """One line per GPU served (a warning when there is none)."""
    if not inv.gpus:
        log.warning("node %s: no GPUs found; serving zero devices", node)
    for g in inv.gpus:
        log.info(
            "node %s: GPU %d %s %s %d MiB NUMA %s MIG %s",
            node,
            g.index,
            g.uuid,
            g.name,
            g.memory_mib,
            g.numa_node,
            "on" if g.mig_enabled else "off",
        )
