"""What the demo shows of DRA pods: the GPUs our ResourceSlices publish, and each container's GPU
shares read from its claim's allocation (kube-scheduler's DRA plugin writes no HAMi annotations).

A pod admitted in DRA mode has one claim per GPU container, ``vgpu-<i>`` for the i-th of its
(init, then app) containers that asked for GPUs, named in ``status.resourceClaimStatuses``; each
allocation result of our driver is a share of ``gpu-<index>`` on the node's pool, with its consumed
``memory`` and ``cores``. They are turned into the extender mode's values (``Gpu``,
``ContainerDevice``) so the demo renders both modes alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vgpu.core import annotations as hami
from vgpu.core import errors, quantity
from vgpu.core.device import Gpu, GpuUuid
from vgpu.core.dra import allocation, names


def _attr(device: Mapping[str, Any], name: str) -> Any:
    raw = (device.get("attributes") or {}).get(name) or {}
    return next(iter(raw.values()), None) if isinstance(raw, Mapping) else None


def inventories(slices: Iterable[Mapping[str, Any]]) -> dict[str, list[Gpu]]:
    """Node -> its GPUs, from our driver's ResourceSlices (a tainted GPU shown unhealthy)."""
    out: dict[str, list[Gpu]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != names.DRIVER or not spec.get("nodeName"):
            continue
        for device in spec.get("devices") or ():
            capacity = device.get("capacity") or {}
            try:
                memory = quantity.parse_mib(
                    (capacity.get(names.CAPACITY_MEMORY) or {}).get("value", "0"), field="memory"
                )
                cores = quantity.parse_int(
                    (capacity.get(names.CAPACITY_CORES) or {}).get("value", "100"), field="cores"
                )
            except errors.QuantityError:
                continue
            index = _attr(device, names.ATTR_INDEX)
            out.setdefault(str(spec["nodeName"]), []).append(
                Gpu(
                    uuid=GpuUuid(str(_attr(device, names.ATTR_UUID) or device.get("name"))),
                    index=index if isinstance(index, int) else 0,
                    count=0,
                    memory_mib=memory,
                    cores=cores,
                    type=str(_attr(device, names.ATTR_MODEL) or "?"),
                    health=not any(
                        t.get("effect") in ("NoSchedule", "NoExecute") for t in device.get("taints") or ()
                    ),
                )
            )
    for gpus in out.values():
        gpus.sort(key=lambda g: g.index)
    return out


def pod_devices(
    pod: Mapping[str, Any],
    claims: Mapping[str, Mapping[str, Any]],
    uuids: Mapping[tuple[str, str], GpuUuid],
) -> hami.PodDevices:
    """Each GPU container's shares, in container order, as ``ContainerDevice`` values.

    ``claims``: the pod's namespace's claims by name; ``uuids``: (node, device name) -> GPU UUID."""
    recorded = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    spec = pod.get("spec") or {}
    out: list[tuple[hami.ContainerDevice, ...]] = []
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        shown: list[hami.ContainerDevice] = []
        for ref in (container.get("resources") or {}).get("claims") or ():
            claim = claims.get(str(recorded.get(ref.get("name")) or ""))
            if claim is None:
                continue
            try:
                shares = allocation.shares(claim)
            except allocation.AllocationError:
                continue
            for share in shares:
                uuid = uuids.get((share.pool, share.device), GpuUuid(share.device))
                shown.append(hami.ContainerDevice(uuid, share.memory_mib or 0, share.cores_percent or 0))
        if shown:
            out.append(tuple(shown))
    return tuple(out)


def device_uuids(inventory: Mapping[str, list[Gpu]]) -> dict[tuple[str, str], GpuUuid]:
    """(node, ``gpu-<index>``) -> the GPU's UUID."""
    return {(node, names.device_name(g.index)): g.uuid for node, gpus in inventory.items() for g in gpus}
