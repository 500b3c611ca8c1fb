"""The kubelet DevicePlugin gRPC service (grpc.aio) for one resource, on one unix socket.

``ListAndWatch`` sends the full device list first and again on every health change, and ends
when the plugin stops. ``Allocate`` and ``GetPreferredAllocation`` delegate to an
``AllocateHandler`` (HAMi sharing or MIG passthrough); its ``AllocationError`` becomes
FAILED_PRECONDITION, any other failure INTERNAL, each with a message naming the pod and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
from collections.abc import AsyncIterator
from typing import Protocol

import grpc
from vgpu.core import allocation, errors
from vgpu.kubeletapi.v1beta1 import api_pb2, api_pb2_grpc

from vgpu_device_plugin import convert
from vgpu_device_plugin.health import HealthMonitor
from vgpu_device_plugin.inventory import Resource

log = logging.getLogger(__name__)


class AllocateHandler(Protocol):
    async def allocate(self, requests: list[list[str]]) -> list[allocation.ContainerAllocation]: ...

    async def preferred(self, requests: list[allocation.PreferredRequest]) -> list[list[str]]: ...


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """One resource's DevicePlugin service; call its methods directly in tests."""

    def __init__(
        self,
        *,
        resource: Resource,
        health: HealthMonitor,
        handler: AllocateHandler,
        get_preferred_allocation: bool,
    ) -> None:
        self.resource = resource
        self._health = health
        self._handler = handler
        self.options = convert.options(get_preferred_allocation=get_preferred_allocation)
        self.stopped = asyncio.Event()
        self.watchers = 0  # ListAndWatch streams open now (kubelet keeps one while it has us)
        self.watchers_changed = asyncio.Event()  # set on every open and close; the reader clears it

    def _watching(self, delta: int) -> None:
        self.watchers += delta
        self.watchers_changed.set()

    def device_list(self) -> api_pb2.ListAndWatchResponse:
        return convert.device_list(self.resource.devices, self._health.tracker.healthy)

    async def GetDevicePluginOptions(
        self,
        request: api_pb2.Empty,
        context: grpc.aio.ServicerContext[api_pb2.Empty, api_pb2.DevicePluginOptions],
    ) -> api_pb2.DevicePluginOptions:
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: object
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        self._watching(+1)
        try:
            version = self._health.version
            log.info("ListAndWatch(%s): sending %d devices", self.resource.name, len(self.resource.devices))
            yield self.device_list()
            while not self.stopped.is_set():
                changed = asyncio.ensure_future(self._health.wait_changed(version))
                stop = asyncio.ensure_future(self.stopped.wait())
                try:
                    await asyncio.wait({changed, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (changed, stop):
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                if self.stopped.is_set():
                    break
                version = self._health.version
                response = self.device_list()
                unhealthy = sum(1 for d in response.devices if d.health != convert.HEALTHY)
                log.info(
                    "ListAndWatch(%s): health changed, sending %d devices (%d unhealthy)",
                    self.resource.name,
                    len(response.devices),
                    unhealthy,
                )
                yield response
            log.info("ListAndWatch(%s): stream ends (plugin stopping)", self.resource.name)
        finally:
            self._watching(-1)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.AllocateResponse:
        try:
            allocs = await self._handler.allocate(convert.allocate_requests(request))
        except errors.AllocationError as exc:
            log.warning("Allocate(%s) refused: %s", self.resource.name, exc)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except errors.VgpuError as exc:
            log.error("Allocate(%s) failed: %s", self.resource.name, exc)
            await context.abort(grpc.StatusCode.INTERNAL, f"Allocate failed: {exc}")
        return convert.allocate_response(allocs)

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.PreferredAllocationResponse:
        try:
            choices = await self._handler.preferred(convert.preferred_requests(request))
        except errors.VgpuError as exc:
            log.warning("GetPreferredAllocation(%s): no preference: %s", self.resource.name, exc)
            choices = [[] for _ in request.container_requests]
        return convert.preferred_response(choices)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


class PluginServer:
    """Serves one DevicePluginService on ``socket_path`` (removes the socket on stop)."""

    def __init__(self, service: DevicePluginService, socket_path: pathlib.Path) -> None:
        self.service = service
        self.socket_path = socket_path
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a stale socket from an earlier run
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)  # type: ignore[no-untyped-call]
        try:
            # grpc says a socket it cannot bind (no directory yet, no permission, a path too
            # long) with a bare RuntimeError: an OSError here, a start failure the manager retries
            server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError as exc:
            raise OSError(f"cannot serve {self.service.resource.name} on {self.socket_path}: {exc}") from None
        await server.start()
        self._server = server
        log.info("serving %s on %s", self.service.resource.name, self.socket_path)

    async def stop(self, *, grace_s: float = 1.0) -> None:
        self.service.stopped.set()
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        log.info("stopped serving %s (socket %s removed)", self.service.resource.name, self.socket_path)
