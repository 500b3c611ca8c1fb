"""``Charge``: what one pod holds on one node, read from its annotations (``charge_of``).

A pod's charge is its collapsed GPU footprint (``vgpu.core.usage``) from ``devices-allocated``,
for pods not Succeeded/Failed; once its regular init containers have all exited 0 they stop
counting (its sidecars, restartable init containers, keep counting with the app containers). A
decision that was filtered but never bound stops counting ``reservation_ttl_s`` after its
``vgpu-time`` (HAMi keeps it forever, docs/protocol.md#departures-from-hami); the rule reads only the pod and the clock,
so a restarted scheduler rebuilds the same charges.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from vgpu.core import annotations as hami
from vgpu.core import errors, request, usage
from vgpu.core.device import GpuUsage, GpuUuid
from vgpu.kube.port import JsonObj

log = logging.getLogger(__name__)

FINISHED = ("Succeeded", "Failed")


@dataclass
class Charge:
    """What one pod holds on one node. ``reservation``: made by our filter, not yet seen in a watch."""

    node: str
    namespace: str
    usage: dict[GpuUuid, GpuUsage]
    devices_raw: str
    reservation: bool = False
    expires_s: float | None = None  # unbound decisions stop counting then


def charge_of(pod: JsonObj, *, keys: hami.Keys, reservation_ttl_s: float, now: float) -> Charge | None:
    """The pod's charge, or None (finished, no decision, an unreadable one, or an expired one)."""
    status: Any = pod.get("status") or {}
    if status.get("phase") in FINISHED:
        return None
    meta: Any = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    node = ann.get(keys.assigned_node)
    raw = ann.get(keys.devices_allocated)
    if not node or raw is None:
        return None
    try:
        devices = hami.decode_pod_devices(raw, field=keys.devices_allocated)
    except errors.AnnotationError as exc:
        log.warning("pod %s/%s: ignoring its GPU usage: %s", meta.get("namespace"), meta.get("name"), exc)
        return None
    spec = pod.get("spec") or {}
    init = spec.get("initContainers") or []
    expires: float | None = None
    if not spec.get("nodeName") and keys.bind_phase not in ann:
        try:
            expires = float(ann.get(keys.assigned_time, "")) + reservation_ttl_s
        except ValueError:
            expires = None
        if expires is not None and expires <= now:
            return None  # filtered long ago and never bound: gives its share back
    return Charge(
        node=node,
        namespace=str(meta.get("namespace", "")),
        usage=usage.pod_usage(
            devices,
            init_count=len(init),
            sidecars=request.sidecar_indices(init),
            init_done=usage.regular_init_done(pod),
        ),
        devices_raw=raw,
        expires_s=expires,
    )
