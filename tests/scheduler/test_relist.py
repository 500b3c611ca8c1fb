"""A lost watch that comes back with 410 Gone: the re-list must replace the state exactly.

The case that leaked (issue 16, item 3): a StatefulSet pod is deleted and re-created under the same
name while the scheduler's watch is down, and so much happens meanwhile that the API server's watch
history no longer covers it (410 Gone). The re-list then sees the same namespace/name with a new
uid; the old uid's GPU charge must go, whatever the new pod holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from vgpu.core import annotations
from vgpu.core.device import GpuUsage, GpuUuid

from tests.scheduler.scenario import Cluster, gpu_container

KEYS = annotations.KEYS
HISTORY = 5  # events the emulated API server remembers: a few more while disconnected give 410


@pytest.fixture
async def small_history() -> AsyncIterator[Cluster]:
    c = Cluster(history_size=HISTORY)
    c.add_node("node-a")
    await c.start()
    yield c
    await c.stop()


def _bound_pod(name: str, devices: str, *, node: str = "node-a") -> dict[str, Any]:
    ann = {KEYS.assigned_node: node, KEYS.devices_allocated: devices, KEYS.bind_phase: "success"}
    return {
        "metadata": {"name": name, "annotations": ann},
        "spec": {"nodeName": node, "containers": [gpu_container(mem=4000)]},
        "status": {"phase": "Running"},
    }


def _pods_informer(cluster: Cluster) -> Any:
    assert cluster.service is not None
    return next(i for i in cluster.service.informers if i.kind == "pods")


def _fill_history(cluster: Cluster) -> None:
    """More events than the history holds: a resuming watch gets 410 Gone."""
    for i in range(HISTORY + 1):
        cluster.store.create(
            "events", {"metadata": {"name": f"filler-{i}"}, "reason": "Filler"}, namespace="default"
        )


@pytest.mark.parametrize(
    "new_holds", [None, "GPU-node-a-1,NVIDIA,2000,0:;"], ids=["pending", "bound-elsewhere"]
)
async def test_same_name_new_uid_across_a_410_drops_the_old_charge(
    small_history: Cluster, new_holds: str | None
) -> None:
    cluster = small_history
    old = cluster.store.create(
        "pods", _bound_pod("web-0", "GPU-node-a-0,NVIDIA,4000,0:;"), namespace="default"
    )
    await cluster.synced()
    assert cluster.state.used("node-a") == {GpuUuid("GPU-node-a-0"): GpuUsage(1, 4000, 0)}
    relists = _pods_informer(cluster).relists

    cluster.store.close_watchers()  # no await from here on: the informers stay down meanwhile
    cluster.store.delete("pods", "web-0", namespace="default")
    body = (
        _bound_pod("web-0", new_holds)
        if new_holds
        else {"metadata": {"name": "web-0"}, "spec": {"containers": [gpu_container(mem=4000)]}}
    )
    new = cluster.store.create("pods", body, namespace="default")
    _fill_history(cluster)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]

    await cluster.until(lambda: _pods_informer(cluster).relists > relists)  # it got 410 Gone
    await cluster.synced()
    want = {GpuUuid("GPU-node-a-1"): GpuUsage(1, 2000, 0)} if new_holds else {}
    assert dict(cluster.state.used("node-a")) == want
    assert set(cluster.state.pods) == {new["metadata"]["uid"]}
    assert set(cluster.state.charges) <= {new["metadata"]["uid"]}
    assert cluster.state.quota.namespace_gpu_usage("default") == ((2000, 0) if new_holds else (0, 0))
