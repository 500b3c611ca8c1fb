"""The scheduler's listener limits: connections per listener and body caps per path.

Body caps follow what may legitimately arrive: an AdmissionReview holds an object the API server
accepted (at most its 3 MiB request limit; an UPDATE carries the old object too) plus the
envelope; ExtenderBindingArgs is four short strings; ExtenderArgs is the pod plus, per candidate
node (``--extender-max-nodes``), its name when the extender entry is ``nodeCacheCapable`` (as the
chart configures it) or its whole Node object otherwise (``--extender-node-objects``). A cap sized
for Node objects in either mode (83 MiB at 5,000 nodes) let a 60 MiB body be read and parsed for
4.4 s at 1.6 GB before it was found not to be ExtenderArgs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vgpu_scheduler import listener

API_OBJECT_MAX_BYTES = 3 << 20  # the API server refuses larger requests (--max-request-bytes)
# an AdmissionReview: the object (and, for an UPDATE, the old one) plus the envelope
WEBHOOK_MAX_BODY_BYTES = 2 * API_OBJECT_MAX_BYTES + (1 << 20)
BIND_MAX_BODY_BYTES = 64 << 10  # ExtenderBindingArgs: four short strings
NODE_MAX_BYTES = 16 << 10  # one Node object in Nodes mode
NODE_NAME_MAX_BYTES = 256  # one name in NodeNames mode: at most 253 characters, its quotes, a comma
DEFAULT_MAX_NODES = 5000
DEFAULT_EXTENDER_PORT = 8888


def filter_max_body_bytes(max_nodes: int, *, node_objects: bool = False) -> int:
    """ExtenderArgs for ``max_nodes`` candidate nodes: the pod plus a name per node, or a Node
    object per node with ``node_objects`` (an extender entry without ``nodeCacheCapable``)."""
    return API_OBJECT_MAX_BYTES + max_nodes * (NODE_MAX_BYTES if node_objects else NODE_NAME_MAX_BYTES)


def preempt_max_body_bytes(max_nodes: int) -> int:
    """ExtenderPreemptionArgs: the pod plus the victims of each candidate node (their UIDs with
    ``nodeCacheCapable``, whole pods otherwise); sized as a Node object per node in either mode."""
    return API_OBJECT_MAX_BYTES + max_nodes * NODE_MAX_BYTES


@dataclass(frozen=True)
class ListenerLimits:
    """The limits of both listeners (``listener.Limits``), and the extender's per-path body caps
    (``/bind``'s is ``BIND_MAX_BODY_BYTES``; the extender listener's own cap is ``/preempt``'s)."""

    service: listener.Limits = field(
        default_factory=lambda: listener.Limits(max_body_bytes=WEBHOOK_MAX_BODY_BYTES)
    )
    extender: listener.Limits = field(
        default_factory=lambda: listener.Limits(max_body_bytes=preempt_max_body_bytes(DEFAULT_MAX_NODES))
    )
    filter_max_body_bytes: int = filter_max_body_bytes(DEFAULT_MAX_NODES)

    @classmethod
    def build(cls, *, max_connections: int, max_nodes: int, node_objects: bool = False) -> ListenerLimits:
        return cls(
            service=listener.Limits(max_connections=max_connections, max_body_bytes=WEBHOOK_MAX_BODY_BYTES),
            extender=listener.Limits(
                max_connections=max_connections, max_body_bytes=preempt_max_body_bytes(max_nodes)
            ),
            filter_max_body_bytes=filter_max_body_bytes(max_nodes, node_objects=node_objects),
        )
