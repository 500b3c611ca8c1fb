"""bench/throughput_dra's pure parts: the objects the DRA phase writes, the claim tracker's
overcommit check (garbage included) and the split of a DRA pod's time."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import config as configs
from vgpu.core.dra import names

from bench import throughput_dra, throughput_figures, throughput_options, throughput_pods


def allocated(
    name: str, *, pod: str, device: str = "gpu-0", memory: str = "1000Mi", cores: str | None = None
) -> dict[str, Any]:
    consumed = {names.CAPACITY_MEMORY: memory}
    if cores is not None:
        consumed[names.CAPACITY_CORES] = cores
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "ownerReferences": [{"kind": "Pod", "name": pod, "apiVersion": "v1", "uid": "u"}],
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": names.DRIVER,
                            "pool": "node-1",
                            "device": device,
                            "shareID": f"share-{name}",
                            "consumedCapacity": consumed,
                        }
                    ]
                }
            }
        },
    }


def test_a_node_slice_is_what_the_device_plugin_publishes() -> None:
    body = throughput_dra.node_slice("node-1", gpus=2, memory_mib=40960)
    spec = body["spec"]
    assert body["metadata"]["name"] == f"node-1-{names.DRIVER}"
    assert spec["pool"] == {"name": "node-1", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    gpu = spec["devices"][0]
    assert gpu["allowMultipleAllocations"] is True
    memory = gpu["capacity"][names.CAPACITY_MEMORY]
    assert memory["value"] == "40Gi" and memory["requestPolicy"]["default"] == "40Gi"
    assert gpu["attributes"][names.ATTR_UUID] == {"string": "GPU-node-1-0"}


def test_the_dra_pod_is_the_gpu_pod_as_the_webhook_converts_it() -> None:
    config = configs.load({})
    user = throughput_pods.gpu_pod("x", config=config, policy="binpack", webhook=True)
    pod, templates = throughput_dra.dra_pod("dra-7", gpu_pod=user, config=config)
    (template,) = templates
    name = template["metadata"]["name"]
    assert pod["metadata"]["name"] == "dra-7" and pod["spec"]["schedulerName"] == "default-scheduler"
    assert pod["spec"]["resourceClaims"] == [{"name": "vgpu-0", "resourceClaimTemplateName": name}]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["claims"] == [{"name": "vgpu-0"}]
    assert not container["resources"].get("limits")  # nvidia.com/* taken out
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["capacity"]["requests"] == {names.CAPACITY_MEMORY: "1000Mi"}
    assert user["spec"]["containers"][0]["resources"]["limits"]  # the user's pod left as it was
    again, _ = throughput_dra.dra_pod("dra-8", gpu_pod=user, config=config)
    assert again["spec"]["resourceClaims"] == pod["spec"]["resourceClaims"]


def test_the_tracker_times_each_pods_claim_and_sees_an_overcommit() -> None:
    tracker = throughput_dra.ClaimTracker(capacity_mib=3000)
    pending = allocated("c1", pod="p1")
    del pending["status"]
    tracker.on_event("ADDED", pending, 1.0)
    tracker.on_event("MODIFIED", allocated("c1", pod="p1", memory="2000Mi"), 1.5)
    tracker.on_event("MODIFIED", allocated("c1", pod="p1", memory="2000Mi"), 9.0)  # a later write
    assert tracker.seen == {"p1": 1.0} and tracker.allocated == {"p1": 1.5}
    assert not tracker.violations
    tracker.on_event("ADDED", allocated("c2", pod="p2", memory="1000Mi"), 2.0)
    assert not tracker.violations  # 3000 of 3000 MiB
    tracker.on_event("ADDED", allocated("c3", pod="p3", memory="1Mi"), 3.0)
    assert tracker.violations == ["node-1/gpu-0: 3001 MiB, 0 % after default/c3"]


def test_a_deleted_claim_gives_its_share_back() -> None:
    tracker = throughput_dra.ClaimTracker(capacity_mib=3000)
    tracker.on_event("ADDED", allocated("c1", pod="p1", memory="3000Mi", cores="100"), 1.0)
    tracker.on_event("DELETED", allocated("c1", pod="p1", memory="3000Mi", cores="100"), 2.0)
    tracker.on_event("ADDED", allocated("c2", pod="p2", memory="3000Mi", cores="100"), 3.0)
    assert not tracker.violations


def test_cores_over_100_percent_are_an_overcommit() -> None:
    tracker = throughput_dra.ClaimTracker(capacity_mib=3000)
    tracker.on_event("ADDED", allocated("c1", pod="p1", cores="60"), 1.0)
    tracker.on_event("ADDED", allocated("c2", pod="p2", cores="41"), 1.0)
    assert tracker.violations == ["node-1/gpu-0: 2000 MiB, 101 % after default/c2"]


def _bad_memory() -> dict[str, Any]:
    claim = allocated("x", pod="p")
    claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {"memory": "lots"}
    return claim


@pytest.mark.parametrize(
    ("garbage", "reported"),
    [
        ({}, False),  # nothing allocated: nothing to count
        ({"metadata": None, "status": None}, False),
        ({"metadata": {"name": "x"}, "status": {"allocation": {"devices": {"results": "nonsense"}}}}, True),
        (_bad_memory(), True),
    ],
    ids=["empty", "nulls", "results-not-a-list", "memory-not-a-quantity"],
)
def test_a_garbage_claim_is_reported_not_raised(garbage: dict[str, Any], reported: bool) -> None:
    tracker = throughput_dra.ClaimTracker(capacity_mib=3000)
    tracker.on_event("ADDED", garbage, 1.0)
    assert bool(tracker.violations) == reported
    assert all("unreadable allocation" in v for v in tracker.violations)
    assert not tracker.allocated


def test_the_split_follows_each_pod_from_create_to_bound() -> None:
    tracker = throughput_dra.ClaimTracker(capacity_mib=3000)
    tracker.seen.update({"a": 1.2, "b": 2.5})
    tracker.allocated.update({"a": 1.5})
    split = throughput_dra.dra_split(
        ["a", "b", "never-created"], created={"a": 1.0, "b": 2.0}, bound={"a": 1.6}, claims=tracker
    )
    assert split["claim created"][2] == 2 and split["allocated"][2] == 1 and split["bound"][2] == 1
    assert split["allocated"][0] == pytest.approx(0.3)
    assert split["bound"][0] == pytest.approx(0.1)


def test_events_are_counted_by_component_and_reason_for_the_phases_pods_only() -> None:
    items: list[Any] = [
        {"involvedObject": {"name": "a"}, "reportingComponent": "default-scheduler", "reason": "Scheduled"},
        {
            "involvedObject": {"name": "b"},
            "source": {"component": "default-scheduler"},
            "reason": "Scheduled",
        },
        {
            "involvedObject": {"name": "a"},
            "source": {"component": "default-scheduler"},
            "reason": "FailedScheduling",
            "count": 3,
        },
        {"involvedObject": {"name": "other-phase"}, "reason": "Scheduled"},
        {"involvedObject": "garbage", "reason": "Scheduled"},
        {"involvedObject": {"name": "b"}, "count": "many"},
        {},
    ]
    assert throughput_figures.event_counts(items, {"a", "b"}) == {
        "default-scheduler Scheduled": 2,
        "default-scheduler FailedScheduling": 3,
        "? ?": 1,
    }


def test_dra_needs_a_real_control_plane() -> None:
    with pytest.raises(SystemExit):
        throughput_options.parse_args(["--dra"])
    opts = throughput_options.parse_args(
        ["--dra", "--k8s-bin", "/k8s", "--node-locks", "always", "contended"]
    )
    assert opts.dra and opts.node_locks == ["always", "contended"]
