"""``/metrics``: HAMi's GPU metric names computed live at scrape time, plus the extender's own.

HAMi serves snapshots from a 15 s tick (PROTOCOL.md I.14); here a custom collector reads the
cluster state when Prometheus scrapes, so the numbers are never stale. Names and labels follow
H.6 (memory in bytes, cores in percent units as HAMi does, constant label ``zone="vGPU"``).
Each app has its own ``CollectorRegistry``: nothing is registered globally.
"""

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from vgpu.core.device import EMPTY_USAGE

from vgpu_scheduler.state import ClusterState

MIB = 1 << 20
_GPU_LABELS = ["node", "device_uuid", "device_index", "device_type", "zone"]
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class GpuCollector(Collector):
    """Per-GPU capacity and allocation, per-pod allocation, node counts: read from ``state``."""

    def __init__(self, state: ClusterState, clock: Callable[[], float]) -> None:
        self._state = state
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state
        state.expire()
        now = self._clock()
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
        for name, entry in state.nodes.items():
            if state.problem(name, now) is None:
                schedulable += 1
            used = state.used(name)
            for gpu in entry.gpus:
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
        nodes.add_metric(["unschedulable"], len(state.nodes) - schedulable)
        yield from (memory_limit, core_limit, memory_used, shared, cores_used, memory_ratio, nodes)
        yield from self._pods()

    def _pods(self) -> Iterator[GaugeMetricFamily]:
        labels = ["namespace", "node", "pod", "container_index", "device_uuid", "zone"]
        memory = GaugeMetricFamily(
            "hami_vgpu_memory_allocated_bytes", "Pod GPU memory (bytes)", labels=labels
        )
        cores = GaugeMetricFamily(
            "hami_vgpu_core_allocated_ratio", "Pod GPU cores (percent units)", labels=labels
        )
        for uid, charge in self._state.charges.items():
            pod = self._state.pods.get(uid)
            name = str((pod or {}).get("metadata", {}).get("name", uid))
            for uuid, used in charge.usage.items():
                values = [charge.namespace, charge.node, name, "0", uuid, "vGPU"]
                memory.add_metric(values, used.memory_mib * MIB)
                cores.add_metric(values, used.cores)
        yield memory
        yield cores


class Metrics:
    """The app's registry: the live GPU collector and the extender's latency and error metrics."""

    def __init__(self, state: ClusterState, *, clock: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(GpuCollector(state, clock))
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
        self.errors = Counter(
            "vgpu_scheduler_errors",
            "Filter and bind calls answered with an error",
            ["verb"],
            registry=self.registry,
        )
