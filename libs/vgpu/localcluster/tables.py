"""Server-side printing: the ``meta.k8s.io`` Table that ``kubectl get`` asks for.

kubectl lists with ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints the columns
the server names. A real kube-apiserver fills them from its printers (kubernetes'
``pkg/printers/internalversion``); this module gives the same columns, in the same order, for the
kinds kubectl users list against the demo (pods, nodes, events, leases, namespaces), and upstream's default
(``Name``, ``Created At``) for every other kind. Every column is sent (the server prints wide);
kubectl hides the ones of priority 1 unless ``-o wide``. Each row carries the object as
``includeObject`` asks: ``Metadata`` (the default: a ``PartialObjectMetadata``), ``Object`` or
``None``.

Pure: the caller passes the objects and the time (for ages such as ``5m2s``).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JsonObj = dict[str, Any]
TABLE_VERSIONS = ("v1", "v1beta1")
INCLUDE_OBJECT = ("None", "Metadata", "Object")


@dataclass(frozen=True)
class Column:
    name: str
    type: str = "string"
    priority: int = 0  # 1: shown by kubectl only with -o wide
    format: str = ""
    description: str = ""

    def definition(self) -> JsonObj:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


def table_version(accept: str) -> str | None:
    """The Table version (``v1`` or ``v1beta1``) that an Accept header asks for first, or None when
    it asks for plain objects first (``application/json``, ``*/*``) or names no Table."""
    for media_range in accept.split(","):
        media_type, *raw_params = (p.strip() for p in media_range.split(";"))
        params = dict(p.partition("=")[::2] for p in raw_params)
        if media_type.lower() not in ("application/json", "*/*", "application/*"):
            continue
        if params.get("as") != "Table":
            return None
        if params.get("g") == "meta.k8s.io" and params.get("v") in TABLE_VERSIONS:
            return params["v"]
    return None


def human_duration(seconds: float) -> str:
    """An age as kubectl prints it (apimachinery's ``HumanDuration``): ``45s``, ``5m2s``, ``3h10m``, ``4d``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _since(stamp: Any, now: datetime.datetime) -> str:
    if not isinstance(stamp, str) or not stamp:
        return "<unknown>"
    try:
        then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    return human_duration((now - then).total_seconds())


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    value: Any = obj
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


NAME = Column("Name", format="name", description="the object's name")
AGE = Column("Age", description="time since the object was created")


def _pod_row(pod: JsonObj, now: datetime.datetime) -> list[Any]:
    spec, status = _mapping(pod.get("spec")), _mapping(pod.get("status"))
    reason = status.get("reason") or status.get("phase") or ""
    ready = restarts = 0
    running = False
    for raw in reversed(_list(status.get("containerStatuses"))):
        c = _mapping(raw)
        count = c.get("restartCount")
        restarts += count if isinstance(count, int) else 0
        state = _mapping(c.get("state"))
        waiting, terminated = _mapping(state.get("waiting")), state.get("terminated")
        if waiting.get("reason"):
            reason = waiting["reason"]
        elif isinstance(terminated, Mapping):
            code = terminated.get("exitCode", 0)
            reason = terminated.get("reason") or (
                f"Signal:{terminated['signal']}" if terminated.get("signal") else f"ExitCode:{code}"
            )
        elif c.get("ready") is True and "running" in state:
            running = True
            ready += 1
    if reason == "Completed" and running:
        reason = "Running"
    if _get(pod, "metadata", "deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    gates = _list(spec.get("readinessGates"))
    conditions = {_mapping(c).get("type"): _mapping(c).get("status") for c in _list(status.get("conditions"))}
    gates_ready = sum(conditions.get(_mapping(g).get("conditionType")) == "True" for g in gates)
    return [
        _get(pod, "metadata", "name"),
        f"{ready}/{len(_list(spec.get('containers')))}",
        reason,
        restarts,
        _since(_get(pod, "metadata", "creationTimestamp"), now),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        f"{gates_ready}/{len(gates)}" if gates else "<none>",
    ]


def _node_row(node: JsonObj, now: datetime.datetime) -> list[Any]:
    status = _mapping(node.get("status"))
    conditions = {_mapping(c).get("type"): _mapping(c).get("status") for c in _list(status.get("conditions"))}
    ready = conditions.get("Ready")
    state = "Ready" if ready == "True" else "NotReady" if ready == "False" else "Unknown"
    if _get(node, "spec", "unschedulable") is True:
        state += ",SchedulingDisabled"
    labels = _mapping(_get(node, "metadata", "labels"))
    roles = sorted(
        {
            k.removeprefix("node-role.kubernetes.io/")
            for k in labels
            if k.startswith("node-role.kubernetes.io/")
        }
        | ({str(labels["kubernetes.io/role"])} if labels.get("kubernetes.io/role") else set())
    )
    addresses = {_mapping(a).get("type"): _mapping(a).get("address") for a in _list(status.get("addresses"))}
    info = _mapping(status.get("nodeInfo"))
    return [
        _get(node, "metadata", "name"),
        state,
        ",".join(r for r in roles if r) or "<none>",
        _since(_get(node, "metadata", "creationTimestamp"), now),
        info.get("kubeletVersion") or "",
        addresses.get("InternalIP") or "<none>",
        addresses.get("ExternalIP") or "<none>",
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _event_row(event: JsonObj, now: datetime.datetime) -> list[Any]:
    first = event.get("firstTimestamp") or event.get("eventTime")
    last = event.get("lastTimestamp") or first
    count = event.get("count") if isinstance(event.get("count"), int) else 0
    series = event.get("series")
    if isinstance(series, Mapping):
        last = series.get("lastObservedTime") or last
        count = series.get("count") if isinstance(series.get("count"), int) else count
    elif count == 0:
        count = 1  # a singleton event of the events.k8s.io API has no count
    involved = _mapping(event.get("involvedObject"))
    kind, name = str(involved.get("kind") or "").lower(), involved.get("name")
    source = _mapping(event.get("source"))
    component = source.get("component") or event.get("reportingComponent") or ""
    host = source.get("host") or event.get("reportingInstance") or ""
    return [
        _since(last, now),
        event.get("type") or "",
        event.get("reason") or "",
        f"{kind}/{name}" if name else kind,
        involved.get("fieldPath") or "",
        f"{component}, {host}" if host else component,
        str(event.get("message") or "").strip(),
        _since(first, now),
        count,
        _get(event, "metadata", "name"),
    ]


def _lease_row(lease: JsonObj, now: datetime.datetime) -> list[Any]:
    return [
        _get(lease, "metadata", "name"),
        _get(lease, "spec", "holderIdentity") or "",
        _since(_get(lease, "metadata", "creationTimestamp"), now),
    ]


def _namespace_row(ns: JsonObj, now: datetime.datetime) -> list[Any]:
    return [
        _get(ns, "metadata", "name"),
        _get(ns, "status", "phase") or "",
        _since(_get(ns, "metadata", "creationTimestamp"), now),
    ]


def _default_row(obj: JsonObj, now: datetime.datetime) -> list[Any]:
    return [_get(obj, "metadata", "name"), _get(obj, "metadata", "creationTimestamp")]


Printer = tuple[tuple[Column, ...], Callable[[JsonObj, datetime.datetime], list[Any]]]

PRINTERS: dict[str, Printer] = {
    "pods": (
        (
            NAME,
            Column("Ready", description="ready containers of all"),
            Column("Status", description="the aggregate status of the containers"),
            Column("Restarts", type="integer", description="restarts of the containers"),
            AGE,
            Column("IP", priority=1, description="the pod's IP address"),
            Column("Node", priority=1, description="the node the pod is bound to"),
            Column("Nominated Node", priority=1, description="the node preemption freed for the pod"),
            Column("Readiness Gates", priority=1, description="readiness gates met of all"),
        ),
        _pod_row,
    ),
    "nodes": (
        (
            NAME,
            Column("Status", description="the node's readiness"),
            Column("Roles", description="the node's roles"),
            AGE,
            Column("Version", description="the kubelet's version"),
            Column("Internal-IP", priority=1, description="the node's internal address"),
            Column("External-IP", priority=1, description="the node's external address"),
            Column("OS-Image", priority=1, description="the node's operating system"),
            Column("Kernel-Version", priority=1, description="the node's kernel"),
            Column("Container-Runtime", priority=1, description="the node's container runtime"),
        ),
        _node_row,
    ),
    "events": (
        (
            Column("Last Seen", description="time since the event last happened"),
            Column("Type", description="Normal or Warning"),
            Column("Reason", description="why the event happened"),
            Column("Object", description="the object the event is about"),
            Column("Subobject", priority=1, description="the part of the object"),
            Column("Source", priority=1, description="the component that reported it"),
            Column("Message", description="what happened"),
            Column("First Seen", priority=1, description="time since the event first happened"),
            Column("Count", priority=1, description="how often it happened"),
            Column("Name", priority=1, format="name", description="the event's name"),
        ),
        _event_row,
    ),
    "leases": (
        (NAME, Column("Holder", description="who holds the lease"), AGE),
        _lease_row,
    ),
    "namespaces": (
        (NAME, Column("Status", description="Active or Terminating"), AGE),
        _namespace_row,
    ),
}
DEFAULT: Printer = (
    (NAME, Column("Created At", type="date", description="when the object was created")),
    _default_row,
)


def _row_object(obj: JsonObj, include: str, *, kind: str, api_version: str, version: str) -> JsonObj | None:
    if include == "None":
        return None
    if include == "Object":
        return {"kind": kind, "apiVersion": api_version, **obj}
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": dict(_mapping(obj.get("metadata"))),
    }


def table(
    plural: str,
    objects: Sequence[JsonObj],
    *,
    kind: str,
    api_version: str,
    resource_version: str,
    now: datetime.datetime,
    version: str = "v1",
    include_object: str = "Metadata",
) -> JsonObj:
    """The Table of ``objects`` (of ``kind`` in ``api_version``, listed as ``plural``)."""
    columns, row = PRINTERS.get(plural, DEFAULT)
    rows = []
    for obj in objects:
        entry: JsonObj = {"cells": row(obj, now)}
        shown = _row_object(obj, include_object, kind=kind, api_version=api_version, version=version)
        if shown is not None:
            entry["object"] = shown
        rows.append(entry)
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [c.definition() for c in columns],
        "rows": rows,
    }
