"""The HAMi annotation codec against the exact strings of docs/protocol.md, round trips and garbage."""

from __future__ import annotations

import contextlib
import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core import annotations, errors
from vgpu.core.annotations import ContainerDevice, NodeLock
from vgpu.core.device import Gpu, GpuUuid, Mode

V100_EXAMPLE = (
    '[{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},'
    '{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","index":1,"count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core","health":true}]'
)


def test_register_json_worked_example_decodes_and_reencodes_byte_for_byte() -> None:
    gpus = annotations.decode_node_register(V100_EXAMPLE)
    assert [g.uuid for g in gpus] == [
        "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec",
        "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448",
    ]
    assert gpus[0].index == 0 and gpus[0].numa == 0
    assert gpus[1].index == 1 and gpus[1].numa == 1
    assert all(g.memory_mib == 32768 and g.count == 10 and g.cores == 100 and g.health for g in gpus)
    assert annotations.encode_node_register(gpus) == V100_EXAMPLE


def test_register_omits_zero_values_like_go_omitempty() -> None:
    gpu = Gpu(GpuUuid("GPU-x"), 0, 4, 1024, 100, "NVIDIA-T4", numa=0, health=False)
    assert annotations.encode_node_register([gpu]) == (
        '[{"id":"GPU-x","count":4,"devmem":1024,"devcore":100,"type":"NVIDIA-T4","mode":"hami-core"}]'
    )


def test_register_legacy_nine_field_example() -> None:
    raw = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,10,7680,100,NVIDIA-Tesla P4,0,true,0,hami-core:"
    (gpu,) = annotations.decode_node_register(raw)
    assert gpu == Gpu(
        GpuUuid("GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"),
        0,
        10,
        7680,
        100,
        "NVIDIA-Tesla P4",
        0,
        Mode.HAMI_CORE,
        True,
    )
    assert annotations.encode_node_register_legacy([gpu]) == raw


def test_register_legacy_seven_fields_defaults_index_and_mode() -> None:
    (gpu,) = annotations.decode_node_register("GPU-a,10,7680,100,NVIDIA-Tesla P4,1,false:")
    assert (gpu.index, gpu.mode, gpu.numa, gpu.health) == (0, Mode.HAMI_CORE, 1, False)


def test_register_legacy_empty_segments_are_skipped() -> None:
    assert annotations.decode_node_register("::") == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[]", "no gpu found on node"),
        ("[", "invalid JSON"),
        ('{"id":"x"}', "expected a JSON array"),
        ('[{"id":""}]', "missing GPU UUID"),
        # the pod device string's separators: a pod bound to it would name another GPU, or none
        ('[{"id":"GPU-a;b"}]', "the pod device string's separators"),
        ('[{"id":"GPU-a:b"}]', "the pod device string's separators"),
        ('[{"id":"GPU-a,b"}]', "the pod device string's separators"),
        (",10,7680,100,T4,0,true:", "missing GPU UUID"),
        ("GPU-a;b,10,7680,100,T4,0,true:", "the pod device string's separators"),
        ('["x"]', "expected an object"),
        ('[{"id":"a","count":"ten"}]', "expected an integer"),
        ('[{"id":"a","health":"yes"}]', "expected a boolean"),
        ('[{"id":"a","mode":"turbo"}]', "unknown mode"),
        ('[{"id":"a","count":-1}]', "must not be negative"),
        ('[{"id":"a"},{"id":"a"}]', "duplicate GPU UUID"),
        ('[{"id":"a","migProfiles":{}}]', "expected a list"),
        ("no separators at all", "missing device separator"),
        ("justuuid:", "malformed node annotation segment"),
        ("a,b,c:", "unexpected field count 3"),
        ("GPU-a,ten,7680,100,T4,0,true:", "invalid integer"),
        ("GPU-a,10,7680,100,T4,0,maybe:", "invalid boolean"),
        ("GPU-a,10,7680,100,T4,0,true,0,warp:", "unknown mode"),
        (12, "expected a string, got int"),
        (None, "expected a string, got NoneType"),
        ("[" * 5000 + "]" * 5000, "invalid JSON"),
        ('[{"id":"a","count":' + "7" * 5000 + "}]", "invalid JSON"),
        ('[{"id":"a","devmem":' + "7" * 4000 + "}]", "integer out of range"),
        ("GPU-a,10,99999999999,100,T4,0,true:", "integer out of range"),
    ],
)
def test_register_garbage_raises_one_typed_error_naming_the_field(raw: object, message: str) -> None:
    with pytest.raises(errors.AnnotationError) as info:
        annotations.decode_node_register(raw)
    assert message in str(info.value)
    assert info.value.field.startswith("hami.io/node-nvidia-register")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,0:;",
            ((("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", 3000, 0),),),
        ),
        ("GPU-x,NVIDIA,3000,0:;GPU-x,NVIDIA,5000,0:;", ((("GPU-x", 3000, 0),), (("GPU-x", 5000, 0),))),
        ("GPU-a,NVIDIA,4000,30:GPU-b,NVIDIA,4000,30:;", ((("GPU-a", 4000, 30), ("GPU-b", 4000, 30)),)),
        (";uuid1,NVIDIA,1000,30:;", ((), (("uuid1", 1000, 30),))),
        (
            "device3,NVIDIA,5000,20:;device3,NVIDIA,4000,20:;",
            ((("device3", 5000, 20),), (("device3", 4000, 20),)),
        ),
        (
            ";uuid1,NVIDIA,1000,30:;uuid1,NVIDIA,1000,30:;",
            ((), (("uuid1", 1000, 30),), (("uuid1", 1000, 30),)),
        ),
    ],
)
def test_pod_devices_protocol_examples(
    raw: str, expected: tuple[tuple[tuple[str, int, int], ...], ...]
) -> None:
    decoded = annotations.decode_pod_devices(raw)
    assert tuple(tuple((d.uuid, d.memory_mib, d.cores) for d in c) for c in decoded) == expected
    assert all(d.type == "NVIDIA" for c in decoded for d in c)
    assert annotations.encode_pod_devices(decoded) == raw


def test_pod_devices_empty_map_encodes_to_nothing() -> None:
    assert annotations.encode_pod_devices(()) == ""
    assert annotations.decode_pod_devices("") == ()


def test_pod_devices_tolerates_hami_quirks() -> None:
    # extra fields are ignored; pieces without a comma are ignored; a missing final ';' is accepted
    decoded = annotations.decode_pod_devices("GPU-a,NVIDIA,10,20,extra:junk:")
    assert decoded == ((ContainerDevice(GpuUuid("GPU-a"), 10, 20),),)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("GPU-a,NVIDIA,10:;", "missing fields"),
        ("GPU-a,NVIDIA,ten,20:;", "invalid integer"),
        ("GPU-a,NVIDIA,10,x:;", "invalid integer"),
        (",NVIDIA,10,20:;", "empty GPU UUID"),
        ("GPU-a,NVIDIA,-10,20:;", "must not be negative"),
    ],
)
def test_pod_devices_garbage(raw: str, message: str) -> None:
    with pytest.raises(errors.AnnotationError) as info:
        annotations.decode_pod_devices(raw)
    assert message in str(info.value)
    assert "container 0" in info.value.field


_uuid = st.from_regex(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){0,3}", fullmatch=True)
_device = st.builds(
    ContainerDevice,
    uuid=_uuid.map(GpuUuid),
    memory_mib=st.integers(0, 10**6),
    cores=st.integers(0, 100),
)
_pod = st.lists(st.lists(_device, max_size=4).map(tuple), max_size=5).map(tuple)


@given(_pod)
def test_pod_devices_round_trip(pod: annotations.PodDevices) -> None:
    encoded = annotations.encode_pod_devices(pod)
    assert annotations.decode_pod_devices(encoded) == pod
    assert annotations.encode_pod_devices(annotations.decode_pod_devices(encoded)) == encoded


_gpu = st.builds(
    Gpu,
    uuid=_uuid.map(GpuUuid),
    index=st.integers(0, 15),
    count=st.integers(1, 64),
    memory_mib=st.integers(1, 200_000),
    cores=st.integers(1, 400),
    type=st.sampled_from(["NVIDIA-A100-SXM4-40GB", "NVIDIA-Tesla T4", "NVIDIA-H100 80GB HBM3"]),
    numa=st.integers(0, 7),
    mode=st.sampled_from(list(Mode)),
    health=st.booleans(),
)


@given(st.lists(_gpu, min_size=1, max_size=8, unique_by=lambda g: g.uuid))
def test_register_round_trips_json_and_legacy(gpus: list[Gpu]) -> None:
    assert annotations.decode_node_register(annotations.encode_node_register(gpus)) == gpus
    assert annotations.decode_node_register(annotations.encode_node_register_legacy(gpus)) == gpus


@given(st.text(max_size=200))
def test_decoders_never_raise_anything_but_annotation_error(raw: str) -> None:
    for decode in (
        annotations.decode_node_register,
        annotations.decode_pod_devices,
        annotations.decode_node_lock,
    ):
        with contextlib.suppress(errors.AnnotationError):
            decode(raw)


def test_node_lock_new_format() -> None:
    lock = annotations.decode_node_lock("2026-08-21T06:20:39Z,default,gpu-pod-1")
    assert lock == NodeLock(
        datetime.datetime(2026, 8, 21, 6, 20, 39, tzinfo=datetime.UTC), "default", "gpu-pod-1"
    )
    assert lock.held_by("default", "gpu-pod-1") and not lock.legacy
    assert annotations.encode_node_lock(lock) == "2026-08-21T06:20:39Z,default,gpu-pod-1"


def test_node_lock_legacy_bare_time() -> None:
    lock = annotations.decode_node_lock("2026-08-21T06:20:39Z")
    assert lock.legacy and lock.pod == ""
    assert annotations.encode_node_lock(lock) == "2026-08-21T06:20:39Z"


@pytest.mark.parametrize(
    "raw", ["a,b", "2026-08-21T06:20:39Z,default", "x,y,z", "2026-08-21T06:20:39Z,,p", "yesterday"]
)
def test_node_lock_garbage(raw: str) -> None:
    with pytest.raises(errors.AnnotationError):
        annotations.decode_node_lock(raw)


def test_handshake_round_trip_and_other_states() -> None:
    now = datetime.datetime(2026, 8, 21, 6, 20, 39)
    raw = annotations.encode_handshake_requesting(now)
    assert raw == "Requesting_2026-08-21 06:20:39"
    assert annotations.decode_handshake(raw) == ("Requesting", now)
    assert annotations.decode_handshake("Reported 2026-08-21 06:20:39.1 +0000 UTC") == ("Reported", None)
    with pytest.raises(errors.AnnotationError):
        annotations.decode_handshake("Requesting_soon")


def test_bind_phase_and_cordon() -> None:
    assert annotations.decode_bind_phase("allocating") is annotations.BindPhase.ALLOCATING
    with pytest.raises(errors.AnnotationError, match="unknown bind phase"):
        annotations.decode_bind_phase("done")
    assert annotations.decode_cordon(" GPU-a, ,GPU-b,") == {"GPU-a", "GPU-b"}


def test_keys_follow_the_configured_prefix() -> None:
    keys = annotations.Keys("example.com")
    assert keys.node_register == "example.com/node-nvidia-register"
    assert keys.node_lock == "example.com/mutex.lock"
    assert annotations.KEYS.devices_allocated == "hami.io/vgpu-devices-allocated"
    assert "hami.io/bind-phase" in annotations.KEYS.internal_pod_keys()


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        (None, {}),
        ({}, {}),
        ({"metadata": None}, {}),
        ({"metadata": ["not", "a", "mapping"]}, {}),
        ({"metadata": {"annotations": "a string"}}, {}),
        ({"metadata": {"annotations": None}}, {}),
        ({"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}, {"hami.io/bind-phase": "success"}),
    ],
)
def test_of_reads_annotations_and_gives_empty_for_anything_malformed(obj: object, want: dict) -> None:
    assert annotations.of(obj) == want  # type: ignore[arg-type]
