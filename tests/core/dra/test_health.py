"""What the DRA kubelet plugin streams to kubelet about its GPUs' health (``vgpu.core.dra.health``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core.device import Gpu, GpuUuid, Mode, NodeInventory, NodeName
from vgpu.core.dra import health, slices
from vgpu.core.dra.health import DeviceHealth, Health

NODE = "n1"


def gpu(index: int, **kw: Any) -> Gpu:
    base: dict[str, Any] = {
        "uuid": GpuUuid(f"GPU-{index:08d}-0000-0000-0000-000000000000"),
        "index": index,
        "count": 4,
        "memory_mib": 24576,
        "cores": 100,
        "type": "NVIDIA-A10",
    }
    return Gpu(**(base | kw))


def inv(*gpus: Gpu) -> NodeInventory:
    return NodeInventory(NodeName(NODE), tuple(gpus))


def healthy(device: str) -> DeviceHealth:
    return DeviceHealth(NODE, device, Health.HEALTHY)


def test_every_gpu_of_the_slice_is_reported_under_the_slices_pool_and_device_names() -> None:
    gpus = inv(gpu(0), gpu(1, health=False), gpu(3, mode=Mode.MIG))
    states = health.device_states(gpus, reasons={gpus.gpus[1].uuid: "XID 79 critical error"})
    published = slices.build(gpus, driver_version=None).body["spec"]
    assert published["pool"]["name"] == NODE
    assert [d for _, d in states] == [d["name"] for d in published["devices"]] == ["gpu-0", "gpu-1", "gpu-3"]
    assert list(states.values()) == [
        healthy("gpu-0"),
        DeviceHealth(NODE, "gpu-1", Health.UNHEALTHY, "XID 79 critical error"),
        healthy("gpu-3"),
    ]


def test_an_unhealthy_gpu_without_a_reason_says_unhealthy_and_a_healthy_one_carries_no_message() -> None:
    g = gpu(0, health=False)
    assert health.device_states(inv(g), reasons={})[(NODE, "gpu-0")].message == "unhealthy"
    assert health.device_states(inv(gpu(0)), reasons={gpu(0).uuid: "stale"})[(NODE, "gpu-0")].message == ""


def test_gpus_the_slice_leaves_out_are_not_reported() -> None:
    broken = gpu(1, memory_mib=0)  # no memory: not publishable
    twice = gpu(0, uuid=gpu(2).uuid)  # a duplicate UUID
    states = health.device_states(inv(gpu(2, health=False), broken, twice), reasons={})
    assert list(states.values()) == [healthy("gpu-0")]  # the slice keeps the first of a UUID


def test_a_long_reason_is_cut_as_kubelet_cuts_it() -> None:
    g = gpu(0, health=False)
    message = health.device_states(inv(g), reasons={g.uuid: "x" * 2000})[(NODE, "gpu-0")].message
    assert len(message) == health.MESSAGE_MAX
    assert message.endswith("...") and message[:-3] == "x" * 1021
    assert health.truncate("y" * 1024) == "y" * 1024


def test_the_first_batch_is_every_device_then_only_changes() -> None:
    stream = health.HealthStream(refresh_s=20)
    current = {s.key: s for s in (healthy("gpu-0"), healthy("gpu-1"))}
    assert stream.batch(current, now=0) == [healthy("gpu-0"), healthy("gpu-1")]
    assert stream.batch(current, now=1) == []
    bad = DeviceHealth(NODE, "gpu-1", Health.UNHEALTHY, "XID 48 critical error")
    assert stream.batch({**current, bad.key: bad}, now=2) == [bad]
    worse = DeviceHealth(NODE, "gpu-1", Health.UNHEALTHY, "lost: GPU is lost")
    assert stream.batch({**current, bad.key: worse}, now=3) == [worse]  # a new reason is news
    assert stream.batch(current, now=4) == [healthy("gpu-1")]


def test_the_whole_list_goes_again_every_refresh_even_while_changes_keep_coming() -> None:
    stream = health.HealthStream(refresh_s=20)
    a = {(NODE, "gpu-0"): healthy("gpu-0")}
    b = {(NODE, "gpu-0"): healthy("gpu-0"), (NODE, "gpu-1"): healthy("gpu-1")}
    stream.batch(a, now=0)
    assert stream.wait_s(now=5) == 15
    assert stream.batch(b, now=10) == [healthy("gpu-1")]  # a change does not reset the refresh
    assert stream.wait_s(now=10) == 10
    assert stream.batch(b, now=20) == [healthy("gpu-0"), healthy("gpu-1")]
    assert stream.wait_s(now=25) == 15
    assert stream.wait_s(now=99) == 0


def test_a_device_gone_from_the_slice_is_sent_unknown_once() -> None:
    stream = health.HealthStream(refresh_s=20)
    stream.batch({(NODE, "gpu-0"): healthy("gpu-0"), (NODE, "gpu-1"): healthy("gpu-1")}, now=0)
    gone = DeviceHealth(NODE, "gpu-1", Health.UNKNOWN, health.GONE_MESSAGE)
    assert stream.batch({(NODE, "gpu-0"): healthy("gpu-0")}, now=1) == [gone]
    assert stream.batch({(NODE, "gpu-0"): healthy("gpu-0")}, now=2) == []
    assert stream.batch({(NODE, "gpu-0"): healthy("gpu-0")}, now=21) == [healthy("gpu-0")]


def test_no_devices_sends_nothing_and_a_bad_refresh_is_refused() -> None:
    assert health.HealthStream().batch({}, now=0) == []
    assert health.HealthStream().wait_s(now=0) == 0
    with pytest.raises(ValueError, match="refresh_s"):
        health.HealthStream(refresh_s=0)


def test_the_refresh_fits_kubelets_timeout_several_times() -> None:
    assert health.TIMEOUT_S >= 3 * health.REFRESH_S


@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(list(Health)), st.text(max_size=3)), max_size=8),
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(list(Health)), st.text(max_size=3)), max_size=8),
)
def test_applying_the_changes_to_what_was_sent_gives_the_current_state(
    before: list[tuple[int, Health, str]], after: list[tuple[int, Health, str]]
) -> None:
    def states(rows: list[tuple[int, Health, str]]) -> dict[health.Key, DeviceHealth]:
        return {(NODE, f"gpu-{i}"): DeviceHealth(NODE, f"gpu-{i}", h, m) for i, h, m in rows}

    sent, current = states(before), states(after)
    view = dict(sent)  # what kubelet holds, a device it was told UNKNOWN about included
    for change in health.changes(sent, current):
        view[change.key] = change
    assert {k: v for k, v in view.items() if k in current} == current
    assert all(v.health == Health.UNKNOWN for k, v in view.items() if k not in current)
