"""Register a plugin with kubelet: ``/v1beta1.Registration/Register`` on ``kubelet.sock``.

``Kubelet.register_all`` registers a session's resources: the count resource first (its failure
raises: the session fails and is retried), then the others, each of whose failure is logged and
left to ``Kubelet.retry`` while the rest serve (one MIG profile never takes the node down)."""

from __future__ import annotations

import asyncio
import logging
import pathlib
from collections.abc import Callable, Sequence

import grpc
from vgpu.core import errors
from vgpu.kubeletapi.v1beta1 import api_pb2, api_pb2_grpc

from vgpu_device_plugin import convert
from vgpu_device_plugin.server import DevicePluginService

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"


class RegistrationError(errors.VgpuError):
    """kubelet could not be reached or refused the registration."""


async def register(
    kubelet_socket: pathlib.Path,
    *,
    endpoint: str,
    resource_name: str,
    plugin_options: api_pb2.DevicePluginOptions,
    timeout_s: float = 5.0,
    wait_for_ready: bool = True,
) -> None:
    """Register ``endpoint`` (a file name in kubelet's device-plugin dir) for ``resource_name``.

    ``wait_for_ready``: wait up to ``timeout_s`` for kubelet to listen (pass False when kubelet.sock
    does not exist: fail at once, the caller watches for it to appear)."""
    request = convert.register_request(
        endpoint=endpoint, resource_name=resource_name, plugin_options=plugin_options
    )
    try:
        # A channel of its own: no subchannel shared with an earlier failed attempt, whose reconnect
        # back-off would fail this call at once.
        async with grpc.aio.insecure_channel(
            f"unix://{kubelet_socket}", options=[("grpc.use_local_subchannel_pool", 1)]
        ) as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(request, timeout=timeout_s, wait_for_ready=wait_for_ready)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
        detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        raise RegistrationError(
            f"Register {resource_name} (endpoint {endpoint}) with {kubelet_socket} failed: {code}: {detail}"
        ) from None
    log.info("registered %s with kubelet (endpoint %s)", resource_name, endpoint)


class Kubelet:
    """kubelet's Registration service at ``socket``; ``listening`` says whether it exists now."""

    def __init__(self, socket: pathlib.Path, *, listening: Callable[[], bool]) -> None:
        self.socket = socket
        self._listening = listening

    async def register(self, service: DevicePluginService, *, endpoint: str) -> None:
        await register(
            self.socket,
            endpoint=endpoint,
            resource_name=service.resource.name,
            plugin_options=service.options,
            wait_for_ready=self._listening(),
        )

    async def register_all(
        self,
        services: Sequence[DevicePluginService],
        *,
        on_primary: Callable[[DevicePluginService], None],
        node: str,
        retry_s: float,
    ) -> list[DevicePluginService]:
        """Register the count resource (first; its failure raises, ``on_primary`` is told of its
        success) and then the others; return those kubelet did not take (logged)."""
        primary, *others = services
        await self.register(primary, endpoint=primary.resource.socket_name)
        on_primary(primary)
        failed = []
        for service in others:
            try:
                await self.register(service, endpoint=service.resource.socket_name)
            except RegistrationError as exc:
                log.error(
                    "node %s: %s; the other resources keep serving; retrying every %.0f s", node, exc, retry_s
                )
                failed.append(service)
        return failed

    async def retry(self, failed: list[DevicePluginService], *, node: str, retry_s: float) -> None:
        """Register ``failed`` again every ``retry_s`` until kubelet takes each."""
        while failed:
            await asyncio.sleep(retry_s)
            for service in list(failed):
                try:
                    await self.register(service, endpoint=service.resource.socket_name)
                except RegistrationError as exc:
                    log.error("node %s: %s; retrying in %.0f s", node, exc, retry_s)
                    continue
                failed.remove(service)
