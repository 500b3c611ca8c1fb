"""``POST /preempt``: ExtenderPreemptionArgs in, ExtenderPreemptionResult out, from memory (issue 14).

kube-scheduler's DefaultPreemption cannot see GPU slices (``nvidia.com/gpumem`` and friends are
``ignoredByScheduler``), so for a pod that fits nowhere it offers each candidate node with its own
victims (none, for a GPU-only shortfall; kube-scheduler since kubernetes PR #135486 passes such
nodes on with an empty list). For every node we pick the fewest lower-priority GPU pods whose
slices, once freed, let the preemptor fit by ``/filter``'s rules (``vgpu.core.preempt``), keeping
kube-scheduler's own victims. Both modes: ``NodeNameToVictims`` (full pods, not nodeCacheCapable)
and ``NodeNameToMetaVictims`` (UIDs); the answer is always ``NodeNameToMetaVictims``, as
kube-scheduler reads it.

kube-scheduler treats a node with an empty victim list in the answer as an error, so nodes without a
solution are left out; when some nodes' victims break no disruption budget only those are kept.
``ExtenderPreemptionResult`` has no ``Error`` member: a request naming victims we do not know, or
on another node, is answered HTTP 200 with an empty result (no preemption this cycle), the reason
logged and put in an extra ``Error`` member (Go's decoder ignores it); a body that is not
ExtenderPreemptionArgs is HTTP 400. Nothing is written: kube-scheduler deletes the victims and
nominates the preemptor. When the preemptor's nomination comes back through the watch, each
victim we proposed on that node gets a ``Preempted`` event naming the preemptor and the GPUs.
The request's reading and the answer's writing are ``vgpu_scheduler.preemptwire``'s.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vgpu.core import errors, fit, lease, request
from vgpu.core import preempt as victims_of
from vgpu.core.config import Config, Preemption
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_scheduler import nominated, pacing, preemptwire
from vgpu_scheduler.budgets import Budgets
from vgpu_scheduler.charges import Charge
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.extender import pod_ref
from vgpu_scheduler.priorities import PriorityClasses
from vgpu_scheduler.state import ClusterState

log = logging.getLogger(__name__)

PROPOSALS_KEPT = 256  # preemptors whose last answer is remembered for the Preempted events
# the work of one call (issue 49) is paced (pacing.py): the body is read, the nodes judged and the
# answer written in slices, with a turn of the loop between slices (a /filter or /webhook waits for
# the rest of one slice at most), and nodes not judged after BUDGET_S of the loop thread's CPU time,
# or after DEADLINE_S of it with the turns (the loop is shared fairly with the calls beside it:
# under a stream of /filter calls the call's time grows past its own work), are left out of the
# answer (kube-scheduler picks one node of those answered); both count the loop thread's CPU only,
# so a machine busy with other processes does not shrink the answer
BUDGET_S = 0.025
DEADLINE_S = 0.040


_by_uid = operator.attrgetter("uid")


def _name(pod: Mapping[str, Any] | None) -> str:
    meta = (pod or {}).get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _start_s(pod: Mapping[str, Any]) -> float:
    raw = (pod.get("status") or {}).get("startTime") or (pod.get("metadata") or {}).get("creationTimestamp")
    try:
        return lease.parse_micro_time(raw).timestamp() if isinstance(raw, str) else 0.0
    except ValueError:
        return 0.0


class Preempter:
    """The preempt verb over a ``ClusterState``: decides in memory, writes nothing."""

    def __init__(
        self,
        *,
        config: Config,
        state: ClusterState,
        events: EventRecorder,
        clock: Callable[[], float],
        budgets: Budgets | None = None,
        priorities: PriorityClasses | None = None,
        api: KubeApi | None = None,
        work_clock: Callable[[], float] = time.thread_time,
        pace_clock: Callable[[], float] = time.perf_counter,
        budget_s: float = BUDGET_S,
        deadline_s: float = DEADLINE_S,
        slice_s: float = pacing.SLICE_S,
    ) -> None:
        """``work_clock`` measures the judging against ``budget_s`` (seconds; the loop thread's CPU
        time, so that a busy machine does not shrink the answer); ``pace_clock`` cuts the work in
        slices of ``slice_s`` with a turn of the loop between them (``pacing.Pacer``); the judging
        stops at ``deadline_s`` of the work clock with the turns (``Pacer.loop_s``) too."""
        self._budgets = budgets or Budgets()
        self._priorities = priorities or PriorityClasses()
        self._api = api  # reads a preemptor the pod watch has not shown yet
        self._work_clock = work_clock
        self._pace_clock = pace_clock
        self._budget_s = budget_s
        self._deadline_s = deadline_s
        self._slice_s = slice_s
        self.on_verb: Callable[[str], None] | None = None  # (preemptor uid): kube-scheduler called
        self._config = config
        self._state = state
        self._events = events
        self._clock = clock
        # preemptor uid -> "node uid uid\nnode uid ..." as answered, for the Preempted events: one
        # string per answer, which the cyclic GC never scans (a dict of 500 nodes' victims kept per
        # request made it run a full collection every few requests)
        self._proposed: collections.OrderedDict[str, str] = collections.OrderedDict()
        # uid -> (pod object, charge, Resident) as last built
        self._residents_cache: dict[str, tuple[JsonObj | None, Charge | None, victims_of.Resident]] = {}
        state.nominations.on_nominated = self._on_nominated

    def _pacer(self) -> pacing.Pacer:
        return pacing.Pacer(slice_s=self._slice_s, clock=self._pace_clock, work_clock=self._work_clock)

    @property
    def budgets(self) -> Budgets:
        return self._budgets

    async def preempt(self, raw: Any) -> preemptwire.PreemptReply:
        pacer = self._pacer()
        args = await preemptwire.parse_args(raw, pacer=pacer)
        del raw  # the parsed body (a container per node) is freed now, not after the judging
        pod = args.pod
        uid = str(pod["metadata"]["uid"])
        state = self._state
        # every victim must be a pod on its node: a node whose proposal names another (our watch
        # behind kube-scheduler's cache, or a stale proposal) is left out, the others are answered
        refused: dict[str, str] = {}
        for node, uids in args.victims.items():
            if not uids:  # kube-scheduler's usual proposal for a GPU-only shortfall
                continue
            await pacer.pace()
            problem = next(filter(None, (self._not_on(victim, node) for victim in uids)), None)
            if problem is not None:
                refused[node] = problem
        message = ""
        if refused:
            shown = "; ".join(f"{n}: {r}" for n, r in sorted(refused.items())[:5])
            message = f"preemption for pod {_name(pod)} refused on {len(refused)} node(s): {shown}"
            log.warning("%s", message)
            if len(refused) == len(args.victims):
                return preemptwire.PreemptReply(await preemptwire.encoded((), message, pacer=pacer), "error")
        try:
            ask = request.parse_pod(pod, self._config)
        except errors.ParseError as exc:
            message = f"pod {_name(pod)}: {exc}"
            log.warning("preemption refused: %s", message)
            return preemptwire.PreemptReply(await preemptwire.encoded((), message, pacer=pacer), "error")
        if not ask.wants_gpu:  # not ours to judge: kube-scheduler's proposal as it is
            given = ((node, uids, args.violations[node]) for node, uids in args.victims.items())
            return preemptwire.PreemptReply(await preemptwire.encoded(given, "", pacer=pacer), "passthrough")
        mode = self._config.scheduler.preemption
        if mode in (Preemption.OFF, Preemption.SELF):
            message = f"GPU preemption through kube-scheduler's call is off (scheduler.preemption: {mode})"
            return preemptwire.PreemptReply(await preemptwire.encoded((), message, pacer=pacer), "none")
        known = state.pods.get(uid) or await self._fetch(pod, uid)
        if known is None:  # its priority is the cluster's, not the body's
            message = f"preemptor {_name(pod)} (uid {uid}) is not a known pod"
            log.warning("preemption refused: %s", message)
            return preemptwire.PreemptReply(await preemptwire.encoded((), message, pacer=pacer), "error")
        if self.on_verb is not None:
            self.on_verb(uid)  # kube-scheduler preempts for this pod itself: the own path stays out
        priority = self._priorities.standing(known).priority
        proposals = (
            {n: uids for n, uids in args.victims.items() if n not in refused} if refused else args.victims
        )
        answers, dropped, skipped = await self.judge(
            uid, ask, priority=priority, proposals=proposals, pacer=pacer
        )
        chosen = victims_of.prefer_unviolating(answers)
        await pacer.pace()
        self._remember(uid, chosen)
        if skipped:
            log.info(
                "preemption for %s: %d node(s) not judged, past this call's %.0f ms of CPU or %.0f ms "
                "with the calls beside it (%d answered)",
                _name(pod),
                skipped,
                self._budget_s * 1000,
                self._deadline_s * 1000,
                len(chosen),
            )
        if dropped:
            shown = "; ".join(f"{n}: {r}" for n, r in sorted(dropped.items())[:5])
            log.info("preemption for %s: %d node(s) without victims (%s)", _name(pod), len(dropped), shown)
        if chosen:
            shown = "; ".join(
                f"{n}: {', '.join(_name(state.pods.get(u)) for u in v.uids)}"
                for n, v in sorted(chosen.items())[:3]
            )
            log.info("preemption for %s: victims on %d node(s) (%s)", _name(pod), len(chosen), shown)
        answered = ((node, v.uids, v.pdb_violations) for node, v in chosen.items())
        return preemptwire.PreemptReply(
            await preemptwire.encoded(answered, message, pacer=pacer), "victims" if chosen else "none"
        )

    async def judge(
        self,
        uid: str,
        ask: request.PodRequest,
        *,
        priority: int,
        proposals: Mapping[str, Sequence[str]],
        spare: Callable[[str], bool] | None = None,
        pacer: pacing.Pacer | None = None,
    ) -> tuple[dict[str, victims_of.Victims], dict[str, str], int]:
        """The victims on each node of ``proposals`` (node -> kube-scheduler's own victims) for pod
        ``uid`` asking ``ask`` at ``priority``, within this call's budget, paced by ``pacer`` (a
        turn of the loop between slices): (node -> victims, node -> why none, nodes not judged).
        ``spare(uid)`` True: that pod is never chosen."""
        state = self._state
        pacer = pacer or self._pacer()
        gpu_policy = nominated.policy_of(ask, self._config)
        answers: dict[str, victims_of.Victims] = {}
        dropped: dict[str, str] = {}
        started = pacer.worked_s()
        judged = 0
        for node, uids in proposals.items():
            await pacer.pace()
            over = pacer.worked_s() - started >= self._budget_s or pacer.loop_s() >= self._deadline_s
            if over and answers:
                break  # the rest is left out (skipped)
            judged += 1
            now = self._clock()
            views: list[fit.NodeGpus | None] = [state.inventory.live_view(node, now)]
            problems: dict[str, str | None] = {}
            if views[0] is not None and node in state.nominations.by_node:
                nominated.hold(state, self._config, [node], views, problems, pod_priority=priority, uid=uid)
            view = views[0]
            if view is None:
                dropped[node] = problems.get(node) or state.problem(node, now) or "no view"
                continue
            residents = self._residents(node, uids, exclude=uid)
            if spare is not None:
                residents = [
                    dataclasses.replace(r, evictable=False) if spare(r.uid) else r for r in residents
                ]
            allowed: dict[str, int] = {}
            if self._budgets.by_namespace:  # which residents' eviction would break a budget
                selected, allowed = self._budgets.for_pods(state.pods.get(r.uid) or {} for r in residents)
                residents = [dataclasses.replace(r, pdbs=selected.get(r.uid, ())) for r in residents]
            search = victims_of.search_victims(
                ask,
                view,
                residents,
                priority=priority,
                gpu_policy=gpu_policy,
                proposed=uids,
                pdb_allowed=allowed,
            )
            while True:  # a turn of the loop between fit checks once the slice is used up
                try:
                    next(search)
                except StopIteration as done:
                    got: victims_of.Victims | victims_of.NoVictims = done.value
                    break
                await pacer.pace()
            if isinstance(got, victims_of.NoVictims):
                dropped[node] = got.reason
            else:
                answers[node] = got
        return answers, dropped, len(proposals) - judged

    async def _fetch(self, pod: JsonObj, uid: str) -> JsonObj | None:
        """The preemptor from the API server when the pod watch has not shown it yet (kube-scheduler
        calls /preempt at once for a pod short of CPU too, before any /filter): None when it is not
        there with that UID."""
        if self._api is None:
            return None
        meta = pod.get("metadata") or {}
        try:
            got = await self._api.get(
                "pods", str(meta.get("name")), namespace=str(meta.get("namespace") or "default")
            )
        except errors.KubeError as exc:
            log.info("preemptor %s not readable: %s", _name(pod), exc)
            return None
        return got if (got.get("metadata") or {}).get("uid") == uid else None

    def _not_on(self, uid: str, node: str) -> str | None:
        """Why ``uid`` is no pod on ``node`` (unknown, or elsewhere), or None."""
        pod = self._state.pods.get(uid)
        if pod is None:
            return f"victim uid {uid} on node {node} is not a known pod"
        charge = self._state.decision(uid)
        where = (pod.get("spec") or {}).get("nodeName") or (charge.node if charge else None)
        if where != node:
            return f"victim {_name(pod)} (uid {uid}) is on node {where or 'none'}, not on {node}"
        return None

    def _residents(self, node: str, proposed: Sequence[str], *, exclude: str) -> list[victims_of.Resident]:
        state = self._state
        cache = self._residents_cache
        if len(cache) > 2 * len(state.pods) + 1024:
            cache.clear()
        pods, charges = state.pods, state.charges  # the plain dicts: this runs per node and resident
        here = state.charged_on(node)
        out = []
        for uid in [*here, *(u for u in dict.fromkeys(proposed) if u not in here)] if proposed else here:
            if uid == exclude:
                continue
            pod = pods.get(uid)
            charge = charges.get(uid)
            known = cache.get(uid)
            if known is not None and known[0] is pod and known[1] is charge and known[2].uid == uid:
                resident = known[2]
            else:  # objects are replaced, never changed in place: identity tells a change
                resident = self._resident(uid, node, pod or {}, charge)
                cache[uid] = (pod, charge, resident)
            if resident.usage or uid in proposed:
                out.append(resident)
        out.sort(key=_by_uid)  # decisions never depend on set order
        return out

    @staticmethod
    def _resident(uid: str, node: str, pod: Mapping[str, Any], charge: Charge | None) -> victims_of.Resident:
        bound = (pod.get("spec") or {}).get("nodeName") == node
        deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
        return victims_of.Resident(
            uid,
            nominated.priority(pod),
            charge.usage if charge is not None and charge.node == node else {},
            start_s=_start_s(pod),
            evictable=bound and not deleting,
        )

    def _remember(self, uid: str, chosen: Mapping[str, victims_of.Victims]) -> None:
        self._proposed.pop(uid, None)
        if not chosen:
            return
        self._proposed[uid] = "\n".join(f"{node} {' '.join(v.uids)}" for node, v in chosen.items())
        while len(self._proposed) > PROPOSALS_KEPT:
            self._proposed.popitem(last=False)

    def _gpus_of(self, uid: str) -> str:
        charge = self._state.decision(uid)
        return ",".join(sorted(charge.usage)) if charge is not None and charge.usage else "none"

    def _on_nominated(self, pod: JsonObj, node: str) -> None:
        """The preemptor was nominated to ``node``: a Preempted event on each victim we proposed."""
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        lines = self._proposed.pop(uid, "").split("\n")
        proposed = next((line.split()[1:] for line in lines if line.split(" ", 1)[0] == node), [])
        for victim in proposed:
            target = self._state.pods.get(victim)
            if target is None:
                continue
            message = (
                f"Preempted by pod {_name(pod)} (priority {nominated.priority(pod)}) "
                f"to free GPU {self._gpus_of(victim)} on node {node}"
            )
            try:
                self._events.emit(pod_ref(target), reason="Preempted", message=message)
            except RuntimeError:  # no running loop (unit tests feeding the state directly)
                log.info("%s: %s", _name(target), message)
