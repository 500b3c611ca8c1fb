"""The monitor's ``/metrics``: what each GPU container really uses, under HAMi's vGPU monitor names.

At every scrape (nothing is kept between scrapes, so the series of a pod that is gone simply are
not there, and no maximum outlives its container): the pods on this node are read from the pod
cache on the event loop, then in a worker thread the containers' region files are found
(``mapping.scan``) and read (``region.read``) and the GPUs are asked through the ``GpuBackend`` port
for their used memory, their processes and their utilisation. Names and labels are HAMi's
(``cmd/vGPUmonitor/metrics.go``), with the constant label ``zone="vGPU"``; ours are prefixed
``vgpu_monitor_``. A file that cannot be read is skipped and logged once (again only when its
problem changes); a GPU the driver cannot read likewise.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from vgpu.core import errors
from vgpu.gpu.port import DeviceInfo, GpuBackend, GpuMemoryUsage

from vgpu_device_plugin.monitor import mapping, region
from vgpu_device_plugin.podcache import ClusterView

log = logging.getLogger(__name__)

ZONE = "vGPU"
HOST_LABELS = ["nodeid", "deviceidx", "deviceuuid", "devicetype", "zone"]
CONTAINER_LABELS = ["podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid", "zone"]


@dataclass(frozen=True)
class HostGpu:
    info: DeviceInfo
    memory: GpuMemoryUsage | None  # None: the driver could not say
    utilization_percent: int | None


@dataclass(frozen=True)
class ContainerReading:
    where: mapping.ContainerRegion
    region: region.Region


@dataclass(frozen=True)
class Reading:
    """One scrape's measurements."""

    node: str
    now_s: float
    gpus: tuple[HostGpu, ...]
    containers: tuple[ContainerReading, ...]
    unreadable: int
    not_ours: int
    empty: int


class ProblemLog:
    """Logs a problem of a thing (a file, a GPU) once, then again only when it changes; forgets
    the things that are no longer there or have recovered."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._seen: dict[str, str] = {}

    def report(self, key: str, problem: str) -> None:
        if self._seen.get(key) != problem:
            self._seen[key] = problem
            self._log.warning("%s: skipped: %s", key, problem)

    def keep_only(self, keys: set[str]) -> None:
        for key in [k for k in self._seen if k not in keys]:
            del self._seen[key]


class Monitor:
    """Reads the regions under ``containers_dir`` and the GPUs of ``backend``; ``scrape`` is the
    ``/metrics`` body."""

    def __init__(
        self,
        *,
        backend: GpuBackend,
        view: ClusterView,
        containers_dir: pathlib.Path,
        node: str,
        clock: Callable[[], float],
    ) -> None:
        self._backend = backend
        self._view = view
        self._dir = containers_dir
        self._node = node
        self._clock = clock
        self._problems = ProblemLog(log)
        self._lock = asyncio.Lock()

    async def scrape(self) -> bytes:
        async with self._lock:  # one scrape at a time: the problem log is not shared across threads
            pods = mapping.pods_on_node(self._view.pods())
            return await asyncio.to_thread(lambda: render(self.measure(pods)))

    def measure(self, pods: dict[str, mapping.PodRef]) -> Reading:
        """Blocking: the file system and the driver."""
        found = mapping.scan(self._dir, pods)
        containers = []
        failing: set[str] = set()
        for where in found.regions:
            try:
                containers.append(ContainerReading(where, region.read(where.path)))
            except region.RegionError as exc:
                key = str(where.path)
                failing.add(key)
                self._problems.report(key, str(exc))
        gpus = []
        try:
            devices = self._backend.devices()
        except errors.GpuBackendError as exc:
            failing.add("GPUs")
            self._problems.report("GPUs", str(exc))
            devices = []
        for info in devices:
            memory: GpuMemoryUsage | None = None
            utilization: int | None = None
            try:
                memory = self._backend.memory_usage(info.uuid)
                utilization = self._backend.utilization_percent(info.uuid)
            except errors.GpuBackendError as exc:
                key = f"GPU {info.uuid}"
                failing.add(key)
                self._problems.report(key, str(exc))
            gpus.append(HostGpu(info, memory, utilization))
        self._problems.keep_only(failing)
        return Reading(
            node=self._node,
            now_s=self._clock(),
            gpus=tuple(gpus),
            containers=tuple(containers),
            unreadable=len(found.regions) - len(containers),
            not_ours=found.not_ours,
            empty=found.empty,
        )


class _Collector(Collector):
    def __init__(self, reading: Reading) -> None:
        self._reading = reading

    def collect(self) -> Iterator[Metric]:
        r = self._reading
        yield from _host_families(r)
        yield from _container_families(r)
        regions = GaugeMetricFamily(
            "vgpu_monitor_container_dirs",
            "Container directories under the hook path at the last scrape, by what they held",
            labels=["state"],
        )
        regions.add_metric(["read"], len(r.containers))
        regions.add_metric(["unreadable"], r.unreadable)
        regions.add_metric(["no_region_yet"], r.empty)
        regions.add_metric(["not_of_a_pod_here"], r.not_ours)
        yield regions


def _host_families(r: Reading) -> Iterable[Metric]:
    memory = GaugeMetricFamily("HostGPUMemoryUsage", "GPU device memory usage (bytes)", labels=HOST_LABELS)
    cores = GaugeMetricFamily("HostCoreUtilization", "GPU core utilization (percent)", labels=HOST_LABELS)
    for gpu in r.gpus:
        labels = [r.node, str(gpu.info.index), gpu.info.uuid, gpu.info.name, ZONE]
        if gpu.memory is not None:
            memory.add_metric(labels, gpu.memory.used_bytes)
        if gpu.utilization_percent is not None:
            cores.add_metric(labels, gpu.utilization_percent)
    return (memory, cores)


def _container_families(r: Reading) -> Iterable[Metric]:
    def family(name: str, doc: str, extra: list[str] | None = None) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=CONTAINER_LABELS + (extra or []))

    usage = family("vGPU_device_memory_usage_in_bytes", "vGPU device usage (bytes, as HAMi-core counts it)")
    limit = family("vGPU_device_memory_limit_in_bytes", "vGPU device limit (bytes)")
    desc = family(
        "Device_memory_desc_of_container",
        "Container device memory description (bytes; the breakdown in labels, as HAMi writes it)",
        ["context", "module", "data", "offset"],
    )
    util = family("Device_utilization_desc_of_container", "Container device SM utilization (percent)")
    kernel = family("Device_last_kernel_of_container", "Seconds since the container last launched a kernel")
    context = family("vGPU_device_memory_context_size_bytes", "Container device memory context size")
    module = family("vGPU_device_memory_module_size_bytes", "Container device memory module size")
    buffer = family("vGPU_device_memory_buffer_size_bytes", "Container device memory buffer size")
    nvml_used = GaugeMetricFamily(
        "vgpu_monitor_container_nvml_memory_used_bytes",
        "GPU memory of the container's processes as the driver counts it (NVML per process, bytes)",
        labels=["podnamespace", "podname", "ctrname", "deviceuuid", "zone"],
    )
    by_pid: dict[str, dict[int, int]] = {}
    for gpu in r.gpus:
        if gpu.memory is not None:
            by_pid[gpu.info.uuid] = {p.pid: p.used_memory_bytes or 0 for p in gpu.memory.processes}
    for c in r.containers:
        pod, reg = c.where.pod, c.region
        host_pids = {p.host_pid for p in reg.processes if p.host_pid > 0}
        for d in reg.devices:
            labels = [pod.namespace, pod.name, c.where.container, str(d.index), d.uuid, ZONE]
            usage.add_metric(labels, d.used_bytes)
            limit.add_metric(labels, d.limit_bytes)
            desc.add_metric(
                [*labels, str(d.context_bytes), str(d.module_bytes), str(d.data_bytes), str(d.offset_bytes)],
                d.used_bytes,
            )
            util.add_metric(labels, d.sm_util_percent)
            if reg.last_kernel_time > 0:
                kernel.add_metric(labels, max(0.0, r.now_s - reg.last_kernel_time))
            context.add_metric(labels, d.context_bytes)
            module.add_metric(labels, d.module_bytes)
            buffer.add_metric(labels, d.data_bytes)
            on_gpu = by_pid.get(d.uuid)
            if on_gpu is not None:
                used = sum(on_gpu.get(pid, 0) for pid in host_pids)
                nvml_used.add_metric([pod.namespace, pod.name, c.where.container, d.uuid, ZONE], used)
    return (usage, limit, desc, util, kernel, context, module, buffer, nvml_used)


def render(reading: Reading) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(reading))
    return generate_latest(registry)
