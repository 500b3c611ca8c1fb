"""kube-scheduler's structured DRA allocation, for the local cluster: given the ResourceSlices, the
DeviceClasses and the claims already allocated, find devices on one node for all of a pod's
unallocated claims, with consumable capacity (KEP-5075), or say that they do not fit.

It follows ``k8s.io/dynamic-resource-allocation/structured`` (the "incubating" allocator that
Kubernetes 1.36 runs with consumable capacity on):

- **pools** (``allocinputs``): the node's complete pools of the newest generation, in the real order;
- **search**: claims in order, requests in order, ``firstAvailable`` subrequests in order (the first
  that fits wins), devices depth-first with backtracking; within one request each device is taken at
  most once (the search for a request's next device starts after the previous one), but a device
  with ``allowMultipleAllocations`` may serve several requests and claims;
- **capacity**: for a multi-allocatable device every published capacity is consumed: the request's
  amount rounded up by the capacity's ``requestPolicy`` (``validRange``: up to ``min``, then to
  ``min`` + a multiple of ``step``; ``validValues``: to the next listed value), or, when not
  requested, the policy's ``default`` (else the whole value). An amount above ``validRange.max``, off
  the step grid, or not among ``validValues`` (and not the default) does not fit, nor does a total
  (already allocated + this search's + this one) above the capacity's value, nor a request naming a
  capacity the device does not publish. A device without ``allowMultipleAllocations`` is exclusive;
- **taints**: a ``NoSchedule`` or ``NoExecute`` device taint not tolerated by the request's
  ``tolerations`` excludes the device;
- **selectors**: the class's and the request's CEL selectors, in the subset ``selector`` evaluates
  (anything else is an ``AllocatorError``, as a CEL error is kube-scheduler's error);
- **constraints**: ``matchAttribute`` (every device of the named requests, or of the whole claim,
  has the same value of the attribute; a device without it cannot be taken).

Not emulated: ``distinctAttribute``, ``adminAccess``, device ``config``, partitionable devices
(counters), slices with a ``nodeSelector`` or per-device node selection (skipped), binding
conditions, and scoring (the first solution is taken, as the real one does without scoring).

The result for each claim is the ``status.allocation`` body kube-scheduler writes: one result per
device with ``request`` (``<request>/<subrequest>`` for a subrequest), ``driver``, ``pool``,
``device``, and for a multi-allocatable device a new ``shareID`` and its ``consumedCapacity``; plus a
``nodeSelector`` on the node's name when a device came from a node-local slice.
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vgpu.core import quantity
from vgpu.core.dra import allocinputs, selector

JsonObj = dict[str, Any]
DeviceId = allocinputs.DeviceId
AllocatorError = allocinputs.AllocatorError
format_quantity = allocinputs.format_quantity


# ----- the search -----


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("key") and toleration.get("key") != taint.get("key"):
        return False
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def _tainted(device: allocinputs.Device, request: allocinputs.Request) -> bool:
    return any(
        t.get("effect") in ("NoSchedule", "NoExecute")
        and not any(_tolerates(x, t) for x in request.tolerations)
        for t in device.taints
    )


def _whole(value: decimal.Decimal) -> int:
    """``Quantity.Value()``: the value in whole units, rounded up."""
    return int(value.to_integral_value(rounding=decimal.ROUND_CEILING))


def _consumed(requested: allocinputs.Amount | None, cap: allocinputs.Capacity) -> allocinputs.Amount:
    """``calculateConsumedCapacity``: what one share takes of ``cap``."""
    if requested is None:
        return cap.default or cap.value
    if cap.min is not None:
        if requested.value < cap.min.value:
            return cap.min
        if cap.step is None:
            return requested
        # Quantity.Value(): whole units, rounded up
        low, step = _whole(cap.min.value), _whole(cap.step.value)
        steps = -(-(_whole(requested.value) - low) // step)  # ceiling, on ints
        value = decimal.Decimal(low + step * steps)
        return allocinputs.Amount(value, format_quantity(value))
    if cap.valid_values:
        for v in cap.valid_values:
            if requested.value <= v.value:
                return v
    return requested


def _violates(consumed: allocinputs.Amount, cap: allocinputs.Capacity) -> bool:
    if cap.default is not None and consumed.value == cap.default.value:
        return False
    if cap.min is not None:
        if cap.max is not None and consumed.value > cap.max.value:
            return True
        return (
            cap.step is not None
            and (_whole(consumed.value) - _whole(cap.min.value)) % _whole(cap.step.value) != 0
        )
    if cap.valid_values:
        return all(consumed.value != v.value for v in cap.valid_values)
    return False


Usage = dict[DeviceId, dict[str, decimal.Decimal]]


def _shares(
    device: allocinputs.Device, request: allocinputs.Request, used: Usage
) -> dict[str, allocinputs.Amount] | None:
    """The capacity one share of ``device`` takes for ``request``, or None when it does not fit."""
    if any(name not in device.capacity for name in request.capacity):
        return None
    taken = {}
    current = used.get(device.id, {})
    for name, cap in device.capacity.items():
        amount = _consumed(request.capacity.get(name), cap)
        if _violates(amount, cap) or current.get(name, decimal.Decimal(0)) + amount.value > cap.value.value:
            return None
        taken[name] = amount
    return taken


@dataclasses.dataclass
class _Matching:
    """A ``matchAttribute`` constraint during the search: the value its devices share."""

    constraint: allocinputs.MatchAttribute
    value: selector.Value | None = None
    count: int = 0

    def admits(self, device: allocinputs.Device) -> bool:
        try:
            value = selector.attribute(device.view, self.constraint.domain, self.constraint.name)
        except selector.SelectorError:
            return False  # a device without the attribute cannot satisfy it
        return self.count == 0 or value == self.value

    def add(self, device: allocinputs.Device) -> None:
        if self.count == 0:
            self.value = selector.attribute(device.view, self.constraint.domain, self.constraint.name)
        self.count += 1


@dataclasses.dataclass
class _Pick:
    request: allocinputs.Request
    device: allocinputs.Device
    consumed: dict[str, allocinputs.Amount] | None  # None: exclusive
    constrained: list[_Matching]  # the constraints this device counted in


@dataclasses.dataclass
class _Search:
    pools: list[list[allocinputs.Device]]
    claims: list[list[list[allocinputs.Request]]]
    used: Usage
    exclusive: set[DeviceId]
    picks: list[list[_Pick]]
    matching: list[list[_Matching]]

    def devices(self) -> list[allocinputs.Device]:
        return [d for pool in self.pools for d in pool]

    def selectable(self, device: allocinputs.Device, request: allocinputs.Request) -> bool:
        try:
            return all(selector.matches(t, device.view) for t in request.selectors)
        except selector.SelectorError as exc:
            raise AllocatorError(f"request {request.name}: CEL runtime error: {exc}") from None

    def take(self, claim_i: int, device: allocinputs.Device, request: allocinputs.Request) -> _Pick | None:
        if device.id in self.exclusive or _tainted(device, request):
            return None
        constrained = [m for m in self.matching[claim_i] if m.constraint.applies(request.name)]
        if not all(m.admits(device) for m in constrained):
            return None
        if device.view.allow_multiple:
            consumed = _shares(device, request, self.used)
            if consumed is None:
                return None
            usage = self.used.setdefault(device.id, {})
            for name, amount in consumed.items():
                usage[name] = usage.get(name, decimal.Decimal(0)) + amount.value
        else:
            if _shares(device, request, {}) is None:
                return None
            consumed = None
            self.exclusive.add(device.id)
        for m in constrained:
            m.add(device)
        pick = _Pick(request, device, consumed, constrained)
        self.picks[claim_i].append(pick)
        return pick

    def give_back(self, claim_i: int, pick: _Pick) -> None:
        self.picks[claim_i].pop()
        for m in pick.constrained:
            m.count -= 1
        if pick.consumed is None:
            self.exclusive.discard(pick.device.id)
            return
        usage = self.used[pick.device.id]
        for name, amount in pick.consumed.items():
            usage[name] -= amount.value

    def run(self, claim_i: int, req_i: int) -> bool:
        if claim_i == len(self.claims):
            return True
        if req_i == len(self.claims[claim_i]):
            return self.run(claim_i + 1, 0)
        return any(self.request(claim_i, req_i, alt) for alt in self.claims[claim_i][req_i])

    def request(self, claim_i: int, req_i: int, request: allocinputs.Request) -> bool:
        candidates = [d for d in self.devices() if self.selectable(d, request)]
        if request.all_devices:
            if not candidates:
                return False
            return self.fill(claim_i, req_i, request, candidates, start=0, left=len(candidates), strict=True)
        return self.fill(claim_i, req_i, request, candidates, start=0, left=request.count, strict=False)

    def fill(
        self,
        claim_i: int,
        req_i: int,
        request: allocinputs.Request,
        candidates: list[allocinputs.Device],
        *,
        start: int,
        left: int,
        strict: bool,
    ) -> bool:
        if left == 0:
            return self.run(claim_i, req_i + 1)
        for i in range(start, len(candidates)):
            pick = self.take(claim_i, candidates[i], request)
            if pick is None:
                if strict:
                    return False
                continue
            if self.fill(claim_i, req_i, request, candidates, start=i + 1, left=left - 1, strict=strict):
                return True
            self.give_back(claim_i, pick)
            if strict:
                return False
        return False


def _usage(allocated: Iterable[Mapping[str, Any]]) -> tuple[Usage, set[DeviceId]]:
    """What already allocated claims hold: shares' consumed capacity, and exclusive devices."""
    used: Usage = {}
    exclusive: set[DeviceId] = set()
    for claim in allocated:
        alloc = (claim.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or ():
            device_id = (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
            if r.get("shareID") is None:
                exclusive.add(device_id)
                continue
            usage = used.setdefault(device_id, {})
            for name, raw in (r.get("consumedCapacity") or {}).items():
                usage[name] = (
                    usage.get(name, decimal.Decimal(0))
                    + allocinputs.amount(raw, field="consumedCapacity").value
                )
    return used, exclusive


def allocate(
    claims: Sequence[Mapping[str, Any]],
    *,
    node: str,
    slices: Iterable[Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    allocated: Iterable[Mapping[str, Any]],
    new_share_id: Callable[[], str],
) -> list[JsonObj] | None:
    """The ``status.allocation`` of each of ``claims`` on ``node``, or None when they do not all
    fit there. ``allocated``: every claim whose allocation counts (in-flight ones included).
    ``AllocatorError`` for a claim or class that cannot be evaluated."""
    wanted = [allocinputs.claim_requests(c, classes) for c in claims]
    used, exclusive = _usage(allocated)
    matching = [[_Matching(c) for c in allocinputs.constraints(claim)] for claim in claims]
    search = _Search(allocinputs.pools(slices, node), wanted, used, exclusive, [[] for _ in claims], matching)
    if not search.run(0, 0):
        return None
    out = []
    for picks in search.picks:
        results: list[JsonObj] = []
        node_local = False
        for pick in picks:
            driver, pool, device = pick.device.id
            result: JsonObj = {"request": pick.request.name, "driver": driver, "pool": pool, "device": device}
            if pick.request.tolerations:
                result["tolerations"] = [dict(t) for t in pick.request.tolerations]
            if pick.consumed is not None:
                result["shareID"] = new_share_id()
                if pick.consumed:
                    result["consumedCapacity"] = {
                        name: quantity.canonical(a.text) for name, a in pick.consumed.items()
                    }
            node_local = node_local or pick.device.node_local
            results.append(result)
        allocation: JsonObj = {"devices": {"results": results}}
        if node_local:
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        out.append(allocation)
    return out
