"""The generated kubelet API stubs: fresh, wire-identical paths and field numbers, no sys.path tricks."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from vgpu.kubeletapi.v1beta1 import api_pb2, api_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_checked_in_stubs_match_a_fresh_generation() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_service_paths_use_package_v1beta1() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    services = {
        s.full_name: [m.name for m in s.methods] for s in api_pb2.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    assert hasattr(api_pb2_grpc, "add_DevicePluginServicer_to_server")
    assert (
        api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming
    )


def test_field_numbers_match_protocol_table() -> None:
    expected = {
        "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
        "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
        "Device": {"ID": 1, "health": 2, "topology": 3},
        "NUMANode": {"ID": 1},
        "ContainerPreferredAllocationRequest": {
            "available_deviceIDs": 1,
            "must_include_deviceIDs": 2,
            "allocation_size": 3,
        },
        "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
        "ContainerAllocateRequest": {"devices_ids": 1},
        "PreStartContainerRequest": {"devices_ids": 1},
        "ContainerAllocateResponse": {
            "envs": 1,
            "mounts": 2,
            "devices": 3,
            "annotations": 4,
            "cdi_devices": 5,
        },
        "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
        "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
        "CDIDevice": {"name": 1},
    }
    for message, fields in expected.items():
        desc = api_pb2.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in desc.fields} == fields, message


def test_known_wire_bytes() -> None:
    # field 1 (ID, length-delimited) "a", field 2 (health) "Healthy"
    raw = api_pb2.Device(ID="a", health="Healthy").SerializeToString()
    assert raw == b"\n\x01a\x12\x07Healthy"
