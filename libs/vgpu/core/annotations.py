"""The HAMi annotation codec: the protocol between our scheduler and device plugin (docs/protocol.md,
#node-annotations and #pod-annotations).

Every decoder takes the raw annotation string and returns typed values, or raises one
``AnnotationError`` whose ``field`` names the annotation key (and element) that was bad.

This module holds the keys (``Keys``, ``KEYS``), the bind phase, the handshake and the device cordon;
the larger formats live in their own modules and are re-exported here, so call sites read
``annotations.decode_node_register(raw)``: ``noderegister`` (the GPU inventory),
``poddevices`` (the pod device string), ``nodelock`` (the node lock) and ``goscalars`` (Go's int32,
bool and RFC3339 text forms).
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors
from vgpu.core.device import GpuUuid
from vgpu.core.goscalars import format_rfc3339
from vgpu.core.nodelock import NodeLock, decode_node_lock, encode_node_lock
from vgpu.core.noderegister import decode_node_register, encode_node_register, encode_node_register_legacy
from vgpu.core.poddevices import (
    ContainerDevice,
    ContainerDevices,
    PodDevices,
    decode_pod_devices,
    encode_pod_devices,
)

__all__ = [
    "DEFAULT_PREFIX",
    "KEYS",
    "BindPhase",
    "ContainerDevice",
    "ContainerDevices",
    "Keys",
    "NodeLock",
    "PodDevices",
    "decode_bind_phase",
    "decode_cordon",
    "decode_handshake",
    "decode_node_lock",
    "decode_node_register",
    "decode_pod_devices",
    "encode_handshake_requesting",
    "encode_node_lock",
    "encode_node_register",
    "encode_node_register_legacy",
    "encode_pod_devices",
    "format_rfc3339",
    "of",
]

DEFAULT_PREFIX = "hami.io"


def of(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    """An object's ``metadata.annotations``; empty when the object, its metadata or its
    annotations are missing or not mappings (a watch can deliver anything)."""
    meta = (obj or {}).get("metadata")
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    return ann if isinstance(ann, Mapping) else {}


@dataclass(frozen=True)
class Keys:
    """Annotation keys under one prefix (``hami.io`` by default, configurable)."""

    prefix: str = DEFAULT_PREFIX

    @property
    def node_register(self) -> str:
        return f"{self.prefix}/node-nvidia-register"

    @property
    def node_handshake(self) -> str:
        return f"{self.prefix}/node-handshake"

    @property
    def node_lock(self) -> str:
        return f"{self.prefix}/mutex.lock"

    @property
    def node_plugin_error(self) -> str:
        """Ours, not HAMi's: why the node's device plugin runs with zero devices (absent when fine)."""
        return f"{self.prefix}/node-nvidia-plugin-error"

    @property
    def node_outside_usage(self) -> str:
        """Ours, not HAMi's: GPU memory (MiB per GPU UUID) used outside kube-vgpu (vgpu.core.outside)."""
        return f"{self.prefix}/node-nvidia-outside-usage"

    @property
    def device_cordon(self) -> str:
        return f"{self.prefix}/device-cordon"

    @property
    def assigned_node(self) -> str:
        return f"{self.prefix}/vgpu-node"

    @property
    def assigned_time(self) -> str:
        return f"{self.prefix}/vgpu-time"

    @property
    def devices_to_allocate(self) -> str:
        return f"{self.prefix}/vgpu-devices-to-allocate"

    @property
    def devices_allocated(self) -> str:
        return f"{self.prefix}/vgpu-devices-allocated"

    @property
    def bind_phase(self) -> str:
        return f"{self.prefix}/bind-phase"

    @property
    def bind_time(self) -> str:
        return f"{self.prefix}/bind-time"

    @property
    def node_policy(self) -> str:
        return f"{self.prefix}/node-scheduler-policy"

    @property
    def gpu_policy(self) -> str:
        return f"{self.prefix}/gpu-scheduler-policy"

    @property
    def webhook_ignore_label(self) -> str:
        return f"{self.prefix}/webhook"

    def internal_pod_keys(self) -> tuple[str, ...]:
        """The pod annotations only the scheduler and device plugin may write (anti-forgery)."""
        return (
            self.assigned_node,
            self.assigned_time,
            self.devices_to_allocate,
            self.devices_allocated,
            self.bind_phase,
            self.bind_time,
        )


KEYS = Keys()


class BindPhase(enum.StrEnum):
    ALLOCATING = "allocating"
    SUCCESS = "success"
    FAILED = "failed"


def decode_bind_phase(raw: str, *, field: str = "bind-phase") -> BindPhase:
    try:
        return BindPhase(raw)
    except ValueError:
        raise errors.AnnotationError(
            field, f"unknown bind phase {raw!r}: expected allocating, success or failed"
        ) from None


# --- handshake (HAMi's, decoded only: docs/protocol.md#node-liveness-a-lease) ------------------------------------------------

_HANDSHAKE_LAYOUT = "%Y-%m-%d %H:%M:%S"


def encode_handshake_requesting(now: datetime.datetime) -> str:
    return "Requesting_" + now.strftime(_HANDSHAKE_LAYOUT)


def decode_handshake(
    raw: str, *, field: str = "hami.io/node-handshake"
) -> tuple[str, datetime.datetime | None]:
    """(state, time): ``Requesting_2026-08-21 06:20:39`` → ("Requesting", time). Other values
    (``Reported ...``, ``Deleted_...``) give their first word and no time."""
    state, sep, rest = raw.partition("_")
    if not sep:
        return raw.split(" ", 1)[0], None
    try:
        return state, datetime.datetime.strptime(rest, _HANDSHAKE_LAYOUT)
    except ValueError:
        raise errors.AnnotationError(field, f"invalid handshake time {rest!r}") from None


def decode_cordon(raw: str) -> frozenset[GpuUuid]:
    """``hami.io/device-cordon``: comma-separated UUIDs, blanks trimmed, empties skipped."""
    return frozenset(GpuUuid(part.strip()) for part in raw.split(",") if part.strip())
