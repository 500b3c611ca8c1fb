"""The DRA kubelet plugin's gRPC service: ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` and the
``v1beta1`` one on one unix socket (``<plugin dir>/dra.sock``).

kubelet 1.36 calls the first service of the plugin's GetInfo list that it knows (``v1.DRAPlugin``;
kubelets before 1.34 know ``v1beta1.DRAPlugin`` only). Both carry the same messages but ``Device``'s
``share_id`` (v1 only). Every claim of a request gets an entry in the answer's map (kubelet fails a
pod whose claim is missing from it); a claim's failure is its ``error``, never a gRPC error: the
other claims of the call are still answered. The work is ``prepare.Preparer``'s.

Given a health source, the same socket also serves ``v1alpha1.DRAResourceHealth`` (``healthwatch``):
kubelet 1.36 opens its ``NodeWatchResources`` stream on every registered DRA plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
from collections.abc import Sequence
from typing import Any, Protocol

import grpc
from vgpu.kubeletapi.dra.v1 import api_pb2 as v1
from vgpu.kubeletapi.dra.v1 import api_pb2_grpc as v1_grpc
from vgpu.kubeletapi.dra.v1beta1 import api_pb2 as v1beta1
from vgpu.kubeletapi.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2_grpc as health_grpc

from vgpu_device_plugin.dra import healthwatch
from vgpu_device_plugin.dra.prepare import ClaimRef, Prepared

log = logging.getLogger(__name__)


class Handler(Protocol):
    """``prepare.Preparer``'s two calls."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Prepared]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]: ...


def _refs(claims: Sequence[Any]) -> list[ClaimRef]:
    return [ClaimRef(uid=c.uid, namespace=c.namespace, name=c.name) for c in claims]


class V1Service(v1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: object
    ) -> v1.NodePrepareResourcesResponse:
        results = await self._handler.prepare(_refs(request.claims))
        answer = v1.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = answer.claims[uid]
            entry.error = result.error
            for d in result.devices:
                device = entry.devices.add(
                    request_names=[d.request],
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_device_ids),
                )
                if d.share_id is not None:
                    device.share_id = d.share_id
        return answer

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: object
    ) -> v1.NodeUnprepareResourcesResponse:
        results = await self._handler.unprepare(_refs(request.claims))
        answer = v1.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            answer.claims[uid].error = error
        return answer


class V1beta1Service(v1beta1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (no ``share_id``)."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: object
    ) -> v1beta1.NodePrepareResourcesResponse:
        results = await self._handler.prepare(_refs(request.claims))
        answer = v1beta1.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = answer.claims[uid]
            entry.error = result.error
            for d in result.devices:
                entry.devices.add(
                    request_names=[d.request],
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_device_ids),
                )
        return answer

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: object
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        results = await self._handler.unprepare(_refs(request.claims))
        answer = v1beta1.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            answer.claims[uid].error = error
        return answer


class DraServer:
    """Serves both services on ``socket_path`` (a stale socket is replaced; removed on stop), and
    ``DRAResourceHealth`` when given a ``health`` source."""

    def __init__(
        self,
        handler: Handler,
        socket_path: pathlib.Path,
        *,
        health: healthwatch.HealthSource | None = None,
        health_service: dict[str, Any] | None = None,
    ) -> None:
        """``health_service``: keyword arguments of ``healthwatch.HealthService`` (its refresh
        period, timeout and clocks)."""
        self.socket_path = socket_path
        self._handler = handler
        self._server: grpc.aio.Server | None = None
        self._feed = healthwatch.HealthFeed(health) if health is not None else None
        self.health_service = (
            healthwatch.HealthService(self._feed, **(health_service or {}))
            if self._feed is not None
            else None
        )
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            self.socket_path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()  # a stale socket from an earlier run
        except OSError as exc:
            raise OSError(f"cannot serve the DRA plugin on {self.socket_path}: {exc}") from None
        server = grpc.aio.server()
        v1_grpc.add_DRAPluginServicer_to_server(V1Service(self._handler), server)  # type: ignore[no-untyped-call]
        v1beta1_grpc.add_DRAPluginServicer_to_server(V1beta1Service(self._handler), server)  # type: ignore[no-untyped-call]
        if self.health_service is not None:
            health_grpc.add_DRAResourceHealthServicer_to_server(self.health_service, server)  # type: ignore[no-untyped-call]
        try:
            server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError as exc:  # grpc's word for a socket it cannot bind
            raise OSError(f"cannot serve the DRA plugin on {self.socket_path}: {exc}") from None
        await server.start()
        self._server = server
        if self._feed is not None:
            self._feed.reopen()
            self._pump = asyncio.create_task(self._feed.run(), name="dra-health-feed")
        log.info(
            "DRA plugin serving v1 and v1beta1 DRAPlugin%s on %s",
            " and v1alpha1 DRAResourceHealth" if self._feed is not None else "",
            self.socket_path,
        )

    async def stop(self, *, grace_s: float = 1.0) -> None:
        if self._feed is not None:
            await self._feed.close()  # health streams end at once (OK), not after the grace period
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
            self._pump = None
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # never made, or no dir
            self.socket_path.unlink()
