"""The own preemption path (issue 50): GPU preemption that does not wait for kube-scheduler's call.

kube-scheduler cannot see GPU slices. For a pod that is short only of GPU memory or cores (CPU to
spare), its in-tree dry run finds that the pod fits once nothing is evicted, drops every node
("expected at least one victim pod"), and never calls ``/preempt``: every release before
kubernetes PR #135486, and v1.20/v1.21 never call it at all. So when ``/filter`` fails a pod on
every node it was offered (those nodes passed kube-scheduler's own filters: the shortfall is the
GPU's), ``shortfall`` notes it, and ``step`` (run every second, off the hot path) may preempt:

* only with ``scheduler.preemption`` ``auto`` or ``self`` and ``preemptionsPerMinute`` above 0;
* after ``preemptionGraceS``, and not when kube-scheduler called ``/preempt`` for the pod since its
  filter failed or nominated it to a node where a lower-priority pod is still terminating (it
  preempts for the pod itself), nor while the pod has a
  preemption of this path under way (never two at once), nor during its back-off;
* only when its PriorityClass (``priorities.py``, not the pod's copy) allows preempting
  (``preemptionPolicy`` not ``Never``);
* at most ``preemptionsPerMinute`` preemptions started per minute, cluster-wide.

The victims are chosen as ``/preempt`` chooses them (``Preempter.judge``: the fewest pods of the
lowest priority, budgets respected when possible) on the nodes the filter failed, never pods of
equal or higher priority, system-critical pods (priority 2000000000 and above) or pods of
``preemptionExcludedNamespaces``; the node as kube-scheduler picks one (``preempt.pick_node``).
The node is held for the pod (``Nominations.hold``: ``/filter`` gives no other pod of its priority
or lower what the victims free), then the victims are evicted through the Eviction API, those
a budget selects first: a refused eviction (429, a budget allows none now) before any other went
makes that pod spared and the choice is made again (another set or node, ``ATTEMPTS`` in all).
Events: ``Preempted`` on each victim, ``Preempting`` on the pod. Once the victims are gone the pod
is nudged (``FilterRetries.ask_retry``) and kube-scheduler's next attempt binds it.

A preemption ends when the pod is bound (``bound``), goes away or gets a decision on another node
(``cancelled``), or its victims are not gone after ``preemptionVictimTimeoutS`` (``timeout``: the
hold is released and the pod backs off, 10 s doubling to 10 minutes, as after ``none`` and
``refused``). Each decision is a ``Record`` (the dashboard's and ``vgpu status``'s list) and a count
of ``vgpu_scheduler_preemptions_total{path="self", outcome}``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.core import errors, request
from vgpu.core import preempt as victims_of
from vgpu.core.config import Config, Preemption
from vgpu.kube.port import JsonObj, KubeApi

from vgpu_scheduler import dashboard, nominated
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.extender import pod_ref
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.preempt import Preempter
from vgpu_scheduler.priorities import PriorityClasses
from vgpu_scheduler.state import ClusterState

log = logging.getLogger(__name__)

SYSTEM_CRITICAL = 2_000_000_000  # system-cluster-critical; system-node-critical is above it
TICK_S = 1.0
ATTEMPTS = 3  # choices per preemption when evictions are refused
BACKOFF_FIRST_S = 10.0
BACKOFF_MAX_S = 600.0
RECORDS_KEPT = 50
WANTS_KEPT = 1000  # pods waiting for a decision; the oldest are forgotten past this
UNSEEN_KEPT_S = 60.0  # a pod the watch has not shown is waited for this long after its filter

Count = Callable[[str], None]  # (outcome): the metrics counter of the self path


@dataclass(frozen=True)
class Record:
    """One decision of the own path: when, for which pod, where, whom, and how it ended."""

    at_s: float
    pod: str
    node: str
    victims: tuple[str, ...]
    outcome: str  # started, none, refused, partial, error, bound, cancelled, timeout
    message: str

    def row(self) -> dashboard.PreemptionRow:
        return dashboard.PreemptionRow(
            at=self.at_s,
            pod=self.pod,
            node=self.node,
            victims=list(self.victims),
            outcome=self.outcome,
            message=self.message,
        )


@dataclass
class _Under:
    """A preemption under way: the node held, the victims evicted (uid -> ns/name)."""

    pod: str
    node: str
    victims: dict[str, str]
    started_s: float
    nudged: bool = False


def _name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _going(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) or (pod.get("status") or {}).get(
        "phase"
    ) in ("Succeeded", "Failed")


class SelfPreemption:
    """See the module docstring."""

    def __init__(
        self,
        *,
        config: Config,
        state: ClusterState,
        api: KubeApi,
        events: EventRecorder,
        preempter: Preempter,
        priorities: PriorityClasses,
        reasons: FilterReasons,
        clock: Callable[[], float],
        retry: Callable[[str, JsonObj, str], bool] | None = None,
        count: Count | None = None,
    ) -> None:
        """``retry(uid, pod, why)`` asks kube-scheduler to retry a pod (``FilterRetries.ask_retry``)."""
        self._config = config
        self._state = state
        self._api = api
        self._events = events
        self._preempter = preempter
        self._priorities = priorities
        self._reasons = reasons
        self._clock = clock
        self._retry = retry
        self._count = count
        # uid -> (failed at, node -> reason): the filter's own dict, made for that call (no copy
        # on the hot path)
        self._wants: dict[str, tuple[float, Mapping[str, str]]] = {}
        self._verb: dict[str, float] = {}  # uid -> when kube-scheduler last called /preempt for it
        self.under: dict[str, _Under] = {}
        self._backoff: dict[str, tuple[float, float]] = {}  # uid -> (until, next delay)
        self._starts: collections.deque[float] = collections.deque()
        self.records: collections.deque[Record] = collections.deque(maxlen=RECORDS_KEPT)
        self.version = 0  # bumped at each record (the dashboard rebuilds on it)
        self.on_change: Callable[[], None] | None = None
        self._wake = asyncio.Event()
        self._stepping = asyncio.Lock()  # one pass at a time (the loop's and a test's)
        preempter.on_verb = self.verb

    @property
    def enabled(self) -> bool:
        sched = self._config.scheduler
        return sched.preemption in (Preemption.AUTO, Preemption.SELF) and sched.preemptions_per_minute > 0

    # ----- from the hot paths: notes only -----

    def shortfall(self, uid: str, nodes: Mapping[str, str]) -> None:
        """``/filter`` failed pod ``uid`` on every node, ``nodes`` (node -> reason) for GPUs."""
        if not self.enabled or not nodes:
            return
        if uid not in self._wants and len(self._wants) >= WANTS_KEPT:
            self._wants.pop(next(iter(self._wants)))
        self._wants[uid] = (self._clock(), nodes)
        self._wake.set()

    def verb(self, uid: str) -> None:
        """kube-scheduler called ``/preempt`` for pod ``uid``."""
        self._verb[uid] = self._clock()
        if len(self._verb) > WANTS_KEPT:
            self._verb.pop(next(iter(self._verb)))

    # ----- the loop -----

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.step()
            except errors.VgpuError as exc:  # never let one pod's trouble stop the path
                log.warning("own preemption: %s", exc)
            except Exception:  # a bug: said with its traceback, and the next pass runs all the same
                log.exception("own preemption: a pass failed")

    async def step(self) -> None:
        """One pass: follow the preemptions under way, then start those that are due."""
        async with self._stepping:
            await self._step()

    async def _step(self) -> None:
        now = self._clock()
        self._follow(now)
        grace = self._config.scheduler.preemption_grace_s
        for uid, (since, nodes) in list(self._wants.items()):
            pod = self._state.pods.get(uid)
            if pod is None:  # the /filter came before the pod watch showed it, or it is gone
                if now - since > UNSEEN_KEPT_S:
                    del self._wants[uid]
                continue
            if (pod.get("spec") or {}).get("nodeName") or _going(pod):
                del self._wants[uid]
                continue
            if uid in self.under:
                continue  # never two preemptions for one pod
            if now < since + grace:
                continue
            if self._verb.get(uid, float("-inf")) >= since or self._preempting_itself(pod):
                del self._wants[uid]  # kube-scheduler preempts for it itself
                continue
            if self._reasons.get(uid) is None or self._state.decision(uid) is not None:
                del self._wants[uid]  # it passed a filter since: it fits somewhere
                continue
            if now < self._backoff.get(uid, (0.0, 0.0))[0]:
                continue
            standing = self._priorities.standing(pod)
            if not standing.may_preempt:
                del self._wants[uid]
                continue
            while self._starts and now - self._starts[0] >= 60.0:
                self._starts.popleft()
            if len(self._starts) >= self._config.scheduler.preemptions_per_minute:
                continue  # the cluster-wide rate: it stays wanted
            del self._wants[uid]
            try:
                ask = request.parse_pod(pod, self._config)
            except errors.ParseError:
                continue  # its filter reports it
            await self._preempt(uid, pod, ask=ask, priority=standing.priority, nodes=tuple(nodes), now=now)

    def _preempting_itself(self, pod: JsonObj) -> bool:
        """kube-scheduler nominated ``pod`` and a pod of lower priority on that node is still
        terminating: its own preemption is under way (its eligibility rule). A nomination whose
        victims are gone (v1.20 evicting for CPU only, say) leaves a GPU shortfall to this path."""
        node = nominated.nominated_node(pod)
        if node is None:
            return False
        mine = nominated.priority(pod)
        return any(
            (other.get("spec") or {}).get("nodeName") == node
            and (other.get("metadata") or {}).get("deletionTimestamp")
            and nominated.priority(other) < mine
            for other in self._state.pods.values()
        )

    # ----- one preemption -----

    def _spare(self, victim: str, blocked: set[str]) -> bool:
        pod = self._state.pods.get(victim) or {}
        ns = (pod.get("metadata") or {}).get("namespace") or "default"
        return (
            victim in blocked
            or nominated.priority(pod) >= SYSTEM_CRITICAL
            or ns in self._config.scheduler.preemption_excluded_namespaces
        )

    async def _preempt(
        self,
        uid: str,
        pod: JsonObj,
        *,
        ask: request.PodRequest,
        priority: int,
        nodes: tuple[str, ...],
        now: float,
    ) -> None:
        who = _name(pod)
        blocked: set[str] = set()
        refusals: list[str] = []
        for _ in range(ATTEMPTS):
            answers, dropped, _skipped = await self._preempter.judge(
                uid,
                ask,
                priority=priority,
                proposals={node: [] for node in nodes},
                spare=lambda victim: self._spare(victim, blocked),
            )
            if not answers:
                why = "; ".join(f"{n}: {r}" for n, r in sorted(dropped.items())[:3]) or "no candidate node"
                message = f"no lower-priority GPU pods whose eviction makes room ({why})"
                if refusals:
                    message += f"; refused: {'; '.join(refusals)}"
                self._record(Record(now, who, "", (), "refused" if refusals else "none", message))
                self._back_off(uid, now)
                return
            prios = {
                v: nominated.priority(self._state.pods.get(v) or {}) for a in answers.values() for v in a.uids
            }
            node = victims_of.pick_node(answers, prios)
            victims = {v: _name(self._state.pods.get(v) or {}) for v in answers[node].uids}
            self._state.nominations.hold(uid, node)
            self.under[uid] = _Under(who, node, victims, now)
            self._starts.append(now)
            evicted, refused = await self._evict(victims, self._budgeted(victims))
            if refused is None:
                self._started(pod, priority=priority, node=node, victims=victims, now=now)
                return
            victim, why = refused
            if evicted:  # the others went: keep the node held for what they free
                self.under[uid].victims = {v: victims[v] for v in evicted}
                self._record(Record(now, who, node, tuple(victims[v] for v in evicted), "partial", why))
                self._back_off(uid, now)
                return
            del self.under[uid]
            self._state.nominations.release(uid)
            blocked.add(victim)
            refusals.append(why)
        self._record(Record(now, who, "", (), "refused", f"evictions refused: {'; '.join(refusals)}"))
        self._back_off(uid, now)

    def _budgeted(self, victims: Mapping[str, str]) -> list[str]:
        """The victims in eviction order: those a disruption budget selects first (a refusal then
        comes before any other pod went)."""
        selected, _ = self._preempter.budgets.for_pods(self._state.pods.get(v) or {} for v in victims)
        return sorted(victims, key=lambda v: (v not in selected, victims[v]))

    async def _evict(
        self, victims: Mapping[str, str], order: list[str]
    ) -> tuple[list[str], tuple[str, str] | None]:
        """Evict in ``order``; (the evicted, (the first refused one, why) or None)."""
        evicted: list[str] = []
        for uid in order:
            ns, _, name = victims[uid].partition("/")
            try:
                await self._api.evict_pod(ns, name, uid=uid)
            except errors.NotFound:
                pass  # gone already
            except errors.KubeError as exc:
                why = f"{victims[uid]}: {exc}"
                log.info("own preemption: eviction of %s refused: %s", victims[uid], exc)
                return evicted, (uid, why)
            evicted.append(uid)
        return evicted, None

    def _started(
        self, pod: JsonObj, *, priority: int, node: str, victims: Mapping[str, str], now: float
    ) -> None:
        who = _name(pod)
        names = ", ".join(sorted(victims.values()))
        for victim in victims:
            target = self._state.pods.get(victim)
            if target is not None:
                self._emit(
                    target,
                    "Preempted",
                    f"Preempted by pod {who} (priority {priority}) to free GPUs on node {node} "
                    "(evicted by vgpu-scheduler: kube-scheduler does not preempt for GPU-only shortfalls)",
                )
        self._emit(pod, "Preempting", f"evicting {len(victims)} pod(s) on node {node} to make room: {names}")
        self._record(
            Record(now, who, node, tuple(victims.values()), "started", f"holding node {node} for it")
        )
        log.info("own preemption for %s: node %s held, evicting %s", who, node, names)

    # ----- what happens next -----

    def _follow(self, now: float) -> None:
        timeout = self._config.scheduler.preemption_victim_timeout_s
        for uid, under in list(self.under.items()):
            pod = self._state.pods.get(uid)
            bound = (pod or {}).get("spec", {}).get("nodeName")
            decision = self._state.decision(uid)
            if pod is None or (_going(pod) and not bound):
                self._finish(uid, under, "cancelled", "the pod went away", now)
            elif bound:
                outcome = "bound" if bound == under.node else "cancelled"
                self._finish(uid, under, outcome, f"bound to node {bound}", now)
            elif decision is not None and decision.node != under.node:
                self._finish(uid, under, "cancelled", f"it fits on node {decision.node}", now)
            elif now - under.started_s > timeout:
                left = [n for v, n in under.victims.items() if v in self._state.pods]
                why = (
                    f"victims not gone after {timeout:g} s: {', '.join(left)}"
                    if left
                    else "not bound in time"
                )
                self._finish(uid, under, "timeout", why, now)
                self._back_off(uid, now)
            elif not under.nudged and not any(v in self._state.pods for v in under.victims):
                under.nudged = self._retry is None or self._retry(
                    uid, pod, f"its preemption victims on node {under.node} are gone"
                )

    def _finish(self, uid: str, under: _Under, outcome: str, message: str, now: float) -> None:
        del self.under[uid]
        self._state.nominations.release(uid)
        self._record(Record(now, under.pod, under.node, tuple(under.victims.values()), outcome, message))

    def _back_off(self, uid: str, now: float) -> None:
        _, delay = self._backoff.get(uid, (0.0, BACKOFF_FIRST_S))
        self._backoff[uid] = (now + delay, min(delay * 2, BACKOFF_MAX_S))
        if len(self._backoff) > WANTS_KEPT:
            self._backoff.pop(next(iter(self._backoff)))

    def rows(self) -> list[dashboard.PreemptionRow]:
        """The latest decisions, oldest first, for the dashboard."""
        return [r.row() for r in self.records]

    def _record(self, record: Record) -> None:
        self.records.append(record)
        self.version += 1
        if self.on_change is not None:
            self.on_change()
        if self._count is not None:
            self._count(record.outcome)
        if record.outcome not in ("started", "bound"):
            log.info("own preemption for %s: %s: %s", record.pod, record.outcome, record.message)

    def _emit(self, pod: JsonObj, reason: str, message: str) -> None:
        try:
            self._events.emit(pod_ref(pod), reason=reason, message=message)
        except RuntimeError:  # no running loop (unit tests feeding the state directly)
            log.info("%s: %s", _name(pod), message)
