"""Which of HAMi-core's per-container directories (``<hook>/vgpu/containers/<pod UID>_<container>``,
made by Allocate and mounted into the container) have outlived their pod.

HAMi-core keeps a container's shared usage region there; nothing else removes it, so a node that
runs many short GPU pods would fill up with them. A directory is stale when its pod is no longer on
the node and it is older than a grace that covers the gap between Allocate (the pod exists) and the
pod watch delivering that pod. Names that are not ``<uid>_<container>`` are never touched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable


@dataclasses.dataclass(frozen=True)
class CacheDir:
    """One entry of the containers directory: its name and its age in seconds."""

    name: str
    age_s: float


def pod_uid_of(name: str) -> str | None:
    """The pod UID a ``<uid>_<container>`` directory name starts with, or None for any other name."""
    uid, sep, container = name.partition("_")
    if not sep or not uid or not container or uid.startswith("."):
        return None
    return uid


def stale(entries: Iterable[CacheDir], *, live_pod_uids: Collection[str], grace_s: float) -> list[str]:
    """The names to remove: a pod UID not among ``live_pod_uids`` and older than ``grace_s``."""
    out = []
    for entry in entries:
        uid = pod_uid_of(entry.name)
        if uid is not None and uid not in live_pod_uids and entry.age_s >= grace_s:
            out.append(entry.name)
    return sorted(out)
