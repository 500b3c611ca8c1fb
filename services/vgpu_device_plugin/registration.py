"""Register a plugin with kubelet: ``/v1beta1.Registration/Register`` on ``kubelet.sock``."""

from __future__ import annotations

import logging
import pathlib

import grpc
from vgpu.core import errors
from vgpu.kubeletapi.v1beta1 import api_pb2, api_pb2_grpc

from vgpu_device_plugin import convert

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
) -> None:
    """Register ``endpoint`` (a file name in kubelet's device-plugin dir) for ``resource_name``."""
    request = convert.register_request(
        endpoint=endpoint, resource_name=resource_name, plugin_options=plugin_options
    )
    try:
        async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(request, timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
        detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        raise RegistrationError(
            f"Register {resource_name} (endpoint {endpoint}) with {kubelet_socket} failed: {code}: {detail}"
        ) from None
    log.info("registered %s with kubelet (endpoint %s)", resource_name, endpoint)
