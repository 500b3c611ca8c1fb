"""What the DRA placement of ``vgpu simulate`` reads from the ``--dra`` file's objects and from
the claims it makes, read defensively (the file is the user's): a slice's shape, the GPU memory sizes
the webhook converts percentages over, a DRA pod's quota charge, where an allocation may be used, and
kube-scheduler's DynamicResources score. Pure; nothing here raises on garbage."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vgpu.core.dra import convert, names

PRIORITIZED_MAX = 8  # resource.FirstAvailableDeviceRequestMaxSize: the prioritized-list score's base


def allocation_of(claim: Mapping[str, Any]) -> Any:
    status = claim.get("status")
    return status.get("allocation") if isinstance(status, Mapping) else None


def meta(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def slice_problem(obj: object) -> str | None:
    """Why ``obj`` is not a ResourceSlice shaped as the API server serves one (None: it is)."""
    if not isinstance(obj, Mapping):
        return "not an object"
    meta, spec = obj.get("metadata"), obj.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return "no metadata.name"
    if not isinstance(spec, Mapping) or not isinstance(spec.get("driver"), str):
        return "no spec.driver"
    pool = spec.get("pool")
    if not isinstance(pool, Mapping) or not isinstance(pool.get("name"), str):
        return "no spec.pool.name"
    for key in ("generation", "resourceSliceCount"):
        value = pool.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return f"spec.pool.{key} is not an integer"
    devices = spec.get("devices")
    if devices is not None and not isinstance(devices, list):
        return "spec.devices is not a list"
    for i, dev in enumerate(devices or ()):
        where = f"spec.devices[{i}]"
        if not isinstance(dev, Mapping) or not isinstance(dev.get("name"), str):
            return f"{where} has no name"
        for key in ("attributes", "capacity"):
            value = dev.get(key)
            if value is not None and not (
                isinstance(value, Mapping) and all(isinstance(v, Mapping) for v in value.values())
            ):
                return f"{where}.{key} is not a map of objects"
        taints = dev.get("taints")
        if taints is not None and not (
            isinstance(taints, list) and all(isinstance(t, Mapping) for t in taints)
        ):
            return f"{where}.taints is not a list of objects"
    return None


def memory_sizes_mib(slices: Iterable[Mapping[str, Any]]) -> tuple[int, ...]:
    """The distinct ``memoryMiB`` attributes of our driver's devices (what the webhook's
    ``gpumem-percentage`` becomes ``firstAvailable`` alternatives over)."""
    sizes: set[int] = set()
    for s in slices:
        if s["spec"]["driver"] != names.DRIVER:
            continue
        for dev in s["spec"].get("devices") or ():
            attr = (dev.get("attributes") or {}).get(names.ATTR_MEMORY_MIB) or {}
            value = attr.get("int")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                sizes.add(value)
    return tuple(sorted(sizes))


def charge(
    pod: Mapping[str, Any], templates: Sequence[Mapping[str, Any]], *, largest_gpu_memory_mib: int
) -> tuple[int, int]:
    """(memory MiB, cores) the namespace quota charges ``pod`` from its admission on, as the
    scheduler's ``draquota`` does: each claim made from one of ``templates`` (the webhook's) at
    ``convert.claim_charge``; claims and templates the pod names itself are not ours to count."""
    ours = {t["metadata"]["name"]: t for t in templates}
    memory = cores = 0
    for entry in path_list(pod, "spec", "resourceClaims"):
        template = ours.get(str(entry.get("resourceClaimTemplateName")))
        if template is not None:
            m, c = convert.claim_charge(
                template["spec"]["spec"], largest_gpu_memory_mib=largest_gpu_memory_mib
            )
            memory, cores = memory + m, cores + c
    return memory, cores


def selector_allows(allocation: Mapping[str, Any], node: str) -> bool:
    """Whether an allocation's ``nodeSelector`` (a ``metadata.name`` match, as kube-scheduler writes
    it for node-local devices) admits ``node``; none: every node."""
    selector = allocation.get("nodeSelector")
    if not selector:
        return True
    for term in (selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None) or ():
        fields = term.get("matchFields") if isinstance(term, Mapping) else None
        if isinstance(fields, list) and all(
            isinstance(f, Mapping)
            and f.get("key") == "metadata.name"
            and f.get("operator") == "In"
            and node in (f.get("values") or ())
            for f in fields
        ):
            return True
    return False


def path_list(obj: object, *keys: str) -> list[Any]:
    """``obj[keys...]`` when it is a list of objects' path through mappings, else []."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return [x for x in obj if isinstance(x, Mapping)] if isinstance(obj, list) else []


def prioritized_score(claims: Sequence[Mapping[str, Any]], allocations: Sequence[Mapping[str, Any]]) -> int:
    """DynamicResources' Score: per claim, ``8 - i`` for each ``firstAvailable`` subrequest ``i``
    its allocation (the one at the same position of ``allocations``) used."""
    score = 0
    for claim, allocation in zip(claims, allocations, strict=True):
        used = {str(r.get("request")) for r in path_list(allocation, "devices", "results")}
        for request in path_list(claim, "spec", "devices", "requests"):
            for i, sub in enumerate(path_list(request, "firstAvailable")):
                if f"{request.get('name')}/{sub.get('name')}" in used:
                    score += PRIORITIZED_MAX - i
    return score


def node_of(allocation: Mapping[str, Any]) -> str | None:
    """The node a held allocation is on: its ``nodeSelector``'s node, else its first result's pool."""
    selector = allocation.get("nodeSelector")
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
    for term in terms if isinstance(terms, list) else ():
        fields = term.get("matchFields") if isinstance(term, Mapping) else None
        for f in fields if isinstance(fields, list) else ():
            values = f.get("values") if isinstance(f, Mapping) else None
            if f.get("key") == "metadata.name" and isinstance(values, list) and len(values) == 1:
                return str(values[0])
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if isinstance(results, list) and results and isinstance(results[0], Mapping):
        return str(results[0].get("pool"))
    return None
