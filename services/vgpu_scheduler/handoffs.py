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
only one ``allocating`` on its node. A pod ``allocating`` for a long time (kubelet down, a slow
admission) still holds the node: its Allocate may yet come, and then its plugin must find it and
no other. A lock annotation already on the node makes the bind take the lock. The annotation is
what guards against a second scheduler binding to the same node, so this mode assumes one active
scheduler (kube-scheduler's leader election).

Which pod a device plugin finds without a lock: kube-vgpu's takes the one pod ``allocating`` on
its node, so this mode is for kube-vgpu's device plugin (the scheduler offers only nodes whose
device plugin renews kube-vgpu's Lease). HAMi's plugins cannot follow this mode: the v2.x search
(docs/protocol.md#allocate) also takes a pod past Allocate whose containers have not started (bind phase
``success``), first in LIST order, and the newest serves only the pod a lock names (HAMi issue
#3076). docs/scheduler.md has the measurements.

Times are Unix seconds (wall clock, like the ``bind-time`` annotation); the caller passes now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from vgpu.core import annotations as hami
from vgpu.kube.port import JsonObj

_V = TypeVar("_V")

_DONE_PHASES = ("Running", "Succeeded", "Failed")


@dataclass
class Handoffs:
    """Pods ``allocating`` per node (from the pod watch), and this process's own claims."""

    keys: hami.Keys
    # node -> uid -> bind time (Unix s; 0 when the annotation does not parse: taken as the oldest)
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
        on_node = not deleted and bool(node) and phase not in _DONE_PHASES
        bind_phase = notes.get(self.keys.bind_phase)
        allocating = on_node and bind_phase == hami.BindPhase.ALLOCATING.value
        changed = _place(
            self._allocating,
            self._node_of,
            uid,
            node if allocating else None,
            lambda: _bind_time(notes.get(self.keys.bind_time)),
        )
        claim = self._claims.get(node) if node else None
        if claim is not None and claim[0] == uid:  # the watch has caught up with its Binding
            del self._claims[node]
            changed.append(node)
        return changed

    def others(self, node: str, uid: str, *, now: float, claim_timeout_s: float) -> list[str]:
        """Pods other than ``uid`` being handed over on ``node``, oldest first, as uids: every pod
        still ``allocating`` there, however long it has waited (its Allocate may yet come, and its
        device plugin must then still find it: no other pod may be handed over beside it), and a
        claim made within ``claim_timeout_s`` (an older one is a leftover: ignored)."""
        waiting: list[tuple[float, str]] = []
        claim = self._claims.get(node)
        if claim is not None and claim[0] != uid and now - claim[1] <= claim_timeout_s:
            waiting.append((claim[1], claim[0]))
        waiting.extend(
            (since, other) for other, since in (self._allocating.get(node) or {}).items() if other != uid
        )
        return [u for _, u in sorted(waiting)]

    def claim(self, node: str, uid: str, *, now: float) -> None:
        self._claims[node] = (uid, now)

    def release(self, node: str, uid: str) -> None:
        """Drop ``uid``'s claim on ``node`` (its bind failed)."""
        if self._claims.get(node, ("", 0.0))[0] == uid:
            del self._claims[node]

    def nodes(self) -> set[str]:
        """Nodes with a hand-off under way (the filter treats them as busy)."""
        return set(self._allocating).union(self._claims)


def _place(
    by_node: dict[str, dict[str, _V]],
    node_of: dict[str, str],
    uid: str,
    node: str | None,
    value: Callable[[], _V],
) -> list[str]:
    """File ``uid`` under ``node`` in ``by_node`` (``None``: under no node), with ``value()`` when
    it joins; returns the nodes it left or joined."""
    changed: list[str] = []
    old = node_of.get(uid)
    if old is not None and old != node:
        del node_of[uid]
        entries = by_node[old]
        del entries[uid]
        if not entries:
            del by_node[old]
        changed.append(old)
    if node is not None and old != node:
        node_of[uid] = node
        by_node.setdefault(node, {})[uid] = value()
        changed.append(node)
    return changed


def _bind_time(raw: str | None) -> float:
    try:
        return float(raw or "")
    except ValueError:
        return 0.0
