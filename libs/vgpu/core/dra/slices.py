"""The ResourceSlice that publishes one node's GPUs to Dynamic Resource Allocation (``resource.k8s.io/v1``).

One slice per node for :data:`names.DRIVER`, named :func:`slice_name`, its pool the node's name,
``resourceSliceCount: 1``. Each GPU is one device ``gpu-<index>``:

* ``allowMultipleAllocations: true``: claims share the GPU out (KEP-5075, consumable capacity).
* capacity ``memory`` (``<MiB>Mi``, canonical) whose request policy defaults to the whole memory,
  with ``validRange`` min ``1Mi`` step ``1Mi``; capacity ``cores`` (percent, ``100`` unless core
  scaling says otherwise) whose policy defaults to ``0`` (HAMi: no ``gpucores``, no SM limit, and
  none consumed), ``validRange`` min ``0`` step ``1`` and max ``100`` (or the capacity when under
  100): as in the extender, one claim asks at most the whole GPU's SMs, while core scaling lets the
  claims together ask more. kube-apiserver 1.36
  (``validateRequestPolicyRange``) wants a default when a range is set, ``min <= default <= max <=
  value``, ``min + step <= value`` and ``default - min``, ``max - min`` multiples of the step: hence
  a GPU under 2 MiB or under 1 % is left out.
* attributes ``uuid``, ``model`` (NVML's name), ``index``, ``numaNode`` (when known), ``migEnabled``,
  ``memoryMiB`` and ``driverVersion`` as a ``version`` (semver) attribute when the driver's version
  reads as one (:func:`driver_semver`), left out otherwise: an attribute keeps one type everywhere.
* an unhealthy GPU carries the device taint :data:`names.UNHEALTHY_TAINT_KEY` ``NoSchedule``
  (DRADeviceTaints, beta and on in 1.36). Built with ``taints=False`` (a server that dropped them),
  an unhealthy GPU is left out instead. kube-apiserver sets a taint's ``timeAdded`` when it is
  missing; :func:`reconcile` carries the stored one over so an unchanged taint stays unchanged.
* a GPU with MIG enabled is shown (``migEnabled: true``) but not shared: no capacity, no multiple
  allocations, and the DeviceClasses (:mod:`deviceclass`) leave it out.

Quantities are written in the canonical form kube-apiserver stores (``40960Mi`` is ``40Gi``), so a
slice read back equals the one written and :func:`reconcile` sees no change where there is none.
GPUs that cannot be published (a bad UUID, no memory, a duplicate or negative index, past the 64
devices a slice with taints may hold) are left out and listed in :attr:`SliceBuild.skipped`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from vgpu.core import device, quantity
from vgpu.core.device import Gpu, NodeInventory
from vgpu.core.dra import names

JsonObj = dict[str, Any]

API_VERSION: Final = "resource.k8s.io/v1"
KIND: Final = "ResourceSlice"
NAME_MAX: Final = 253  # a DNS subdomain (ValidateResourceSlice: NameIsDNSSubdomain)
MAX_DEVICES: Final = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures: the limit once a device has taints
VALUE_MAX_BYTES: Final = 64  # DeviceAttributeMaxValueLength, counted in bytes (Go's len)
MIN_MEMORY_MIB: Final = 2  # validRange min 1Mi + step 1Mi must not pass the capacity
MAX_MEMORY_MIB: Final = (2**63 - 1) // quantity.MIB  # a quantity is at most 2^63-1
PER_CLAIM_CORES: Final = 100  # a claim's cores at most: the whole GPU (HAMi's gpucores is 0-100)
MAX_CORES: Final = 10**6  # far past any core scaling; guards the int64 quantity and attribute
TAINT_EFFECT: Final = "NoSchedule"

_SEMVER_ISH = re.compile(r"^[0-9]+(?:\.[0-9]+){0,2}$")


@dataclasses.dataclass(frozen=True, slots=True)
class Skipped:
    """A GPU left out of the slice, and why (for the publisher's log)."""

    index: int
    uuid: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class SliceBuild:
    """The slice body to publish and the GPUs left out of it."""

    body: JsonObj
    skipped: tuple[Skipped, ...]


def slice_name(node: str) -> str:
    """``<node>-gpu.kube-vgpu.io``; over 253 characters, the node's name is cut and a hash of it
    added (``<prefix>-<10 hex>-gpu.kube-vgpu.io``) so two long names stay apart."""
    name = f"{node}-{names.DRIVER}"
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = NAME_MAX - len(digest) - len(names.DRIVER) - 2
    prefix = node[:keep].rstrip(".-")
    return f"{prefix}-{digest}-{names.DRIVER}"


def driver_semver(raw: str | None) -> str | None:
    """The driver's version as semver 2.0.0 (what a ``version`` attribute must be), or None.
    NVIDIA writes ``550.54.15``, ``535.104.05`` (a leading zero semver forbids) or ``470.82``:
    each part is read as a number, missing ones are 0 (``535.104.5``, ``470.82.0``)."""
    if raw is None:
        return None
    text = raw.strip()
    if not _SEMVER_ISH.match(text) or len(text) > VALUE_MAX_BYTES:
        return None
    parts = [int(p) for p in text.split(".")]
    parts += [0] * (3 - len(parts))
    return ".".join(str(p) for p in parts)


def _short(text: str) -> str:
    """``text`` cut to 64 bytes of UTF-8 (on a character boundary)."""
    return text.encode()[:VALUE_MAX_BYTES].decode("utf-8", "ignore")


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _problem(gpu: Gpu) -> str | None:
    uuid = gpu.uuid
    if not isinstance(uuid, str) or not uuid or not uuid.isascii() or not uuid.isprintable():
        return "UUID is not printable ASCII"
    if len(uuid) > VALUE_MAX_BYTES:
        return f"UUID is longer than {VALUE_MAX_BYTES} characters"
    if not _whole(gpu.index) or gpu.index < 0:
        return "index is not a non-negative integer"
    if not _whole(gpu.memory_mib) or not MIN_MEMORY_MIB <= gpu.memory_mib <= MAX_MEMORY_MIB:
        return f"memory {gpu.memory_mib!r} MiB is outside {MIN_MEMORY_MIB}..{MAX_MEMORY_MIB}"
    if not _whole(gpu.cores) or not 1 <= gpu.cores <= MAX_CORES:
        return f"cores {gpu.cores!r} % is outside 1..{MAX_CORES}"
    return None


def _attributes(gpu: Gpu, *, driver_version: str | None) -> JsonObj:
    attrs: JsonObj = {
        names.ATTR_UUID: {"string": gpu.uuid},
        names.ATTR_INDEX: {"int": gpu.index},
        names.ATTR_MIG: {"bool": gpu.mode == device.Mode.MIG},
        names.ATTR_MEMORY_MIB: {"int": gpu.memory_mib},
    }
    model = _short(device.model_name(gpu.type)) if isinstance(gpu.type, str) else ""
    if model:
        attrs[names.ATTR_MODEL] = {"string": model}
    if _whole(gpu.numa) and 0 <= gpu.numa < 2**31:
        attrs[names.ATTR_NUMA] = {"int": gpu.numa}
    if driver_version is not None:
        attrs[names.ATTR_DRIVER_VERSION] = {"version": driver_version}
    return attrs


def _capacity(gpu: Gpu) -> JsonObj:
    memory = quantity.canonical(f"{gpu.memory_mib}Mi")
    cores = quantity.canonical(str(gpu.cores))
    per_claim = quantity.canonical(str(min(gpu.cores, PER_CLAIM_CORES)))
    return {
        names.CAPACITY_MEMORY: {
            "value": memory,
            "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
        names.CAPACITY_CORES: {
            "value": cores,
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": per_claim, "step": "1"}},
        },
    }


def device_entry(gpu: Gpu, *, driver_version: str | None, taint: bool) -> JsonObj:
    """The slice's ``devices[]`` entry for one GPU (already checked by :func:`build`)."""
    entry: JsonObj = {
        "name": names.device_name(gpu.index),
        "attributes": _attributes(gpu, driver_version=driver_version),
    }
    if gpu.mode != device.Mode.MIG:
        entry["allowMultipleAllocations"] = True
        entry["capacity"] = _capacity(gpu)
    if taint:
        entry["taints"] = [{"key": names.UNHEALTHY_TAINT_KEY, "effect": TAINT_EFFECT}]
    return entry


def build(
    inventory: NodeInventory,
    *,
    driver_version: str | None,
    generation: int = 1,
    taints: bool = True,
    node_uid: str | None = None,
) -> SliceBuild:
    """The node's slice at pool generation ``generation``. ``taints`` False: the server keeps no
    device taints, so unhealthy GPUs are left out. ``node_uid`` set: the Node owns the slice (it
    goes when the Node goes, as the kubelet plugin helper upstream does it)."""
    node = str(inventory.node)
    version = driver_semver(driver_version)
    devices: list[JsonObj] = []
    skipped: list[Skipped] = []
    seen_index: set[int] = set()
    seen_uuid: set[str] = set()
    for gpu in sorted(inventory.gpus, key=_order):
        why = _problem(gpu)
        if why is None and gpu.index in seen_index:
            why = f"index {gpu.index} is given twice"
        if why is None and gpu.uuid in seen_uuid:
            why = "UUID is given twice"
        if why is None and not gpu.health and not taints:
            why = "unhealthy, and the API server keeps no device taints"
        if why is None and len(devices) >= MAX_DEVICES:
            why = f"a slice holds at most {MAX_DEVICES} devices"
        if why is not None:
            skipped.append(Skipped(_safe_index(gpu), str(gpu.uuid)[:80], why))
            continue
        seen_index.add(gpu.index)
        seen_uuid.add(gpu.uuid)
        devices.append(device_entry(gpu, driver_version=version, taint=not gpu.health))
    metadata: JsonObj = {"name": slice_name(node)}
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    spec: JsonObj = {
        "driver": names.DRIVER,
        "nodeName": node,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
    }
    if devices:
        spec["devices"] = devices
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
    return SliceBuild(body=body, skipped=tuple(skipped))


def _order(gpu: Gpu) -> tuple[int, str]:
    return (_safe_index(gpu), str(gpu.uuid))


def _safe_index(gpu: Gpu) -> int:
    return gpu.index if _whole(gpu.index) else -1


Ownership = Literal["ours", "stale", "foreign"]


def ownership(existing: Mapping[str, Any], *, node: str) -> Ownership:
    """Whose is the slice found under our name: ``ours`` (our driver, this node, this pool: we
    update it), ``stale`` (our driver but another node or pool, fields that cannot change: we
    delete and recreate it), ``foreign`` (another driver's: never touched)."""
    spec = existing.get("spec")
    if not isinstance(spec, Mapping) or spec.get("driver") != names.DRIVER:
        return "foreign"
    pool = spec.get("pool")
    pool_name = pool.get("name") if isinstance(pool, Mapping) else None
    if spec.get("nodeName") != node or pool_name != node:
        return "stale"
    return "ours"


def _generation(obj: Mapping[str, Any]) -> int:
    pool = (obj.get("spec") or {}).get("pool") or {}
    value = pool.get("generation") if isinstance(pool, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _without_generation(spec: Mapping[str, Any]) -> JsonObj:
    out = copy.deepcopy(dict(spec))
    pool = out.get("pool")
    if isinstance(pool, dict):
        pool.pop("generation", None)
    return out


def _carry_taint_times(desired: JsonObj, existing: Mapping[str, Any]) -> None:
    """Give each taint in ``desired`` the ``timeAdded`` the same taint (key, value, effect) of the
    same device has in ``existing``: kube-apiserver stamped it; resending it keeps it."""
    stored: dict[tuple[str, str, str, str], Any] = {}
    for dev in (existing.get("spec") or {}).get("devices") or []:
        if not isinstance(dev, Mapping):
            continue
        for taint in dev.get("taints") or []:
            if isinstance(taint, Mapping) and "timeAdded" in taint:
                key = (str(dev.get("name")), *(str(taint.get(k, "")) for k in ("key", "value", "effect")))
                stored[key] = taint["timeAdded"]  # type: ignore[index]
    for dev in desired["spec"].get("devices") or []:
        for taint in dev.get("taints") or []:
            key = (str(dev["name"]), *(str(taint.get(k, "")) for k in ("key", "value", "effect")))
            if "timeAdded" not in taint and key in stored:
                taint["timeAdded"] = stored[key]


def reconcile(existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> JsonObj | None:
    """The body to write so the stored slice says what ``desired`` says (a :func:`build` body),
    or None when it already does. Creating: ``desired`` as built. Updating ``existing`` (ours): its
    resourceVersion (a compare-and-swap), its labels and annotations, the stored taint times, and
    the pool generation one past the stored one, so every change of content raises it."""
    body = copy.deepcopy(dict(desired))
    if existing is None:
        return body
    _carry_taint_times(body, existing)
    old_meta = existing.get("metadata") or {}
    same_spec = _without_generation(existing.get("spec") or {}) == _without_generation(body["spec"])
    owners = body["metadata"].get("ownerReferences")
    same_owner = owners is None or old_meta.get("ownerReferences") == owners
    if same_spec and same_owner:
        return None
    meta = body["metadata"]
    for key in ("resourceVersion", "uid", "labels", "annotations"):
        if key in old_meta:
            meta[key] = copy.deepcopy(old_meta[key])
    if owners is None and "ownerReferences" in old_meta:
        meta["ownerReferences"] = copy.deepcopy(old_meta["ownerReferences"])
    body["spec"]["pool"]["generation"] = max(_generation(existing) + 1, _generation(body))
    return body


def taints_dropped(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """True when ``sent`` had device taints and the server's answer ``stored`` has none: an API
    server without DRADeviceTaints drops the field silently."""

    def count(obj: Mapping[str, Any]) -> int:
        devices = (obj.get("spec") or {}).get("devices") or []
        return sum(len(d.get("taints") or []) for d in devices if isinstance(d, Mapping))

    return count(sent) > 0 and count(stored) == 0
