"""Our values ↔ kubelet v1beta1 protobuf messages (with ``server`` and ``registration``, the only
importers of the generated modules)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vgpu.core import allocation
from vgpu.core.device import GpuUuid
from vgpu.kubeletapi.v1beta1 import api_pb2

from vgpu_device_plugin.inventory import VirtualDevice

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def options(*, get_preferred_allocation: bool) -> api_pb2.DevicePluginOptions:
    return api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=get_preferred_allocation
    )


def register_request(
    *, endpoint: str, resource_name: str, plugin_options: api_pb2.DevicePluginOptions
) -> api_pb2.RegisterRequest:
    return api_pb2.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource_name, options=plugin_options
    )


def device_list(
    devices: Sequence[VirtualDevice], healthy: Callable[[GpuUuid], bool]
) -> api_pb2.ListAndWatchResponse:
    out = []
    for d in devices:
        msg = api_pb2.Device(ID=d.id, health=HEALTHY if healthy(d.gpu) else UNHEALTHY)
        if d.numa is not None:
            msg.topology.nodes.append(api_pb2.NUMANode(ID=d.numa))
        out.append(msg)
    return api_pb2.ListAndWatchResponse(devices=out)


def allocate_requests(request: api_pb2.AllocateRequest) -> list[list[str]]:
    return [list(c.devices_ids) for c in request.container_requests]


def container_response(alloc: allocation.ContainerAllocation) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=alloc.envs,
        mounts=[
            api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in alloc.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in alloc.devices
        ],
        annotations=alloc.annotations,
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in alloc.cdi_devices],
    )


def allocate_response(allocs: Sequence[allocation.ContainerAllocation]) -> api_pb2.AllocateResponse:
    return api_pb2.AllocateResponse(container_responses=[container_response(a) for a in allocs])


def preferred_requests(request: api_pb2.PreferredAllocationRequest) -> list[allocation.PreferredRequest]:
    return [
        allocation.PreferredRequest(
            available=tuple(c.available_deviceIDs),
            must_include=tuple(c.must_include_deviceIDs),
            size=int(c.allocation_size),
        )
        for c in request.container_requests
    ]


def preferred_response(choices: Sequence[Sequence[str]]) -> api_pb2.PreferredAllocationResponse:
    return api_pb2.PreferredAllocationResponse(
        container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=list(c)) for c in choices]
    )
