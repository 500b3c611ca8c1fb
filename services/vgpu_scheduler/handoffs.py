"""``Handoffs``: per node, the GPU pods between their Binding and their device plugin's Allocate.

The device plugin's Allocate request names no pod: kubelet sends only device IDs, so the plugin
must work out which pod it is serving. HAMi's answer is the node lock (``hami.io/mutex.lock``):
the scheduler writes it before the Binding, the plugin reads the holder and deletes the lock
after Allocate, so one pod per node is handed over at a time. That costs two node writes per GPU
pod (and two node watch events to every node watcher), on every pod, also when nothing else is
happening on the node.

With ``scheduler.nodeLock: contended`` the scheduler keeps the same one-at-a-time rule in memory
instead: it binds without the annotation when it knows that no other pod on the node is being
handed over (bind phase ``allocating``, not yet running), and claims the node in process until the
pod's Binding comes back through the watch. kube-vgpu's device plugin then finds the pod as the
only one ``allocating`` on its node. Anything less clear (another pod allocating for longer than
``nodeLockTimeoutS``, a lock annotation already on the node) falls back to the lock. The
annotation is what guards against a second scheduler binding to the same node, so this mode
assumes one active scheduler (kube-scheduler's leader election) and kube-vgpu's device plugin,
which is the only kind the scheduler places pods beside (it offers a node only while that plugin
renews its Lease). HAMi's v2.x plugin would need ``always``: its lock-less search also takes pods
already ``success`` but not yet running.

Times are Unix seconds (wall clock, like the ``bind-time`` annotation); the caller passes now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vgpu.core import annotations as hami
from vgpu.kube.port import JsonObj

_DONE_PHASES = ("Running", "Succeeded", "Failed")


@dataclass
class Handoffs:
    """Pods ``allocating`` per node (from the pod watch) and this process's own claims."""

    keys: hami.Keys
    # node -> uid -> bind time (Unix s; 0 when the annotation does not parse: oldest, so stale)
    _allocating: dict[str, dict[str, float]] = field(default_factory=dict)
    _node_of: dict[str, str] = field(default_factory=dict)  # uid -> node, for the entries above
    # node -> (uid, since): a lock-less bind under way, until its Binding shows in the watch
    _claims: dict[str, tuple[str, float]] = field(default_factory=dict)

    def pod(self, obj: JsonObj, *, deleted: bool) -> Iterable[str]:
        """Follow one pod event; returns the nodes whose hand-off state changed."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        notes = meta.get("annotations") or {}
        phase = (obj.get("status") or {}).get("phase")
        allocating = (
            not deleted
            and bool(node)
            and notes.get(self.keys.bind_phase) == hami.BindPhase.ALLOCATING.value
            and phase not in _DONE_PHASES
        )
        changed: list[str] = []
        old = self._node_of.get(uid)
        if old is not None and (not allocating or old != node):
            del self._node_of[uid]
            entries = self._allocating[old]
            del entries[uid]
            if not entries:
                del self._allocating[old]
            changed.append(old)
        if allocating and old != node:
            self._node_of[uid] = node
            self._allocating.setdefault(node, {})[uid] = _bind_time(notes.get(self.keys.bind_time))
            changed.append(node)
        claim = self._claims.get(node) if node else None
        if claim is not None and claim[0] == uid:  # the watch has caught up with its Binding
            del self._claims[node]
            changed.append(node)
        return changed

    def others(self, node: str, uid: str, *, now: float, timeout_s: float) -> tuple[list[str], bool]:
        """Pods other than ``uid`` being handed over on ``node``: (those still within
        ``timeout_s``, oldest first, as uids; whether any older one is left over)."""
        fresh: list[tuple[float, str]] = []
        stale = False
        claim = self._claims.get(node)
        if claim is not None and claim[0] != uid:
            if now - claim[1] <= timeout_s:
                fresh.append((claim[1], claim[0]))
            else:
                stale = True
        for other, since in (self._allocating.get(node) or {}).items():
            if other == uid:
                continue
            if now - since <= timeout_s:
                fresh.append((since, other))
            else:
                stale = True
        return [u for _, u in sorted(fresh)], stale

    def claim(self, node: str, uid: str, *, now: float) -> None:
        self._claims[node] = (uid, now)

    def release(self, node: str, uid: str) -> None:
        """Drop ``uid``'s claim on ``node`` (its bind failed)."""
        if self._claims.get(node, ("", 0.0))[0] == uid:
            del self._claims[node]

    def nodes(self) -> set[str]:
        """Nodes with a hand-off under way (the filter treats them as busy)."""
        return set(self._allocating).union(self._claims)


def _bind_time(raw: str | None) -> float:
    try:
        return float(raw or "")
    except ValueError:
        return 0.0
