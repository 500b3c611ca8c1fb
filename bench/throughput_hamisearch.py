"""``HamiSearchAllocator``: the throughput bench's device plugin finding its pod the way HAMi's does.

With ``--plugin-search hami`` each emulated node's Allocate (``throughput_nodes.NodeSide``) runs
our allocator with HAMi's v2.x pod search instead of ours (docs/protocol.md#allocate, step 1):
whether a node lock mode leaves that search a single right answer. ``hamis_first_pending`` is its
lock-less pick, a pure function of the node's pods as listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vgpu.core import annotations as hami
from vgpu.core import errors
from vgpu.kube.port import JsonObj
from vgpu_device_plugin import writebehind
from vgpu_device_plugin.allocator import HamiAllocator


class HamiSearchAllocator(HamiAllocator):
    """Our Allocate, finding its pod as HAMi's device plugin (v2.x) does (docs/protocol.md#allocate, step 1),
    from the API server as it does: GET the node; with a lock naming a pod, GET that pod and take
    it whatever its phase; else (no lock, a legacy one, or one with an empty namespace or name)
    LIST the node's pods and take the first that is ``Pending``, has a bind time, bind phase
    ``allocating`` or ``success`` and ``vgpu-node`` = this node. "First" relies on the API server
    returning LIST items in (namespace, name) order, as kube-apiserver's LIST that HAMi reads does
    (etcd's key order, ``/registry/pods/<namespace>/<name>``) and our local store's does.

    Ours takes only ``allocating`` pods, the oldest first; this one shows whether a node lock mode
    leaves HAMi's search a single right answer. Like HAMi's plugin it takes what the API server
    answered, never our own patch answers (the parent's freshness bookkeeping is for reading
    behind a watch: not needed here), and writes before it answers, as HAMi's plugin does. Its reads cost the API server a GET of the node and a GET or
    a LIST of pods per Allocate: not a throughput setting."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs, writes=writebehind.Inline())

    async def _pending_pod(self, *, read_api: bool = True) -> JsonObj | None:  # always reads the API
        # the parent keeps each of its patch answers until a read from the watch catches up with
        # it; this search reads no watch, so nothing would ever drop them
        self._overlay.keep_only(())
        keys = self._keys
        node = await self._api.get("nodes", self._node)
        raw = hami.of(node).get(keys.node_lock)
        if raw:
            time_part, *holder = raw.split(",")
            if len(holder) == 2 and not all(holder):
                # HAMi parses "<time>,<ns>,<name>" with an empty ns or name (ours calls it malformed)
                # and then searches as with no lock: as with a legacy lock, only the time must parse
                raw = time_part
            try:
                lock = hami.decode_node_lock(raw, field=keys.node_lock)
            except errors.AnnotationError:
                return None  # HAMi's plugin fails the Allocate on a lock it cannot parse
            if not lock.legacy:
                try:
                    return await self._api.get("pods", lock.pod, namespace=lock.namespace)
                except errors.NotFound:
                    return None
        listed = await self._api.list("pods", field_selector=f"spec.nodeName={self._node}")
        return hamis_first_pending(listed.items, node=self._node, keys=keys)


def hamis_first_pending(pods: Iterable[JsonObj], *, node: str, keys: hami.Keys) -> JsonObj | None:
    """HAMi's v2.x lock-less pick among ``pods`` (a LIST of the node's pods, in its order): the
    first ``Pending`` one with a bind time, bind phase ``allocating`` or ``success`` and
    ``vgpu-node`` = ``node``."""
    for pod in pods:
        notes = hami.of(pod)
        if (
            (pod.get("status") or {}).get("phase") == "Pending"
            and keys.bind_time in notes
            and notes.get(keys.bind_phase) in ("allocating", "success")
            and notes.get(keys.assigned_node) == node
        ):
            return pod
    return None
