"""DRA GPU pods still waiting for an allocation, and why, as the views list them (pure).

kube-scheduler's DynamicResources plugin places a DRA pod, not ``/filter``, so the scheduler has
no filter failure to show for it. What a waiting pod asked and why it waits come from what the
cluster says:

* **Whose pod**: an unbound, unfinished pod with a ``spec.resourceClaims`` entry whose claim (named
  directly, or through ``status.resourceClaimStatuses`` for a template) asks our DeviceClass, or,
  while that claim is not made or not seen yet, whose ResourceClaimTemplate does (the webhook's
  conversion: ``convert.template_body``). A template or claim of another class, or one not known,
  is not ours: such a pod is not listed.
* **What it asked**, per claim request of our class (``Ask``): the GPU ``count``, the memory
  (``capacity.requests.memory``; none asked is the whole GPU), the cores (``capacity.requests.cores``;
  none asked is 0, no limit), and for ``gpumem-percentage`` (a ``firstAvailable`` of ``mem-<size>``
  subrequests) the percentage.
* **Why it waits**, in this order: its claims are all allocated and reserved for it (``allocated
  on <node>; waiting for the bind``: kube-scheduler's binding cycle); kube-scheduler's
  ``PodScheduled=False`` condition message (``0/3 nodes are available: 3 cannot allocate all
  claims. still not schedulable ...``); a template claim that kube-controller-manager has not made
  yet (kube-scheduler's PreEnqueue does not try the pod then, and writes no condition); a claim
  recorded but not in the claims' cache yet; else queued (kube-scheduler has not tried it yet).

API data is not trusted: nothing here raises on garbage (a malformed allocation counts as not
allocated, an unreadable amount as not asked).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from vgpu.core import errors, quantity
from vgpu.core.dra import allocation, names

Key = tuple[str, str]  # (namespace, name)
FINISHED = ("Succeeded", "Failed")
# where a waiting DRA pod stands: its claim not made (or not seen) yet; kube-scheduler has not
# tried it; kube-scheduler said why it cannot place it; its claims allocated, the bind under way
STAGES = ("claim_pending", "queued", "unschedulable", "binding")
MAX_MESSAGE_CHARS = 1024  # a condition message is shown cut to this (kube-scheduler's is a histogram)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """One claim request of our DeviceClass: per GPU, ``memory_mib`` (None: the whole memory or a
    percentage), ``memory_percent`` (``gpumem-percentage``; None otherwise) and ``cores``."""

    gpus: int
    memory_mib: int | None
    memory_percent: int | None
    cores: int

    @property
    def shown(self) -> str:
        """``1 GPU: 4096 MiB, 30 % cores``, ``2 GPUs: whole memory``, ``1 GPU: 50 % of memory``."""
        parts = [
            f"{self.memory_mib} MiB"
            if self.memory_mib is not None
            else f"{self.memory_percent} % of memory"
            if self.memory_percent is not None
            else "whole memory"
        ]
        if self.cores:
            parts.append(f"{self.cores} % cores")
        return f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}: {', '.join(parts)}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """One DRA GPU pod waiting for its allocation (see the module docstring)."""

    namespace: str
    name: str
    uid: str
    asks: tuple[Ask, ...]
    reason: str
    stage: str  # one of STAGES: where it stands, for counting (the reason says it in words)


def _get(obj: object, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _key(obj: object) -> Key | None:
    ns, name = _get(obj, "metadata", "namespace"), _get(obj, "metadata", "name")
    return (ns, name) if isinstance(ns, str) and isinstance(name, str) else None


def index(objects: Iterable[object]) -> dict[Key, Mapping[str, Any]]:
    """(namespace, name) -> object, of the objects that have both (claims, templates)."""
    out: dict[Key, Mapping[str, Any]] = {}
    for obj in objects:
        key = _key(obj)
        if key is not None and isinstance(obj, Mapping):
            out[key] = obj
    return out


def _amount(raw: object, *, memory: bool) -> int | None:
    if raw is None:
        return None
    try:
        if memory:
            return allocation.memory_mib(raw, field=names.CAPACITY_MEMORY)
        return max(quantity.parse_int(raw, field=names.CAPACITY_CORES), 0)
    except errors.VgpuError:
        return None


def _one(request: Mapping[str, Any]) -> Ask | None:
    """An ``exactly`` body or a subrequest read as an Ask; None when not of our DeviceClass."""
    if request.get("deviceClassName") != names.DEVICE_CLASS:
        return None
    count = request.get("count", 1)
    if request.get("allocationMode", "ExactCount") != "ExactCount" or type(count) is not int:
        count = 1  # "All" (not the webhook's): at least one
    amounts = _get(request, "capacity", "requests")
    memory = _amount(_get(amounts, names.CAPACITY_MEMORY), memory=True)
    cores = _amount(_get(amounts, names.CAPACITY_CORES), memory=False)
    return Ask(gpus=max(count, 0), memory_mib=memory, memory_percent=None, cores=cores or 0)


def _percent(options: list[tuple[str, Ask]]) -> int | None:
    """The ``gpumem-percentage`` P the webhook's ``mem-<S>`` subrequests (memory ``S*P//100``) say."""
    found: set[int] = set()
    for name, ask in options:
        size = name.removeprefix("mem-")
        if not name.startswith("mem-") or not size.isdigit() or int(size) <= 0 or ask.memory_mib is None:
            return None
        total = int(size)
        percent = -(-ask.memory_mib * 100 // total)  # the smallest P with S*P//100 >= M
        if not 1 <= percent <= 100 or total * percent // 100 != ask.memory_mib:
            return None
        found.add(percent)
    return found.pop() if len(found) == 1 else None


def asks(spec: object) -> tuple[Ask, ...]:
    """What a ResourceClaimSpec asks of our DeviceClass, one Ask per request (empty: none)."""
    requests = _get(spec, "devices", "requests")
    out: list[Ask] = []
    for item in requests if isinstance(requests, list) else ():
        if not isinstance(item, Mapping):
            continue
        exactly = item.get("exactly")
        options = item.get("firstAvailable")
        if isinstance(exactly, Mapping):
            ask = _one(exactly)
            if ask is not None:
                out.append(ask)
        elif isinstance(options, list):
            read = [
                (str(o.get("name")), a)
                for o in options
                if isinstance(o, Mapping) and (a := _one(o)) is not None
            ]
            if not read:
                continue
            percent = _percent(read)
            first = read[0][1]
            out.append(
                first
                if percent is None
                else dataclasses.replace(first, memory_mib=None, memory_percent=percent)
            )
    return tuple(out)


def _allocated_on(claim: Mapping[str, Any], uid: str) -> set[str] | None:
    """The nodes (pools) of ``claim``'s allocation when it is allocated and reserved for pod
    ``uid``; None otherwise, a malformed allocation (or one without our driver's results) included."""
    if not isinstance(_get(claim, "status", "allocation"), Mapping):
        return None
    reserved = _get(claim, "status", "reservedFor")
    if not isinstance(reserved, list) or not any(
        isinstance(r, Mapping) and r.get("uid") == uid for r in reserved
    ):
        return None
    try:
        pools = {s.pool for s in allocation.shares(claim)}
    except errors.VgpuError:
        return None
    return pools or None  # no result of our driver: not what the pod waits for


def condition_message(pod: object) -> str | None:
    """The message of ``pod``'s ``PodScheduled=False`` condition (kube-scheduler's why), stripped and
    cut to ``MAX_MESSAGE_CHARS``; None when there is none or it is blank."""
    conditions = _get(pod, "status", "conditions")
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False":
            message = c.get("message")
            if isinstance(message, str) and message.strip():
                text = message.strip()
                return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"
    return None


def waiting(
    pod: object,
    *,
    claims: Mapping[Key, Mapping[str, Any]],
    templates: Mapping[Key, Mapping[str, Any]],
) -> Waiting | None:
    """``pod`` as a waiting DRA GPU pod, or None when it is not one (see the module docstring).
    ``claims``: ResourceClaims by (namespace, name); ``templates``: ResourceClaimTemplates likewise
    (``index``)."""
    if not isinstance(pod, Mapping):
        return None
    entries = _get(pod, "spec", "resourceClaims")
    if not isinstance(entries, list) or not entries or _get(pod, "spec", "nodeName"):
        return None
    if _get(pod, "status", "phase") in FINISHED:
        return None
    meta = _get(pod, "metadata")
    ns = _get(meta, "namespace")
    ns = ns if isinstance(ns, str) else ""
    uid = str(_get(meta, "uid") or "")
    statuses = _get(pod, "status", "resourceClaimStatuses")
    made = {
        s["name"]: s.get("resourceClaimName")
        for s in (statuses if isinstance(statuses, list) else ())
        if isinstance(s, Mapping) and isinstance(s.get("name"), str)
    }
    found: list[Ask] = []
    not_made: list[str] = []  # pod claim entries whose claim kube-controller-manager has not made
    not_seen: list[str] = []  # claims recorded, not in the cache yet
    nodes: set[str] = set()
    all_allocated = True
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        direct, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        claim_name = direct if isinstance(direct, str) else made.get(entry["name"])
        if not isinstance(direct, str) and entry["name"] in made and claim_name is None:
            continue  # intentionally not created (kube-controller-manager's null name)
        claim = claims.get((ns, claim_name)) if isinstance(claim_name, str) else None
        if claim is not None:
            spec: object = claim.get("spec")
        elif isinstance(template, str):
            spec = _get(templates.get((ns, template)), "spec", "spec")
        else:
            spec = None
        mine = asks(spec)
        if not mine:
            continue
        found.extend(mine)
        on = _allocated_on(claim, uid) if claim is not None else None
        if on is None:
            all_allocated = False
        else:
            nodes |= on
        if claim is None:
            (not_seen if isinstance(claim_name, str) else not_made).append(
                claim_name if isinstance(claim_name, str) else entry["name"]
            )
    if not found:
        return None
    name = _get(meta, "name")
    name = name if isinstance(name, str) else uid
    stage, reason = _reason(
        pod, all_allocated=all_allocated, nodes=nodes, not_made=not_made, not_seen=not_seen
    )
    return Waiting(namespace=ns, name=name, uid=uid, asks=tuple(found), reason=reason, stage=stage)


def _reason(
    pod: Mapping[str, Any], *, all_allocated: bool, nodes: set[str], not_made: list[str], not_seen: list[str]
) -> tuple[str, str]:
    """(stage, reason in words)."""
    if all_allocated and not not_made and not not_seen:
        return "binding", f"claims allocated on {', '.join(sorted(nodes))}; waiting for the bind"
    message = condition_message(pod)
    if message is not None:
        return "unschedulable", message
    if not_made:
        return "claim_pending", (
            f"waiting for its ResourceClaim: kube-controller-manager has not created "
            f"{', '.join(not_made)} from its template yet"
        )
    if not_seen:
        return "claim_pending", f"waiting for its ResourceClaim {', '.join(not_seen)} (not seen yet)"
    return "queued", "queued: kube-scheduler has not tried it yet"
