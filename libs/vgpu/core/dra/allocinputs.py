"""What kube-scheduler's DRA allocator reads, parsed for ``allocator``: a node's ResourceSlices as
pools of devices (capacities with their request policies, attributes, taints) and a claim's requests
(each request or its ``firstAvailable`` subrequests, resolved against their DeviceClass's selectors).

Pools: the slices of the node (``spec.nodeName``) or of every node (``spec.allNodes``), grouped by
driver and pool; only the newest ``pool.generation`` counts and a pool whose slice count differs
from ``resourceSliceCount`` is incomplete and skipped. Pools are ordered by (driver, pool), slices by
name, devices in slice order (``k8s.io/dynamic-resource-allocation/structured``'s order)."""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vgpu.core import errors, quantity
from vgpu.core.dra import selector
from vgpu.core.errors import VgpuError

DeviceId = tuple[str, str, str]  # driver, pool, device


class AllocatorError(VgpuError):
    """A claim or class the allocator cannot work with (kube-scheduler's ``statusError``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Amount:
    """A quantity's value and the text it was written as (the result repeats the text)."""

    value: decimal.Decimal
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Capacity:
    value: Amount
    default: Amount | None = None
    min: Amount | None = None
    max: Amount | None = None
    step: Amount | None = None
    valid_values: tuple[Amount, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Device:
    id: DeviceId
    node_local: bool
    view: selector.DeviceView
    capacity: Mapping[str, Capacity]
    taints: tuple[Mapping[str, Any], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One request or subrequest, resolved against its class."""

    name: str  # as results name it: "req" or "req/sub"
    selectors: tuple[selector.Expression, ...]
    all_devices: bool
    count: int
    capacity: Mapping[str, Amount]
    tolerations: tuple[Mapping[str, Any], ...]


def amount(raw: object, *, field: str) -> Amount:
    try:
        return Amount(quantity.parse(raw, field=field), str(raw))
    except errors.QuantityError as exc:
        raise AllocatorError(str(exc)) from None


def format_quantity(value: decimal.Decimal) -> str:
    """``resource.NewQuantity(value, BinarySI).String()``: a whole multiple of 1024 (from 1024 up)
    in the largest binary suffix that keeps it whole, a smaller value in decimal SI."""
    if abs(value) < 1024 or value != value.to_integral_value():
        return quantity.canonical(str(value))
    mantissa, power = int(value), 0
    suffixes = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
    while mantissa % 1024 == 0 and power < len(suffixes) - 1:
        mantissa //= 1024
        power += 1
    return f"{mantissa}{suffixes[power]}"


# ----- reading slices -----


def _capacity(raw: Mapping[str, Any], *, field: str) -> Capacity:
    value = amount(raw.get("value"), field=f"{field}.value")
    policy = raw.get("requestPolicy") or {}
    if not isinstance(policy, Mapping):
        raise AllocatorError(f"{field}.requestPolicy is not an object")
    rng = policy.get("validRange") or {}

    def opt(src: Mapping[str, Any], key: str) -> Amount | None:
        return None if src.get(key) is None else amount(src[key], field=f"{field}.requestPolicy.{key}")

    step = opt(rng, "step")
    if step is not None and step.value <= 0:
        raise AllocatorError(f"{field}.requestPolicy.validRange.step must be positive, got {step.text}")
    return Capacity(
        value=value,
        default=opt(policy, "default"),
        min=opt(rng, "min"),
        max=opt(rng, "max"),
        step=step,
        valid_values=tuple(
            amount(v, field=f"{field}.requestPolicy.validValues") for v in policy.get("validValues") or ()
        ),
    )


def pools(slices: Iterable[Mapping[str, Any]], node: str) -> list[list[Device]]:
    """The complete pools usable on ``node``, each as its devices in allocation order."""
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        local = spec.get("nodeName") == node
        if not (local or spec.get("allNodes") is True):
            continue
        pool = spec.get("pool") or {}
        grouped.setdefault((str(spec.get("driver")), str(pool.get("name"))), []).append(s)
    pools = []
    for (driver, pool_name), members in sorted(grouped.items()):
        newest = max(int((m["spec"].get("pool") or {}).get("generation") or 0) for m in members)
        current = [m for m in members if int((m["spec"].get("pool") or {}).get("generation") or 0) == newest]
        expected = int((current[0]["spec"].get("pool") or {}).get("resourceSliceCount") or 1)
        if len(current) != expected:
            continue  # incomplete pool
        devices = []
        for s in sorted(current, key=lambda m: str((m.get("metadata") or {}).get("name"))):
            spec = s["spec"]
            for i, d in enumerate(spec.get("devices") or ()):
                where = f"ResourceSlice {s['metadata'].get('name')}: spec.devices[{i}]"
                devices.append(
                    Device(
                        id=(driver, pool_name, str(d.get("name"))),
                        node_local=spec.get("nodeName") == node,
                        view=selector.DeviceView(
                            driver=driver,
                            attributes=d.get("attributes") or {},
                            allow_multiple=d.get("allowMultipleAllocations") is True,
                        ),
                        capacity={
                            name: _capacity(c, field=f"{where}.capacity[{name}]")
                            for name, c in (d.get("capacity") or {}).items()
                        },
                        taints=tuple(d.get("taints") or ()),
                    )
                )
        pools.append(devices)
    return pools


# ----- reading claims -----


def _class_selectors(classes: Mapping[str, Mapping[str, Any]], name: object, *, where: str) -> list[Any]:
    if not isinstance(name, str) or not name:
        raise AllocatorError(f"{where}: missing device class name")
    cls = classes.get(name)
    if cls is None:
        raise AllocatorError(f"{where}: could not retrieve device class {name}: not found")
    return list((cls.get("spec") or {}).get("selectors") or ())


def _terms(raw: Sequence[Any], *, where: str) -> tuple[selector.Expression, ...]:
    out = []
    for i, sel in enumerate(raw):
        cel = sel.get("cel") if isinstance(sel, Mapping) else None
        if not isinstance(cel, Mapping):
            raise AllocatorError(f"{where}, selector #{i}: CEL expression empty (unsupported selector type?)")
        try:
            out.append(selector.parse(cel.get("expression")))
        except selector.SelectorError as exc:
            raise AllocatorError(f"{where}, selector #{i}: {exc}") from None
    return tuple(out)


def _request(
    raw: Mapping[str, Any], name: str, classes: Mapping[str, Mapping[str, Any]], *, where: str
) -> Request:
    class_sel = _class_selectors(classes, raw.get("deviceClassName"), where=where)
    mode = raw.get("allocationMode") or "ExactCount"
    count = raw.get("count", 1) if mode == "ExactCount" else 0
    if (
        mode not in ("ExactCount", "All")
        or not isinstance(count, int)
        or (mode == "ExactCount" and count <= 0)
    ):
        raise AllocatorError(f"{where}: unsupported allocationMode {mode!r} / count {count!r}")
    if raw.get("adminAccess"):
        raise AllocatorError(f"{where}: adminAccess is not emulated")
    requests = ((raw.get("capacity") or {}).get("requests")) or {}
    return Request(
        name=name,
        selectors=_terms(class_sel, where=f"{where} (class)")
        + _terms(raw.get("selectors") or (), where=where),
        all_devices=mode == "All",
        count=count,
        capacity={k: amount(v, field=f"{where}.capacity.requests[{k}]") for k, v in requests.items()},
        tolerations=tuple(raw.get("tolerations") or ()),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class MatchAttribute:
    """A claim's ``matchAttribute`` constraint: every device allocated for ``requests`` (all of the
    claim's when empty; a request's name covers its subrequests) has the same ``attribute``."""

    requests: frozenset[str]
    domain: str
    name: str

    def applies(self, request: str) -> bool:
        return not self.requests or request in self.requests or request.partition("/")[0] in self.requests


def constraints(claim: Mapping[str, Any]) -> list[MatchAttribute]:
    """The ``matchAttribute`` constraints of ``claim`` (``distinctAttribute`` is not emulated)."""
    meta = claim.get("metadata") or {}
    label = f"claim {meta.get('namespace')}/{meta.get('name')}"
    out = []
    for i, raw in enumerate(((claim.get("spec") or {}).get("devices") or {}).get("constraints") or ()):
        attribute = raw.get("matchAttribute") if isinstance(raw, Mapping) else None
        if not isinstance(attribute, str) or "/" not in attribute:
            raise AllocatorError(
                f"{label}, constraint #{i}: only matchAttribute with a fully qualified name is emulated"
            )
        domain, _, name = attribute.rpartition("/")
        out.append(MatchAttribute(frozenset(str(r) for r in raw.get("requests") or ()), domain, name))
    return out


def claim_requests(claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> list[list[Request]]:
    """Each request of ``claim`` as its alternatives (one, or its ``firstAvailable`` subrequests)."""
    meta = claim.get("metadata") or {}
    label = f"claim {meta.get('namespace')}/{meta.get('name')}"
    devices = (claim.get("spec") or {}).get("devices") or {}
    out = []
    for r in devices.get("requests") or ():
        name = str(r.get("name"))
        where = f"{label}, request {name}"
        if r.get("exactly") is not None:
            out.append([_request(r["exactly"], name, classes, where=where)])
        elif r.get("firstAvailable"):
            out.append(
                [
                    _request(sub, f"{name}/{sub.get('name')}", classes, where=f"{where}/{sub.get('name')}")
                    for sub in r["firstAvailable"]
                ]
            )
        else:
            raise AllocatorError(f"{where}: exactly one of `exactly` or `firstAvailable` is required")
    return out
