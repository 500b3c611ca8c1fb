"""The device plugin's outside-usage reporter (issue 13.4): fake GPUs, a fake host /proc, a local store."""

from __future__ import annotations

import json
import pathlib

import pytest
from vgpu.core import errors
from vgpu.core.device import GpuUuid
from vgpu.localcluster.store import Store
from vgpu_device_plugin import outside
from vgpu_device_plugin.hostfs import HostFs

from tests.device_plugin.builders import (
    GPU_A,
    GPU_B,
    KEYS,
    NODE,
    StoreView,
    add_pod,
    cluster,
    config,
    fake_backend,
)

GPUS = [GpuUuid(GPU_A), GpuUuid(GPU_B)]


def cgroup(root: pathlib.Path, pid: int, uid: str) -> None:
    path = root / "proc" / str(pid) / "cgroup"
    path.parent.mkdir(parents=True)
    path.write_text(f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-1.scope\n")


def published(store: Store) -> dict[str, int] | None:
    raw = store.get("nodes", NODE)["metadata"].get("annotations", {}).get(KEYS.node_outside_usage)
    return None if raw is None else json.loads(raw)


def reporter(store: Store, api, backend, root: pathlib.Path, **changes) -> outside.OutsideUsageReporter:
    return outside.OutsideUsageReporter(
        backend=backend,
        api=api,
        view=StoreView(store),
        host=HostFs(root, hook_path="/usr/local"),
        node=NODE,
        keys=KEYS,
        config=config(**changes),
    )


async def test_outside_is_used_memory_minus_what_our_pods_use(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    ours = add_pod(store, "ours", to_allocate=f"{GPU_A},NVIDIA,4000,30:;")
    backend = fake_backend()
    # GPU A: driver reserve 300, our pod's process 1000 of its 4000, a hand-started process 2000
    backend.set_memory_usage(GPU_A, reserved_mib=300, processes={100: 1000, 200: 2000})
    cgroup(tmp_path, 100, ours["metadata"]["uid"])
    rep = reporter(store, api, backend, tmp_path)
    assert await rep.run_once(GPUS) is True
    assert published(store) == {GPU_A: 2300, GPU_B: 0}
    assert await rep.run_once(GPUS) is False  # nothing moved
    # our pod grows within its share: nothing outside moves; over its share: the excess is outside
    backend.set_memory_usage(GPU_A, reserved_mib=300, processes={100: 3900, 200: 2000})
    assert await rep.run_once(GPUS) is False
    backend.set_memory_usage(GPU_A, reserved_mib=300, processes={100: 5000, 200: 2000})
    assert await rep.run_once(GPUS) is True
    assert published(store) == {GPU_A: 3300, GPU_B: 0}


async def test_step_and_pods_that_are_not_ours(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    finished = add_pod(store, "done", to_allocate=f"{GPU_B},NVIDIA,4000,30:;")
    store.patch("pods", "done", {"status": {"phase": "Succeeded"}}, namespace="default", subresource="status")
    backend = fake_backend()
    rep = reporter(store, api, backend, tmp_path, outside_usage_step_mib=500)
    assert await rep.run_once(GPUS) is True
    assert published(store) == {GPU_A: 0, GPU_B: 0}
    backend.set_memory_usage(GPU_B, processes={7: 500})  # a finished pod's process is not ours
    cgroup(tmp_path, 7, finished["metadata"]["uid"])
    assert await rep.run_once(GPUS) is False  # 500 is not more than the step
    backend.set_memory_usage(GPU_B, processes={7: 501})
    assert await rep.run_once(GPUS) is True
    assert published(store) == {GPU_A: 0, GPU_B: 501}


async def test_a_failed_reading_keeps_the_published_value(tmp_path: pathlib.Path, caplog) -> None:
    store, api = cluster()
    backend = fake_backend()
    backend.set_memory_usage(GPU_A, processes={1: 1000})
    rep = reporter(store, api, backend, tmp_path)
    assert await rep.run_once(GPUS)
    before = store.get("nodes", NODE)["metadata"]["resourceVersion"]
    backend.fail_memory_usage("Unknown Error")
    backend.set_memory_usage(GPU_A, processes={1: 9000})
    for _ in range(2):
        assert await rep.run_once(GPUS) is False
    assert store.get("nodes", NODE)["metadata"]["resourceVersion"] == before
    assert published(store) == {GPU_A: 1000, GPU_B: 0}
    warnings = [r for r in caplog.records if "no memory reading" in r.getMessage()]
    assert len(warnings) == 2  # once per GPU and distinct message, not once per round


@pytest.mark.parametrize(
    "garbage",
    ["not json", "[1,2]", '{"GPU-x": -5}', '{"GPU-x": "lots"}'],
    ids=["not-json", "list", "negative", "string"],
)
async def test_garbage_on_the_node_is_replaced(tmp_path: pathlib.Path, garbage: str) -> None:
    store, api = cluster()
    store.patch("nodes", NODE, {"metadata": {"annotations": {KEYS.node_outside_usage: garbage}}})
    rep = reporter(store, api, fake_backend(), tmp_path)
    assert await rep.run_once(GPUS) is True
    assert published(store) == {GPU_A: 0, GPU_B: 0}


class FlakyApi:
    """The API, with the next ``fail`` PATCHes answered 500."""

    def __init__(self, api, fail: int) -> None:
        self._api = api
        self.fail = fail

    async def merge_patch(self, *args, **kwargs):
        if self.fail:
            self.fail -= 1
            raise errors.KubeError("Internal error", status=500)
        return await self._api.merge_patch(*args, **kwargs)


async def test_a_failed_patch_is_retried_next_round(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    rep = reporter(store, FlakyApi(api, fail=1), fake_backend(), tmp_path)
    assert await rep.run_once(GPUS) is False  # logged, nothing raised, nothing written
    assert published(store) is None
    assert await rep.run_once(GPUS) is True
    assert published(store) == {GPU_A: 0, GPU_B: 0}


def test_allocations_skip_garbage_and_other_nodes() -> None:
    pods = [
        {
            "metadata": {
                "uid": "a",
                "annotations": {
                    KEYS.assigned_node: NODE,
                    KEYS.devices_allocated: f"{GPU_A},NVIDIA,1000,0:{GPU_A},NVIDIA,500,0:;",
                },
            },
            "status": {"phase": "Running"},
        },
        {
            "metadata": {
                "uid": "b",
                "annotations": {KEYS.assigned_node: NODE, KEYS.devices_allocated: "garbage"},
            }
        },
        {
            "metadata": {
                "uid": "c",
                "annotations": {KEYS.assigned_node: "other", KEYS.devices_allocated: f"{GPU_A},NVIDIA,1,0:;"},
            }
        },
        {"metadata": {"uid": "d", "annotations": {KEYS.assigned_node: NODE}}},
        {"metadata": {"uid": "e", "annotations": "not-a-map"}, "status": "weird"},
    ]
    assert outside.allocations(pods, node=NODE, keys=KEYS) == {GPU_A: {"a": 1500}}


def test_pod_uid_of_process(tmp_path: pathlib.Path) -> None:
    host = HostFs(tmp_path, hook_path="/usr/local")
    uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    cgroup(tmp_path, 42, uid)
    assert host.pod_uid_of_process(42) == uid
    assert host.pod_uid_of_process(43) is None  # gone (or not visible): outside
    (tmp_path / "proc" / "44").mkdir()
    (tmp_path / "proc" / "44" / "cgroup").write_bytes(b"\xff\xfe garbage")
    assert host.pod_uid_of_process(44) is None
