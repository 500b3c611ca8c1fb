"""``Liveness``: whether each node's device plugin is reporting, from its Lease.

The device plugin renews a Lease named ``vgpu-device-plugin-<node>`` (``vgpu.core.lease``) in the
scheduler's lease namespace. A node whose Lease is missing, unreadable, or older than
``scheduler.leaseTimeoutS`` is not trusted: its GPUs are not offered to pods. The filter's hot path
(``NodeInventory.live_views``) reads ``renew_s`` and ``timeout_s`` directly; everything else asks
``live``.

Times are Unix seconds; the caller passes now.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from vgpu.core import lease
from vgpu.kube.port import JsonObj

log = logging.getLogger(__name__)


@dataclass
class Liveness:
    """The last renewal of each node's device plugin Lease, and how old one may be."""

    timeout_s: float
    renew_s: dict[str, float] = field(default_factory=dict)  # node -> renewTime (Unix s)

    def lease(self, obj: JsonObj, *, deleted: bool, now: float) -> str | None:
        """Follow one Lease event; Leases not named ``vgpu-device-plugin-<node>`` are ignored.
        Returns the node whose device plugin this event made live again (reporting after it was
        not), else None."""
        meta = obj.get("metadata")
        name = str(meta.get("name", "")) if isinstance(meta, Mapping) else ""
        node = lease.node_of(name)
        if node is None:
            return None
        was_live = self.live(node, now)
        renew = (obj.get("spec") or {}).get("renewTime") or (obj.get("spec") or {}).get("acquireTime")
        if deleted or not isinstance(renew, str):
            self.renew_s.pop(node, None)
            return None
        try:
            self.renew_s[node] = lease.parse_micro_time(renew).timestamp()
        except ValueError:
            log.warning("lease %s has an unreadable renewTime %r", name, renew)
            self.renew_s.pop(node, None)
            return None
        return node if not was_live and self.live(node, now) else None

    def live(self, node: str, now: float) -> bool:
        """The device plugin of ``node`` renewed its Lease within ``timeout_s`` (the rule that
        ``NodeInventory.live_views`` repeats inline on the filter's serial path)."""
        renew = self.renew_s.get(node)
        return renew is not None and now - renew <= self.timeout_s

    def problem(self, node: str, now: float) -> str | None:
        """Why the device plugin of ``node`` is not trusted now (its Lease), or None."""
        if self.live(node, now):
            return None
        renew = self.renew_s.get(node)
        if renew is None:
            return "device plugin not reporting (no lease)"
        return f"device plugin not reporting for {int(now - renew)} s"
