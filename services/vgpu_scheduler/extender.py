"""``POST /filter``: ExtenderArgs in, ExtenderFilterResult out (docs/protocol.md#scheduler-extender), from memory.

Every candidate node is checked against the pod's request with ``vgpu.core.fit`` on the node's
current usage (including reservations of decisions still in flight); nodes that do not fit get a
short reason in ``FailedNodes``, or in ``FailedAndUnresolvableNodes`` when evicting pods would not
help. The best fitting node (node policy) is reserved in memory, and that is all: the filter
writes nothing to the API server. kube-scheduler calls filter inside its serial, one-pod-at-a-time
scheduling cycle, so any round trip here would cap the whole cluster's rate; the decision is
written by ``/bind`` (binder.py), which kube-scheduler runs concurrently per pod. Among fitting
nodes, one where a bind is under way (node lock held, or a decision not yet bound) is chosen only
when no other node fits: a bind there would wait for the lock.

Both kube-scheduler modes: ``NodeNames`` in and out (nodeCacheCapable) or ``Nodes`` in and out (a
NodeList holding only the chosen node; inventories are then read from the Node objects given).
A pod asking for none of our resources gets its input back unchanged, with no side effects.
"""

import itertools
import logging
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from vgpu.core import annotations, errors, fit, quota, request
from vgpu.core.config import Config, Policy
from vgpu.kube.port import JsonObj

from vgpu_scheduler import bodies, nominated
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.inventory import Picked
from vgpu_scheduler.pending import Ask, FilterReasons
from vgpu_scheduler.state import ClusterState

log = logging.getLogger(__name__)

MISS_MEMO_SIZE = 16  # distinct pod requests remembered per node view
Outcome = Literal["passthrough", "placed", "unschedulable", "error"]
# how the nodes were decided: the walk in policy order, or why every candidate was (scheduler.md)
FilterPath = Literal["walk", "none_fit", "check_limit", "not_simple", "node_objects", "preemption"]


@dataclass(frozen=True)
class FilterReply:
    """The ExtenderFilterResult body and what happened (for metrics and logs)."""

    body: dict[str, Any]
    outcome: Outcome
    path: FilterPath | None = None  # None: no node was looked at (no GPU asked, bad pod, quota)


def pod_ref(pod: Mapping[str, Any]) -> JsonObj:
    """The ``involvedObject`` of an event about ``pod``."""
    meta = pod.get("metadata") or {}
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta},
    }


@dataclass(frozen=True)
class _Args:
    pod: JsonObj
    node_names: list[str] | None
    nodes: list[JsonObj] | None


def parse_args(raw: Any) -> _Args:
    """Validate ExtenderArgs; ``ParseError`` (HTTP 400) names what is wrong."""
    if not isinstance(raw, Mapping):
        raise errors.ParseError("ExtenderArgs", "expected a JSON object")
    pod = bodies.go_field(raw, "Pod")
    if not isinstance(pod, dict):
        raise errors.ParseError("ExtenderArgs.Pod", "extender args missing pod")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name") or not meta.get("uid"):
        raise errors.ParseError("ExtenderArgs.Pod.metadata", "pod needs metadata.name and metadata.uid")
    names = bodies.go_field(raw, "NodeNames")
    if names is not None and (not isinstance(names, list) or not set(map(type, names)) <= {str}):
        raise errors.ParseError("ExtenderArgs.NodeNames", "expected a list of node names")
    node_list = bodies.go_field(raw, "Nodes")
    nodes: list[JsonObj] | None = None
    if names is None and node_list is not None:
        items = node_list.get("items") if isinstance(node_list, dict) else None
        if not isinstance(items, list) or not all(
            isinstance(n, dict) and isinstance((n.get("metadata") or {}).get("name"), str) for n in items
        ):
            raise errors.ParseError(
                "ExtenderArgs.Nodes", "expected a NodeList whose items have metadata.name"
            )
        nodes = items
    return _Args(pod, names, nodes)


class Extender:
    """The filter verb over a ``ClusterState``: decides and reserves in memory, no API calls."""

    def __init__(
        self,
        *,
        config: Config,
        state: ClusterState,
        events: EventRecorder,
        clock: Callable[[], float],
        reasons: FilterReasons | None = None,
    ) -> None:
        """``reasons`` gets each pod's last filter failure (the dashboard's pending list)."""
        self._config = config
        self.reasons = reasons if reasons is not None else FilterReasons()
        self._state = state
        self._events = events
        self._clock = clock
        self._keys = state.keys
        # (pod uid, node -> reason): /filter failed the pod on every node for GPUs (selfpreempt.py)
        self.on_shortfall: Callable[[str, dict[str, str]], None] | None = None

    def filter(self, raw: Any) -> FilterReply:
        args = parse_args(raw)
        pod = args.pod
        meta = pod["metadata"]
        ns, name, uid = str(meta.get("namespace") or "default"), str(meta["name"]), str(meta["uid"])
        try:
            req = request.parse_pod(pod, self._config)
        except errors.ParseError as exc:  # the pod's request (resources, annotations), not the body
            self._events.emit(pod_ref(pod), reason="FilteringFailed", message=str(exc), type="Warning")
            self.reasons.failed(uid, str(exc), now=self._clock())
            return FilterReply({"Error": f"pod {ns}/{name}: {exc}"}, "error")
        if not req.wants_gpu:
            return FilterReply(self._result(args, None, {}, {}, passthrough=True), "passthrough")

        now = self._clock()
        state = self._state
        bound = state.bound_problem(uid, ns, name)
        if bound is not None:
            # a Binding of an earlier try took effect (or is on its way) after kube-scheduler gave up
            # on that bind: its cache has not seen it yet; the pod keeps what it was bound with
            log.info("filtered again: %s", bound)
            return FilterReply({"Error": bound}, "error")
        state.expire()
        state.release(uid)  # a re-filter replaces the pod's previous decision
        sched = self._config.scheduler
        gpu_policy = req.gpu_policy or sched.gpu_policy
        over_quota = state.quota.pod_problem(req, namespace=ns, uid=uid)
        if over_quota is not None:  # the namespace is full: no node can take the pod (issue 13)
            every = args.node_names or [n["metadata"]["name"] for n in args.nodes or ()]
            self._events.emit(pod_ref(pod), reason="FilteringFailed", message=over_quota, type="Warning")
            self.reasons.failed(uid, over_quota, now=now, ask=Ask(req, gpu_policy))
            return FilterReply(
                self._result(args, None, {}, dict.fromkeys(every, over_quota)), "unschedulable"
            )
        simple = fit.simple_container(req)
        # a GPU init container placed on other GPUs than the app containers is charged beside them,
        # more than the pod-level check counts: such a pod's placement is checked per node
        check_placement = simple is None and quota.needs_placement_check(req)
        binpack = (req.node_policy or sched.node_policy) is Policy.BINPACK
        busy = state.busy_nodes() if sched.avoid_busy_nodes else frozenset[str]()
        path: FilterPath
        if simple is None:
            path = "not_simple"
        elif args.node_names is None:
            path = "node_objects"
        elif state.nominations.by_node:
            path = "preemption"
        else:
            # the common case: walk the nodes in policy order to the first candidate that fits; the
            # pass over every candidate below runs only when none does (it gives each one's reason)
            picked = state.inventory.pick_simple(args.node_names, simple, binpack=binpack, busy=busy, now=now)
            if not isinstance(picked, Picked):
                path = picked
            else:
                order = "binpack" if binpack else "spread"
                return self._place(
                    args,
                    req,
                    picked.node,
                    picked.view,
                    gpu_policy=gpu_policy,
                    placement=None,
                    how=f"the best by {order} of {len(args.node_names)} candidate nodes",
                    failed={},
                    unresolvable={},
                    path="walk",
                )
        best: str | None = None
        best_score = 0.0
        fitting = 0
        placements: dict[str, fit.Placement] = {}
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        names, views, problems = self._views(args, now)
        if state.nominations.by_node:  # a preemption is under way: hold its pods' slices (issue 14)
            nominated.hold(
                state, self._config, names, views, problems, pod_priority=nominated.priority(pod), uid=uid
            )
        miss_key = (req, gpu_policy)
        for node_name in itertools.compress(names, map(operator.not_, views)):  # the None views, in C
            unresolvable[node_name] = problems.get(node_name) or state.problem(node_name, now) or "?"
        best_busy = False
        if simple is not None:
            # the hot path: every node decided from its precomputed summary in one pass
            scan = fit.scan_simple(views, names, simple, binpack=binpack, busy=busy)
            fitting = scan.fitting
            best = names[scan.best] if scan.best >= 0 else None
            candidates: Iterable[int] = scan.misses
        else:
            candidates = (i for i, v in enumerate(views) if v is not None)
        for index in candidates:
            node_name, view = names[index], views[index]
            assert view is not None
            got = view.misses.get(miss_key) or fit.fit_pod(req, view, gpu_policy=gpu_policy)
            if isinstance(got, fit.Miss):
                (unresolvable if got.unresolvable else failed)[node_name] = got.reason
                if len(view.misses) < MISS_MEMO_SIZE:
                    view.misses[miss_key] = got
                continue
            if simple is not None:  # the fast check and the fit disagree: a bug, say so
                raise errors.SchedulingError(f"node {node_name}: fast check says no, fit says yes")
            if check_placement:
                # unresolvable, as the pod-level check says; not memoized in view.misses, for it
                # depends on the namespace
                within = state.quota.placement_within(
                    req, view, got, gpu_policy=gpu_policy, namespace=ns, uid=uid
                )
                if isinstance(within, str):
                    unresolvable[node_name] = within
                    continue
                got = within
            placements[node_name] = got
            fitting += 1
            score = view.score
            is_busy = node_name in busy
            if (
                best is None
                or (best_busy and not is_busy)
                or (
                    best_busy == is_busy
                    and fit.better_node(score, node_name, best_score, best, binpack=binpack)
                )
            ):
                best, best_score, best_busy = node_name, score, is_busy
        if best is None:
            message = _summary(failed, unresolvable)
            waiting = nominated.note(state, uid)
            if waiting is not None:
                message = f"{message}; {waiting}"
            self._events.emit(pod_ref(pod), reason="FilteringFailed", message=message, type="Warning")
            self.reasons.failed(uid, message, now=now, ask=Ask(req, gpu_policy))
            if failed and self.on_shortfall is not None:
                self.on_shortfall(uid, failed)
            return FilterReply(self._result(args, None, failed, unresolvable), "unschedulable", path)
        best_view = views[names.index(best)]  # with any nominated pods' slices held
        assert best_view is not None
        how = f"{len(failed) + len(unresolvable)} nodes not fit, {fitting} nodes fit"
        return self._place(
            args,
            req,
            best,
            best_view,
            gpu_policy=gpu_policy,
            placement=placements.get(best),
            how=how,
            failed=failed,
            unresolvable=unresolvable,
            path=path,
        )

    def _place(
        self,
        args: _Args,
        req: request.PodRequest,
        best: str,
        best_view: fit.NodeGpus,
        *,
        gpu_policy: Policy,
        placement: fit.Placement | None,
        how: str,
        failed: dict[str, str],
        unresolvable: dict[str, str],
        path: FilterPath,
    ) -> FilterReply:
        """Reserve ``best`` for the pod (``placement``, or fitted now on ``best_view``) and answer."""
        pod = args.pod
        meta = pod["metadata"]
        ns, uid = str(meta.get("namespace") or "default"), str(meta["uid"])
        got = placement or fit.fit_pod(req, best_view, gpu_policy=gpu_policy)
        if isinstance(got, fit.Miss):  # the simple check and fit_pod disagree: a bug, say so
            raise errors.SchedulingError(f"node {best} passed the fast check but not the fit: {got.reason}")
        devices = annotations.encode_pod_devices(got.devices)
        self._state.reserve(uid, namespace=ns, node=best, placement=got, devices_raw=devices)
        self.reasons.placed(uid)
        message = f"find fit node({best}), {how}; devices {devices}"
        self._events.emit(pod_ref(pod), reason="FilteringSucceed", message=message)
        return FilterReply(self._result(args, best, failed, unresolvable), "placed", path)

    def _views(
        self, args: _Args, now: float
    ) -> tuple[list[str], list[fit.NodeGpus | None], dict[str, str | None]]:
        """Candidate names, their views (None: no schedulable GPUs) and known problems."""
        if args.node_names is not None:
            names = args.node_names
            return names, self._state.inventory.live_views(names, now), {}
        names, views, problems = [], [], {}
        for obj in args.nodes or ():
            node_name = obj["metadata"]["name"]
            view, problem = self._object_view(obj, now)
            names.append(node_name)
            views.append(view)
            problems[node_name] = problem
        return names, views, problems

    def _object_view(self, obj: JsonObj, now: float) -> tuple[fit.NodeGpus | None, str | None]:
        """A Node object's view (Nodes mode): the cached one when its annotations are the same."""
        state = self._state
        node_name = obj["metadata"]["name"]
        ann = obj["metadata"].get("annotations") or {}
        register_key, cordon_key = self._keys.node_register, self._keys.device_cordon
        cached = state.inventory.node_object(node_name)
        cached_ann = ((cached or {}).get("metadata") or {}).get("annotations") or {}
        if cached is not None and all(ann.get(k) == cached_ann.get(k) for k in (register_key, cordon_key)):
            return state.inventory.live_view(node_name, now), state.problem(node_name, now)
        raw = ann.get(register_key)
        if raw is None:
            return None, "no GPUs registered (no register annotation)"
        try:
            gpus = tuple(annotations.decode_node_register(raw))
        except errors.AnnotationError as exc:
            return None, f"corrupt register annotation: {exc}"
        problem = state.inventory.liveness_problem(node_name, now)
        if problem is not None:
            return None, problem
        cordoned = annotations.decode_cordon(ann.get(cordon_key, ""))
        return fit.NodeGpus.build(
            gpus, state.used(node_name), cordoned, outside=state.inventory.outside(node_name)
        ), None

    @staticmethod
    def _result(
        args: _Args,
        best: str | None,
        failed: dict[str, str],
        unresolvable: dict[str, str],
        *,
        passthrough: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }
        if args.node_names is not None or args.nodes is None:
            body["NodeNames"] = list(args.node_names or []) if passthrough else ([best] if best else [])
            body["Nodes"] = None
        else:
            chosen = args.nodes if passthrough else [n for n in args.nodes if n["metadata"]["name"] == best]
            body["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": chosen}
            body["NodeNames"] = None
        return body


def _summary(failed: Mapping[str, str], unresolvable: Mapping[str, str]) -> str:
    """``0/N nodes are available: 2 no GPU with ... (n1, n2); 1 device plugin not reporting ...``"""
    by_reason: dict[str, list[str]] = {}
    for reasons in (unresolvable, failed):
        for node, reason in reasons.items():
            by_reason.setdefault(reason, []).append(node)
    total = len(failed) + len(unresolvable)
    parts = []
    for reason, nodes in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(sorted(nodes)[:3]) + (", ..." if len(nodes) > 3 else "")
        parts.append(f"{len(nodes)} {reason} ({shown})")
    return f"0/{total} nodes fit: " + ("; ".join(parts) or "no candidate nodes")
