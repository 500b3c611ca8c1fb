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
