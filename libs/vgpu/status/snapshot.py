"""One snapshot of the cluster for ``vgpu status``: nodes, pods and plugin leases read through a
``KubeApi`` and turned into per-node, per-GPU rows (``ClusterStatus``).

Plugin liveness comes from the Lease ``vgpu-device-plugin-<node>``; the GPUs from the register
annotation; usage from every unfinished assigned pod's allocated devices, collapsed as the scheduler
does (``vgpu.core.usage``). API data is not trusted: a corrupt annotation becomes the node's
``problem`` or a warning, with the decoder's reason.

Nodes in the DRA mode (``mode == "dra"``) come from our driver's ResourceSlices and the
ResourceClaims allocated on them (``vgpu.core.dra.usage``): the same rows, a GPU's slots without a
total (DRA has no slot limit), its pods those the claims are reserved for. An API server that does
not serve ``resource.k8s.io/v1`` (before Kubernetes 1.34) has no DRA nodes.

Unbound GPU pods of both modes are listed with what they ask and why they wait (``pendingpods``): a DRA
pod's ask from its claim, or our ResourceClaimTemplate while the claim is not made.
"""

import asyncio
import contextlib
import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu.core import annotations, errors, lease, outside, request, usage
from vgpu.core.annotations import Keys
from vgpu.core.config import Config
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid
from vgpu.core.dra import names as dra_names
from vgpu.core.dra import usage as dra_usage
from vgpu.kube.port import JsonObj, Kind, KubeApi, ObjectList
from vgpu.status import pendingpods

FINISHED_PHASES = ("Succeeded", "Failed")


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class GpuStatus:
    gpu: Gpu
    used: GpuUsage
    pods: tuple[str, ...]
    cordoned: bool = False
    outside_mib: int = 0  # used outside kube-vgpu, from the device plugin's measurement


@dataclass(frozen=True)
class NodeStatus:
    """One node. ``problem``: why its GPUs cannot be read; ``reporting`` None: no lease at all."""

    name: str
    gpus: tuple[GpuStatus, ...] = ()
    problem: str = ""
    reporting: bool | None = None
    lease_age_s: float | None = None
    warnings: tuple[str, ...] = ()
    mode: str = dra_names.MODE_EXTENDER  # or MODE_DRA: GPUs from ResourceSlices, usage from claims


@dataclass(frozen=True)
class ClusterStatus:
    nodes: tuple[NodeStatus, ...]
    other_nodes: int
    taken_at: datetime.datetime
    warnings: tuple[str, ...] = field(default=())
    # the scheduler's preemptions: (when, pod ns/name, message) of its Preempting events, newest first
    preemptions: tuple[tuple[str, str, str], ...] = field(default=())
    # unbound GPU pods of both modes, what they ask and why they wait (pendingpods.py), by name
    pending: tuple[pendingpods.PendingPod, ...] = field(default=())


PREEMPTIONS_SHOWN = 10


def _preemptions(events: Sequence[JsonObj]) -> tuple[tuple[str, str, str], ...]:
    """The scheduler's ``Preempting`` events (its own preemption path, issue 50), newest first."""
    out: list[tuple[str, str, str]] = []
    for event in events:
        if not isinstance(event, Mapping) or event.get("reason") != "Preempting":
            continue
        involved = event.get("involvedObject") or {}
        if not isinstance(involved, Mapping) or not involved.get("name"):
            continue
        when = str(
            event.get("lastTimestamp")
            or event.get("eventTime")
            or _meta(event).get("creationTimestamp")
            or ""
        )
        pod = f"{involved.get('namespace') or 'default'}/{involved.get('name')}"
        out.append((when, pod, str(event.get("message") or "")))
    out.sort(reverse=True)
    return tuple(out[:PREEMPTIONS_SHOWN])


def _dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...`` or None when a level is missing or not an object (API data is not trusted)."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _meta(obj: Any) -> Mapping[str, Any]:
    meta = _dig(obj, "metadata")
    return meta if isinstance(meta, Mapping) else {}


def _lease_ages(leases: Sequence[JsonObj], now: datetime.datetime) -> dict[str, float | None]:
    """node → seconds since its plugin lease was renewed (None: the lease has no readable time)."""
    ages: dict[str, float | None] = {}
    for obj in leases:
        node = lease.node_of(str(_meta(obj).get("name", "")))
        if node is None:
            continue
        renew = _dig(obj, "spec", "renewTime") or _dig(obj, "spec", "acquireTime")
        age: float | None = None
        if isinstance(renew, str):
            with contextlib.suppress(ValueError):
                age = (now - lease.parse_micro_time(renew)).total_seconds()
        ages[node] = age
    return ages


def _pod_footprints(
    pods: Sequence[JsonObj], keys: Keys
) -> tuple[dict[str, list[tuple[str, dict[GpuUuid, GpuUsage]]]], dict[str, list[str]]]:
    """node → [(ns/name, per-GPU usage)] of unfinished assigned pods, and node → pod problems."""
    by_node: dict[str, list[tuple[str, dict[GpuUuid, GpuUsage]]]] = {}
    problems: dict[str, list[str]] = {}
    for pod in pods:
        meta = _meta(pod)
        notes = meta.get("annotations") or {}
        if not isinstance(notes, Mapping):
            continue
        node = notes.get(keys.assigned_node)
        if not isinstance(node, str) or not node:
            continue
        if _dig(pod, "status", "phase") in FINISHED_PHASES:
            continue
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        raw = notes.get(keys.devices_allocated)
        if not isinstance(raw, str):
            problems.setdefault(node, []).append(f"pod {key}: no {keys.devices_allocated} annotation")
            continue
        init = _dig(pod, "spec", "initContainers") or []
        try:
            devices = annotations.decode_pod_devices(raw, field=keys.devices_allocated)
        except errors.AnnotationError as exc:
            problems.setdefault(node, []).append(f"pod {key}: {exc}")
            continue
        footprint = usage.pod_usage(
            devices,
            init_count=len(init) if isinstance(init, list) else 0,
            sidecars=request.sidecar_indices(init),
            init_done=usage.regular_init_done(pod),
        )
        by_node.setdefault(node, []).append((key, footprint))
    return by_node, problems


def _node_status(
    node: JsonObj,
    *,
    keys: Keys,
    pods: list[tuple[str, dict[GpuUuid, GpuUsage]]],
    pod_problems: list[str],
    lease_age: tuple[bool, float | None],
    lease_timeout_s: float,
) -> NodeStatus:
    meta = _meta(node)
    name = str(meta.get("name", ""))
    notes = meta.get("annotations") or {}
    notes = notes if isinstance(notes, Mapping) else {}
    has_lease, age = lease_age
    reporting = None if not has_lease else (age is not None and age <= lease_timeout_s)
    warnings = list(pod_problems)

    def unusable(problem: str) -> NodeStatus:
        return NodeStatus(
            name, problem=problem, reporting=reporting, lease_age_s=age, warnings=tuple(warnings)
        )

    raw = notes.get(keys.node_register)
    if not isinstance(raw, str):
        return unusable(f"no {keys.node_register} annotation")
    plugin_error = notes.get(keys.node_plugin_error)
    if isinstance(plugin_error, str) and plugin_error:
        return unusable(f"device plugin has no GPUs: {plugin_error}")
    try:
        gpus = annotations.decode_node_register(raw)
    except errors.AnnotationError as exc:
        return unusable(f"corrupt register annotation: {exc}")
    cordon_raw = notes.get(keys.device_cordon)
    cordoned = annotations.decode_cordon(cordon_raw) if isinstance(cordon_raw, str) else frozenset()
    away: Mapping[GpuUuid, int] = {}
    outside_raw = notes.get(keys.node_outside_usage)
    if outside_raw is not None:
        try:
            if not isinstance(outside_raw, str):
                raise errors.AnnotationError(keys.node_outside_usage, "expected a string")
            away = outside.decode(outside_raw, field=keys.node_outside_usage)
        except errors.AnnotationError as exc:
            warnings.append(f"memory used outside kube-vgpu unreadable (the scheduler counts 0): {exc}")
    known = {g.uuid for g in gpus}
    used = usage.node_usage(footprint for _, footprint in pods)
    sharing: dict[GpuUuid, list[str]] = {}
    for key, footprint in pods:
        for uuid in footprint:
            if uuid in known:
                sharing.setdefault(uuid, []).append(key)
            else:
                warnings.append(f"pod {key} holds {uuid}, which the node does not register")
    rows = tuple(
        GpuStatus(
            g,
            used.get(g.uuid, EMPTY_USAGE),
            tuple(sorted(sharing.get(g.uuid, ()))),
            g.uuid in cordoned,
            away.get(g.uuid, 0),
        )
        for g in sorted(gpus, key=lambda g: g.index)
    )
    return NodeStatus(name, rows, reporting=reporting, lease_age_s=age, warnings=tuple(warnings))


def dra_nodes(found: dra_usage.DraUsage) -> list[NodeStatus]:
    """The DRA mode's nodes as rows (see the module docstring)."""
    rows = []
    for name, node in found.nodes.items():
        gpus = tuple(
            GpuStatus(
                g,
                node.used.get(g.uuid, EMPTY_USAGE),
                tuple(sorted({h.shown for h in node.holders.get(g.uuid, ())})),
            )
            for g in node.inventory.gpus
        )
        rows.append(NodeStatus(name, gpus, warnings=node.problems, mode=dra_names.MODE_DRA))
    return rows


async def _list_if_served(
    api: KubeApi, kind: Kind, *, label_selector: str | None = None, unseen: str = "DRA nodes"
) -> tuple[ObjectList, str | None]:
    """``kind``'s objects; none when the API server does not serve it (404), and none with a
    warning (``unseen`` not shown) when this user may not list it (403): the rest still shows."""
    try:
        return await api.list(kind, label_selector=label_selector), None
    except errors.NotFound:
        return ObjectList([], ""), None
    except errors.KubeError as exc:
        if exc.status != 403:
            raise
        return ObjectList([], ""), f"{unseen} not shown: cannot list {kind}: {exc}"


async def collect(
    api: KubeApi, *, config: Config, now: Callable[[], datetime.datetime] = utcnow
) -> ClusterStatus:
    """One snapshot: nodes, pods (all namespaces), plugin leases, the scheduler's preemption
    events, and the DRA mode's ResourceSlices, ResourceClaims and our ResourceClaimTemplates, read
    with seven list calls."""
    keys = Keys(config.annotation_prefix)
    (nodes, pods, leases, events, slices, claims), templates = await asyncio.gather(
        asyncio.gather(
            api.list("nodes"),
            api.list("pods"),
            api.list("leases", namespace=config.scheduler.lease_namespace),
            api.list("events", field_selector="reason=Preempting"),
            _list_if_served(api, "resourceslices"),
            _list_if_served(api, "resourceclaims"),
        ),
        _list_if_served(
            api,
            "resourceclaimtemplates",
            label_selector=f"{dra_names.TEMPLATE_LABEL}=true",
            unseen="what DRA pods whose claim is not made yet ask",
        ),
    )
    dra = dra_usage.build(slices[0].items, claims[0].items)
    taken_at = now()
    ages = _lease_ages(leases.items, taken_at)
    by_node, pod_problems = _pod_footprints(pods.items, keys)
    rows: list[NodeStatus] = []
    other = 0
    seen: set[str] = set()
    for node in sorted(nodes.items, key=lambda n: str(_meta(n).get("name", ""))):
        name = str(_meta(node).get("name", ""))
        seen.add(name)
        notes = _meta(node).get("annotations") or {}
        registered = isinstance(notes, Mapping) and keys.node_register in notes
        if not registered and name not in ages and name not in by_node and name not in pod_problems:
            if name not in dra.nodes:
                other += 1
            continue
        rows.append(
            _node_status(
                node,
                keys=keys,
                pods=by_node.get(name, []),
                pod_problems=pod_problems.get(name, []),
                lease_age=(name in ages, ages.get(name)),
                lease_timeout_s=config.scheduler.lease_timeout_s,
            )
        )
    missing = sorted(set(by_node) - seen)
    warnings = [
        f"pods assigned to node {n}, which does not exist: {', '.join(k for k, _ in by_node[n])}"
        for n in missing
    ]
    both = sorted({r.name for r in rows} & set(dra.nodes))
    warnings.extend(
        f"node {n} has GPUs in both modes (a register annotation or plugin lease, and a "
        f"ResourceSlice of {dra_names.DRIVER}): each mode hands out the same GPUs"
        for n in both
    )
    warnings.extend(w for w in (slices[1], claims[1], templates[1]) if w)
    warnings.extend(dra.problems)
    rows.extend(dra_nodes(dra))
    rows.sort(key=lambda r: (r.name, r.mode != dra_names.MODE_EXTENDER))
    waiting = pendingpods.pending_pods(
        pods.items, claims=claims[0].items, templates=templates[0].items, config=config
    )
    return ClusterStatus(tuple(rows), other, taken_at, tuple(warnings), _preemptions(events.items), waiting)
