"""The core/v1 ``Event`` object our components record, built the way client-go's recorder does."""

from __future__ import annotations

import datetime

from vgpu.kube.port import JsonObj


def event_body(
    involved: JsonObj,
    *,
    reason: str,
    message: str,
    type: str,
    component: str,
    now: datetime.datetime,
    count: int = 1,
) -> JsonObj:
    """An Event about ``involved`` (its kind, apiVersion, name, namespace, uid and resourceVersion
    are referenced); the name is generated from the involved object's name. ``count`` is how many
    times it happened (the recorder coalesces repeats, as client-go's EventCorrelator does)."""
    meta = involved.get("metadata") or {}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name') or 'object'}."},
        "involvedObject": {
            "kind": involved.get("kind", ""),
            "apiVersion": involved.get("apiVersion", "v1"),
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "reason": reason,
        "message": message,
        "type": type,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": count,
    }
