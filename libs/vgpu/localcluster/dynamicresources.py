"""kube-scheduler's DynamicResources plugin, emulated for ``SchedulerEmulator``: a pod's
ResourceClaims are allocated by ``vgpu.core.dra.allocator`` on the node the scheduler picks.

As upstream (``pkg/scheduler/framework/plugins/dynamicresources``):

- **PreFilter** (``pre_filter``): each ``spec.resourceClaims`` entry names its claim (directly, or
  through ``pod.status.resourceClaimStatuses`` for a template: ``pod "<ns>/<name>": ResourceClaim
  not created yet`` until kube-controller-manager has made it); a claim missing from the informer
  is ``resourceclaim.resource.k8s.io "<name>" not found``, one being deleted ``resourceclaim "<name>"
  is being deleted``, a template claim not owned by the pod ``... (Pod is not owner)``, an
  unallocated claim whose allocation is in flight for another pod ``resource claim <ns>/<name> is in
  the process of being allocated``. These reject the pod on every node;
- **Filter** (``filter``, per node): an allocated claim must be available on the node (its
  ``nodeSelector``: "resourceclaim not available on the node"); the unallocated ones must all be
  allocatable there, against every allocation the cluster holds plus those in flight ("cannot
  allocate all claims"). Both are UnschedulableAndUnresolvable (preemption does not help). A claim or
  class the allocator cannot evaluate is a scheduling error (back-off), as upstream;
- **Reserve** (``reserve``): the chosen node's allocations are held in memory (in flight) at once,
  so the next scheduling cycle counts them; **PreBind** (``pre_bind``, in the binding cycle):
  each claim's status gets its ``allocation`` and the pod in ``reservedFor`` (one status write per
  claim); **Unreserve** (``unreserve``): a failed binding cycle drops what was in flight and, for
  claims it wrote, the reservation and allocation again.

An allocation stays in flight until the claims informer shows it. Not emulated: the finalizer
upstream adds before writing the allocation (the store has no finalizers), extended resources
backed by DRA, binding conditions, claims shared between pods being counted only once when several
pods reserve them (every claim is counted once by uid, which is the same thing).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from vgpu.core import errors
from vgpu.core.dra import allocator
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster import statuswriter

log = logging.getLogger(__name__)

CANNOT_ALLOCATE = "cannot allocate all claims"
NOT_ON_NODE = "resourceclaim not available on the node"


@dataclasses.dataclass
class CycleState:
    """What PreFilter found for one pod, and what Filter allocated on each node."""

    claims: list[JsonObj]
    to_allocate: list[JsonObj]
    allocated: list[JsonObj]  # every allocation the cluster holds, in flight included
    per_node: dict[str, list[JsonObj]] = dataclasses.field(default_factory=dict)
    written: list[str] = dataclasses.field(default_factory=list)  # claim names PreBind allocated


def _selector_allows(allocation: Mapping[str, Any], node: str) -> bool:
    """Whether an allocation's ``nodeSelector`` (the ``metadata.name`` match the allocator writes)
    admits ``node``; an allocation without one is available everywhere."""
    selector = allocation.get("nodeSelector")
    if not selector:
        return True
    for term in selector.get("nodeSelectorTerms") or ():
        fields = term.get("matchFields") or []
        if all(
            f.get("key") == "metadata.name" and f.get("operator") == "In" and node in (f.get("values") or ())
            for f in fields
        ) and not term.get("matchExpressions"):
            return True
    return False


class DynamicResources:
    """The plugin's informers and in-flight allocations; ``on_change`` is called on a cluster event
    that may make an unschedulable pod schedulable (a slice, class or claim changed)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        status_writer: statuswriter.StatusWriter,
        new_share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self._status = status_writer
        self._new_share_id = new_share_id
        self.on_change: Callable[[], None] = lambda: None
        self.slices = informer.Informer(api, "resourceslices", on_event=self._changed, unserved_ok=True)
        self.classes = informer.Informer(api, "deviceclasses", on_event=self._changed, unserved_ok=True)
        self.claims = informer.Informer(api, "resourceclaims", on_event=self._on_claim, unserved_ok=True)
        self._in_flight: dict[str, JsonObj] = {}  # claim uid -> allocation

    @property
    def informers(self) -> tuple[informer.Informer, ...]:
        return (self.slices, self.classes, self.claims)

    def _changed(self, change: informer.Change) -> None:
        self.on_change()

    def _on_claim(self, change: informer.Change) -> None:
        uid = (change.object.get("metadata") or {}).get("uid")
        if change.type == "DELETED" or (change.object.get("status") or {}).get("allocation"):
            self._in_flight.pop(str(uid), None)
        old_alloc = ((change.old or {}).get("status") or {}).get("allocation")
        new_alloc = (change.object.get("status") or {}).get("allocation")
        if change.type != "MODIFIED" or (old_alloc and not new_alloc):
            self.on_change()  # a claim created, deleted or deallocated

    # ----- PreFilter -----

    @staticmethod
    def has_claims(pod: Mapping[str, Any]) -> bool:
        return bool((pod.get("spec") or {}).get("resourceClaims"))

    def pre_filter(self, pod: Mapping[str, Any]) -> CycleState | str:
        """The pod's claims, or the message that rejects it on every node."""
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace") or "default", meta.get("name")
        recorded = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        }
        claims = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            check_owner = False
            if entry.get("resourceClaimName"):
                claim_name = entry["resourceClaimName"]
            elif entry.get("resourceClaimTemplateName"):
                if entry.get("name") not in recorded:
                    return f'pod "{ns}/{name}": ResourceClaim not created yet'
                claim_name = recorded[entry.get("name")]
                if claim_name is None:
                    continue  # "not needed": no claim was generated
                check_owner = True
            else:
                return f'pod "{ns}/{name}", spec.resourceClaim "{entry.get("name")}": none of the supported fields are set'
            claim = self.claims.get(ns, claim_name)
            if claim is None:
                return f'resourceclaim.resource.k8s.io "{claim_name}" not found'
            if (claim.get("metadata") or {}).get("deletionTimestamp"):
                return f'resourceclaim "{claim_name}" is being deleted'
            if check_owner and not any(
                r.get("uid") == meta.get("uid") and r.get("controller")
                for r in (claim.get("metadata") or {}).get("ownerReferences") or ()
            ):
                return (
                    f"ResourceClaim {ns}/{claim_name} was not created for Pod {ns}/{name} (Pod is not owner)"
                )
            claims.append(claim)
        to_allocate = [c for c in claims if not (c.get("status") or {}).get("allocation")]
        for claim in to_allocate:
            if claim["metadata"]["uid"] in self._in_flight:
                return f"resource claim {ns}/{claim['metadata']['name']} is in the process of being allocated"
        return CycleState(claims=claims, to_allocate=to_allocate, allocated=self._allocated())

    def _allocated(self) -> list[JsonObj]:
        held = [
            c
            for c in self.claims.items()
            if (c.get("status") or {}).get("allocation") and c["metadata"]["uid"] not in self._in_flight
        ]
        return held + [{"status": {"allocation": a}} for a in self._in_flight.values()]

    # ----- Filter -----

    def filter(self, state: CycleState, node: str) -> list[str]:
        """Why ``node`` cannot take the pod's claims ([] when it can; the allocation is kept)."""
        for claim in state.claims:
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation and not _selector_allows(allocation, node):
                return [NOT_ON_NODE]
        if not state.to_allocate:
            return []
        try:
            found = allocator.allocate(
                state.to_allocate,
                node=node,
                slices=self.slices.items(),
                classes={c["metadata"]["name"]: c for c in self.classes.items()},
                allocated=state.allocated,
                new_share_id=self._new_share_id,
            )
        except allocator.AllocatorError as err:
            raise errors.SchedulingError(str(err)) from None
        if found is None:
            return [CANNOT_ALLOCATE]
        state.per_node[node] = found
        return []

    # ----- Reserve, PreBind, Unreserve -----

    def reserve(self, state: CycleState, node: str) -> None:
        for claim, allocation in zip(state.to_allocate, state.per_node.get(node, ()), strict=False):
            self._in_flight[claim["metadata"]["uid"]] = allocation

    async def pre_bind(self, state: CycleState, pod: Mapping[str, Any], node: str) -> None:
        """Write each claim's allocation (for the ones this cycle allocated) and reserve it for the pod."""
        meta = pod.get("metadata") or {}
        consumer = {"resource": "pods", "name": meta.get("name"), "uid": meta.get("uid")}
        allocations = dict(
            zip((c["metadata"]["uid"] for c in state.to_allocate), state.per_node.get(node, ()), strict=False)
        )
        for claim in state.claims:
            cmeta = claim["metadata"]
            reserved = list((claim.get("status") or {}).get("reservedFor") or [])
            if any(r.get("uid") == consumer["uid"] for r in reserved) and cmeta["uid"] not in allocations:
                continue
            status: JsonObj = {"reservedFor": [*reserved, consumer]}
            if cmeta["uid"] in allocations:
                status["allocation"] = allocations[cmeta["uid"]]
            await self._status.merge_patch_status(
                "resourceclaims",
                cmeta["name"],
                {"metadata": {"uid": cmeta["uid"]}, "status": status},
                namespace=cmeta.get("namespace"),
            )
            if cmeta["uid"] in allocations:
                state.written.append(cmeta["name"])

    async def unreserve(self, state: CycleState, pod: Mapping[str, Any]) -> None:
        for claim in state.to_allocate:
            self._in_flight.pop(claim["metadata"]["uid"], None)
        uid = (pod.get("metadata") or {}).get("uid")
        for claim in state.claims:
            cmeta = claim["metadata"]
            current = self.claims.get(cmeta.get("namespace"), cmeta["name"]) or claim
            reserved = (current.get("status") or {}).get("reservedFor") or []
            remaining = [r for r in reserved if r.get("uid") != uid]
            if len(remaining) == len(reserved) and cmeta["name"] not in state.written:
                continue
            status: JsonObj = {"reservedFor": remaining or None}
            if cmeta["name"] in state.written and not remaining:
                status["allocation"] = None
            try:
                await self._status.merge_patch_status(
                    "resourceclaims", cmeta["name"], {"status": status}, namespace=cmeta.get("namespace")
                )
            except errors.KubeError as err:
                log.warning("unreserve %s: %s", cmeta["name"], err)
