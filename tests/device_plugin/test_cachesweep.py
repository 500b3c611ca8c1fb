"""The plugin's sweep of HAMi-core's per-container directories, on a real directory tree."""

from __future__ import annotations

import os
import pathlib

from vgpu_device_plugin import cachesweep
from vgpu_device_plugin.hostfs import HostFs


def _host(tmp_path: pathlib.Path) -> tuple[HostFs, pathlib.Path]:
    return HostFs(tmp_path, hook_path="/usr/local"), tmp_path / "usr/local/vgpu/containers"


def test_directories_of_departed_pods_are_removed_with_their_contents(tmp_path: pathlib.Path) -> None:
    host, containers = _host(tmp_path)
    gone = pathlib.Path(host.container_dir("uid-gone", "main").lstrip("/"))
    live = pathlib.Path(host.container_dir("uid-live", "main").lstrip("/"))
    (tmp_path / gone / "region.cache").write_bytes(b"x" * 64)  # what HAMi-core writes there
    (containers / "README").write_text("not a container's")
    old = 1_000_000.0
    for d in (tmp_path / gone, tmp_path / live):
        os.utime(d, (old, old))
    removed = cachesweep.sweep(host, live_pod_uids={"uid-live"}, grace_s=60.0, clock=lambda: old + 61)
    assert removed == ["uid-gone_main"]
    assert not (tmp_path / gone).exists()
    assert (tmp_path / live).is_dir() and (containers / "README").exists()


def test_a_fresh_directory_is_kept_until_the_grace_has_passed(tmp_path: pathlib.Path) -> None:
    host, containers = _host(tmp_path)
    host.container_dir("uid-new", "main")
    made = (containers / "uid-new_main").stat().st_mtime
    assert cachesweep.sweep(host, live_pod_uids=set(), grace_s=60.0, clock=lambda: made + 59) == []
    assert cachesweep.sweep(host, live_pod_uids=set(), grace_s=60.0, clock=lambda: made + 60) == [
        "uid-new_main"
    ]


def test_no_containers_directory_yet_is_nothing_to_do(tmp_path: pathlib.Path) -> None:
    host, _ = _host(tmp_path)
    assert cachesweep.sweep(host, live_pod_uids=set(), grace_s=0.0) == []


def test_live_uids_are_read_from_the_view_pods() -> None:
    pods = [{"metadata": {"uid": "a"}}, {"metadata": {"uid": "b"}}, {"metadata": {}}]
    assert cachesweep.live_uids(pods) == {"a", "b", ""}
