"""Memory used outside kube-vgpu: attribution, the annotation codec (with garbage), when to publish."""

from __future__ import annotations

import pytest
from vgpu.core import errors, outside
from vgpu.core.device import GpuUuid
from vgpu.core.outside import ProcessMemory as P

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
OTHER = "11111111-2222-3333-4444-555555555555"

CGROUPS = [
    ("v1-cgroupfs", f"12:memory:/kubepods/burstable/pod{UID}/0123abcd\n", UID),
    (
        "v2-systemd",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
        "cri-containerd-0123.scope\n",
        UID,
    ),
    ("uppercase", f"0::/kubepods/pod{UID.upper()}/x\n", UID),
    ("second-line", f"1:name=systemd:/user.slice\n0::/kubepods/pod{UID}/c\n", UID),
    ("not-a-pod", "0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("empty", "", None),
    ("uid-too-long", f"0::/kubepods/pod{UID}0/c\n", None),
    ("garbage", "\x00\x01pod-not-a-uid", None),
]


@pytest.mark.parametrize(("text", "want"), [c[1:] for c in CGROUPS], ids=[c[0] for c in CGROUPS])
def test_pod_uid_from_cgroup(text: str, want: str | None) -> None:
    assert outside.pod_uid_from_cgroup(text) == want


OUTSIDE = [
    ("nothing-running", 0, [], {}, 0),
    ("driver-reserve-only", 300, [], {}, 300),
    ("a-hand-started-process", 2300, [P(1, 2000)], {}, 2300),
    ("our-pod-within-its-share", 2300, [P(1, 2000, UID)], {UID: 4000}, 300),
    ("our-pod-over-its-share-shows-the-excess", 5300, [P(1, 5000, UID)], {UID: 4000}, 1300),
    ("two-processes-of-one-pod", 3000, [P(1, 1000, UID), P(2, 2000, UID)], {UID: 4000}, 0),
    ("a-pod-not-ours-on-this-gpu", 3000, [P(1, 1000, UID), P(2, 2000, OTHER)], {UID: 4000}, 2000),
    ("unknown-memory-stays-outside", 3000, [P(1, None, UID)], {UID: 4000}, 3000),
    ("nvml-used-below-the-processes", 100, [P(1, 2000, UID)], {UID: 4000}, 0),
]


@pytest.mark.parametrize(
    ("used", "processes", "ours", "want"), [c[1:] for c in OUTSIDE], ids=[c[0] for c in OUTSIDE]
)
def test_outside_mib(used: int, processes: list[P], ours: dict[str, int], want: int) -> None:
    assert outside.outside_mib(used, processes, allocated_mib=ours) == want


def test_codec_round_trip_is_sorted_and_stable() -> None:
    usage = {GpuUuid("GPU-b"): 2000, GpuUuid("GPU-a"): 0}
    raw = outside.encode(usage)
    assert raw == '{"GPU-a":0,"GPU-b":2000}'
    assert outside.decode(raw, field="k") == usage
    assert outside.decode("{}", field="k") == {}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("", "not JSON", id="empty"),
        pytest.param("GPU-a,2000", "not JSON", id="not-json"),
        pytest.param("[1]", "expected a JSON object", id="a-list"),
        pytest.param('{"GPU-a": -1}', "GPU GPU-a: expected MiB", id="negative"),
        pytest.param('{"GPU-a": 1.5}', "GPU GPU-a: expected MiB", id="float"),
        pytest.param('{"GPU-a": "2000"}', "GPU GPU-a: expected MiB", id="string"),
        pytest.param('{"GPU-a": true}', "GPU GPU-a: expected MiB", id="bool"),
        pytest.param('{"GPU-a": 1e300}', "GPU GPU-a: expected MiB", id="huge-float"),
        pytest.param('{"GPU-a": 99999999999999999999}', "GPU GPU-a: expected MiB", id="huge"),
        pytest.param('{" ": 1}', "empty GPU UUID", id="blank-uuid"),
        pytest.param("[" * 100_000, "not JSON", id="deep"),
    ],
)
def test_decode_garbage_names_the_field(raw: str, message: str) -> None:
    with pytest.raises(errors.AnnotationError, match=message) as info:
        outside.decode(raw, field="hami.io/node-nvidia-outside-usage")
    assert info.value.field == "hami.io/node-nvidia-outside-usage"


A, B = GpuUuid("GPU-a"), GpuUuid("GPU-b")
PUBLISH = [
    ("nothing-published-yet", None, {A: 0}, True),
    ("same", {A: 1000}, {A: 1000}, False),
    ("within-the-step", {A: 1000}, {A: 1256}, False),
    ("over-the-step", {A: 1000}, {A: 1257}, True),
    ("down-over-the-step", {A: 1000}, {A: 0}, True),
    ("a-gpu-appeared", {A: 0}, {A: 0, B: 0}, True),
    ("a-gpu-went", {A: 0, B: 0}, {A: 0}, True),
]


@pytest.mark.parametrize(
    ("published", "measured", "want"), [c[1:] for c in PUBLISH], ids=[c[0] for c in PUBLISH]
)
def test_should_publish(published: dict | None, measured: dict, want: bool) -> None:
    assert outside.should_publish(published, measured, step_mib=256) is want
