"""The DRA resource health stubs (KEP-4680): kubelet's bare ``v1alpha1`` package, its service path,
field numbers and enum values, so kubelet 1.36's client and our server meet on the wire."""

from __future__ import annotations

from vgpu.kubeletapi.drahealth.v1alpha1 import api_pb2, api_pb2_grpc


def test_the_service_path_is_kubelets() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1alpha1"
    service = api_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert service.full_name == "v1alpha1.DRAResourceHealth"
    method = service.methods_by_name["NodeWatchResources"]
    assert method.server_streaming and not method.client_streaming
    assert hasattr(api_pb2_grpc, "add_DRAResourceHealthServicer_to_server")


def test_field_numbers_and_enum_values_match_kubelets_proto() -> None:
    expected = {
        "NodeWatchResourcesRequest": {},
        "DeviceIdentifier": {"pool_name": 1, "device_name": 2},
        "DeviceHealth": {
            "device": 1,
            "health": 2,
            "last_updated_time": 3,
            "health_check_timeout_seconds": 4,
            "message": 5,
        },
        "NodeWatchResourcesResponse": {"devices": 1},
    }
    for message, fields in expected.items():
        desc = api_pb2.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in desc.fields} == fields, message
    assert dict(api_pb2.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_known_wire_bytes() -> None:
    raw = api_pb2.DeviceHealth(
        device=api_pb2.DeviceIdentifier(pool_name="n", device_name="gpu-0"),
        health=api_pb2.UNHEALTHY,
        last_updated_time=1,
        health_check_timeout_seconds=60,
        message="x",
    ).SerializeToString()
    assert raw == b"\n\x0a\n\x01n\x12\x05gpu-0\x10\x02\x18\x01\x20\x3c\x2a\x01x"
