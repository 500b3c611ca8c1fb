"""HostFs's checks of what Allocate mounts: HAMi-core's files (regular files, no symlinks) and the
lock dir (a root-owned real directory, never followed through a symlink), and HamiCoreWatch's
health and logging."""

from __future__ import annotations

import logging
import os
import pathlib

import pytest
from vgpu.core import errors
from vgpu.gpu import fake
from vgpu_device_plugin import hamicore
from vgpu_device_plugin.health import HealthMonitor, HealthTracker
from vgpu_device_plugin.hostfs import HamiCoreMissing, HostFs

from tests.device_plugin.builders import GPU_A, GPU_B, installed_host

CORE = "usr/local/vgpu"


def _host(root: pathlib.Path, **kw: object) -> HostFs:
    return HostFs(root, hook_path="/usr/local", **kw)  # type: ignore[arg-type]


def _missing(root: pathlib.Path) -> None:
    (root / CORE).mkdir(parents=True)
    (root / CORE / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")


def _directory(root: pathlib.Path) -> None:
    _missing(root)
    (root / CORE / "libvgpu.so").mkdir()  # what containerd makes of a missing mount source


def _symlink(root: pathlib.Path) -> None:
    _missing(root)
    (root / "elsewhere.so").write_text("not HAMi-core")
    (root / CORE / "libvgpu.so").symlink_to(root / "elsewhere.so")


def _fifo(root: pathlib.Path) -> None:
    _missing(root)
    os.mkfifo(root / CORE / "libvgpu.so")


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        (lambda root: None, "is missing"),
        (_missing, "is missing"),
        (_directory, "is a directory"),
        (_symlink, "is a symlink"),
        (_fifo, "not a regular file"),
    ],
    ids=["nothing", "no-library", "runtime-made-directory", "symlink", "fifo"],
)
def test_hami_core_problem_names_the_path_and_the_installer(tmp_path: pathlib.Path, setup, words) -> None:
    setup(tmp_path)
    host = _host(tmp_path)
    problem = host.hami_core_problem()
    assert problem is not None
    assert "/usr/local/vgpu/" in problem and words in problem and "hami-core-installer" in problem
    with pytest.raises(HamiCoreMissing, match="hami-core-installer"):
        host.check_hami_core()
    library = tmp_path / CORE / "libvgpu.so"
    assert library.is_symlink() or not library.is_file()  # the check creates nothing


def test_installed_files_pass(tmp_path: pathlib.Path) -> None:
    host = installed_host(tmp_path)
    assert host.hami_core_problem() is None
    assert (tmp_path / CORE / "ld.so.preload").read_text().strip() == "/usr/local/vgpu/libvgpu.so"


# --- the lock dir (issue 49 item 5) -------------------------------------------------------------


def test_lock_dir_is_made_under_the_hami_core_dir_world_writable(tmp_path: pathlib.Path) -> None:
    host = installed_host(tmp_path)
    assert host.lock_dir() == "/usr/local/vgpu/vgpulock"
    st = os.lstat(tmp_path / CORE / "vgpulock")
    assert st.st_mode & 0o7777 == 0o777
    assert host.lock_dir() == "/usr/local/vgpu/vgpulock"  # again: checked, kept


def test_a_planted_lock_symlink_is_refused_and_its_target_untouched(tmp_path: pathlib.Path) -> None:
    host = installed_host(tmp_path)
    target = tmp_path / "etc"
    target.mkdir(mode=0o755)
    (tmp_path / CORE / "vgpulock").symlink_to(target)
    with pytest.raises(errors.AllocationError, match="vgpulock"):
        host.lock_dir()
    assert os.stat(target).st_mode & 0o777 == 0o755


def test_a_lock_path_that_is_a_file_is_refused(tmp_path: pathlib.Path) -> None:
    host = installed_host(tmp_path)
    (tmp_path / CORE / "vgpulock").write_text("")
    with pytest.raises(errors.AllocationError, match=r"(?i)not a directory"):
        host.lock_dir()


def test_a_lock_dir_not_owned_by_root_is_refused(tmp_path: pathlib.Path) -> None:
    installed_host(tmp_path)
    (tmp_path / CORE / "vgpulock").mkdir()
    owner = os.lstat(tmp_path / CORE / "vgpulock").st_uid
    host = _host(tmp_path, trusted_uids=frozenset({owner + 1}))  # as if someone else had made it
    with pytest.raises(errors.AllocationError, match="not root"):
        host.lock_dir()


def test_a_symlinked_hami_core_dir_is_refused_for_the_lock(tmp_path: pathlib.Path) -> None:
    real = tmp_path / "real"
    installed_host(real)
    (tmp_path / "usr/local").mkdir(parents=True)
    (tmp_path / CORE).symlink_to(real / CORE)
    with pytest.raises(errors.AllocationError, match="not a directory"):
        _host(tmp_path).lock_dir()
    assert not (real / CORE / "vgpulock").exists()


def test_container_dir_refuses_a_planted_lock_symlink(tmp_path: pathlib.Path) -> None:
    host = installed_host(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / CORE / "vgpulock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(errors.AllocationError, match="vgpulock"):
        host.container_dir("uid-1", "main")


# --- HamiCoreWatch -------------------------------------------------------------------------------


async def _inline(func):  # type: ignore[no-untyped-def]
    return func()


async def test_watch_marks_gpus_unhealthy_logs_once_and_recovers(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracker = HealthTracker([GPU_A, GPU_B], clock=lambda: 0.0, recovery_s=60, ignored_xids=())
    monitor = HealthMonitor(fake.FakeGpuBackend([]), tracker, probe_interval_s=60)
    watch = hamicore.HamiCoreWatch(_host(tmp_path), node="n1", offload=_inline)
    caplog.set_level(logging.INFO, logger="vgpu_device_plugin.hamicore")
    for _ in range(3):
        assert await watch.apply(monitor, [GPU_A]) is not None
    assert tracker.snapshot() == {GPU_A: False, GPU_B: True}
    assert monitor.version == 1  # one change, told once
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    installed_host(tmp_path)
    for _ in range(2):
        assert await watch.apply(monitor, [GPU_A]) is None
    assert tracker.snapshot() == {GPU_A: True, GPU_B: True}
    assert len([r for r in caplog.records if "in place again" in r.getMessage()]) == 1


def test_a_condition_does_not_heal_a_gpu_the_driver_marked_bad() -> None:
    tracker = HealthTracker([GPU_A], clock=lambda: 0.0, recovery_s=60, ignored_xids=())
    tracker.on_probe(GPU_A, ok=False)
    assert tracker.set_condition("hami-core", "missing", uuids=[GPU_A]) == set()
    assert tracker.set_condition("hami-core", None, uuids=[GPU_A]) == set()
    assert tracker.healthy(GPU_A) is False


def test_a_symlink_planted_at_the_hosts_tmp_vgpulock_is_never_followed(tmp_path: pathlib.Path) -> None:
    """The old host path, world-writable /tmp: a planted symlink there made the root plugin chmod
    its target 0777 and mount it read-write into every GPU container. It is not used any more."""
    host = installed_host(tmp_path)
    target = tmp_path / "etc"
    target.mkdir(mode=0o755)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp/vgpulock").symlink_to(target)
    host.container_dir("uid-1", "main")
    assert os.stat(target).st_mode & 0o777 == 0o755
    assert os.lstat(tmp_path / CORE / "vgpulock").st_mode & 0o777 == 0o777
