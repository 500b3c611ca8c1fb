"""What the DRA kubelet plugin tells kubelet about its devices' health (KEP-4680, kubelet's
``ResourceHealthStatus``: ``v1alpha1.DRAResourceHealth/NodeWatchResources``, docs/protocol.md).

kubelet keeps one stream open per registered plugin and writes what it hears into the pod status
(``containerStatuses[].allocatedResourcesStatus``) of every pod whose claim holds the device. A
device it has heard nothing about for its ``health_check_timeout_seconds`` reads ``Unknown``.

:func:`device_states` is every GPU of the node's ResourceSlice (pool = the node, device names as
:func:`slices.build` publishes them, the same GPUs left out) with the health the device plugin's
watcher tracks (the source that taints an unhealthy GPU in the slice) and, for an unhealthy one,
the reason (``XID 79 critical error``, ``lost: ...``, HAMi-core's files missing). A GPU the server
would drop from the slice for being unhealthy (no device taints) is still reported: claims
allocated before keep it.

:class:`HealthStream` is one stream's memory: the first message carries every device, later ones
the devices whose health or message changed (a device gone from the slice as ``UNKNOWN``), and
every :data:`REFRESH_S` the whole list again, so kubelet's :data:`TIMEOUT_S` never runs out while
the plugin lives.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Final

from vgpu.core.device import GpuUuid, NodeInventory
from vgpu.core.dra import names, slices

TIMEOUT_S: Final = 60
"""``health_check_timeout_seconds`` sent with every device: kubelet reads a device ``Unknown`` once
this long passed without a message about it (its default, when none is sent, is 30 s)."""

REFRESH_S: Final = 20.0
"""Every device is sent again at least this often: three refreshes fit in :data:`TIMEOUT_S`, so a
late one (a busy node) does not make kubelet report ``Unknown``."""

MESSAGE_MAX: Final = 1024
"""kubelet's ``ResourceHealthMessageMaxLength``: a longer message is cut to 1021 characters + ``...``."""

GONE_MESSAGE: Final = "no longer published in the node's ResourceSlice"

Key = tuple[str, str]
"""(pool, device): how kubelet matches a report to a claim's allocation result."""


class Health(enum.IntEnum):
    """The wire's ``HealthStatus`` values."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclasses.dataclass(frozen=True)
class DeviceHealth:
    pool: str
    device: str
    health: Health
    message: str = ""

    @property
    def key(self) -> Key:
        return (self.pool, self.device)


def truncate(message: str) -> str:
    """``message`` as kubelet would store it (at most :data:`MESSAGE_MAX` characters)."""
    return message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 3] + "..."


def device_states(inventory: NodeInventory, *, reasons: Mapping[GpuUuid, str]) -> dict[Key, DeviceHealth]:
    """Every device of ``inventory``'s slice with its health; ``reasons``: GPU UUID -> why it is
    unhealthy (a GPU unhealthy without one says ``unhealthy``)."""
    built = slices.build(inventory, driver_version=None, taints=True)
    gpus = {(g.index, g.uuid): g for g in inventory.gpus}
    pool = str(inventory.node)
    out: dict[Key, DeviceHealth] = {}
    for entry in built.body["spec"].get("devices") or ():
        attrs = entry["attributes"]
        uuid = GpuUuid(attrs[names.ATTR_UUID]["string"])
        gpu = gpus[(attrs[names.ATTR_INDEX]["int"], uuid)]
        if gpu.health:
            state = DeviceHealth(pool, entry["name"], Health.HEALTHY)
        else:
            reason = reasons.get(uuid) or "unhealthy"
            state = DeviceHealth(pool, entry["name"], Health.UNHEALTHY, truncate(reason))
        out[state.key] = state
    return out


def changes(sent: Mapping[Key, DeviceHealth], current: Mapping[Key, DeviceHealth]) -> list[DeviceHealth]:
    """The devices whose health or message differs from what was ``sent``, new ones included, and
    those sent before but no longer current, as ``UNKNOWN``; in (pool, device) order."""
    out = [state for key, state in current.items() if sent.get(key) != state]
    out += [
        DeviceHealth(old.pool, old.device, Health.UNKNOWN, GONE_MESSAGE)
        for key, old in sent.items()
        if key not in current and old.health != Health.UNKNOWN
    ]
    return sorted(out, key=lambda s: s.key)


class HealthStream:
    """One kubelet stream: what it was told, and when the whole list is due again.

    ``now`` is any monotonic clock in seconds; the first :meth:`batch` is always the whole list."""

    def __init__(self, *, refresh_s: float = REFRESH_S) -> None:
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be positive, got {refresh_s}")
        self._refresh_s = refresh_s
        self._sent: dict[Key, DeviceHealth] = {}
        self._full_at: float | None = None  # when the last whole list went

    def batch(self, current: Mapping[Key, DeviceHealth], *, now: float) -> list[DeviceHealth]:
        """What to send now (possibly nothing), and remember it as sent."""
        if self._full_at is None or now - self._full_at >= self._refresh_s:
            out = changes(self._sent, current)
            gone = [s for s in out if s.key not in current]
            out = sorted([*current.values(), *gone], key=lambda s: s.key)
            self._full_at = now
        else:
            out = changes(self._sent, current)
        self._sent = dict(current)
        return out

    def wait_s(self, *, now: float) -> float:
        """Seconds until the whole list is due again (0 when it is due, or nothing went yet)."""
        if self._full_at is None:
            return 0.0
        return max(0.0, self._full_at + self._refresh_s - now)
