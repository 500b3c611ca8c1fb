"""What kubelet 1.36 does with a DRA plugin, for tests over real unix sockets: the plugin watcher's
handshake (dial the registration socket, GetInfo, check the type, pick the first of the plugin's
versions that kubelet knows, NotifyRegistrationStatus) and the DRA manager's Prepare/Unprepare
calls on the endpoint, in the service version it picked (pkg/kubelet/pluginmanager,
pkg/kubelet/cm/dra/plugin)."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import grpc
from vgpu.kubeletapi.dra.v1 import api_pb2 as v1
from vgpu.kubeletapi.dra.v1 import api_pb2_grpc as v1_grpc
from vgpu.kubeletapi.dra.v1beta1 import api_pb2 as v1beta1
from vgpu.kubeletapi.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from vgpu.kubeletapi.pluginregistration.v1 import api_pb2 as reg
from vgpu.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # servicesSupportedByKubelet, newest first


class FakeDraKubelet:
    def __init__(self, *, services: Sequence[str] = KUBELET_SERVICES) -> None:
        self.services = tuple(services)
        self.info: reg.PluginInfo | None = None
        self.chosen = ""
        self._channel: grpc.aio.Channel | None = None

    async def register(self, socket: pathlib.Path, *, accept: bool = True, wait_s: float = 0.0) -> str:
        """The handshake on ``socket``; returns the chosen service ('' when refused). ``wait_s``:
        wait so long for the socket to appear (kubelet's watcher only dials a socket it saw)."""
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = await stub.GetInfo(reg.InfoRequest(), timeout=max(1.0, wait_s), wait_for_ready=wait_s > 0)
            self.info = info
            chosen = next((v for v in info.supported_versions if v in self.services), "")
            error = ""
            if info.type != "DRAPlugin":
                error = f"no handler registered for plugin type: {info.type}"
            elif not chosen:
                error = f"none of services supported by the plugin ({list(info.supported_versions)}) are supported"
            elif not accept:
                error = "endpoint already registered"
            registered = not error
            await stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=registered, error=error), timeout=1.0
            )
        if registered:
            await self.connect(pathlib.Path(info.endpoint), service=chosen)
        return chosen if registered else ""

    async def connect(self, endpoint: pathlib.Path, *, service: str = "v1.DRAPlugin") -> None:
        """Dial ``endpoint`` to call ``service`` (as after a registration)."""
        await self.close()
        self.chosen = service
        self._channel = grpc.aio.insecure_channel(f"unix:{endpoint}")

    def _stub(self) -> Any:
        assert self._channel is not None, "not registered"
        if self.chosen == "v1.DRAPlugin":
            return v1_grpc.DRAPluginStub(self._channel)  # type: ignore[no-untyped-call]
        return v1beta1_grpc.DRAPluginStub(self._channel)  # type: ignore[no-untyped-call]

    def _api(self) -> Any:
        return v1 if self.chosen == "v1.DRAPlugin" else v1beta1

    async def prepare(self, *claims: tuple[str, str, str]) -> Any:
        """NodePrepareResources for (uid, namespace, name) claims."""
        api = self._api()
        request = api.NodePrepareResourcesRequest(
            claims=[api.Claim(uid=u, namespace=ns, name=n) for u, ns, n in claims]
        )
        return await self._stub().NodePrepareResources(request, timeout=10.0)

    async def unprepare(self, *claims: tuple[str, str, str]) -> Any:
        api = self._api()
        request = api.NodeUnprepareResourcesRequest(
            claims=[api.Claim(uid=u, namespace=ns, name=n) for u, ns, n in claims]
        )
        return await self._stub().NodeUnprepareResources(request, timeout=10.0)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None
