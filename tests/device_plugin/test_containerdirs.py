"""The per-container HAMi-core directories of pods that are gone are removed, judged by the
cluster's pods (cache, then the API server), after a grace; never a live pod's, never through a
symlink."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest
from vgpu.core import errors
from vgpu_device_plugin import containerdirs

from tests.device_plugin.builders import NODE, StoreView, add_pod, cluster, installed_host

CONTAINERS = "usr/local/vgpu/containers"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _inline(func: Any) -> Any:
    return func()


class LaggingView(StoreView):
    """A pod cache that has not shown ``hidden`` yet."""

    def __init__(self, store: Any, hidden: set[str]) -> None:
        super().__init__(store)
        self.hidden = hidden

    def pods(self) -> list[Any]:
        return [p for p in super().pods() if p["metadata"]["uid"] not in self.hidden]


def _dirs(root: pathlib.Path) -> list[str]:
    return sorted(os.listdir(root / CONTAINERS))


@pytest.fixture
def node(tmp_path: pathlib.Path) -> dict[str, Any]:
    store, api = cluster()
    host = installed_host(tmp_path)
    live = add_pod(store, "live", to_allocate="")
    done = add_pod(store, "done", to_allocate="")
    store.patch("pods", "done", {"status": {"phase": "Succeeded"}}, namespace="default", subresource="status")
    lagging = add_pod(store, "lagging", to_allocate="")
    uids = {name: p["metadata"]["uid"] for name, p in (("live", live), ("done", done), ("lagging", lagging))}
    for name in ("live", "done", "lagging"):
        host.container_dir(uids[name], "main")
    host.container_dir("0b0e1c4e-dead-4f00-8000-000000000001", "main")  # a pod that is gone
    host.container_dir("0b0e1c4e-dead-4f00-8000-000000000001", "side")
    (tmp_path / CONTAINERS / "not-a-pod").mkdir()  # not ours to judge
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (tmp_path / CONTAINERS / "0b0e1c4e-dead-4f00-8000-000000000002_x").symlink_to(outside)
    clock = Clock()
    reaper = containerdirs.ContainerDirReaper(
        host=host,
        view=LaggingView(store, {uids["lagging"]}),
        api=api,
        node=NODE,
        clock=clock,
        grace_s=120,
        offload=_inline,
    )
    return {"reaper": reaper, "clock": clock, "uids": uids, "root": tmp_path, "outside": outside}


async def test_gone_pods_directories_are_removed_after_the_grace(node: dict[str, Any]) -> None:
    reaper, clock, uids, root = node["reaper"], node["clock"], node["uids"], node["root"]
    before = _dirs(root)
    assert await reaper.sweep() == []  # first seen missing now: the grace starts
    clock.now = 119
    assert await reaper.sweep() == []
    clock.now = 121
    removed = await reaper.sweep()
    assert sorted(removed) == [
        "0b0e1c4e-dead-4f00-8000-000000000001_main",
        "0b0e1c4e-dead-4f00-8000-000000000001_side",
        "0b0e1c4e-dead-4f00-8000-000000000002_x",
    ]
    assert _dirs(root) == sorted(set(before) - set(removed))
    # kept: a live pod, a finished pod still in the cluster, a pod the cache lags behind (the API
    # server's LIST shows it), and an entry that is not <uid>_<container>
    assert {f"{uids[n]}_main" for n in ("live", "done", "lagging")} | {"not-a-pod"} <= set(_dirs(root))
    assert (node["outside"] / "keep").read_text() == "x"  # the symlink was unlinked, not followed


async def test_a_pod_back_in_the_cache_restarts_the_grace(node: dict[str, Any]) -> None:
    reaper, clock, uids = node["reaper"], node["clock"], node["uids"]
    await reaper.sweep()
    reaper._view.hidden.clear()  # the watch catches up
    clock.now = 200
    await reaper.sweep()
    reaper._view.hidden.add(uids["lagging"])
    clock.now = 201
    removed = await reaper.sweep()
    assert f"{uids['lagging']}_main" not in removed


async def test_nothing_is_removed_when_the_api_server_cannot_confirm(node: dict[str, Any]) -> None:
    reaper, clock, root = node["reaper"], node["clock"], node["root"]

    class DownApi:
        async def list(self, *args: Any, **kw: Any) -> Any:
            raise errors.KubeError("connection refused")

    reaper._api = DownApi()
    before = _dirs(root)
    await reaper.sweep()
    clock.now = 500
    assert await reaper.sweep() == []
    assert _dirs(root) == before


@pytest.mark.parametrize(
    ("entry", "uid"),
    [
        ("0b0e1c4e-dead-4f00-8000-000000000001_main", "0b0e1c4e-dead-4f00-8000-000000000001"),
        ("uid_ctr", "uid"),
        ("no-underscore", None),
        ("_main", None),
        ("uid_", None),
        ("a_b_c", None),
        ("../x_y", None),
        (".hidden_x", None),
    ],
)
def test_entry_names(entry: str, uid: str | None) -> None:
    assert containerdirs.pod_uid(entry) == uid


def test_remove_refuses_unsafe_names(tmp_path: pathlib.Path) -> None:
    host = installed_host(tmp_path)
    for bad in ("../etc", "a/b", ".."):
        with pytest.raises(errors.VgpuError):
            host.remove_container_dir(bad)
