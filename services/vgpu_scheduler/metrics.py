"""``/metrics``: HAMi's GPU metric names computed live at scrape time, plus the extender's own.

HAMi serves snapshots from a 15 s tick (PROTOCOL.md I.14); here each scrape reads the cluster state:
``snapshot()`` copies what is needed on the event loop (the state is only ever touched there), and
``render()`` formats it in a worker thread, so a big cluster's exposition does not stall filters.
Names and labels follow H.6 (memory in bytes, cores in percent units as HAMi does, constant label
``zone="vGPU"``). Each app has its own registries: nothing is registered globally.
"""

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid

from vgpu_scheduler.events import EventRecorder
from vgpu_scheduler.load import Load
from vgpu_scheduler.state import Charge, ClusterState

MIB = 1 << 20
_GPU_LABELS = ["node", "device_uuid", "device_index", "device_type", "zone"]
_POD_LABELS = ["namespace", "node", "pod", "container_index", "device_uuid", "zone"]
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass(frozen=True)
class Snapshot:
    """What one scrape reports, taken on the event loop: copies of what the loop mutates in place
    (the per-node usage maps), references to what it only ever replaces (charges, pod objects)."""

    nodes: list[tuple[str, tuple[Gpu, ...], dict[GpuUuid, GpuUsage], bool]]
    charges: list[tuple[str, Charge]]
    pods: Mapping[str, Mapping[str, Any]]  # read with .get only (atomic), never iterated
    runtime: Mapping[str, float] = dataclasses.field(default_factory=dict)  # queues, pools, loop lag


def take_snapshot(state: ClusterState, now: float) -> Snapshot:
    state.expire()
    nodes = [
        (name, entry.gpus, dict(state.used(name)), state.problem(name, now) is None)
        for name, entry in state.nodes.items()
    ]
    return Snapshot(nodes, list(state.charges.items()), state.pods)


class _SnapshotCollector(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        memory_limit = GaugeMetricFamily(
            "hami_gpu_memory_limit_bytes", "GPU memory (bytes)", labels=_GPU_LABELS
        )
        core_limit = GaugeMetricFamily(
            "hami_gpu_core_limit_ratio", "GPU cores (percent units)", labels=_GPU_LABELS
        )
        memory_used = GaugeMetricFamily(
            "hami_gpu_memory_allocated_bytes",
            "GPU memory allocated to pods (bytes)",
            labels=["node", "device_uuid", "device_index", "device_cores", "device_type", "zone"],
        )
        shared = GaugeMetricFamily("hami_gpu_shared_count", "Containers sharing the GPU", labels=_GPU_LABELS)
        cores_used = GaugeMetricFamily(
            "hami_gpu_core_allocated_ratio", "GPU cores allocated (percent units)", labels=_GPU_LABELS
        )
        memory_ratio = GaugeMetricFamily(
            "hami_node_gpu_memory_allocated_ratio", "Allocated / total GPU memory", labels=_GPU_LABELS
        )
        nodes = GaugeMetricFamily(
            "vgpu_scheduler_nodes", "Nodes known to the scheduler by GPU schedulability", labels=["state"]
        )
        schedulable = 0
        for name, gpus, used, ok in self._snapshot.nodes:
            schedulable += ok
            for gpu in gpus:
                u = used.get(gpu.uuid, EMPTY_USAGE)
                labels = [name, gpu.uuid, str(gpu.index), gpu.type, "vGPU"]
                memory_limit.add_metric(labels, gpu.memory_mib * MIB)
                core_limit.add_metric(labels, gpu.cores)
                memory_used.add_metric(
                    [name, gpu.uuid, str(gpu.index), str(gpu.cores), gpu.type, "vGPU"], u.memory_mib * MIB
                )
                shared.add_metric(labels, u.slots)
                cores_used.add_metric(labels, u.cores)
                if gpu.memory_mib > 0:
                    memory_ratio.add_metric(labels, u.memory_mib / gpu.memory_mib)
        nodes.add_metric(["schedulable"], schedulable)
        nodes.add_metric(["unschedulable"], len(self._snapshot.nodes) - schedulable)
        pod_memory = GaugeMetricFamily(
            "hami_vgpu_memory_allocated_bytes", "Pod GPU memory (bytes)", labels=_POD_LABELS
        )
        pod_cores = GaugeMetricFamily(
            "hami_vgpu_core_allocated_ratio", "Pod GPU cores (percent units)", labels=_POD_LABELS
        )
        pods = self._snapshot.pods
        for uid, charge in self._snapshot.charges:
            pod = str(((pods.get(uid) or {}).get("metadata") or {}).get("name", uid))
            for uuid, u in charge.usage.items():
                values = [charge.namespace, charge.node, pod, "0", uuid, "vGPU"]
                pod_memory.add_metric(values, u.memory_mib * MIB)
                pod_cores.add_metric(values, u.cores)
        yield from (memory_limit, core_limit, memory_used, shared, cores_used, memory_ratio, nodes)
        yield from (pod_memory, pod_cores)
        yield from _runtime_families(self._snapshot.runtime)


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
            "API calls running on the pool",
            value=runtime["api_calls_busy"],
        )
        yield GaugeMetricFamily(
            "vgpu_scheduler_api_calls_queued",
            "API calls waiting for a pool worker",
            value=runtime["api_calls_queued"],
        )
    if "loop_lag_seconds" in runtime:
        yield GaugeMetricFamily(
            "vgpu_scheduler_event_loop_lag_seconds",
            "How late the event loop ran its last probe timer",
            value=runtime["loop_lag_seconds"],
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
    ) -> None:
        self._state = state
        self._clock = clock
        self._events = events
        self._load = load
        self.registry = CollectorRegistry(auto_describe=False)
        self.filter_seconds = Histogram(
            "vgpu_scheduler_filter_duration_seconds",
            "Time to answer a filter call",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
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
        self.errors = Counter(
            "vgpu_scheduler_errors",
            "Filter, bind and preempt calls answered with an error",
            ["verb"],
            registry=self.registry,
        )

    def snapshot(self) -> Snapshot:
        """Call on the event loop."""
        snapshot = take_snapshot(self._state, self._clock())
        runtime: dict[str, float] = {}
        if self._events is not None:
            events = self._events
            runtime |= {"events_queued": events.queued, "events_sent": events.sent}
            runtime |= {"events_coalesced": events.coalesced, "events_dropped": events.dropped}
        if self._load is not None and self._load.pool is not None:
            runtime |= {"api_calls_busy": self._load.pool.busy, "api_calls_queued": self._load.pool.queued}
        if self._load is not None and self._load.probe is not None:
            runtime["loop_lag_seconds"] = self._load.probe.lag_s
        return dataclasses.replace(snapshot, runtime=runtime)

    def render(self, snapshot: Snapshot) -> bytes:
        """The exposition text; safe in a worker thread."""
        gpus = CollectorRegistry(auto_describe=False)
        gpus.register(_SnapshotCollector(snapshot))
        return generate_latest(gpus) + generate_latest(self.registry)
