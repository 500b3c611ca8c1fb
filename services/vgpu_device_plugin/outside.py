"""Measuring GPU memory used outside kube-vgpu and publishing it on the node (vgpu.core.outside).

Every ``outsideUsageIntervalS`` (so at most that often), for each shared GPU: the driver's used
memory and running processes (``GpuBackend.memory_usage``, in a thread), each process's pod from its
cgroup (``HostFs.pod_uid_of_process``), and our pods' allocations on the GPU from this node's pods
(``devices-allocated`` of unfinished pods assigned here). The outside figure per GPU is merge-patched
into ``<prefix>/node-nvidia-outside-usage`` when a GPU moved by more than ``outsideUsageStepMib``
from the value on the node (or the set of GPUs changed, or the value there does not decode).

A GPU whose reading fails (driver error, garbage reply) keeps the value last published for it and
the failure is logged once per distinct message; a failed PATCH is logged and retried next round.
Nothing here ever ends the plugin session.
"""

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from vgpu.core import annotations, errors, outside
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid
from vgpu.gpu.port import GpuBackend, GpuMemoryUsage
from vgpu.kube.port import KubeApi

from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.podcache import ClusterView

log = logging.getLogger(__name__)

MIB = 1 << 20
_FINISHED = ("Succeeded", "Failed")


def allocations(
    pods: Sequence[Mapping[str, Any]], *, node: str, keys: annotations.Keys
) -> dict[GpuUuid, dict[str, int]]:
    """Per GPU, the MiB allocated to each of our unfinished pods on ``node`` (pod UID to MiB).
    A pod whose ``devices-allocated`` does not decode is left out (the scheduler ignores it too)."""
    out: dict[GpuUuid, dict[str, int]] = {}
    for pod in pods:
        notes = annotations.of(pod)
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        raw = notes.get(keys.devices_allocated)
        if notes.get(keys.assigned_node) != node or raw is None or phase in _FINISHED:
            continue
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        try:
            devices = annotations.decode_pod_devices(raw, field=keys.devices_allocated)
        except errors.AnnotationError:
            continue
        for container in devices:
            for device in container:
                held = out.setdefault(device.uuid, {})
                held[uid] = held.get(uid, 0) + device.memory_mib
    return out


class OutsideUsageReporter:
    """One per plugin session; ``run(gpus)`` until cancelled."""

    def __init__(
        self,
        *,
        backend: GpuBackend,
        api: KubeApi,
        view: ClusterView,
        host: HostFs,
        node: str,
        keys: annotations.Keys,
        config: DevicePluginConfig,
    ) -> None:
        self._backend = backend
        self._api = api
        self._view = view
        self._host = host
        self._node = node
        self._keys = keys
        self._config = config
        self._last_written: dict[GpuUuid, int] | None = None
        self._warned: dict[GpuUuid, str] = {}

    def _published(self) -> dict[GpuUuid, int] | None:
        """The value on the node (our last write while the node is not cached yet); None when absent
        or not decodable (then it is overwritten)."""
        node = self._view.node()
        if node is None:
            return self._last_written
        raw = annotations.of(node).get(self._keys.node_outside_usage)
        if raw is None:
            return None
        try:
            return outside.decode(raw, field=self._keys.node_outside_usage)
        except errors.AnnotationError as exc:
            log.warning("node %s: replacing an unreadable outside-usage annotation: %s", self._node, exc)
            return None

    def _read(self, gpus: Sequence[GpuUuid]) -> dict[GpuUuid, GpuMemoryUsage | str]:
        """Blocking: each GPU's reading, or why it failed (run in a thread)."""
        out: dict[GpuUuid, GpuMemoryUsage | str] = {}
        for uuid in gpus:
            try:
                out[uuid] = self._backend.memory_usage(uuid)
            except errors.GpuBackendError as exc:
                out[uuid] = str(exc)
        return out

    def _attribute(self, reading: GpuMemoryUsage) -> list[outside.ProcessMemory]:
        return [
            outside.ProcessMemory(
                p.pid,
                None if p.used_memory_bytes is None else p.used_memory_bytes // MIB,
                self._host.pod_uid_of_process(p.pid),
            )
            for p in reading.processes
        ]

    async def measure(self, gpus: Sequence[GpuUuid]) -> dict[GpuUuid, int]:
        """Outside MiB per GPU now; a GPU that cannot be read keeps its published value (or is left out)."""
        ours = allocations(list(self._view.pods()), node=self._node, keys=self._keys)
        readings = await asyncio.to_thread(self._read, gpus)
        attributed = await asyncio.to_thread(
            lambda: {u: self._attribute(r) for u, r in readings.items() if not isinstance(r, str)}
        )
        published = self._published() or {}
        measured: dict[GpuUuid, int] = {}
        for uuid, reading in readings.items():
            if isinstance(reading, str):
                if self._warned.get(uuid) != reading:
                    self._warned[uuid] = reading
                    log.warning(
                        "node %s: GPU %s: no memory reading, keeping the last one: %s",
                        self._node,
                        uuid,
                        reading,
                    )
                if uuid in published:
                    measured[uuid] = published[uuid]
                continue
            self._warned.pop(uuid, None)
            measured[uuid] = outside.outside_mib(
                reading.used_bytes // MIB, attributed[uuid], allocated_mib=ours.get(uuid, {})
            )
        return measured

    async def run_once(self, gpus: Sequence[GpuUuid]) -> bool:
        """Measure, and publish when it moved enough; True when the annotation was written."""
        measured = await self.measure(gpus)
        if not outside.should_publish(
            self._published(), measured, step_mib=self._config.outside_usage_step_mib
        ):
            return False
        value = outside.encode(measured)
        try:
            await self._api.merge_patch(
                "nodes", self._node, {"metadata": {"annotations": {self._keys.node_outside_usage: value}}}
            )
        except errors.KubeError as exc:
            log.error("node %s: writing the outside-usage annotation failed: %s; retrying", self._node, exc)
            return False
        self._last_written = measured
        log.info("node %s: GPU memory used outside kube-vgpu (MiB): %s", self._node, value)
        return True

    async def run(self, gpus: Sequence[GpuUuid]) -> None:
        while True:
            await self.run_once(gpus)
            await asyncio.sleep(self._config.outside_usage_interval_s)
