"""kubelet device manager bookkeeping: which device IDs a container gets, and which are in use.

``DeviceBook`` holds, per resource, the healthy and unhealthy sets the plugin last reported and
the IDs held by each pod (by UID), and each device's NUMA nodes (ListAndWatch's ``topology``).
Device choice follows kubelet's ``devicesToAllocate`` (docs/protocol.md#how-kubelet-uses-them): devices reused from the
pod's init containers first, then ``GetPreferredAllocation``'s answer ∩ available (when the plugin
offers it), then the rest of the available devices in sorted order. With a TopologyManager hint
(``filter_by_affinity``) the available devices split into aligned (on a NUMA node of the hint),
unaligned and no-affinity ones: when more aligned devices are left than still needed, the plugin
is offered only the aligned ones and kubelet falls back to them; else every aligned one is taken,
then the plugin's preference, then the rest. Pure: the preferred answer is passed in by the caller.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vgpu.core import errors

HEALTHY = "Healthy"


class DeviceUnavailable(errors.AllocationError):
    """kubelet could not find enough devices; the message is kubelet's."""


@dataclass
class ResourceDevices:
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)

    @property
    def capacity(self) -> int:
        return len(self.healthy | self.unhealthy)

    @property
    def allocatable(self) -> int:
        return len(self.healthy)


class DeviceBook:
    """Per resource: reported devices, and devices held per pod UID."""

    def __init__(self) -> None:
        self.resources: dict[str, ResourceDevices] = {}
        self._held: dict[str, dict[str, set[str]]] = collections.defaultdict(dict)  # uid → res → ids
        self._owner: dict[str, dict[str, str]] = collections.defaultdict(dict)  # res → id → uid
        self.numa: dict[str, dict[str, frozenset[int]]] = {}  # res → id → NUMA nodes (when sent)

    def report(
        self,
        resource: str,
        devices: Iterable[tuple[str, str]],
        *,
        numa: Mapping[str, frozenset[int]] | None = None,
    ) -> ResourceDevices:
        """A ListAndWatch message: ``(id, health)`` pairs replace the resource's device set;
        ``numa``: the NUMA nodes of the devices that carry a topology."""
        state = ResourceDevices()
        for device_id, health in devices:
            (state.healthy if health == HEALTHY else state.unhealthy).add(device_id)
        self.resources[resource] = state
        self.numa[resource] = dict(numa or {})
        return state

    def mark_unhealthy(self, resource: str) -> ResourceDevices:
        """The plugin's stream ended: every device of the resource becomes unhealthy."""
        state = self.resources.setdefault(resource, ResourceDevices())
        state.unhealthy |= state.healthy
        state.healthy = set()
        return state

    def forget_devices(self, resource: str) -> ResourceDevices:
        """A kubelet restart: the resource is known but has no devices until the plugin registers."""
        self.resources[resource] = ResourceDevices()
        return self.resources[resource]

    def in_use(self, resource: str) -> set[str]:
        return set(self._owner.get(resource, ()))

    def hold(self, uid: str, resource: str, ids: Iterable[str]) -> None:
        ids = list(ids)
        self._held[uid].setdefault(resource, set()).update(ids)
        owners = self._owner[resource]
        for device_id in ids:
            owners[device_id] = uid

    def release(self, uid: str) -> bool:
        """Free every device the pod holds; True if it held any."""
        held = self._held.pop(uid, None)
        if held is None:
            return False
        for resource, ids in held.items():
            owners = self._owner[resource]
            for device_id in ids:
                if owners.get(device_id) == uid:
                    del owners[device_id]
        return True

    def holds(self, uid: str) -> bool:
        return uid in self._held

    def available(self, resource: str) -> list[str]:
        """Healthy devices no pod holds, sorted."""
        state = self.resources.get(resource, ResourceDevices())
        owners = self._owner.get(resource, {})
        return sorted(d for d in state.healthy if d not in owners)


def filter_by_affinity(
    available: Sequence[str], *, numa_of: Mapping[str, frozenset[int]], hint: frozenset[int] | None
) -> tuple[list[str], list[str], list[str]]:
    """kubelet's ``filterByAffinity``: (aligned, unaligned, no-affinity), each sorted. Without a
    hint, or when no device of the resource has a topology, every device is no-affinity."""
    if hint is None or not numa_of:
        return [], [], sorted(available)
    aligned, unaligned, none = [], [], []
    for device_id in sorted(available):
        nodes = numa_of.get(device_id)
        if not nodes:
            none.append(device_id)
        elif nodes & hint:
            aligned.append(device_id)
        else:
            unaligned.append(device_id)
    return aligned, unaligned, none


def take_reusable(needed: int, reusable: Iterable[str]) -> list[str]:
    """kubelet's first step: up to ``needed`` devices from the pod's init containers. kubelet
    takes them in Go's map order, unpredictable when fewer are needed than the pool holds (the
    scheduler places no such pod, ``vgpu.core.reuse``); here sorted, to be reproducible."""
    return sorted(reusable)[:needed]


def check_available(resource: str, *, required: int, still_needed: int, available: Sequence[str]) -> None:
    if len(available) < still_needed:
        raise DeviceUnavailable(
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {required}, Available: {len(available)}"
        )


def fill(
    allocated: Sequence[str], *, required: int, preferred: Sequence[str], available: Sequence[str]
) -> list[str]:
    """Complete ``allocated`` to ``required`` IDs: preferred ∩ available first, then the rest."""
    chosen = list(allocated)
    allowed = set(available)
    for device_id in [*preferred, *available]:
        if len(chosen) >= required:
            break
        if device_id in allowed and device_id not in chosen:
            chosen.append(device_id)
    if len(chosen) < required:
        raise DeviceUnavailable(
            f"unexpectedly allocated less resources than required. Requested: {required}, Got: {len(chosen)}"
        )
    return chosen
