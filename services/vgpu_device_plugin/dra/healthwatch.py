"""``v1alpha1.DRAResourceHealth/NodeWatchResources`` on the DRA plugin's socket: kubelet ≥ 1.36
(``ResourceHealthStatus``, beta and on) streams our GPUs' health into the pods that hold them
(``allocatedResourcesStatus``); docs/protocol.md, "Device health for kubelet".

What to send and when is ``vgpu.core.dra.health``'s; this module only feeds it and speaks gRPC.
Each stream is its own handler coroutine: it sends every device at once, then waits on the
:class:`HealthFeed` (one condition every stream shares, woken by one pump task per server) for a
change or the next refresh, and ends when kubelet cancels it (the coroutine is cancelled; nothing
else was started for it) or when the server stops (:meth:`HealthFeed.close`: every stream ends
with OK, no grace period to wait out). The states are read from memory; nothing here blocks the
event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from vgpu.core.dra import health
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2 as pb
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2_grpc as pb_grpc

from vgpu_device_plugin.dra.slicepub import MonitorSource

log = logging.getLogger(__name__)


class HealthSource(Protocol):
    """The devices' health now, and a way to wait for it to change (``HealthMonitor``'s counter)."""

    @property
    def version(self) -> int: ...

    async def wait_changed(self, version: int) -> int: ...

    def states(self) -> Mapping[health.Key, health.DeviceHealth]: ...


@dataclasses.dataclass(frozen=True)
class MonitorHealth:
    """A :class:`HealthSource` over the slice publisher's source (the GPUs as the slice publishes
    them, with the health monitor's state) and the monitor's reasons."""

    source: MonitorSource

    @property
    def version(self) -> int:
        return self.source.version

    async def wait_changed(self, version: int) -> int:
        return await self.source.wait_changed(version)

    def states(self) -> Mapping[health.Key, health.DeviceHealth]:
        return health.device_states(self.source.inventory(), reasons=self.source.monitor.tracker.reasons())


class HealthFeed:
    """Wakes every stream when the source changed (``run``, one task) or the server stops (``close``)."""

    def __init__(self, source: HealthSource) -> None:
        self.source = source
        self._cond = asyncio.Condition()
        self.version = 0
        self.closed = False

    async def run(self) -> None:
        """Until cancelled: turn each change of the source into a wake-up of every stream."""
        seen = self.source.version
        while True:
            seen = await self.source.wait_changed(seen)
            async with self._cond:
                self.version += 1
                self._cond.notify_all()

    def reopen(self) -> None:
        """Serve streams again (a server started after a stop)."""
        self.closed = False

    async def close(self) -> None:
        async with self._cond:
            self.closed = True
            self._cond.notify_all()

    async def wait(self, seen: int, *, timeout_s: float) -> int:
        """The version once it differs from ``seen``, the server closes, or ``timeout_s`` passed."""
        async with self._cond:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._cond.wait_for(lambda: self.version != seen or self.closed)
            except TimeoutError:
                pass
            return self.version


def to_wire(
    states: list[health.DeviceHealth], *, now_unix: int, timeout_s: int
) -> pb.NodeWatchResourcesResponse:
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=s.pool, device_name=s.device),
                health=s.health.name,
                last_updated_time=now_unix,
                health_check_timeout_seconds=timeout_s,
                message=s.message,
            )
            for s in states
        ]
    )


class HealthService(pb_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``: one :class:`health.HealthStream` per call."""

    def __init__(
        self,
        feed: HealthFeed,
        *,
        refresh_s: float = health.REFRESH_S,
        timeout_s: int = health.TIMEOUT_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._feed = feed
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._monotonic = monotonic
        self._wall = wall
        self.open_streams = 0  # how many calls are being served (tests and logs)

    async def NodeWatchResources(
        self, request: pb.NodeWatchResourcesRequest, context: object
    ) -> AsyncIterator[pb.NodeWatchResourcesResponse]:
        feed = self._feed
        stream = health.HealthStream(refresh_s=self._refresh_s)
        self.open_streams += 1
        log.info("kubelet watches the GPUs' health (%d stream(s))", self.open_streams)
        try:
            seen = feed.version
            while not feed.closed:
                batch = stream.batch(feed.source.states(), now=self._monotonic())
                if batch:
                    yield to_wire(batch, now_unix=int(self._wall()), timeout_s=self._timeout_s)
                seen = await feed.wait(seen, timeout_s=stream.wait_s(now=self._monotonic()))
        finally:
            self.open_streams -= 1
            log.info("a health stream ended (%d left)", self.open_streams)
