"""The emulated kubelet's device-plugin Registration: the servicer, validation, dialing the plugin.

A ``Register`` is validated as a newer kubelet does (version ``v1beta1``, an extended resource
name), then kubelet dials ``<socket_dir>/<endpoint>`` (``dial_timeout_s``) and calls
``GetDevicePluginOptions``; any failure is ``RegisterRejected`` with kubelet's words, which the
plugin gets as ``UNKNOWN``. What follows (ListAndWatch, the Node's capacity) is ``kubelet``'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from vgpu.core import errors
from vgpu.kubeletapi.v1beta1 import api_pb2, api_pb2_grpc
from vgpu.localcluster import kubeletadmit, podresources

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1beta1",)
DIAL_TIMEOUT_S = 10.0


class RegisterRejected(errors.VgpuError):
    """kubelet refused a plugin's Register; the message is kubelet's, the plugin gets it as UNKNOWN."""


class RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    """``v1beta1.Registration`` for one node: hands each request to ``register``."""

    def __init__(self, *, node: str, register: Callable[[api_pb2.RegisterRequest], Awaitable[None]]) -> None:
        self._node = node
        self._register = register

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        try:
            await self._register(request)
        except RegisterRejected as err:
            log.info("node %s: rejected Register of %r: %s", self._node, request.resource_name, err)
            await context.abort(grpc.StatusCode.UNKNOWN, str(err))
        return api_pb2.Empty()


async def connect(
    request: api_pb2.RegisterRequest, *, socket_dir: Path, dial_timeout_s: float
) -> kubeletadmit.Endpoint:
    """Validate ``request``, dial the plugin and read its options: its endpoint (no task yet)."""
    if request.version not in SUPPORTED_VERSIONS:
        versions = "[" + " ".join(f'"{v}"' for v in SUPPORTED_VERSIONS) + "]"
        raise RegisterRejected(
            f'requested API version "{request.version}" is not supported by kubelet. '
            f"Supported versions are {versions}"
        )
    resource = request.resource_name
    if not podresources.is_extended_resource_name(resource):
        raise RegisterRejected(f'the ResourceName "{resource}" is invalid')
    path = socket_dir / request.endpoint
    channel = grpc.aio.insecure_channel(f"unix://{path}")
    try:
        await asyncio.wait_for(channel.channel_ready(), dial_timeout_s)
        stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        options = await stub.GetDevicePluginOptions(api_pb2.Empty())
    except TimeoutError:
        await channel.close(None)
        raise RegisterRejected(
            f"failed to dial device plugin: dial unix {path}: context deadline exceeded"
        ) from None
    except grpc.aio.AioRpcError as err:
        await channel.close(None)
        raise RegisterRejected(
            f"failed to get device plugin options: {kubeletadmit.go_rpc_error(err)}"
        ) from None
    return kubeletadmit.Endpoint(resource, channel, stub, options)
