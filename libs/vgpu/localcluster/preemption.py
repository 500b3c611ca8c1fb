"""kube-scheduler's PostFilter, emulated: DefaultPreemption with preemption-capable extenders.

Three behaviours, chosen by the emulated kube-scheduler's version (``Behaviour.of``):

* **v1.20, v1.21**: DefaultPreemption is not given the extenders (kubernetes #102971, fixed by
  #103019 in v1.22): the preempt verb is never called; only in-tree victims are evicted.
* **v1.22 to v1.36** (what users run): the in-tree dry run drops a node where it needs no victim
  ("expected at least one victim pod on node ..."), so the preempt verb is called only with nodes
  where kube-scheduler found victims of its own (CPU, memory, pods): a GPU-only shortfall is never
  offered to the extender.
* **``pr135486``**: as upstream since kubernetes PR #135486, a node that fits in-tree with no victim
  stays a candidate with an empty list, for the extenders to judge.

Not emulated: v1.20 nominating a node where its dry run needs no victim (and the panic of
kubernetes #101548 on its retry); the emulation drops such nodes in every version.

For a pod that fits no node, as kube-scheduler's ``Evaluator.Preempt`` does:

1. **Eligibility**: ``preemptionPolicy: Never`` never preempts; a pod already nominated to a node
   where a lower-priority pod is still terminating waits for it (no new preemption).
2. **Dry run** on every node not rejected as unresolvable: remove every pod of lower priority
   (``spec.priority``, set from the PriorityClass at admission), check the in-tree filters (our
   ``ignoredByScheduler`` resources ignored, as upstream), and reprieve pods back, highest priority
   first, while it still fits. A node that fits with no in-tree victim is dropped, or (``pr135486``)
   stays a candidate with an empty list, for the extenders to judge.
3. **Extenders** (from v1.22) with a ``preemptVerb`` that are interested, in config order, each on the previous
   one's answer: every node must be a candidate, every victim a pod on that node, and every list
   non-empty (else the call is an error; an ``ignorable`` extender's empty nodes are dropped).
4. **Pick a node** (``pickOneNodeForPreemption``): fewest PDB violations, then the lowest highest
   victim priority, the lowest sum of priorities, the fewest victims, then the name.
5. **Prepare**: a ``Preempted`` event on each victim, the victims deleted with their
   ``terminationGracePeriodSeconds`` (default 30), the preemptor's ``status.nominatedNodeName`` set.
   The preemptor is retried when the victims' deletion frees the node (a cluster event).

Returns the line kube-scheduler appends to the FailedScheduling message ("preemption: ..."), or
None when no preemption happens: unlike upstream, "No preemption victims found" is not appended,
so messages of clusters that never preempt read as before. When every node that reported a reason
rejected the pod as unresolvable (an extender's ``FailedAndUnresolvableNodes``, the DRA Filter's
"cannot allocate all claims"), the line is upstream's ``preemption: 0/N nodes are available: N
Preemption is not helpful for scheduling.``, as the real 1.36 writes it for a DRA pod no GPU can
take (``tests/realk8s/test_dra_pending_real.py``).
"""

from __future__ import annotations

import contextlib
import decimal
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster import extender, intree, podresources, schedcache, statuswriter

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30
NOT_HELPFUL = "Preemption is not helpful for scheduling"  # upstream's status for such a node
VERSIONS = ("1.20", "1.21", "1.22", "1.36", "pr135486")  # those tests name; any 1.N parses
DEFAULT_VERSION = "1.36"


@dataclass(frozen=True)
class Behaviour:
    """What an emulated kube-scheduler version does in preemption (see the module doc)."""

    version: str
    calls_extenders: bool
    offers_empty: bool

    @classmethod
    def of(cls, version: str) -> Behaviour:
        """``1.N`` (a ``v`` prefix and a patch number allowed) or ``pr135486``; ConfigError otherwise."""
        if version == "pr135486":
            return cls(version, calls_extenders=True, offers_empty=True)
        parts = version.removeprefix("v").split(".")
        if len(parts) not in (2, 3) or parts[0] != "1" or not all(p.isdigit() for p in parts):
            raise errors.ConfigError("kube-scheduler version", f"expected 1.N or pr135486, got {version!r}")
        return cls(version, calls_extenders=int(parts[1]) >= 22, offers_empty=False)


Emit = Callable[[JsonObj, str, str, str], None]  # (pod, reason, message, type)


def priority(pod: Mapping[str, Any]) -> int:
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


@dataclass(frozen=True)
class Candidate:
    node: str
    victims: tuple[JsonObj, ...]
    lower: int = 0  # pods of lower priority on the node (the potential victims)

    def key(self) -> tuple[int, int, int, int, str]:
        prios = [priority(v) for v in self.victims]
        return (0, max(prios, default=-(2**31)), sum(prios), len(prios), self.node)


class Preemption:
    """DefaultPreemption over the scheduler emulation's cache and informer; see the module doc."""

    def __init__(
        self,
        api: KubeApi,
        *,
        cache: schedcache.SchedulerCache,
        pods: informer.Informer,
        extenders: Sequence[extender.ExtenderConfig],
        client: extender.ExtenderClient,
        ignored: Collection[str],
        status: statuswriter.StatusWriter,
        emit: Emit,
        behaviour: Behaviour | None = None,
    ) -> None:
        self._behaviour = behaviour or Behaviour.of(DEFAULT_VERSION)
        self._api = api
        self._cache = cache
        self._pods = pods
        self._extenders = extenders
        self._client = client
        self._ignored = ignored
        self._status = status
        self._emit = emit

    def _pod(self, key: schedcache.PodKey) -> JsonObj | None:
        return self._pods.get(*key)

    def _eligible(self, pod: JsonObj) -> str | None:
        """Why ``pod`` may not preempt now, or None."""
        spec = pod.get("spec") or {}
        if spec.get("preemptionPolicy") == "Never":
            return "not eligible due to preemptionPolicy=Never"
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if nominated:
            mine = priority(pod)
            for key, _ in self._cache.pods_on(nominated):
                other = self._pod(key)
                if (
                    other
                    and (other.get("metadata") or {}).get("deletionTimestamp")
                    and priority(other) < mine
                ):
                    return "not eligible due to a terminating pod on the nominated node"
        return None

    def _dry_run(self, pod: JsonObj, node: str) -> Candidate | None:
        facts = self._cache.facts(node)
        if facts is None:
            return None
        request = podresources.pod_requests(pod)
        want = intree.pod_facts(pod, request, ignored=self._ignored)
        mine = priority(pod)
        used = dict(self._cache.used(node))
        count = self._cache.pods_counted(node)
        lower: list[tuple[JsonObj, Mapping[str, decimal.Decimal]]] = []
        for key, asked in self._cache.pods_on(node):
            other = self._pod(key)
            if other is None or priority(other) >= mine or (other.get("spec") or {}).get("nodeName") != node:
                continue
            lower.append((other, asked))
            for name, amount in asked.items():
                used[name] = used.get(name, decimal.Decimal(0)) - amount
            count -= 1
        if facts.reasons(want, used, pods_on_node=count):
            return None  # removing every lower-priority pod is not enough for the in-tree filters
        victims: list[JsonObj] = []
        lower.sort(key=lambda pa: (-priority(pa[0]), (pa[0].get("status") or {}).get("startTime") or ""))
        for other, asked in lower:  # reprieve, most important first
            trial = dict(used)
            for name, amount in asked.items():
                trial[name] = trial.get(name, decimal.Decimal(0)) + amount
            if facts.reasons(want, trial, pods_on_node=count + 1):
                victims.append(other)
            else:
                used, count = trial, count + 1
        return Candidate(node, tuple(victims), len(lower))

    async def post_filter(
        self, pod: JsonObj, statuses: Mapping[str, list[str]], unresolvable: Collection[str]
    ) -> str | None:
        """Try to make room for ``pod``; the "preemption: ..." text for its FailedScheduling."""
        why = self._eligible(pod)
        if why == "not eligible due to preemptionPolicy=Never":
            return None
        if why is not None:
            return f"preemption: {why}"
        if statuses and all(node in unresolvable for node in statuses):
            # findCandidates: no node where removing pods could help, so Preempt's FitError counts
            # every node as "not helpful" (the DynamicResources Filter's refusals are such)
            total = len(self._cache.node_names())
            return f"preemption: 0/{total} nodes are available: {total} {NOT_HELPFUL}."
        candidates = {
            c.node: c
            for node in statuses
            if node not in unresolvable
            for c in [self._dry_run(pod, node)]
            if c is not None
        }
        if not self._behaviour.offers_empty:
            # no lower-priority pod: "No preemption victims found" (not appended, see the module
            # doc); lower-priority pods but none needed in-tree: an error status for the node
            empty = sorted(n for n, c in candidates.items() if not c.victims and c.lower)
            candidates = {n: c for n, c in candidates.items() if c.victims}
            if not candidates and empty:
                log.info("preemption for pod %s: no in-tree victim on %d node(s)", _uid(pod), len(empty))
                return f'preemption: expected at least one victim pod on node "{empty[0]}"'
        try:
            candidates = await self._call_extenders(pod, candidates)
        except errors.SchedulingError as err:
            log.warning("preemption for pod %s: %s", _uid(pod), err)
            return f"preemption: error calling extenders: {err}"
        if not candidates:
            return None
        best = min(candidates.values(), key=Candidate.key)
        await self._prepare(pod, best)
        names = ", ".join(str((v.get("metadata") or {}).get("name")) for v in best.victims)
        return (
            f"preemption under way: nominated node {best.node}, evicting {len(best.victims)} pod(s): {names}"
        )

    async def _call_extenders(self, pod: JsonObj, candidates: dict[str, Candidate]) -> dict[str, Candidate]:
        if not self._behaviour.calls_extenders:
            return candidates
        for ext in self._extenders:
            if not candidates:
                break
            if not ext.preempt_verb or not ext.is_interested(pod):
                continue
            offered = {n: list(c.victims) for n, c in candidates.items()}
            try:
                answer = await self._client.preempt(ext, pod, offered)
            except errors.SchedulingError:
                if ext.ignorable:
                    continue
                raise
            chosen: dict[str, Candidate] = {}
            for node, uids in answer.items():
                if node not in candidates:
                    raise errors.SchedulingError(f'nodeinfo not found for node name "{node}"')
                if not uids:
                    if ext.ignorable:
                        continue
                    raise errors.SchedulingError(f'expected at least one victim pod on node "{node}"')
                on_node = {_uid(p): p for key, _ in self._cache.pods_on(node) if (p := self._pod(key))}
                missing = [u for u in uids if u not in on_node]
                if missing:
                    raise errors.SchedulingError(
                        f"extender: {ext.url_prefix} claims to preempt pod (UID: {missing[0]}) on node: "
                        f"{node}, but the pod is not found on that node"
                    )
                chosen[node] = Candidate(node, tuple(on_node[u] for u in uids))
            candidates = chosen
        return {n: c for n, c in candidates.items() if c.victims}

    async def _prepare(self, pod: JsonObj, best: Candidate) -> None:
        meta = pod.get("metadata") or {}
        for victim in best.victims:
            vmeta = victim.get("metadata") or {}
            self._emit(
                victim, "Preempted", f"Preempted by pod {meta.get('uid')} on node {best.node}", "Normal"
            )
            grace = (victim.get("spec") or {}).get("terminationGracePeriodSeconds")
            grace = grace if isinstance(grace, int) and grace >= 0 else DEFAULT_GRACE_S
            with contextlib.suppress(errors.NotFound):  # already gone
                await self._api.delete(
                    "pods", vmeta["name"], namespace=vmeta.get("namespace"), grace_period_s=grace
                )
            log.info(
                "preempting %s/%s on %s for %s/%s",
                vmeta.get("namespace"),
                vmeta.get("name"),
                best.node,
                meta.get("namespace"),
                meta.get("name"),
            )
        await self._status.merge_patch_status(
            "pods",
            str(meta.get("name")),
            {"status": {"nominatedNodeName": best.node}},
            namespace=str(meta.get("namespace") or "default"),
        )
