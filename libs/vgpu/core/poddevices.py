"""The pod device string (docs/protocol.md#the-pod-device-string): which GPUs, and how much of each, a pod's containers get.

``hami.io/vgpu-devices-to-allocate`` and ``hami.io/vgpu-devices-allocated`` hold
``uuid,TYPE,mem,cores:`` per device and ``;`` after every container (init containers first).
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu.core import errors, goscalars
from vgpu.core.device import COMMON_TYPE, GpuUuid


@dataclass(frozen=True)
class ContainerDevice:
    """One GPU handed to one container: memory MiB and cores percent on that GPU."""

    uuid: GpuUuid
    memory_mib: int
    cores: int
    type: str = COMMON_TYPE


ContainerDevices = tuple[ContainerDevice, ...]
PodDevices = tuple[ContainerDevices, ...]  # one entry per container: init containers first


def encode_pod_devices(pod: PodDevices) -> str:
    """``uuid,TYPE,mem,cores:`` per device, ``;`` after every container; () encodes to ""."""
    return "".join(
        "".join(f"{d.uuid},{d.type},{d.memory_mib},{d.cores}:" for d in container) + ";" for container in pod
    )


def decode_pod_devices(raw: str, *, field: str = "hami.io/vgpu-devices-to-allocate") -> PodDevices:
    """Inverse of ``encode_pod_devices``.

    Unlike HAMi, the one empty piece after the final ``;`` is not a container, so
    ``encode(decode(s)) == s`` (HAMi appends a ``;`` per round trip, docs/protocol.md#the-pod-device-string).
    """
    if raw == "":
        return ()
    pieces = raw.split(";")
    if raw.endswith(";"):
        pieces.pop()
    out: list[ContainerDevices] = []
    for ci, piece in enumerate(pieces):
        devices: list[ContainerDevice] = []
        for di, item in enumerate(piece.split(":")):
            if "," not in item:
                continue
            f = f"{field}[container {ci}][device {di}]"
            parts = item.split(",")
            if len(parts) < 4:
                raise errors.AnnotationError(
                    f, "pod annotation format error, missing fields, do not use nodeName in task spec"
                )
            if not parts[0]:
                raise errors.AnnotationError(f, "empty GPU UUID")
            memory = goscalars.parse_int32(parts[2], f"{f}.memory")
            cores = goscalars.parse_int32(parts[3], f"{f}.cores")
            if memory < 0 or cores < 0:
                raise errors.AnnotationError(f, "memory and cores must not be negative")
            devices.append(ContainerDevice(GpuUuid(parts[0]), memory, cores, parts[1]))
        out.append(tuple(devices))
    return tuple(out)
