"""``Liveness``: whether each node's device plugin is reporting, from its Lease.

The device plugin renews a Lease named ``vgpu-device-plugin-<node>`` (``vgpu.core.lease``) in the
scheduler's lease namespace. A node whose Lease is missing, unreadable, or older than
``scheduler.leaseTimeoutS`` is not trusted: its GPUs are not offered to pods. The filter's hot path
(``ClusterState.live_views``) reads ``renew_s`` and ``timeout_s`` directly; everything else asks
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

    @staticmethod
    def node_of(obj: JsonObj) -> str | None:
        """The node whose device plugin renews Lease ``obj``, or None (not one of theirs)."""
        meta = obj.get("metadata")
        return lease.node_of(str(meta.get("name", "")) if isinstance(meta, Mapping) else "")

    def lease(self, obj: JsonObj, *, deleted: bool) -> None:
        """Follow one Lease event; Leases not named ``vgpu-device-plugin-<node>`` are ignored."""
        node = self.node_of(obj)
        if node is None:
            return
        name = obj["metadata"]["name"]
        renew = (obj.get("spec") or {}).get("renewTime") or (obj.get("spec") or {}).get("acquireTime")
        if deleted or not isinstance(renew, str):
            self.renew_s.pop(node, None)
            return
        try:
            self.renew_s[node] = lease.parse_micro_time(renew).timestamp()
        except ValueError:
            log.warning("lease %s has an unreadable renewTime %r", name, renew)
            self.renew_s.pop(node, None)

    def live(self, node: str, now: float) -> bool:
        """The device plugin of ``node`` renewed its Lease within ``timeout_s`` (the rule that
        ``ClusterState.live_views`` repeats inline on the filter's serial path)."""
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
