"""DRA pods in ``vgpu simulate``: kube-scheduler's DynamicResources plugin over the ``--dra`` file's
ResourceSlices, allocating through ``vgpu.core.dra.allocator`` (the emulation the local cluster runs,
checked against kube-scheduler 1.36 by differential tests).

A DRA pod is one whose admitted spec has ``spec.resourceClaims``: a HAMi pod the webhook's DRA mode
converted (its claims name the ResourceClaimTemplates the conversion made), or a pod that names
claims or templates itself. As kube-controller-manager does, each template entry becomes a claim of
the template's spec (named ``<pod>-<entry>``, owned by the pod); a ``resourceClaimName`` entry is a
claim of the file. Then, as kube-scheduler:

- **PreFilter**: a template or claim that does not exist, or a claim or DeviceClass the allocator
  cannot read, keeps the pod pending on every node with that message;
- **Filter**, per node (every node with a ResourceSlice, and the cluster file's nodes): an allocated
  claim's ``nodeSelector`` must admit the node (``resourceclaim not available on the node``), and
  the unallocated claims must all be allocatable there against every allocation held so far, the
  file's included (``cannot allocate all claims``); both are unresolvable: no preemption;
- **Score**: the DynamicResources score of the prioritized list (per claim, ``8 - i`` for each
  ``firstAvailable`` subrequest ``i`` allocated), higher first; then the node holding the fewest
  pods; then the node name. Approximated: kube-scheduler adds its other scores (LeastAllocated and
  BalancedAllocation on cpu and memory, which the cluster file does not describe: fewest pods is
  what they come to on equal nodes for pods of equal requests), scores only a sample of the
  feasible nodes in large clusters (``percentageOfNodesToScore``), and breaks ties at random;
- **Reserve/PreBind**: each claim gets the ``status.allocation`` the allocator wrote and the pod in
  ``reservedFor``; share IDs are deterministic (``00000000-0000-0000-0000-<counter>``).

The file's claims that cannot be read, and slices that are not shaped as the API serves them, are
left out with a reason in ``problems`` (``drafacts`` reads them); nothing here raises on garbage.
Feasibility per (claims' specs, node) is cached and recomputed only on nodes whose allocations
changed, as ``engine``'s fit cache does.
"""

from __future__ import annotations

import collections
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.core import fit
from vgpu.core.annotations import PodDevices
from vgpu.core.device import GpuUuid, NodeName
from vgpu.core.dra import allocator, allocinputs, deviceclass, names, usage
from vgpu.core.poddevices import ContainerDevice
from vgpu.simulate import drafacts
from vgpu.simulate.dra import DraObjects

JsonObj = dict[str, Any]
MIB = 1024 * 1024

CANNOT_ALLOCATE = "cannot allocate all claims"  # the DynamicResources Filter's message
NOT_ON_NODE = "resourceclaim not available on the node"


@dataclass(frozen=True)
class DraPlacement:
    """A DRA pod placed: its node, the GPUs of each container (init first), its claims' names."""

    node: NodeName
    devices: PodDevices
    claims: tuple[str, ...]


@dataclass
class _Entry:
    """One claim signature's per-node outcome: a reason (not feasible) or a score."""

    outcome: dict[NodeName, str | int]
    dirty: set[NodeName]


class DraSide:
    """The DRA half of one run: the pools per node, every allocation held (the file's, then the
    run's), and the placement of one pod at a time (see the module docstring)."""

    MAX_SIGNATURES = 64

    def __init__(self, objects: DraObjects, *, other_nodes: Sequence[NodeName] = ()) -> None:
        self.problems: list[str] = []
        self.slices: list[JsonObj] = []
        for obj in objects.slices:
            why = drafacts.slice_problem(obj)
            if why is None:
                self.slices.append(dict(obj))
            else:
                meta = obj.get("metadata") if isinstance(obj, Mapping) else None
                name = meta.get("name") if isinstance(meta, Mapping) else None
                self.problems.append(f"ResourceSlice {name or '?'}: {why}; left out of the run")
        local = {
            str(s["spec"]["nodeName"]) for s in self.slices if isinstance(s["spec"].get("nodeName"), str)
        }
        self.candidates = tuple(NodeName(n) for n in sorted(local | set(other_nodes)))
        ours = {s["spec"]["nodeName"] for s in self.slices if s["spec"]["driver"] == names.DRIVER} & local
        self.problems.extend(
            f"node {n} is in the cluster file and publishes a ResourceSlice of {names.DRIVER}: "
            "both modes would hand out its GPUs"
            for n in sorted(ours & set(other_nodes))
        )
        self._pools: dict[NodeName, list[list[allocinputs.Device]]] = {}
        for node in self.candidates:
            try:
                self._pools[node] = allocinputs.pools(self.slices, node)
            except allocator.AllocatorError as exc:
                self.problems.append(f"node {node}: {exc}; its ResourceSlices are left out of the run")
                self._pools[node] = []
        self.classes: dict[str, JsonObj] = {c["metadata"]["name"]: dict(c) for c in objects.classes}
        self.classes.setdefault(names.DEVICE_CLASS, deviceclass.device_class())  # the chart's
        self._templates = {drafacts.meta(t): t for t in objects.templates}
        self.claims: list[JsonObj] = []
        self._by_name: dict[tuple[str, str], JsonObj] = {}
        self.holding = allocator.Held({}, set())
        # node -> the pods (namespace, name) known to run there: the claims' reservedFor, placed pods
        self._pods_on: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
        for claim in objects.claims:
            self._add_file_claim(claim)
        # pool -> our slices, read as the views read them
        self._read: dict[str, list[usage.SliceGpus]] = collections.defaultdict(list)
        for s in self.slices:
            found = usage.read_slice(s)
            if found is not None and found.pool:
                self._read[found.pool].append(found)
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._share_ids = 0

    def _add_file_claim(self, claim: object) -> None:
        meta = claim.get("metadata") if isinstance(claim, Mapping) else None
        if (
            not isinstance(claim, Mapping)
            or not isinstance(meta, Mapping)
            or not isinstance(meta.get("name"), str)
        ):
            return  # the held section reports it (usage.read_claim)
        key = (str(meta.get("namespace") or ""), meta["name"])
        allocation = drafacts.allocation_of(claim)
        if allocation:
            try:
                held = allocator.held([claim])
            except (allocator.AllocatorError, AttributeError, TypeError) as exc:
                self.problems.append(
                    f"ResourceClaim {key[0]}/{key[1]}: allocation unreadable ({exc}); not counted in the run"
                )
                return
            self._hold(held)
            node = drafacts.node_of(allocation) if isinstance(allocation, Mapping) else None
            if node is not None:
                for consumer in drafacts.path_list(claim, "status", "reservedFor"):
                    self._pods_on[node].add((key[0], str(consumer.get("name"))))
        copy = json.loads(json.dumps(claim))
        self.claims.append(copy)
        self._by_name[key] = copy

    def _hold(self, more: allocator.Held) -> None:
        for device, amounts in more.used.items():
            mine = self.holding.used.setdefault(device, {})
            for name, value in amounts.items():
                mine[name] = mine.get(name, 0) + value
        self.holding.exclusive |= more.exclusive

    # ----- one pod -----

    def _pod_claims(
        self, pod: Mapping[str, Any], templates: Sequence[Mapping[str, Any]]
    ) -> list[tuple[str, JsonObj, bool]] | str:
        """(pod claim entry name, claim, made now) for each entry, or why the pod cannot start."""
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
        made = {t["metadata"]["name"]: t for t in templates}
        out = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            if not isinstance(entry, Mapping):
                return f'pod "{ns}/{name}": spec.resourceClaims holds a non-object'
            entry_name = str(entry.get("name"))
            if entry.get("resourceClaimTemplateName"):
                template_name = str(entry["resourceClaimTemplateName"])
                template = made.get(template_name) or self._templates.get((ns, template_name))
                outer = template.get("spec") if template is not None else None
                inner = outer.get("spec") if isinstance(outer, Mapping) else None
                if not isinstance(inner, Mapping):
                    return (
                        f'pod "{ns}/{name}": ResourceClaim not created yet (resourceclaimtemplate '
                        f'"{template_name}" not found in namespace {ns})'
                    )
                claim: JsonObj = {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {
                        "name": f"{name}-{entry_name}",
                        "namespace": ns,
                        "ownerReferences": [
                            {"apiVersion": "v1", "kind": "Pod", "name": name, "controller": True}
                        ],
                    },
                    "spec": json.loads(json.dumps(inner)),
                }
                out.append((entry_name, claim, True))
            elif entry.get("resourceClaimName"):
                claim_name = str(entry["resourceClaimName"])
                found = self._by_name.get((ns, claim_name))
                if found is None:
                    return f'resourceclaim.resource.k8s.io "{claim_name}" not found'
                out.append((entry_name, found, False))
            else:
                return f'pod "{ns}/{name}", spec.resourceClaim "{entry_name}": none of the supported fields are set'
        return out

    def place(
        self, pod: Mapping[str, Any], *, templates: Sequence[Mapping[str, Any]] = ()
    ) -> DraPlacement | dict[NodeName, fit.Miss]:
        """Place ``pod`` (admitted, with ``spec.resourceClaims``) and hold its claims' allocations,
        or every candidate node's reason. ``templates``: the ones its admission made."""
        found = self._pod_claims(pod, templates)
        if isinstance(found, str):
            return self._everywhere(found)
        claims = [c for _, c, _ in found]
        to_allocate = [c for c in claims if not drafacts.allocation_of(c)]
        try:
            wanted = allocator.wanted(to_allocate, self.classes) if to_allocate else None
        except (allocator.AllocatorError, AttributeError, TypeError) as exc:
            return self._everywhere(f"cannot read the pod's claims: {exc}")
        signature = json.dumps(
            [[c.get("spec"), drafacts.meta(c) if drafacts.allocation_of(c) else None] for c in claims],
            sort_keys=True,
            default=str,
        )
        entry = self._entry(signature)
        for node in entry.dirty:
            entry.outcome[node] = self._try(node, claims, wanted)
        entry.dirty.clear()
        scores = [(n, s) for n, s in entry.outcome.items() if isinstance(s, int)]
        if not scores:
            return {n: fit.Miss(str(r), unresolvable=True) for n, r in entry.outcome.items()}
        node = min(scores, key=lambda ns: (-ns[1], len(self._pods_on[ns[0]]), ns[0]))[0]
        return self._commit(pod, node, found, wanted)

    def _everywhere(self, reason: str) -> dict[NodeName, fit.Miss]:
        return {n: fit.Miss(reason, unresolvable=True) for n in self.candidates}

    def _entry(self, signature: str) -> _Entry:
        entry = self._entries.get(signature)
        if entry is None:
            entry = _Entry({}, set(self.candidates))
            self._entries[signature] = entry
            if len(self._entries) > self.MAX_SIGNATURES:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(signature)
        return entry

    def _allocate(self, node: NodeName, wanted: allocator.Wanted, new_share_id: Any) -> list[JsonObj] | None:
        return allocator.allocate_on(
            wanted,
            node=node,
            pools=self._pools.get(node, []),
            holding=self.holding,
            new_share_id=new_share_id,
        )

    def _try(self, node: NodeName, claims: Sequence[JsonObj], wanted: allocator.Wanted | None) -> str | int:
        """The Filter's reason on ``node``, or the node's score."""
        for claim in claims:
            allocation = drafacts.allocation_of(claim)
            if allocation and not drafacts.selector_allows(allocation, node):
                return NOT_ON_NODE
        new: list[JsonObj] = []
        if wanted is not None:
            try:
                got = self._allocate(node, wanted, lambda: "")
            except allocator.AllocatorError as exc:
                return f"scheduler error: {exc}"
            if got is None:
                return CANNOT_ALLOCATE + self._best_free(node)
            new = got
        fresh = iter(new)
        allocations = [drafacts.allocation_of(c) or next(fresh) for c in claims]
        return drafacts.prioritized_score(claims, allocations)

    def _best_free(self, node: NodeName) -> str:
        """What the node's least used GPU of ours has free, for the reason: `` (best GPU free:
        6144 MiB, 70% cores)``; empty where the node has none (not in the DRA mode)."""
        best: tuple[int, int] | None = None
        for pool in self._pools.get(node, []):
            for device in pool:
                memory, cores = (
                    device.capacity.get(names.CAPACITY_MEMORY),
                    device.capacity.get(names.CAPACITY_CORES),
                )
                if device.id[0] != names.DRIVER or memory is None or cores is None:
                    continue
                used = self.holding.used.get(device.id, {})
                free = (0, 0)
                if device.id not in self.holding.exclusive and not device.taints:
                    free = (
                        int((memory.value.value - used.get(names.CAPACITY_MEMORY, 0)) // MIB),
                        int(cores.value.value - used.get(names.CAPACITY_CORES, 0)),
                    )
                best = free if best is None or free > best else best
        return "" if best is None else f" (best GPU free: {best[0]} MiB, {best[1]}% cores)"

    def _next_share_id(self) -> str:
        self._share_ids += 1
        return str(uuid.UUID(int=self._share_ids))

    def _commit(
        self,
        pod: Mapping[str, Any],
        node: NodeName,
        found: Sequence[tuple[str, JsonObj, bool]],
        wanted: allocator.Wanted | None,
    ) -> DraPlacement:
        meta = pod.get("metadata") or {}
        consumer = {"resource": "pods", "name": str(meta.get("name")), "uid": f"pod-{meta.get('name')}"}
        new = self._allocate(node, wanted, self._next_share_id) if wanted is not None else []
        assert new is not None  # feasible a moment ago, on the same holdings
        fresh = iter(new)
        everywhere = False
        by_entry: dict[str, JsonObj] = {}
        for entry_name, claim, made in found:
            status = claim.setdefault("status", {})
            if not status.get("allocation"):
                allocation = next(fresh)
                status["allocation"] = allocation
                self._hold(allocator.held([claim]))
                everywhere = everywhere or "nodeSelector" not in allocation
            status["reservedFor"] = [*(status.get("reservedFor") or ()), consumer]
            if made:
                self.claims.append(claim)
                self._by_name[drafacts.meta(claim)] = claim
            by_entry[entry_name] = claim
        self._pods_on[node].add((str(meta.get("namespace") or "default"), str(meta.get("name"))))
        for entry in self._entries.values():
            entry.dirty |= set(self.candidates) if everywhere else {node}
        return DraPlacement(
            node, self._devices(pod, by_entry), tuple(drafacts.meta(c)[1] for _, c, _ in found)
        )

    # ----- what the report shows -----

    def _claim_devices(self, claim: Mapping[str, Any]) -> tuple[ContainerDevice, ...]:
        """Our GPUs ``claim`` holds, memory and cores as the views count them."""
        use = usage.read_claim(claim)
        if use is None or use.problem is not None:
            return ()
        got = usage.combine([r for p in {s.pool for s in use.shares} for r in self._read.get(p, ())], [use])
        taken: collections.Counter[GpuUuid] = collections.Counter()
        out = []
        for share in use.shares:
            node = got.nodes.get(share.pool)
            gpu = next(
                (
                    g
                    for g in (node.inventory.gpus if node else ())
                    if names.device_name(g.index) == share.device
                ),
                None,
            )
            if node is None or gpu is None:
                continue
            holder = node.holders[gpu.uuid][taken[gpu.uuid]]
            taken[gpu.uuid] += 1
            out.append(ContainerDevice(gpu.uuid, holder.memory_mib, holder.cores, gpu.type))
        return tuple(out)

    def _devices(self, pod: Mapping[str, Any], by_entry: Mapping[str, JsonObj]) -> PodDevices:
        spec = pod.get("spec") or {}
        out = []
        for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
            refs = (
                ((container.get("resources") or {}).get("claims") or ())
                if isinstance(container, Mapping)
                else ()
            )
            devices: list[ContainerDevice] = []
            for ref in refs if isinstance(refs, list) else ():
                claim = by_entry.get(str(ref.get("name"))) if isinstance(ref, Mapping) else None
                if claim is not None:
                    devices.extend(self._claim_devices(claim))
            out.append(tuple(devices))
        return tuple(out)

    def takes(self, node: str, device: str, spec: Mapping[str, Any]) -> bool:
        """Whether the allocator could give one more claim of ``spec`` a share of our ``device`` on
        ``node`` now (the fragmentation yardstick on DRA GPUs)."""
        pools = [
            [d for d in pool if d.id[0] == names.DRIVER and d.id[2] == device]
            for pool in self._pools.get(NodeName(node), [])
        ]
        claim = {"metadata": {"name": "typical", "namespace": "-"}, "spec": spec}
        try:
            wanted = allocator.wanted([claim], self.classes)
            got = allocator.allocate_on(
                wanted,
                node=node,
                pools=[p for p in pools if p],
                holding=self.holding,
                new_share_id=lambda: "",
            )
        except allocator.AllocatorError:
            return False
        return got is not None

    def usage(self) -> usage.DraUsage:
        """Every node's DRA GPUs and what the file's and the run's claims hold on them."""
        return usage.build(self.slices, self.claims)
