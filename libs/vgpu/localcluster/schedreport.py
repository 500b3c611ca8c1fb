"""What the kube-scheduler emulation writes about a pod: its events and its PodScheduled condition.

A pod it cannot place gets ``PodScheduled=False`` with the reason and message, written only when
they changed (kube-scheduler's ``updatePod``); events are written in the background by the caller,
as kube-scheduler's event broadcaster does, and a failed write is logged, never raised.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from vgpu.core import errors
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster import schedhandlers

log = logging.getLogger(__name__)


def unschedulable_conditions(pod: Mapping[str, Any], *, reason: str, message: str) -> list[JsonObj] | None:
    """``pod``'s conditions with PodScheduled=False for ``reason``/``message``; None when unchanged."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("type") == "PodScheduled" and (c.get("status"), c.get("reason"), c.get("message")) == (
            "False",
            reason,
            message,
        ):
            return None  # kube-scheduler's updatePod: no write when the condition is unchanged
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [c for c in conditions if c.get("type") != "PodScheduled"]
    conditions.append(
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": now,
        }
    )
    return conditions


async def write_event(
    api: KubeApi, pod: JsonObj, *, reason: str, message: str, type_: str, component: str
) -> None:
    """Record an event about ``pod`` from ``component``; an API error is logged."""
    involved = {**pod, "kind": "Pod", "apiVersion": "v1"}
    key = schedhandlers.pod_key(pod)
    try:
        await api.create_event(
            namespace=key[0],
            involved=involved,
            reason=reason,
            message=message,
            type="Warning" if type_ == "Warning" else "Normal",
            component=component,
        )
    except errors.KubeError as err:
        log.warning("could not record %s event for %s/%s: %s", reason, *key, err)
