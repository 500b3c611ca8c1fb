"""What a ResourceClaim's ``status.allocation`` says about kube-vgpu's GPUs.

kube-scheduler's DRA plugin writes one result per allocated device (``status.allocation.devices.
results``): the request it satisfies, the driver, the pool (for us, the node's name), the device
(``gpu-<index>``), and, for a device with ``allowMultipleAllocations``, the ``consumedCapacity``
and a ``shareID``. A capacity the result does not name was consumed at its request policy's default
(or whole), which :func:`shares` resolves against the device's published capacity when given."""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Mapping
from typing import Any

from vgpu.core import errors, quantity
from vgpu.core.dra import names
from vgpu.core.errors import VgpuError


class AllocationError(VgpuError):
    """A claim's allocation that cannot be read (wrong types, a bad quantity)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeviceShare:
    """One allocated share of one of our GPUs."""

    request: str
    pool: str
    device: str
    memory_mib: int | None
    """Consumed memory in MiB; ``None`` when the result does not say (defaulted: see module doc)."""
    cores_percent: int | None
    share_id: str | None


def memory_mib(value: object, *, field: str) -> int:
    """A DRA memory quantity in whole MiB, rounded down. DRA capacities are in bytes (``4Gi``,
    ``4G``, ``4294967296``), unlike HAMi's ``nvidia.com/gpumem`` where a plain number is MiB
    (``quantity.parse_mib``). Raises ``QuantityError`` (a negative amount included)."""
    amount = quantity.parse(value, field=field)
    if amount < 0:
        raise errors.QuantityError(field, f"invalid memory {value!r}: negative")
    return int((amount / quantity.MIB).to_integral_value(rounding=decimal.ROUND_FLOOR))


def _mib(value: object, *, field: str) -> int:
    try:
        return memory_mib(value, field=field)
    except VgpuError as exc:
        raise AllocationError(str(exc)) from exc


def _cores(value: object, *, field: str) -> int:
    try:
        return quantity.parse_int(value, field=field)
    except VgpuError as exc:
        raise AllocationError(str(exc)) from exc


def results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The allocation results of ``claim`` (any driver); ``[]`` while it is unallocated."""
    status = claim.get("status")
    if status is None:
        return []
    if not isinstance(status, Mapping):
        raise AllocationError("status is not an object")
    alloc = status.get("allocation")
    if alloc is None:
        return []
    if not isinstance(alloc, Mapping):
        raise AllocationError("status.allocation is not an object")
    devices = alloc.get("devices") or {}
    if not isinstance(devices, Mapping):
        raise AllocationError("status.allocation.devices is not an object")
    found = devices.get("results") or []
    if not isinstance(found, list) or not all(isinstance(r, Mapping) for r in found):
        raise AllocationError("status.allocation.devices.results is not a list of objects")
    return list(found)


def shares(claim: Mapping[str, Any]) -> list[DeviceShare]:
    """The results of ``claim`` that name :data:`names.DRIVER`, as :class:`DeviceShare` values."""
    out: list[DeviceShare] = []
    for i, result in enumerate(results(claim)):
        if result.get("driver") != names.DRIVER:
            continue
        where = f"status.allocation.devices.results[{i}]"
        fields = {k: result.get(k) for k in ("request", "pool", "device")}
        for key, value in fields.items():
            if not isinstance(value, str) or not value:
                raise AllocationError(f"{where}.{key} is not a non-empty string")
        consumed = result.get("consumedCapacity")
        consumed = {} if consumed is None else consumed
        if not isinstance(consumed, Mapping):
            raise AllocationError(f"{where}.consumedCapacity is not an object")
        memory = consumed.get(names.CAPACITY_MEMORY)
        cores = consumed.get(names.CAPACITY_CORES)
        share_id = result.get("shareID")
        if share_id is not None and not isinstance(share_id, str):
            raise AllocationError(f"{where}.shareID is not a string")
        out.append(
            DeviceShare(
                request=str(fields["request"]),
                pool=str(fields["pool"]),
                device=str(fields["device"]),
                memory_mib=None if memory is None else _mib(memory, field=f"{where}.consumedCapacity.memory"),
                cores_percent=None
                if cores is None
                else _cores(cores, field=f"{where}.consumedCapacity.cores"),
                share_id=share_id,
            )
        )
    return out


def reserved_for(claim: Mapping[str, Any]) -> list[str]:
    """UIDs of the pods ``status.reservedFor`` names (kube-scheduler reserves a claim for its pod)."""
    status = claim.get("status") or {}
    entries = status.get("reservedFor") or [] if isinstance(status, Mapping) else []
    if not isinstance(entries, list):
        raise AllocationError("status.reservedFor is not a list")
    return [str(e["uid"]) for e in entries if isinstance(e, Mapping) and isinstance(e.get("uid"), str)]
