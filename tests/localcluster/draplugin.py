"""A small DRA kubelet plugin for the emulated kubelet's tests, over real unix sockets: the plugin
registration service (``GetInfo``, ``NotifyRegistrationStatus``) and ``DRAPlugin`` v1 and/or v1beta1.
Prepare writes one CDI spec per claim (kind ``kube-vgpu.io/claim``, one device per request, an env
naming the claim) and answers its ids; Unprepare removes it. Calls and statuses are recorded.
With ``health=True`` it also serves ``v1alpha1.DRAResourceHealth``: each ``NodeWatchResources``
stream sends what the test puts with ``send_health`` (without it kubelet gets Unimplemented)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
from vgpu.core.dra import names
from vgpu.kubeletapi.dra.v1 import api_pb2 as v1_pb2
from vgpu.kubeletapi.dra.v1 import api_pb2_grpc as v1_grpc
from vgpu.kubeletapi.dra.v1beta1 import api_pb2 as v1beta1_pb2
from vgpu.kubeletapi.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2 as health_pb2
from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from vgpu.kubeletapi.pluginregistration.v1 import api_pb2 as reg_pb2
from vgpu.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc


class TestDraPlugin:
    """Serve ``start()`` .. ``stop()``; ``versions`` is what GetInfo lists."""

    __test__ = False

    def __init__(
        self,
        *,
        registry_dir: Path,
        plugin_dir: Path,
        cdi_dir: Path,
        driver: str = names.DRIVER,
        versions: tuple[str, ...] = names.KUBELET_SERVICES,
        plugin_type: str = "DRAPlugin",
        health: bool = False,
    ) -> None:
        self.registry_socket = registry_dir / f"{driver}-reg.sock"
        self.endpoint = plugin_dir / "dra.sock"
        self.cdi_dir = cdi_dir
        self.driver = driver
        self.versions = versions
        self.plugin_type = plugin_type
        self.statuses: list[tuple[bool, str]] = []
        self.registered = asyncio.Event()
        self.prepared: list[list[str]] = []  # claim uids per call
        self.unprepared: list[list[str]] = []
        self.fail_prepare = ""  # an error to answer for every claim
        self.calls = asyncio.Event()
        self._servers: list[grpc.aio.Server] = []
        self.health = health
        self.health_streams: list[asyncio.Queue[health_pb2.NodeWatchResourcesResponse | None]] = []
        self.health_watched = asyncio.Event()  # set at each new stream

    def send_health(self, *devices: tuple[str, int, str], timeout_s: int = 0) -> None:
        """One message on every open stream: (device on pool n1, health, message) each."""
        message = health_pb2.NodeWatchResourcesResponse(
            devices=[
                health_pb2.DeviceHealth(
                    device=health_pb2.DeviceIdentifier(pool_name="n1", device_name=name),
                    health=health,  # type: ignore[arg-type]
                    message=text,
                    health_check_timeout_seconds=timeout_s,
                )
                for name, health, text in devices
            ]
        )
        for queue in self.health_streams:
            queue.put_nowait(message)

    def end_health_streams(self) -> None:
        for queue in self.health_streams:
            queue.put_nowait(None)

    async def start(self) -> None:
        self.endpoint.parent.mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        plugin = grpc.aio.server()
        v1_grpc.add_DRAPluginServicer_to_server(_V1(self), plugin)  # type: ignore[no-untyped-call]
        v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1(self), plugin)  # type: ignore[no-untyped-call]
        if self.health:
            health_grpc.add_DRAResourceHealthServicer_to_server(_Health(self), plugin)  # type: ignore[no-untyped-call]
        plugin.add_insecure_port(f"unix://{self.endpoint}")
        await plugin.start()
        registration = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)  # type: ignore[no-untyped-call]
        registration.add_insecure_port(f"unix://{self.registry_socket}")
        await registration.start()
        self._servers = [plugin, registration]

    async def stop(self) -> None:
        for server in self._servers:
            await server.stop(None)
        self._servers = []
        self.registry_socket.unlink(missing_ok=True)

    def spec_path(self, uid: str) -> Path:
        return self.cdi_dir / f"claim-{uid}.json"

    def prepare(self, claims: Any, pb2: Any, *, with_share: bool) -> Any:
        self.prepared.append([c.uid for c in claims])
        self.calls.set()
        answer = pb2.NodePrepareResourcesResponse()
        for claim in claims:
            if self.fail_prepare:
                answer.claims[claim.uid].error = self.fail_prepare
                continue
            device = names.cdi_device(claim.uid, "gpu")
            spec = {
                "cdiVersion": "0.6.0",
                "kind": names.CDI_KIND,
                "devices": [
                    {"name": device, "containerEdits": {"env": [f"CLAIM={claim.namespace}/{claim.name}"]}}
                ],
            }
            self.spec_path(claim.uid).write_text(json.dumps(spec))
            extra = {"share_id": "3c4a2d7e-1a6b-4c7d-9f00-0123456789ab"} if with_share else {}
            answer.claims[claim.uid].devices.append(
                pb2.Device(
                    request_names=["gpu"],
                    pool_name="n1",
                    device_name="gpu-0",
                    cdi_device_ids=[f"{names.CDI_KIND}={device}"],
                    **extra,
                )
            )
        return answer

    def unprepare(self, claims: Any, pb2: Any) -> Any:
        self.unprepared.append([c.uid for c in claims])
        self.calls.set()
        answer = pb2.NodeUnprepareResourcesResponse()
        for claim in claims:
            self.spec_path(claim.uid).unlink(missing_ok=True)
            answer.claims[claim.uid].error = ""
        return answer


class _V1(v1_grpc.DRAPluginServicer):
    def __init__(self, plugin: TestDraPlugin) -> None:
        self._p = plugin

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        if "v1.DRAPlugin" not in self._p.versions:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "v1 not served")
        return self._p.prepare(request.claims, v1_pb2, with_share=True)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return self._p.unprepare(request.claims, v1_pb2)


class _V1beta1(v1beta1_grpc.DRAPluginServicer):
    def __init__(self, plugin: TestDraPlugin) -> None:
        self._p = plugin

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return self._p.prepare(request.claims, v1beta1_pb2, with_share=False)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return self._p.unprepare(request.claims, v1beta1_pb2)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: TestDraPlugin) -> None:
        self._p = plugin

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(
            type=self._p.plugin_type,
            name=self._p.driver,
            endpoint=str(self._p.endpoint),
            supported_versions=list(self._p.versions),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._p.statuses.append((request.plugin_registered, request.error))
        self._p.registered.set()
        return reg_pb2.RegistrationStatusResponse()


class _Health(health_grpc.DRAResourceHealthServicer):
    def __init__(self, plugin: TestDraPlugin) -> None:
        self._p = plugin

    async def NodeWatchResources(self, request: Any, context: Any) -> Any:
        queue: asyncio.Queue[health_pb2.NodeWatchResourcesResponse | None] = asyncio.Queue()
        self._p.health_streams.append(queue)
        self._p.health_watched.set()
        try:
            while (message := await queue.get()) is not None:
                yield message
        finally:
            self._p.health_streams.remove(queue)
