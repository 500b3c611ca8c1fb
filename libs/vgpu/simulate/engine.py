"""Placing a workload on a cluster in-process, through the scheduler's own fit and scoring code.

Each pod first goes through the admission webhook's pure decision (``admit``: ``admission.decide``)
with the run's policies as the configured defaults, as it would on ``kubectl apply``: a denied pod
is *rejected*, an allowed one is patched (default GPU count, exclusive cores for a whole-GPU
request, the node-policy annotation) and its request re-parsed from the patched pod.

Then, in workload order, every node is tried with ``vgpu.core.fit.fit_pod`` against the
usage the earlier pods left (the same call the scheduler's filter makes), the fitting nodes are
ranked with ``vgpu.core.policy.node_score`` / ``pick_node`` under the node policy, and the chosen
placement's collapsed footprint is added to that node's usage. A pod whose namespace quota (the
cluster's ``quotas``) it would break is pending on every node with the filter's quota reason, checked
against what its namespace holds so far (``vgpu.core.quota``); as in the filter, a node whose
placement of a pod with a GPU init container would break it fails with that reason. A pod that fits nowhere stays
pending with every node's reason, unless it has a priority above some placed pods: then, as
kube-scheduler with our ``/preempt``, the fewest lower-priority pods are evicted on the node
kube-scheduler would pick (``simulate.preemption``), the pod is placed there, and the victims become
pending ("preempted by ..."). Per-pod policy annotations override the run's policies, as in
the scheduler. A pod the webhook admits in the DRA mode (its claims replace its ``nvidia.com/*``
resources) is placed by kube-scheduler's DRA allocation instead (``draplace``), on the nodes of the
``--dra`` file's ResourceSlices. No sockets, no clock: the same inputs always give the same result.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass

from vgpu.core import fit, policy, preempt, quota, usage
from vgpu.core.annotations import PodDevices
from vgpu.core.config import Config, Policy
from vgpu.core.device import GpuUsage, GpuUuid, NodeName
from vgpu.core.dra import usage as dra_usage
from vgpu.core.dra.usage import DraUsage
from vgpu.core.request import PodRequest
from vgpu.simulate import drafacts, draplace, model
from vgpu.simulate.admit import Rejected, admit
from vgpu.simulate.dra import DraObjects
from vgpu.simulate.model import Cluster, Workload, WorkloadPod
from vgpu.simulate.preemption import Preemption, choose


@dataclass(frozen=True)
class Placed:
    """A pod that fits: its node and the GPUs of each container (init first); a DRA pod's
    (``pod.dra``) are the shares its claims (``claims``) were allocated."""

    pod: WorkloadPod
    node: NodeName
    devices: PodDevices
    claims: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pending:
    """A pod that fits nowhere, with each node's reason (``unresolvable``: even empty it would not fit)."""

    pod: WorkloadPod
    reasons: dict[NodeName, fit.Miss]

    def summary(self) -> str:
        """The reasons grouped like kube-scheduler's event: ``2 nodes: <reason>; 1 node: <reason>``."""
        groups: dict[str, int] = {}
        for miss in self.reasons.values():
            groups[miss.reason] = groups.get(miss.reason, 0) + 1
        ordered = sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))
        return "; ".join(f"{n} node{'s' if n != 1 else ''}: {reason}" for reason, n in ordered)


@dataclass(frozen=True)
class Run:
    """The outcome of one simulation: who went where, who waits, and each node's final usage."""

    node_policy: Policy
    gpu_policy: Policy
    cluster: Cluster
    placed: tuple[Placed, ...]
    pending: tuple[Pending, ...]
    rejected: tuple[Rejected, ...]
    used: dict[NodeName, dict[GpuUuid, GpuUsage]]
    preemptions: tuple[Preemption, ...] = ()
    dra: draplace.DraSide | None = None  # the DRA side at the end of the run (its nodes' usage)

    @property
    def label(self) -> str:
        return f"{self.node_policy}/{self.gpu_policy}"

    @functools.cached_property
    def dra_usage(self) -> DraUsage:
        return self.dra.usage() if self.dra is not None else dra_usage.EMPTY

    @property
    def node_count(self) -> int:
        """The cluster file's nodes and the DRA nodes (those our driver publishes GPUs on)."""
        return len(self.cluster.nodes) + len(self.dra_usage.nodes)


def simulate(
    cluster: Cluster,
    workload: Workload,
    *,
    config: Config,
    node_policy: Policy,
    gpu_policy: Policy,
    dra: DraObjects | None = None,
) -> Run:
    """Admit then place ``workload`` pod by pod. A pod with no GPU request fits anywhere. ``dra``:
    the ``--dra`` file's objects; DRA pods are placed by ``draplace`` (on its nodes, and on the
    cluster's where a slice for every node makes that possible), the others as above."""
    run_config = dataclasses.replace(
        config,
        scheduler=dataclasses.replace(config.scheduler, node_policy=node_policy, gpu_policy=gpu_policy),
    )
    largest = max((g.memory_mib for n in cluster.nodes for g in n.gpus), default=0)
    objects = dra if dra is not None else DraObjects()
    side = draplace.DraSide(objects, other_nodes=[n.node for n in cluster.nodes])
    admitted, rejected = admit(
        workload,
        config=run_config,
        largest_gpu_memory_mib=largest,
        quotas=cluster.quota,
        namespace_labels=objects.namespace_labels if dra is not None else None,
        dra_memory_sizes_mib=drafacts.memory_sizes_mib(side.slices),
    )
    # namespace -> (memory MiB, cores) placed so far; a DRA pod's claims count from its admission
    held: dict[str, tuple[int, int]] = {}
    largest_any = max((largest, *drafacts.memory_sizes_mib(side.slices)))
    for pod in admitted:
        if pod.dra:
            ns = str(pod.pod["metadata"].get("namespace", "default"))
            more = drafacts.charge(pod.pod, pod.templates, largest_gpu_memory_mib=largest_any)
            held[ns] = (held.get(ns, (0, 0))[0] + more[0], held.get(ns, (0, 0))[1] + more[1])
    used: dict[NodeName, dict[GpuUuid, GpuUsage]] = {n.node: {} for n in cluster.nodes}
    cordoned = {
        n.node: frozenset(g.uuid for g in n.gpus if g.uuid in cluster.cordoned) for n in cluster.nodes
    }
    fits = _FitCache(
        {n.node: fit.NodeGpus.build(n.gpus, used[n.node], cordoned[n.node]) for n in cluster.nodes}
    )
    placed: list[Placed] = []
    pending: list[Pending] = []
    preemptions: list[Preemption] = []
    # node -> pod key -> (its Placed, footprint, priority, placement order): preemption's residents
    on_node: dict[NodeName, dict[str, tuple[Placed, dict[GpuUuid, GpuUsage], int, int]]] = {
        n.node: {} for n in cluster.nodes
    }
    for order, pod in enumerate(admitted):
        if pod.dra:  # kube-scheduler's DynamicResources plugin places it: no extender, no preemption
            outcome = side.place(pod.pod, templates=pod.templates)
            if isinstance(outcome, draplace.DraPlacement):
                placed.append(Placed(pod, outcome.node, outcome.devices, outcome.claims))
            else:
                pending.append(Pending(pod, outcome))
            continue
        ask = pod.request
        namespace = str(pod.pod["metadata"].get("namespace", "default"))
        over_quota = _quota_problem(cluster, namespace, held, ask, config=run_config, largest=largest)
        if over_quota is not None:  # as the filter: no node can take it while the namespace is full
            pending.append(
                Pending(pod, {n.node: fit.Miss(over_quota, unresolvable=True) for n in cluster.nodes})
            )
            continue
        results, fitting = fits.results(ask, ask.gpu_policy or gpu_policy)
        over_quota_on: set[NodeName] = set()
        if quota.needs_placement_check(ask):  # as the filter: each node's placement against the quota
            results, over_quota_on = _within_quota(
                cluster,
                namespace,
                held,
                results,
                fitting,
                ask=ask,
                views=fits.views,
                gpu_policy=ask.gpu_policy or gpu_policy,
                factor=run_config.webhook.memory_factor,
            )
            fitting = fitting - over_quota_on
        scores = ((name, fits.views[name].score) for name in fitting)
        chosen = policy.pick_node(scores, ask.node_policy or node_policy)
        victims: tuple[str, ...] = ()
        if chosen is None:
            misses = {n: r for n, r in results.items() if isinstance(r, fit.Miss)}
            residents = {
                n: [preempt.Resident(k, p, u, float(o)) for k, (_, u, p, o) in held_by.items()]
                for n, held_by in on_node.items()
            }
            got = choose(
                ask,
                priority=model.priority(pod.pod),
                # the filter calls a node over quota unresolvable: kube-scheduler preempts elsewhere
                views={n: v for n, v in fits.views.items() if n not in over_quota_on},
                residents=residents,
                gpu_policy=ask.gpu_policy or gpu_policy,
            )
            if got is None:
                pending.append(Pending(pod, misses))
                continue
            chosen, victims = got
            for key in victims:  # evicted: its footprint leaves the node, it waits again
                gone, footprint, _, _ = on_node[chosen].pop(key)
                usage.add(used[chosen], footprint, sign=-1)
                ns = str(gone.pod.pod["metadata"].get("namespace", "default"))
                memory, cores = held.get(ns, (0, 0))
                held[ns] = (
                    memory - sum(u.memory_mib for u in footprint.values()),
                    cores - sum(u.cores for u in footprint.values()),
                )
                placed.remove(gone)
                reason = fit.Miss(f"preempted by {pod.key} on {chosen}")
                pending.append(Pending(gone.pod, {NodeName(chosen): reason}))
            view = fit.NodeGpus.build(fits.views[NodeName(chosen)].gpus, used[chosen], cordoned[chosen])
            fits.changed(NodeName(chosen), view)
            results = {NodeName(chosen): fit.fit_pod(ask, view, gpu_policy=ask.gpu_policy or gpu_policy)}
            preemptions.append(Preemption(pod.key, NodeName(chosen), victims))
        node = NodeName(chosen)
        placement = results[node]
        assert isinstance(placement, fit.Placement)
        usage.add(used[node], placement.usage)
        memory, cores = held.get(namespace, (0, 0))
        held[namespace] = (
            memory + sum(u.memory_mib for u in placement.usage.values()),
            cores + sum(u.cores for u in placement.usage.values()),
        )
        fits.changed(node, fit.NodeGpus.build(fits.views[node].gpus, used[node], cordoned[node]))
        placed.append(Placed(pod, node, placement.devices))
        on_node[node][pod.key] = (placed[-1], dict(placement.usage), model.priority(pod.pod), order)
    return Run(
        node_policy,
        gpu_policy,
        cluster,
        tuple(placed),
        tuple(pending),
        tuple(rejected),
        used,
        tuple(preemptions),
        side,
    )


def _quota_problem(
    cluster: Cluster,
    namespace: str,
    held: dict[str, tuple[int, int]],
    ask: PodRequest,
    *,
    config: Config,
    largest: int,
) -> str | None:
    """The filter's quota check at placement (``quota.pod_problem``) against what is placed so far."""
    limits = cluster.quota(namespace)
    if limits is None:
        return None
    used_memory, used_cores = held.get(namespace, (0, 0))
    facts = dataclasses.replace(limits, used_memory_mib=used_memory, used_cores=used_cores)
    return quota.pod_problem(
        ask,
        namespace=namespace,
        quota=facts,
        largest_gpu_memory_mib=largest,
        memory_factor=config.webhook.memory_factor,
    )


def _within_quota(
    cluster: Cluster,
    namespace: str,
    held: dict[str, tuple[int, int]],
    results: dict[NodeName, fit.Placement | fit.Miss],
    fitting: set[NodeName],
    *,
    ask: PodRequest,
    views: Mapping[NodeName, fit.NodeGpus],
    gpu_policy: Policy,
    factor: int,
) -> tuple[dict[NodeName, fit.Placement | fit.Miss], set[NodeName]]:
    """``results`` (a copy) with each fitting node's placement checked against the namespace's
    quota as the filter checks it (``quota.fit_within``): replaced by the one that fits within it,
    or failed with the quota's reason when none does; and the nodes that failed."""
    limits = cluster.quota(namespace)
    if limits is None:
        return results, set()
    used_memory, used_cores = held.get(namespace, (0, 0))
    facts = dataclasses.replace(limits, used_memory_mib=used_memory, used_cores=used_cores)
    results, over_quota_on = dict(results), set()

    def problem(footprint: Mapping[GpuUuid, GpuUsage]) -> str | None:
        return quota.placement_problem(namespace, facts, footprint, memory_factor=factor)

    for name in fitting:
        placement = results[name]
        assert isinstance(placement, fit.Placement)
        within = quota.fit_within(ask, views[name], placement, gpu_policy=gpu_policy, problem=problem)
        if isinstance(within, str):
            results[name] = fit.Miss(within, unresolvable=True)
            over_quota_on.add(name)
        else:
            results[name] = within
    return results, over_quota_on


@dataclass
class _Entry:
    results: dict[NodeName, fit.Placement | fit.Miss]
    fitting: set[NodeName]
    dirty: set[NodeName]


class _FitCache:
    """``fit.fit_pod`` results per (request, GPU policy) and node, recomputed only on nodes whose
    usage changed since: a result depends on nothing else, and replicas share one request, so
    placing N replicas costs about N fits instead of N x nodes. Holds ``MAX_REQUESTS`` requests."""

    MAX_REQUESTS = 64

    def __init__(self, views: dict[NodeName, fit.NodeGpus]) -> None:
        self.views = views
        self._entries: collections.OrderedDict[tuple[PodRequest, Policy], _Entry] = collections.OrderedDict()

    def results(
        self, ask: PodRequest, gpu_policy: Policy
    ) -> tuple[dict[NodeName, fit.Placement | fit.Miss], set[NodeName]]:
        """Every node's result for ``ask``, and the nodes where it fits (both live: do not keep)."""
        key = (ask, gpu_policy)
        entry = self._entries.get(key)
        if entry is None:
            entry = _Entry({}, set(), set(self.views))
            self._entries[key] = entry
            if len(self._entries) > self.MAX_REQUESTS:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        for name in entry.dirty:
            result = fit.fit_pod(ask, self.views[name], gpu_policy=gpu_policy)
            entry.results[name] = result
            if isinstance(result, fit.Placement):
                entry.fitting.add(name)
            else:
                entry.fitting.discard(name)
        entry.dirty.clear()
        return entry.results, entry.fitting

    def changed(self, node: NodeName, view: fit.NodeGpus) -> None:
        self.views[node] = view
        for entry in self._entries.values():
            entry.dirty.add(node)
