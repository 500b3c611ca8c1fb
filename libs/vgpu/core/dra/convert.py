"""HAMi GPU requests as DRA claims: what the webhook writes into a pod admitted in DRA mode (pure).

A user's pod keeps asking ``nvidia.com/gpu`` (+ ``gpumem`` / ``gpumem-percentage`` / ``gpucores``
and the ``nvidia.com/use-gputype`` ... annotations); in DRA mode the webhook turns each GPU
container ``i`` (init containers first, then app containers, the order of ``request.parse_pod``)
into a pod-level claim ``vgpu-<i>`` made from a ResourceClaimTemplate we keep, and takes our
resources out of the container so that kube-scheduler's DRA plugin, not the extender, places it:

- pod ``spec.resourceClaims += {name: vgpu-<i>, resourceClaimTemplateName: vgpu-<hash>}``;
- container ``resources.claims += {name: vgpu-<i>}``; every ``nvidia.com/*`` resource of ours
  removed from its ``limits`` and ``requests``;
- pod annotation ``kube-vgpu.io/mode: dra``.

The template (``template_body``) holds one request ``gpu`` of DeviceClass ``gpu.kube-vgpu.io``:

==========================================  ===================================================
HAMi                                        DRA (``resource.k8s.io/v1``)
==========================================  ===================================================
``nvidia.com/gpu: N``                       ``exactly.allocationMode: ExactCount, count: N``; the
                                            allocator never gives one request the same device
                                            twice (it resumes after the last device it took)
``gpumem: M`` (MiB, memory factor applied)  ``capacity.requests.memory: <M>Mi`` (canonical: ``4Gi``)
``gpumem-percentage: P`` (1..99)            ``firstAvailable``: one subrequest ``mem-<S>`` per
                                            distinct GPU memory size S published in our
                                            ResourceSlices (ascending), selector
                                            ``memoryMiB == S``, memory ``S*P//100 Mi``
whole GPU (P 100, or no memory term)        no memory request: the slice's request policy
                                            default is the whole memory
``gpucores: C``                             ``capacity.requests.cores: <C>``; 0 asks none
exclusive (whole GPU, no ``gpucores``)      cores ``100`` (as the extender path writes it)
``use-gputype`` / ``nouse-gputype``         CEL on ``model``: case-insensitive substring, as
                                            HAMi matches
``use-gpuuuid`` / ``nouse-gpuuuid``         CEL ``uuid in [...]`` / ``!(uuid in [...])``
``numa-bind: true``                         constraint ``matchAttribute: gpu.kube-vgpu.io/numaNode``
==========================================  ===================================================

Refused (``errors.RequestError`` naming the field; the webhook answers 400): a pod claim already
named ``vgpu-<i>``, ``spec.resourceClaims`` or a container's ``resources.claims`` that is not a
list, a count above 32 (``AllocationResultsMaxSize``: a claim allocates at most 32 devices), a
percentage when no GPU size is published yet or more than 8 sizes are (a ``firstAvailable`` list
holds at most 8), a selector value with a character outside printable ASCII, a selector longer than
CEL's 10 KiB. What DRA cannot say and is only warned about (by the caller): the node and GPU
scheduling policies (kube-scheduler decides), and that an init container's claim is held for the
pod's whole life (kubelet does not hand DRA devices on to the next container).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vgpu.core import errors, jsonpatch, quantity, request
from vgpu.core.config import ResourceNames
from vgpu.core.dra import names

JsonObj = dict[str, Any]

API_VERSION: Final = "resource.k8s.io/v1"
REQUEST: Final = "gpu"
"""The one device request of every template; a result of a subrequest names ``gpu/mem-<S>``."""
SUBREQUEST_PREFIX: Final = "mem-"
MAX_DEVICES: Final = 32  # resource.AllocationResultsMaxSize: devices one claim may allocate
MAX_SUBREQUESTS: Final = 8  # resource.FirstAvailableDeviceRequestMaxSize
MAX_CEL_CHARS: Final = 10 * 1024  # resource.CELSelectorExpressionMaxLength
EXCLUSIVE_CORES: Final = 100
HASH_CHARS: Final = 16
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"

_ATTRS: Final = f'device.attributes["{names.DRIVER}"]'


@dataclass(frozen=True)
class Claim:
    """One GPU container's claim: its index (init first), pod claim name and template."""

    index: int
    container: str
    claim: str
    template: str
    spec: JsonObj  # the template's ResourceClaimSpec


@dataclass(frozen=True)
class Conversion:
    """The patch (all of the builder's operations, the caller's earlier ones included) and the
    distinct templates the pod's claims name, as bodies ready to create in the pod's namespace."""

    patch: tuple[jsonpatch.Operation, ...]
    templates: tuple[JsonObj, ...]
    claims: tuple[Claim, ...]


def cel_string(value: str, *, field: str) -> str:
    """``value`` as a CEL double-quoted string literal; anything but printable ASCII is refused
    (annotation values reach a selector the API server compiles: no escapes to get wrong)."""
    bad = next((ch for ch in value if not " " <= ch <= "~"), None)
    if bad is not None:
        raise errors.RequestError(field, f"character {bad!r} is not allowed in a GPU selector value")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selectors(chosen: request.Selectors) -> list[JsonObj]:
    """The CEL selectors for the pod's GPU type / UUID annotations (empty when none is set)."""
    out: list[str] = []
    model = f"{_ATTRS}.{names.ATTR_MODEL}.lowerAscii()"
    uuid = f"{_ATTRS}.{names.ATTR_UUID}"
    for key, values, shape, join in (
        (request.USE_GPUTYPE, chosen.use_types, model + ".contains({})", " || "),
        (request.NOUSE_GPUTYPE, chosen.nouse_types, "!" + model + ".contains({})", " && "),
    ):
        if values:
            field = f"annotation {key}"
            out.append(_checked(join.join(shape.format(cel_string(v, field=field)) for v in values), field))
    for key, uuids, shape in (
        (request.USE_GPUUUID, chosen.use_uuids, uuid + " in [{}]"),
        (request.NOUSE_GPUUUID, chosen.nouse_uuids, "!(" + uuid + " in [{}])"),
    ):
        if uuids:
            field = f"annotation {key}"
            listed = ", ".join(cel_string(u, field=field) for u in sorted(uuids))
            out.append(_checked(shape.format(listed), field))
    return [{"cel": {"expression": e}} for e in out]


def _checked(expression: str, field: str) -> str:
    if len(expression) > MAX_CEL_CHARS:
        raise errors.RequestError(
            field,
            f"the GPU selector it makes is {len(expression)} characters, more than CEL's {MAX_CEL_CHARS}",
        )
    return expression


def memory_selector(size_mib: int) -> JsonObj:
    """The selector of a GPU with ``size_mib`` MiB of memory (the slice's ``memoryMiB`` attribute)."""
    return {"cel": {"expression": f"{_ATTRS}.{names.ATTR_MEMORY_MIB} == {size_mib}"}}


def claim_spec(
    ask: request.ContainerRequest,
    *,
    chosen: request.Selectors,
    memory_sizes_mib: Sequence[int],
    exclusive: bool,
    field: str,
) -> JsonObj:
    """The ResourceClaimSpec for one container's ask (see the module docstring's table);
    ``field`` names the container in a refusal."""
    if ask.count > MAX_DEVICES:
        raise errors.RequestError(
            field, f"asks for {ask.count} GPUs; a DRA claim allocates at most {MAX_DEVICES} devices"
        )
    cores = EXCLUSIVE_CORES if exclusive else ask.cores
    base: JsonObj = {
        "deviceClassName": names.DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": ask.count,
    }
    wanted = selectors(chosen)

    def capacity(memory_mib: int | None) -> JsonObj:
        amounts: dict[str, str] = {}
        # in kube-apiserver's canonical form (10240Mi is stored as 10Gi): a template read back
        # from the API server then says exactly what this one says
        if memory_mib is not None:
            amounts[names.CAPACITY_MEMORY] = quantity.canonical(f"{memory_mib}Mi")
        if cores > 0:
            amounts[names.CAPACITY_CORES] = quantity.canonical(cores)
        return {"capacity": {"requests": amounts}} if amounts else {}

    percent = ask.memory_percent
    if ask.memory_mib > 0 or percent in (None, 100):
        memory = ask.memory_mib if ask.memory_mib > 0 else None
        exactly = {**base, **({"selectors": wanted} if wanted else {}), **capacity(memory)}
        device_request: JsonObj = {"name": REQUEST, "exactly": exactly}
    else:
        assert percent is not None
        sizes = sorted({s for s in memory_sizes_mib if s > 0 and s * percent // 100 > 0})
        if not sizes:
            raise errors.RequestError(
                field,
                "gpumem-percentage needs the GPUs' memory sizes, and no GPU of driver "
                f"{names.DRIVER} is published in a ResourceSlice yet; ask gpumem in MiB instead",
            )
        if len(sizes) > MAX_SUBREQUESTS:
            raise errors.RequestError(
                field,
                f"gpumem-percentage: the cluster has {len(sizes)} GPU memory sizes and a DRA request "
                f"may list at most {MAX_SUBREQUESTS} alternatives; ask gpumem in MiB instead",
            )
        device_request = {
            "name": REQUEST,
            "firstAvailable": [
                {
                    "name": f"{SUBREQUEST_PREFIX}{size}",
                    **base,
                    "selectors": [memory_selector(size), *wanted],
                    **capacity(size * percent // 100),
                }
                for size in sizes
            ],
        }
    devices: JsonObj = {"requests": [device_request]}
    if chosen.numa_bind and ask.count > 1:
        devices["constraints"] = [
            {"requests": [REQUEST], "matchAttribute": f"{names.DRIVER}/{names.ATTR_NUMA}"}
        ]
    return {"devices": devices}


def _amount(raw: object, parse: Any, field: str) -> int | None:
    """A capacity quantity as a whole number (MiB or percent), None when absent or unreadable."""
    if raw is None:
        return None
    try:
        value: int = parse(raw, field=field)
    except errors.ParseError:
        return None
    return max(value, 0)


def _request_charge(request_: Mapping[str, Any], largest_gpu_memory_mib: int) -> tuple[int, int]:
    count = request_.get("count", 1)
    if request_.get("allocationMode", "ExactCount") != "ExactCount" or not isinstance(count, int):
        count = 1  # "All" (not ours): at least one device
    capacity = request_.get("capacity")
    amounts = capacity.get("requests") if isinstance(capacity, Mapping) else None
    amounts = amounts if isinstance(amounts, Mapping) else {}
    memory = _amount(amounts.get(names.CAPACITY_MEMORY), quantity.parse_mib, names.CAPACITY_MEMORY)
    cores = _amount(amounts.get(names.CAPACITY_CORES), quantity.parse_int, names.CAPACITY_CORES)
    memory = largest_gpu_memory_mib if memory is None else memory  # the request policy's default: all
    return max(count, 0) * memory, max(count, 0) * (cores or 0)


def claim_charge(spec: Any, *, largest_gpu_memory_mib: int) -> tuple[int, int]:
    """(memory MiB, cores) a claim of ``spec`` (a ResourceClaimSpec) holds at most, for the namespace
    quota: per request ``count`` times its memory (absent: the whole GPU, counted at the largest
    published) and cores (absent: 0); a ``firstAvailable`` request at its largest alternative.
    Unreadable parts count as nothing: a template not made by us is counted as far as it reads."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    memory = cores = 0
    for item in requests if isinstance(requests, list) else ():
        if not isinstance(item, Mapping):
            continue
        if isinstance(item.get("exactly"), Mapping):
            m, c = _request_charge(item["exactly"], largest_gpu_memory_mib)
        elif isinstance(item.get("firstAvailable"), list):
            options = [
                _request_charge(o, largest_gpu_memory_mib)
                for o in item["firstAvailable"]
                if isinstance(o, Mapping)
            ]
            m, c = max((o[0] for o in options), default=0), max((o[1] for o in options), default=0)
        else:
            continue
        memory, cores = memory + m, cores + c
    return memory, cores


def template_name(spec: Mapping[str, Any]) -> str:
    """``vgpu-<hash>``: the same spec gets the same name in every namespace (a DNS label)."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
    return f"{names.CLAIM_PREFIX}{hashlib.sha256(canonical).hexdigest()[:HASH_CHARS]}"


def template_body(spec: Mapping[str, Any], *, namespace: str) -> JsonObj:
    """The ResourceClaimTemplate holding ``spec``, named and labelled as the service keeps them."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(spec),
            "namespace": namespace,
            "labels": {names.TEMPLATE_LABEL: "true"},
        },
        "spec": {"spec": dict(spec)},
    }


def _given(container: Mapping[str, Any], resource: str) -> bool:
    resources = container.get("resources") or {}
    return any(resource in (resources.get(k) or {}) for k in ("limits", "requests"))


def exclusive(container: Mapping[str, Any], ask: request.ContainerRequest, resources: ResourceNames) -> bool:
    """A whole-GPU ask without ``gpucores`` takes all cores (HAMi's exclusive default)."""
    whole = ask.memory_mib == 0 and ask.memory_percent in (None, 100)
    return whole and not _given(container, resources.cores)


def claimed(spec: Mapping[str, Any]) -> frozenset[int]:
    """Indices (init containers first) of the containers already holding their ``vgpu-<i>`` claim:
    a pod this conversion made (the webhook called again, ``reinvocationPolicy: IfNeeded``), whose
    GPU containers ask for no ``nvidia.com/*`` any more and must not be treated as GPU-less."""
    pod_claims = spec.get("resourceClaims")
    if not isinstance(pod_claims, list):
        return frozenset()
    held = {c.get("name") for c in pod_claims if isinstance(c, Mapping)}
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    out = set()
    for index, container in enumerate(containers):
        resources = container.get("resources") if isinstance(container, Mapping) else None
        refs = resources.get("claims") if isinstance(resources, Mapping) else None
        name = names.claim_name(index)
        if (
            isinstance(refs, list)
            and name in held
            and any(isinstance(r, Mapping) and r.get("name") == name for r in refs)
        ):
            out.add(index)
    return frozenset(out)


def _list_at(pod: Mapping[str, Any], tokens: Sequence[jsonpatch.Token], field: str) -> list[Any]:
    value = jsonpatch.get(pod, tokens)
    if value is jsonpatch.MISSING or value is None:
        return []
    if not isinstance(value, list):
        raise errors.RequestError(field, "expected a list")
    return value


def convert(
    pod: Mapping[str, Any],
    parsed: request.PodRequest,
    *,
    namespace: str,
    resources: ResourceNames,
    memory_sizes_mib: Sequence[int],
    patch: jsonpatch.Builder | None = None,
) -> Conversion:
    """Turn ``pod`` (as the API server sent it) with its parsed ask ``parsed`` (``parse_pod``, the
    webhook's reading: ``default_count=True``) into claims; the operations go into ``patch`` (a new
    builder on ``pod`` when None). Raises ``errors.RequestError`` for what DRA cannot say."""
    builder = patch if patch is not None else jsonpatch.Builder(pod)
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        raise errors.RequestError("pod.metadata.annotations", "static pods do not support resource claims")
    pod_claims = _list_at(pod, ("spec", "resourceClaims"), "pod.spec.resourceClaims")
    taken = {c.get("name") for c in pod_claims if isinstance(c, Mapping)}
    init = spec.get("initContainers") or []
    paths = [("initContainers", i) for i in range(len(init))]
    paths += [("containers", i) for i in range(len(spec.get("containers") or []))]
    claims: list[Claim] = []
    bodies: dict[str, JsonObj] = {}
    for index, ask in enumerate(parsed.containers):
        if ask is None:
            continue
        group, position = paths[index]
        container = spec[group][position]
        field = f"container {ask.name}"
        claim = names.claim_name(index)
        if claim in taken:
            raise errors.RequestError(
                "pod.spec.resourceClaims",
                f"a claim named {claim} is there already; kube-vgpu gives that name to {field}'s "
                f"GPUs in DRA mode: rename it",
            )
        container_path: list[jsonpatch.Token] = ["spec", group, position]
        _list_at(pod, [*container_path, "resources", "claims"], f"{field}: resources.claims")
        one = claim_spec(
            ask,
            chosen=parsed.selectors,
            memory_sizes_mib=memory_sizes_mib,
            exclusive=exclusive(container, ask, resources),
            field=field,
        )
        body = template_body(one, namespace=namespace)
        name = body["metadata"]["name"]
        bodies.setdefault(name, body)
        claims.append(Claim(index, ask.name, claim, name, one))
        for kind in ("limits", "requests"):
            current = builder.get([*container_path, "resources", kind])
            if isinstance(current, dict):
                for resource in resources.all():
                    if resource in current:
                        builder.remove([*container_path, "resources", kind, resource])
        builder.append([*container_path, "resources", "claims"], {"name": claim})
    for c in claims:
        builder.append(["spec", "resourceClaims"], {"name": c.claim, "resourceClaimTemplateName": c.template})
    if claims:
        builder.set(["metadata", "annotations", names.MODE_ANNOTATION], names.MODE_DRA)
    return Conversion(tuple(builder.ops), tuple(bodies.values()), tuple(claims))
