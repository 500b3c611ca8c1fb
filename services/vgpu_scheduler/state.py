"""The scheduler's cluster state in memory, fed by watches of nodes, pods, leases, quotas, namespaces.

Everything a filter needs is here, kept up to date by the informers of ``watches.py``, so
``/filter`` never calls the API server to decide. The nodes, their device plugins' liveness, their
``fit.NodeGpus`` views and their policy order are the ``inventory.NodeInventory`` this state owns.
Per pod (keyed by uid, never by name): a *charge* (``charges.py``), the pod's collapsed GPU
footprint on its node, from ``devices-allocated`` (pods not Succeeded/Failed), or a *reservation*
made by a filter whose annotation has not come back through the watch yet. Charges are summed per
node incrementally, and the inventory is told which node's usage changed. A Binding on its way
(``sentbindings.py``) keeps its pod's decision; the namespaces' quota is read through
``quotaview.QuotaView``.

A pod filtered but never bound stops counting ``reservation_ttl_s`` after its decision (HAMi keeps
it forever, docs/protocol.md#departures-from-hami); the rule reads only the pod's annotations and the clock, so a
restarted scheduler rebuilds exactly the same state from the API server.
"""

import asyncio
import heapq
import logging
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from vgpu.core import annotations, fit, usage
from vgpu.core.config import Config
from vgpu.core.device import GpuUsage, GpuUuid
from vgpu.kube.port import JsonObj

from vgpu_scheduler import charges, draquota, handoffs, inventory, nodes
from vgpu_scheduler.charges import Charge
from vgpu_scheduler.namespaces import Namespaces
from vgpu_scheduler.nominated import Nominations
from vgpu_scheduler.quotaview import QuotaView
from vgpu_scheduler.sentbindings import SentBindings

log = logging.getLogger(__name__)

_FINISHED = charges.FINISHED


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class ClusterState:
    """Nodes, GPU usage, reservations, leases, quotas and namespaces; see the module docstring."""

    def __init__(
        self, config: Config, *, clock: Callable[[], float], on_node_warning: nodes.NodeWarning | None = None
    ) -> None:
        self.config = config
        self.keys = annotations.Keys(config.annotation_prefix)
        self._clock = clock
        self._used: dict[str, dict[GpuUuid, GpuUsage]] = {}  # node -> GPU -> what the charges add up to
        self.inventory = inventory.NodeInventory(
            self.keys,
            decoder=nodes.NodeDecoder(
                self.keys,
                subtract_outside_usage=config.scheduler.subtract_outside_usage,
                on_node_warning=on_node_warning,
            ),
            lease_timeout_s=config.scheduler.lease_timeout_s,
            used=self._used,
        )
        self.nodes = self.inventory.nodes  # the same dict: name -> decoded entry
        self.pods: dict[str, JsonObj] = {}  # uid -> pod
        self._pod_uid: dict[tuple[str, str], str] = {}
        self.charges: dict[str, Charge] = {}
        self._charged_on: dict[str, set[str]] = {}  # node -> uids of the pods charged there
        self.nominations = Nominations()  # pods waiting on a node for preemption victims to go
        self._expiry: list[tuple[float, str]] = []
        # the pods whose Binding this scheduler has sent and the watch has not shown bound (or
        # gone) yet: it may take effect at any moment, so their decision neither expires nor is
        # released, except by the bind's own roll-back (``bindings.drop``) or a re-list that no
        # longer holds the pod (``pods_listed``)
        self.bindings = SentBindings()
        self.namespaces = Namespaces(config.resources)
        # pods admitted in DRA mode, charged to their namespace by their claims' templates
        self.dra = draquota.DraUsage(
            self.namespaces,
            clock=clock,
            ttl_s=config.scheduler.reservation_ttl_s,
            largest_gpu_memory_mib=self.inventory.largest_gpu_memory_mib,
        )
        # the webhook's AdmissionView, and the quota check of a placement
        self.quota = QuotaView(
            self.namespaces,
            dra=self.dra,
            charges=self.charges,
            largest_gpu_memory_mib=self.inventory.largest_gpu_memory_mib,
            memory_factor=config.webhook.memory_factor,
        )
        self._waiters: dict[str, asyncio.Event] = {}
        # node -> decisions not bound yet there: with the nodes whose lock is held, a bind is under
        # way on them. The filter prefers other nodes (a bind there would wait).
        self._in_flight: dict[str, int] = {}
        self.handoffs = handoffs.Handoffs(self.keys)  # pods between Binding and Allocate, per node
        # bumped at every change a reader could see; ``on_change`` is called then (the dashboard's
        # live feed sets it: it must be cheap and must not touch the state)
        self.generation = 0
        self.on_change: Callable[[], None] | None = None
        # called with a node where GPUs may have come free or come back, once the state is whole
        # again, and whether a pod went (``pod_went``): a pod's GPUs let go of (the pod deleted or
        # finished, as the watch shows it; not a reservation dropped), which kube-scheduler also
        # sees and retries its unschedulable pods for; or, which it never retries for, the node's
        # GPUs or cordons or outside usage changed, its device plugin's Lease live again.
        # retries.py nudges the pending pods that fit there now
        self.on_freed: Callable[[str, bool], None] | None = None
        # bumped at every change that /metrics shows (a node's GPUs, a pod's charge); a node's
        # entry is the usage generation of its last such change (exposition.py caches per node)
        self.usage_generation = 0
        self.node_generation: dict[str, int] = {}

    # --- events from the watches ------------------------------------------------------------

    def apply(self, kind: str, event_type: str, obj: JsonObj) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) of ``kind``."""
        deleted = event_type == "DELETED"
        self._changed()
        if kind == "nodes":
            self._node(obj, deleted)
        elif kind == "pods":
            self._pod(obj, deleted)
        elif kind == "leases":
            back = self.inventory.liveness.lease(obj, deleted=deleted, now=self._clock())
            if back is not None:
                self._freed(back, pod_went=False)  # its device plugin reports again
        elif kind == "namespaces":
            self.namespaces.namespace(obj, deleted)
        elif kind == "resourcequotas":
            self.namespaces.quota(obj, deleted)

    def _node(self, obj: JsonObj, deleted: bool) -> None:
        name = str(_meta(obj).get("name", ""))
        if deleted:
            if self.inventory.remove(name):
                self._bump(name)
            self._notify(name)
            return
        change = self.inventory.update(name, obj)
        if change.gpus:
            self._bump(name)
        self._notify(name)  # lock waiters re-read the node's annotations
        if change.schedulable:
            # a GPU back (healthy, uncordoned, registered), or more memory free
            self._freed(name, pod_went=False)

    # --- pods and charges -------------------------------------------------------------------

    def _pod(self, obj: JsonObj, deleted: bool) -> None:
        self.dra.pod(obj, deleted)
        for node in self.handoffs.pod(obj, deleted=deleted):
            self._notify(node)  # binds waiting for the node's hand-off re-check
        meta = _meta(obj)
        uid = str(meta.get("uid", ""))
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        self.nominations.pod(uid, obj, deleted=deleted)
        if uid in self.bindings and (deleted or (obj.get("spec") or {}).get("nodeName")):
            self.bindings.drop(uid)  # the Binding came back through the watch (or the pod went)
        if deleted:
            self.pods.pop(uid, None)
            if self._pod_uid.get(key) == uid:
                del self._pod_uid[key]
            self._set_charge(uid, None)
            return
        previous = self._pod_uid.get(key)
        if previous is not None and previous != uid:
            # the name now belongs to a new pod, so the old one is gone (a delete we did not see)
            self.pods.pop(previous, None)
            self.bindings.drop(previous)
            self.nominations.pod(previous, obj, deleted=True)
            self._set_charge(previous, None)
        if uid not in self.pods and uid in self.charges:
            self._bump(self.charges[uid].node)  # the pod's name labels its charge's series
        self.pods[uid] = obj
        self._pod_uid[key] = uid
        new = self._charge_of(obj)
        current = self.charges.get(uid)
        if current is not None and current.reservation:
            finished = (obj.get("status") or {}).get("phase") in _FINISHED
            confirmed = new is not None and (new.node, new.devices_raw) == (current.node, current.devices_raw)
            # bound: the API server's fact, whatever this scheduler decided since (a Binding that
            # landed after kube-scheduler gave up on its bind and filtered the pod again)
            bound = bool((obj.get("spec") or {}).get("nodeName"))
            if not (finished or confirmed or bound):
                return  # our own decision has not come back through the watch yet
            if bound and not (finished or confirmed):
                log.warning(
                    "pod %s/%s: bound to node %s with %s while a decision for node %s was held; "
                    "counting what it was bound with",
                    key[0],
                    key[1],
                    (obj.get("spec") or {}).get("nodeName"),
                    new.devices_raw if new is not None else "no readable devices",
                    current.node,
                )
        self._set_charge(uid, new)

    def _charge_of(self, pod: JsonObj) -> Charge | None:
        return charges.charge_of(
            pod, keys=self.keys, reservation_ttl_s=self.config.scheduler.reservation_ttl_s, now=self._clock()
        )

    def _set_charge(self, uid: str, charge: Charge | None) -> None:
        if self.charges.get(uid) == charge:
            # the same charge again (a GPU pod's bind-phase and status updates): the node's fit
            # summary stays valid and no bind waiting on the node has anything new to check
            return
        self._changed()
        old = self.charges.pop(uid, None)
        for changed in {c.node for c in (old, charge) if c is not None}:
            self._bump(changed)
        if old is not None:
            self._account(old, -1)
            on_node = self._charged_on[old.node]
            on_node.discard(uid)
            if not on_node:
                del self._charged_on[old.node]
            if old.reservation:
                left = self._in_flight[old.node] - 1
                if left:
                    self._in_flight[old.node] = left
                else:
                    del self._in_flight[old.node]
        if charge is not None:
            self.charges[uid] = charge
            self._charged_on.setdefault(charge.node, set()).add(uid)
            self._account(charge, 1)
            if charge.reservation:
                self._in_flight[charge.node] = self._in_flight.get(charge.node, 0) + 1
            if charge.expires_s is not None:
                heapq.heappush(self._expiry, (charge.expires_s, uid))
        if old is not None and charge is None and not old.reservation:
            self._freed(old.node, pod_went=True)

    def _freed(self, node: str, *, pod_went: bool) -> None:
        if self.on_freed is None:
            return
        try:
            self.on_freed(node, pod_went)
        except Exception:  # a hint gone wrong must not break the caller (a watch, a filter, a bind)
            log.exception("node %s: asking for retries of the pods that fit there failed", node)

    def _account(self, charge: Charge, sign: int) -> None:
        usage.add(self._used.setdefault(charge.node, {}), charge.usage, sign=sign)
        self.inventory.usage_changed(charge.node)
        self.namespaces.add_usage(
            charge.namespace,
            memory_mib=sign * sum(u.memory_mib for u in charge.usage.values()),
            cores=sign * sum(u.cores for u in charge.usage.values()),
        )
        self._notify(charge.node)

    def reserve(
        self, uid: str, *, namespace: str, node: str, placement: fit.Placement, devices_raw: str
    ) -> None:
        """Hold a decision (the filter's, or a bind's re-fit) until the pod's annotations come back
        through the watch, or the TTL passes unbound."""
        ttl = self.config.scheduler.reservation_ttl_s
        self._set_charge(
            uid,
            Charge(node, namespace, dict(placement.usage), devices_raw, True, self._clock() + ttl),
        )

    def release(self, uid: str, *, node: str | None = None, devices_raw: str | None = None) -> None:
        """Forget the pod's decision (a re-filter, a bind rolled back). Only a decision: the charge
        of a pod the watch shows bound stays until the watch shows it gone or finished, whoever
        asks (kube-scheduler may retry a pod whose Binding took effect after it gave up on the
        bind). ``node``/``devices_raw``: only if the charge is that one (a bind rolling back its
        own, not a newer decision made while it ran)."""
        charge = self.charges.get(uid)
        if charge is None:
            return
        if node is not None and charge.node != node:
            return
        if devices_raw is not None and charge.devices_raw != devices_raw:
            return
        if uid in self.bindings or (not charge.reservation and self.bound_node(uid) is not None):
            return
        self._set_charge(uid, None)

    def bound_node(self, uid: str) -> str | None:
        """The node the watch shows pod ``uid`` bound to, or None (unbound, or unknown)."""
        spec = (self.pods.get(uid) or {}).get("spec")
        node = spec.get("nodeName") if isinstance(spec, dict) else None
        return str(node) if node else None

    def bound_problem(self, uid: str, ns: str, name: str) -> str | None:
        """Why pod ``uid`` may not be placed again: the watch shows it bound, or its Binding is on
        its way (``bindings.sent``: it may take effect at any moment); None when neither."""
        bound = self.bound_node(uid)
        if bound is not None:
            return f"pod {ns}/{name} is already bound to node {bound}"
        sending = self.bindings.node(uid)
        if sending is not None:
            return f"pod {ns}/{name} has a Binding to node {sending} on its way"
        return None

    def pods_listed(self, pods: list[JsonObj]) -> None:
        """The list asked for at ``bindings.listing`` is applied. A pod whose Binding was sent before
        it and that it does not hold is gone: deleted while the watch was down, never seen by it
        (a re-list reports deletions only of the pods it held), so no event would ever settle its
        decision. It is dropped. A Binding sent after the list began is kept (its pod may be
        newer than the list)."""
        for uid, node in self.bindings.gone(str(_meta(p).get("uid", "")) for p in pods):
            charge = self.charges.get(uid)
            if charge is not None and charge.reservation:
                log.info(
                    "pod %s: gone while the pods watch was down, its Binding to node %s sent; "
                    "giving its share back",
                    uid,
                    node,
                )
                self._set_charge(uid, None)

    def expire(self) -> int:
        """Drop charges of decisions never bound within the TTL; returns how many were dropped."""
        now = self._clock()
        dropped = 0
        while self._expiry and self._expiry[0][0] <= now:
            when, uid = heapq.heappop(self._expiry)
            charge = self.charges.get(uid)
            if charge is None or charge.expires_s != when:
                continue
            pod = self.pods.get(uid)
            if pod is not None and (pod.get("spec") or {}).get("nodeName"):
                continue
            if pod is not None and self.keys.bind_phase in annotations.of(pod):
                continue
            if uid in self.bindings:  # its Binding is on its way: the outcome decides
                continue
            log.info(
                "decision for pod %s on node %s expired unbound; giving its share back", uid, charge.node
            )
            self._set_charge(uid, None)
            dropped += 1
        return dropped

    # --- reading ----------------------------------------------------------------------------

    def busy_nodes(self) -> set[str]:
        """Nodes a bind is under way on (lock held, a decision not yet bound, or a pod between its
        Binding and its Allocate): a pod placed there now would wait for the node, so the filter
        prefers any other fitting node."""
        return self.inventory.locked.union(self._in_flight, self.handoffs.nodes())

    def decision(self, uid: str) -> Charge | None:
        """The charge (reservation or confirmed) that pod ``uid`` holds, if any."""
        return self.charges.get(uid)

    def over_capacity(self, node: str, uid: str) -> str | None:
        """Why the GPUs pod ``uid`` is charged with on ``node`` can no longer hold it, or None
        (``NodeInventory.over_capacity``, against every pod charged there)."""
        charge = self.charges.get(uid)
        if charge is None:
            return None
        charges = self.charges

        def holders() -> Iterable[Mapping[GpuUuid, GpuUsage]]:
            return (charges[other].usage for other in self._charged_on.get(node, ()))

        return self.inventory.over_capacity(node, charge.usage, holders=holders)

    def charged_on(self, node: str) -> AbstractSet[str]:
        """Uids of the pods charged on ``node`` (confirmed or reserved): preemption's residents."""
        return self._charged_on.get(node, frozenset())

    def used(self, node: str) -> Mapping[GpuUuid, GpuUsage]:
        return self._used.get(node, {})

    def problem(self, node: str, now: float) -> str | None:
        """Why ``node`` has no schedulable GPUs now (``inventory.NodeInventory.problem``), or None."""
        return self.inventory.problem(node, now)

    def pod(self, namespace: str, name: str) -> JsonObj | None:
        uid = self._pod_uid.get((namespace, name))
        return None if uid is None else self.pods.get(uid)

    def changed(self, node: str) -> asyncio.Event:
        """An event set at the next change of the node or of the usage on it (lock waiters)."""
        event = self._waiters.get(node)
        if event is None:
            event = self._waiters[node] = asyncio.Event()
        return event

    def _changed(self) -> None:
        self.generation += 1
        if self.on_change is not None:
            self.on_change()

    def _bump(self, node: str) -> None:
        self.usage_generation += 1
        self.node_generation[node] = self.usage_generation

    def _notify(self, node: str) -> None:
        event = self._waiters.pop(node, None)
        if event is not None:
            event.set()
