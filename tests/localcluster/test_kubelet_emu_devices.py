"""kubelet device bookkeeping and device choice (pure)."""

from __future__ import annotations

import pytest
from vgpu.localcluster import kubeletdevices

RES = "example.com/gpu"


def book(*devices: tuple[str, str]) -> kubeletdevices.DeviceBook:
    b = kubeletdevices.DeviceBook()
    b.report(RES, devices)
    return b


def test_report_splits_healthy_from_anything_else():
    state = book(("a", "Healthy"), ("b", "Unhealthy"), ("c", "healthy"), ("d", "")).resources[RES]
    assert (state.healthy, state.unhealthy) == ({"a"}, {"b", "c", "d"})
    assert (state.capacity, state.allocatable) == (4, 1)


def test_a_new_report_replaces_the_set_and_stream_end_marks_all_unhealthy():
    b = book(("a", "Healthy"), ("b", "Healthy"))
    b.report(RES, [("c", "Healthy")])
    assert b.resources[RES].healthy == {"c"}
    state = b.mark_unhealthy(RES)
    assert (state.capacity, state.allocatable) == (1, 0)
    assert (b.forget_devices(RES).capacity, RES in b.resources) == (0, True)


def test_held_devices_are_not_available_until_released():
    b = book(("a", "Healthy"), ("b", "Healthy"), ("c", "Unhealthy"))
    b.hold("pod-1", RES, ["b"])
    b.hold("pod-1", RES, ["b"])  # an app container reusing its init container's device
    assert (b.available(RES), b.in_use(RES), b.holds("pod-1")) == (["a"], {"b"}, True)
    assert b.release("pod-1") is True and b.release("pod-1") is False
    assert b.available(RES) == ["a", "b"] and b.in_use(RES) == set()


def test_releasing_one_pod_leaves_another_pods_devices_held():
    b = book(("a", "Healthy"), ("b", "Healthy"))
    b.hold("p1", RES, ["a"])
    b.hold("p2", RES, ["b"])
    b.release("p1")
    assert b.in_use(RES) == {"b"}


@pytest.mark.parametrize(
    ("allocated", "preferred", "available", "required", "chosen"),
    [
        ([], [], ["a", "b", "c"], 2, ["a", "b"]),
        ([], ["c", "a"], ["a", "b", "c"], 2, ["c", "a"]),
        ([], ["zz", "c"], ["a", "b", "c"], 2, ["c", "a"]),  # unknown IDs ignored, the rest filled up
        (["x"], ["c"], ["a", "b", "c"], 3, ["x", "c", "a"]),  # reused IDs stay first
        ([], ["c", "b", "a"], ["a", "b", "c"], 1, ["c"]),  # a long answer is cut to size
    ],
    ids=["sorted", "preferred", "preferred-garbage", "with-reused", "too-long-answer"],
)
def test_fill(allocated, preferred, available, required, chosen):
    assert (
        kubeletdevices.fill(allocated, required=required, preferred=preferred, available=available) == chosen
    )


def test_too_few_devices_read_like_kubelet():
    with pytest.raises(kubeletdevices.DeviceUnavailable) as info:
        kubeletdevices.check_available(RES, required=3, still_needed=3, available=["a"])
    assert str(info.value) == f"requested number of devices unavailable for {RES}. Requested: 3, Available: 1"
    with pytest.raises(kubeletdevices.DeviceUnavailable, match="unexpectedly allocated less"):
        kubeletdevices.fill([], required=2, preferred=[], available=["a"])


def test_take_reusable_is_sorted_and_capped():
    assert kubeletdevices.take_reusable(2, {"c", "a", "b"}) == ["a", "b"]
    assert kubeletdevices.take_reusable(2, set()) == []
