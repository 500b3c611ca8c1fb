"""The node lock (docs/protocol.md#node-lock): ``hami.io/mutex.lock``, held on a node while one pod is bound to it.

The value is ``<RFC3339>,<namespace>,<pod>``; HAMi's legacy value is the bare time.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from vgpu.core import errors, goscalars


@dataclass(frozen=True)
class NodeLock:
    """``<RFC3339>,<namespace>,<pod>``; the legacy value is the bare time (namespace/pod empty)."""

    time: datetime.datetime
    namespace: str = ""
    pod: str = ""

    @property
    def legacy(self) -> bool:
        return not self.pod

    def held_by(self, namespace: str, pod: str) -> bool:
        return self.namespace == namespace and self.pod == pod


def encode_node_lock(lock: NodeLock) -> str:
    if lock.legacy:
        return goscalars.format_rfc3339(lock.time)
    return f"{goscalars.format_rfc3339(lock.time)},{lock.namespace},{lock.pod}"


def decode_node_lock(raw: str, *, field: str = "hami.io/mutex.lock") -> NodeLock:
    if "," not in raw:
        return NodeLock(goscalars.parse_rfc3339(raw.strip(), field))
    parts = raw.split(",")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise errors.AnnotationError(field, f"malformed lock annotation {raw!r}")
    return NodeLock(goscalars.parse_rfc3339(parts[0], field), parts[1], parts[2])
