"""Reading the CPUs a process may use from /proc and the cgroup files (a fake tree in tmp_path)."""

from __future__ import annotations

import os
from pathlib import Path

from vgpu import cpus


def fake_proc(tmp_path: Path, *, quota: str | None) -> Path:
    """A /proc/self whose cgroup v2 mount is ``tmp_path/cg`` and whose cgroup is ``/pod/c1``."""
    proc = tmp_path / "proc"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/pod/c1\n")
    (proc / "mountinfo").write_text(f"30 25 0:26 / {tmp_path}/cg rw - cgroup2 cgroup2 rw\n")
    leaf = tmp_path / "cg" / "pod" / "c1"
    leaf.mkdir(parents=True)
    if quota is not None:
        (leaf / "cpu.max").write_text(quota)
    return proc


def test_a_quota_below_the_affinity_caps_it(tmp_path: Path) -> None:
    usable = cpus.usable(fake_proc(tmp_path, quota="50000 100000\n"))
    assert usable.cpus == 0.5
    assert usable.affinity == len(os.sched_getaffinity(0))
    assert usable.describe() == f"0.5 CPUs usable (the cgroup's quota, {tmp_path}/cg/pod/c1/cpu.max)"


def test_no_quota_or_garbage_leaves_the_affinity(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    for name, quota in (("none", None), ("max", "max 100000\n"), ("garbage", "\x00\xff banana")):
        usable = cpus.usable(fake_proc(tmp_path / name, quota=quota))
        assert (usable.cpus, usable.limit) == (affinity, None), name
        assert usable.describe() == f"{affinity:g} CPUs usable (affinity)"


def test_unreadable_proc_files_mean_no_limit(tmp_path: Path) -> None:
    (tmp_path / "cgroup").mkdir()  # a directory where the file should be: unreadable, not a crash
    (tmp_path / "mountinfo").write_bytes(b"\xff\xfe not text")
    assert cpus.usable(tmp_path).limit is None
