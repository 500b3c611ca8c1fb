"""The scheduler's listener limits: connections per listener and body caps per path.

Body caps follow what may legitimately arrive: an AdmissionReview holds an object the API server
accepted (at most its 3 MiB request limit; an UPDATE carries the old object too) plus the
envelope; ExtenderBindingArgs is four short strings; ExtenderArgs is the pod plus, in ``Nodes`` mode,
a Node object per candidate node (``--extender-max-nodes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vgpu_scheduler import listener

API_OBJECT_MAX_BYTES = 3 << 20  # the API server refuses larger requests (--max-request-bytes)
# an AdmissionReview: the object (and, for an UPDATE, the old one) plus the envelope
WEBHOOK_MAX_BODY_BYTES = 2 * API_OBJECT_MAX_BYTES + (1 << 20)
BIND_MAX_BODY_BYTES = 64 << 10  # ExtenderBindingArgs: four short strings
NODE_MAX_BYTES = 16 << 10  # one Node object in Nodes mode (a name in NodeNames mode)
DEFAULT_MAX_NODES = 5000
DEFAULT_EXTENDER_PORT = 8888


def filter_max_body_bytes(max_nodes: int) -> int:
    """ExtenderArgs for ``max_nodes`` candidate nodes: the pod plus a Node object per node."""
    return API_OBJECT_MAX_BYTES + max_nodes * NODE_MAX_BYTES


@dataclass(frozen=True)
class ListenerLimits:
    """The limits of both listeners (``listener.Limits``), and the extender's node count."""

    service: listener.Limits = field(
        default_factory=lambda: listener.Limits(max_body_bytes=WEBHOOK_MAX_BODY_BYTES)
    )
    extender: listener.Limits = field(
        default_factory=lambda: listener.Limits(max_body_bytes=filter_max_body_bytes(DEFAULT_MAX_NODES))
    )

    @classmethod
    def build(cls, *, max_connections: int, max_nodes: int) -> ListenerLimits:
        return cls(
            service=listener.Limits(max_connections=max_connections, max_body_bytes=WEBHOOK_MAX_BODY_BYTES),
            extender=listener.Limits(
                max_connections=max_connections, max_body_bytes=filter_max_body_bytes(max_nodes)
            ),
        )
