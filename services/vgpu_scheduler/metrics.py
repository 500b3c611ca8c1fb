"""``/metrics``: HAMi's GPU metric names, kept current between state changes, plus the extender's own.

HAMi serves snapshots from a 15 s tick (docs/protocol.md#departures-from-hami); here a scrape reads the cluster state as
it is. The per-GPU and per-pod series (most of the text at scale) come from
``vgpu_scheduler.exposition``, which renders each node's lines once per change and caches them;
the small families (node counts, pending pods, queues, latency histograms) are built at each scrape
with prometheus_client. ``scrape`` takes the snapshot on the event loop (the state is only ever
touched there) and renders in a worker thread, one scrape at a time. Names and labels follow H.6
(memory in bytes, cores in percent units as HAMi does, constant label ``zone="vGPU"``);
``scheduler.metricsPodSeries: false`` leaves the per-pod series out. The DRA mode's GPUs and
pods have the same series (``exposition``). Each app has its own registries: nothing is registered
globally.
"""

import asyncio
import dataclasses
import gzip
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from vgpu.core import annotations
from vgpu.core.dra import waiting as dra_waiting
from vgpu.gcfreeze import SurvivorFreezer

from vgpu_scheduler import exposition
from vgpu_scheduler.draviews import DraCapture, DraViews
from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.load import Load
from vgpu_scheduler.retries import FilterRetries
from vgpu_scheduler.state import ClusterState

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# why a GPU pod of ours is still pending: where it stands in filter -> bind -> Allocate
PENDING_REASONS = ("unplaced", "reserved", "allocating", "allocation_failed")


@dataclass(frozen=True)
class Snapshot:
    """What one scrape reports, taken on the event loop: the GPU series' snapshot (copies of what
    changed), node counts, and references to the pod objects (replaced, never mutated, by the loop)."""

    gpus: exposition.Snapshot
    schedulable: int
    unschedulable: int
    pods: list[Mapping[str, Any]]
    reserved: frozenset[str]  # uids holding a decision not yet bound
    runtime: Mapping[str, float] = dataclasses.field(default_factory=dict)  # queues, pools, loop lag
    # the extender listener's connections accepted, and its requests by (path, first on its connection)
    extender: tuple[int, Mapping[tuple[str, bool], int]] | None = None
    dra: DraCapture | None = None  # the DRA mode's claims and templates (its pending pods): waiting_inputs


class ExtenderCounts(Protocol):
    """What the extender's listener counts (``extender_http.ExtenderServer``)."""

    @property
    def accepted(self) -> int: ...

    @property
    def requests(self) -> Mapping[tuple[str, bool], int]: ...


def pending_reason(
    pod: Mapping[str, Any], *, scheduler_name: str, keys: annotations.Keys, reserved: bool
) -> str | None:
    """Why a pod of ``scheduler_name`` is pending (one of PENDING_REASONS), None when it is not."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") != scheduler_name:
        return None
    if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
        return None
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    phase = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.bind_phase)
    if phase == annotations.BindPhase.FAILED.value:
        return "allocation_failed"
    if spec.get("nodeName"):
        return None if phase == annotations.BindPhase.SUCCESS.value else "allocating"
    return "reserved" if reserved else "unplaced"


class _SmallCollector(Collector):
    def __init__(self, snapshot: Snapshot, *, scheduler_name: str, keys: annotations.Keys) -> None:
        self._snapshot = snapshot
        self._scheduler_name = scheduler_name
        self._keys = keys

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot
        nodes = GaugeMetricFamily(
            "vgpu_scheduler_nodes", "Nodes known to the scheduler by GPU schedulability", labels=["state"]
        )
        nodes.add_metric(["schedulable"], snap.schedulable)
        nodes.add_metric(["unschedulable"], snap.unschedulable)
        yield nodes
        counts = dict.fromkeys(PENDING_REASONS, 0)
        for pod in snap.pods:
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            reason = pending_reason(
                pod, scheduler_name=self._scheduler_name, keys=self._keys, reserved=uid in snap.reserved
            )
            if reason is not None:
                counts[reason] += 1
        pending = GaugeMetricFamily(
            "vgpu_scheduler_pending_pods",
            "GPU pods of this scheduler still pending, by where they stand: unplaced (no node fits yet), "
            "reserved (a node chosen, not yet bound), allocating (bound, the device plugin has not "
            "allocated), allocation_failed (the device plugin's Allocate failed)",
            labels=["reason"],
        )
        for reason, count in counts.items():
            pending.add_metric([reason], count)
        yield pending
        if snap.dra is not None:
            yield _dra_pending(snap.pods, snap.dra)
        yield from _runtime_families(snap.runtime)
        if snap.extender is not None:
            yield from _extender_families(*snap.extender)


def _dra_pending(pods: Iterable[Mapping[str, Any]], dra: DraCapture) -> Metric:
    """The DRA mode's GPU pods waiting for an allocation, by stage (``vgpu.core.dra.waiting``)."""
    counts = dict.fromkeys(dra_waiting.STAGES, 0)
    claims = templates = None
    for pod in pods:
        if not (pod.get("spec") or {}).get("resourceClaims"):
            continue
        if claims is None or templates is None:  # indexed at the first pod with claims
            claims, templates = dra_waiting.index(dra.claims), dra_waiting.index(dra.templates)
        found = dra_waiting.waiting(pod, claims=claims, templates=templates)
        if found is not None:
            counts[found.stage] += 1
    family = GaugeMetricFamily(
        "vgpu_scheduler_dra_pending_pods",
        "GPU pods of the DRA mode still waiting for their allocation, by where they stand: "
        "claim_pending (kube-controller-manager has not made their claim, or it is not seen yet), "
        "queued (kube-scheduler has not tried them), unschedulable (kube-scheduler said why not), "
        "binding (their claims allocated, the bind under way)",
        labels=["stage"],
    )
    for stage, count in counts.items():
        family.add_metric([stage], count)
    return family


def _extender_families(accepted: int, requests: Mapping[tuple[str, bool], int]) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "vgpu_scheduler_extender_connections",
        "Connections accepted by the extender listener (kube-scheduler's client keeps two idle, so "
        "concurrent binds make it dial)",
        value=accepted,
    )
    by_connection = CounterMetricFamily(
        "vgpu_scheduler_extender_requests",
        "Extender calls by verb path and connection: new (the first on its connection: kube-scheduler "
        "dialled for it) or kept (on a connection it kept alive)",
        labels=["path", "connection"],
    )
    for (path, first), count in sorted(requests.items()):
        by_connection.add_metric([path, "new" if first else "kept"], count)
    yield by_connection


def _runtime_families(runtime: Mapping[str, float]) -> Iterator[Metric]:
    if "events_queued" in runtime:
        yield GaugeMetricFamily(
            "vgpu_scheduler_events_queued",
            "Distinct events waiting to be sent",
            value=runtime["events_queued"],
        )
        events = CounterMetricFamily(
            "vgpu_scheduler_events",
            "Events by fate: sent, coalesced into one still queued, dropped because the queue was full",
            labels=["result"],
        )
        for result in ("sent", "coalesced", "dropped"):
            events.add_metric([result], runtime[f"events_{result}"])
        yield events
    if "api_calls_busy" in runtime:
        yield GaugeMetricFamily(
            "vgpu_scheduler_api_calls_in_flight",
            "Kubernetes API calls in flight",
            value=runtime["api_calls_busy"],
        )
        yield GaugeMetricFamily(
            "vgpu_scheduler_api_calls_queued",
            "Kubernetes API calls waiting for one of the scheduler.apiWorkers places",
            value=runtime["api_calls_queued"],
        )
    if "api_writer_starts" in runtime:
        yield CounterMetricFamily(
            "vgpu_scheduler_api_writer_starts",
            "Helper processes started to make the API writes (scheduler.apiWriter; the watches too with apiWatches: process); each after the first "
            "replaced one that died or stopped answering",
            value=runtime["api_writer_starts"],
        )
    if "filter_retries_sent" in runtime:
        retries = CounterMetricFamily(
            "vgpu_scheduler_filter_retries",
            "Pending pods asked to be retried by kube-scheduler (an annotation write) because GPUs they fit "
            "came free or came back after their /filter failed: sent, or failed (the write did not go through)",
            labels=["result"],
        )
        for result in ("sent", "failed"):
            retries.add_metric([result], runtime[f"filter_retries_{result}"])
        yield retries
    if "loop_lag_seconds" in runtime:
        yield GaugeMetricFamily(
            "vgpu_scheduler_event_loop_lag_seconds",
            "How late the event loop ran its last probe timer",
            value=runtime["loop_lag_seconds"],
        )
    if "gc_frozen_objects" in runtime:
        yield GaugeMetricFamily(
            "vgpu_scheduler_gc_frozen_objects",
            "Objects kept out of the cyclic garbage collector's scans (the state), at the last 30 s check",
            value=runtime["gc_frozen_objects"],
        )
        yield CounterMetricFamily(
            "vgpu_scheduler_gc_compactions",
            "Full collections of the frozen objects, run while no filter, bind, preempt or webhook call came",
            value=runtime["gc_compactions"],
        )


class Metrics:
    """The extender's latency and error metrics, and the live GPU metrics of ``state``."""

    def __init__(
        self,
        state: ClusterState,
        *,
        clock: Callable[[], float],
        events: EventRecorder | None = None,
        load: Load | None = None,
        gc: SurvivorFreezer | None = None,
        retries: FilterRetries | None = None,
        dra: DraViews | None = None,
    ) -> None:
        """``dra``: the DRA mode's slices and claims, whose GPUs get the same series."""
        self._state = state
        self._dra = dra
        self._gc = gc
        self._retries = retries
        self._clock = clock
        self._events = events
        self._load = load
        self._gpus = exposition.GpuExposition(pod_series=state.config.scheduler.metrics_pod_series)
        self._render_lock = threading.Lock()
        self.extender: ExtenderCounts | None = None  # the extender listener, once built
        self._scrape_lock = asyncio.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.filter_seconds = Histogram(
            "vgpu_scheduler_filter_duration_seconds",
            "Time to answer a filter call",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.filter_paths = Counter(
            "vgpu_scheduler_filter_paths_total",
            "GPU filters by how the nodes were decided: walk (policy order, first fit), or why every "
            "candidate was (none_fit, check_limit, not_simple, node_objects, preemption)",
            ["path"],
            registry=self.registry,
        )
        self.bind_seconds = Histogram(
            "vgpu_scheduler_bind_duration_seconds",
            "Time to answer a bind call (includes waiting for the node lock)",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.preempt_seconds = Histogram(
            "vgpu_scheduler_preempt_duration_seconds",
            "Time to answer a preempt call",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.preemptions = Counter(
            "vgpu_scheduler_preemptions",
            "GPU preemption decisions by path (verb: kube-scheduler's /preempt call; self: the "
            "scheduler's own evictions) and outcome",
            ["path", "outcome"],
            registry=self.registry,
        )
        self.webhook_seconds = Histogram(
            "vgpu_scheduler_webhook_duration_seconds",
            "Time to answer an admission review",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "vgpu_scheduler_errors",
            "Filter, bind and preempt calls answered with an error",
            ["verb"],
            registry=self.registry,
        )

    async def scrape(self, *, compress: bool = False) -> bytes:
        """One ``/metrics`` body: snapshot on the loop, render in a worker thread, one at a time.
        ``compress``: gzip, in the same thread (level 1; zlib lets go of the GIL), for a caller that
        accepts it: the event loop then has about a tenth of the bytes to encrypt and send."""
        async with self._scrape_lock:
            snapshot = self.snapshot()
            return await asyncio.to_thread(self._body, snapshot, compress)

    def _body(self, snapshot: Snapshot, compress: bool) -> bytes:
        text = self.render(snapshot)
        return gzip.compress(text, compresslevel=1, mtime=0) if compress else text

    def snapshot(self) -> Snapshot:
        """Call on the event loop (and not while another snapshot is being rendered)."""
        state = self._state
        now = self._clock()
        state.expire()
        schedulable = sum(1 for name in state.nodes if state.problem(name, now) is None)
        runtime: dict[str, float] = {}
        if self._events is not None:
            events = self._events
            runtime |= {"events_queued": events.queued, "events_sent": events.sent}
            runtime |= {"events_coalesced": events.coalesced, "events_dropped": events.dropped}
        if self._load is not None and self._load.pool is not None:
            runtime |= {"api_calls_busy": self._load.pool.busy, "api_calls_queued": self._load.pool.queued}
            # the writes' helper (apiWriter auto or process) counts its starts
            starts = getattr(self._load.pool, "starts", None)
            if isinstance(starts, int):
                runtime["api_writer_starts"] = starts
        if self._retries is not None:
            runtime |= {
                "filter_retries_sent": self._retries.sent,
                "filter_retries_failed": self._retries.failed,
            }
        if self._load is not None and self._load.probe is not None:
            runtime["loop_lag_seconds"] = self._load.probe.lag_s
        if self._gc is not None and self._gc.installed:
            # as counted at the last check (app.gc_check): counting walks every frozen object
            runtime |= {"gc_frozen_objects": self._gc.counted, "gc_compactions": self._gc.compactions}
        return Snapshot(
            gpus=self._gpus.snapshot(state, self._dra.capture if self._dra is not None else None),
            schedulable=schedulable,
            unschedulable=len(state.nodes) - schedulable,
            pods=list(state.pods.values()),
            reserved=frozenset(uid for uid, charge in state.charges.items() if charge.reservation),
            runtime=runtime,
            extender=None
            if self.extender is None
            else (self.extender.accepted, dict(self.extender.requests)),
            dra=self._dra.waiting_inputs() if self._dra is not None else None,
        )

    def render(self, snapshot: Snapshot) -> bytes:
        """The exposition text; safe in a worker thread."""
        small = CollectorRegistry(auto_describe=False)
        small.register(
            _SmallCollector(
                snapshot, scheduler_name=self._state.config.scheduler.scheduler_name, keys=self._state.keys
            )
        )
        with self._render_lock:
            gpus = self._gpus.render(snapshot.gpus)
        return gpus + generate_latest(small) + generate_latest(self.registry)


def families(body: bytes) -> Iterable[str]:
    """The metric family names in an exposition text (for tests and the chart's dashboard check)."""
    for line in body.decode().splitlines():
        if line.startswith("# TYPE "):
            yield line.split()[2]
