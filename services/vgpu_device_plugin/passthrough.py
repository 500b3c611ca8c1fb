"""Allocate for whole devices (MIG strategies ``single``/``mixed``): NVIDIA's plugin behaviour.

No pod lookup and no HAMi-core limits: the device IDs kubelet picked are the devices (MIG UUIDs).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping

from vgpu.core import allocation, errors
from vgpu.core.config import DevicePluginConfig
from vgpu.core.device import GpuUuid

from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.inventory import Resource

log = logging.getLogger(__name__)


class PassthroughAllocator:
    def __init__(
        self,
        *,
        resource: Resource,
        config: DevicePluginConfig,
        refs: Mapping[GpuUuid, allocation.GpuRef],
        host: HostFs,
    ) -> None:
        self._resource = resource
        self._config = config
        self._refs = refs
        self._host = host
        self._known = {d.id for d in resource.devices}

    async def allocate(self, requests: list[list[str]]) -> list[allocation.ContainerAllocation]:
        out = []
        facts = await asyncio.to_thread(self._host.facts)  # file checks: off the event loop
        for ids in requests:
            unknown = [i for i in ids if i not in self._known]
            if unknown:
                raise errors.AllocationError(f"{self._resource.name}: unknown device IDs {unknown}")
            refs = [self._refs[GpuUuid(i)] for i in ids]
            out.append(
                allocation.passthrough_response(
                    ids, refs, config=self._config, response_id=str(uuid.uuid4()), host=facts
                )
            )
            log.info("Allocate %s: devices %s", self._resource.name, ids)
        return out

    async def preferred(self, requests: list[allocation.PreferredRequest]) -> list[list[str]]:
        return [[] for _ in requests]  # no preference: kubelet picks
