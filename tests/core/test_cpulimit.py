"""The CPU quota a process's cgroups set: /proc parsing, v1 and v2 limit files, the walk up."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from vgpu.core import cpulimit

# the lines a container sees (cgroup namespaces: its cgroup is the mount's root)
V2_CGROUP = "0::/\n"
V2_MOUNTINFO = (
    "1300 1299 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate\n"
    "1301 1299 0:88 / /proc rw,nosuid - proc proc rw\n"
)
# a cgroup v1 host process inside a pod's container cgroup, with the mount showing the whole tree
V1_CGROUP = (
    "12:memory:/kubepods/pod1/c1\n4:cpu,cpuacct:/kubepods/pod1/c1\n1:name=systemd:/kubepods/pod1/c1\n0::/\n"
)
V1_MOUNTINFO = (
    "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
    "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
    "32 25 0:28 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n"
)


def files(contents: dict[str, str]) -> Callable[[str], str | None]:
    return contents.get


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("100000 100000", 1.0),
        ("50000 100000\n", 0.5),
        ("250000 100000", 2.5),
        ("max 100000", None),
        ("max", None),
        ("", None),
        (None, None),
        ("0 100000", None),
        ("-1 100000", None),
        ("lots 100000", None),
        ("100000 0", None),
        ("100000 100000 100000", None),
        ("\x00\xff", None),
    ],
    ids=repr,
)
def test_cpu_max(text: str | None, cpus: float | None) -> None:
    assert cpulimit.quota_v2(text) == cpus


@pytest.mark.parametrize(
    ("quota", "period", "cpus"),
    [
        ("100000\n", "100000\n", 1.0),
        ("150000", "100000", 1.5),
        ("-1", "100000", None),
        ("100000", None, None),
        (None, None, None),
        ("x", "100000", None),
        ("100000", "-5", None),
    ],
)
def test_cfs_quota(quota: str | None, period: str | None, cpus: float | None) -> None:
    assert cpulimit.quota_v1(quota, period) == cpus


def test_proc_files_are_parsed_and_garbage_lines_skipped() -> None:
    assert cpulimit.parse_cgroups(V1_CGROUP + "garbage\n7:cpuset\n5:pids:relative\n") == {
        "memory": "/kubepods/pod1/c1",
        "cpu": "/kubepods/pod1/c1",
        "cpuacct": "/kubepods/pod1/c1",
        "name=systemd": "/kubepods/pod1/c1",
        "": "/",
    }
    mounts = cpulimit.parse_mounts(
        V1_MOUNTINFO + "garbage\n1 2 3 - cgroup\n40 25 0:30 / /mnt/with\\040space rw - cgroup2 x rw\n"
    )
    assert [(m.point, m.v2, "cpu" in m.controllers) for m in mounts] == [
        ("/sys/fs/cgroup/memory", False, False),
        ("/sys/fs/cgroup/cpu,cpuacct", False, True),
        ("/sys/fs/cgroup/unified", True, False),
        ("/mnt/with space", True, False),
    ]


def test_v2_container_limit() -> None:
    limit = cpulimit.cpu_limit(V2_CGROUP, V2_MOUNTINFO, files({"/sys/fs/cgroup/cpu.max": "50000 100000\n"}))
    assert limit == cpulimit.Limit(0.5, "/sys/fs/cgroup/cpu.max")
    unlimited = cpulimit.cpu_limit(V2_CGROUP, V2_MOUNTINFO, files({"/sys/fs/cgroup/cpu.max": "max 100000\n"}))
    assert unlimited is None


def test_the_tightest_level_wins_walking_up_to_the_mount_point() -> None:
    """The container's cgroup sets 2 CPUs, the pod's 1.5; the host's root has none. Levels above
    the mount point are never read."""
    read_paths: list[str] = []
    quotas = {
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_quota_us": "200000",
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us": "150000",
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/cpu.cfs_quota_us": "-1",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1",
    }

    def read(path: str) -> str | None:
        read_paths.append(path)
        return quotas.get(path) if path.endswith("quota_us") else "100000"

    limit = cpulimit.cpu_limit(V1_CGROUP, V1_MOUNTINFO, read)
    assert limit == cpulimit.Limit(1.5, "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us")
    assert all(p.startswith("/sys/fs/cgroup/cpu,cpuacct/") for p in read_paths)
    assert "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us" in read_paths  # the mount point itself


def test_a_mount_showing_the_container_cgroup_as_its_root() -> None:
    """cgroup v1 without a cgroup namespace (Docker): the mount's root is the container's cgroup."""
    cgroup = "4:cpu,cpuacct:/docker/abc\n"
    mountinfo = "31 25 0:27 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpuacct,cpu\n"
    quota = {
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "100000",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
    }
    assert cpulimit.cpu_limit(cgroup, mountinfo, files(quota)) == cpulimit.Limit(
        1.0, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"
    )


@pytest.mark.parametrize(
    ("cgroup", "mountinfo"),
    [
        ("", ""),  # nothing readable (not Linux, /proc not mounted)
        (V2_CGROUP, ""),  # no cgroup mount visible
        (
            "4:cpu:/elsewhere\n",
            "31 25 0:27 /mine /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu\n",
        ),  # outside it
        ("\x00garbage:::\n", "garbage - cgroup\n"),
    ],
)
def test_no_limit_when_nothing_says_so(cgroup: str, mountinfo: str) -> None:
    assert (
        cpulimit.cpu_limit(cgroup, mountinfo, files({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "1000"})) is None
    )


def test_usable_cpus_is_the_affinity_capped_by_the_limit() -> None:
    assert cpulimit.usable_cpus(16, None) == 16
    assert cpulimit.usable_cpus(16, cpulimit.Limit(0.5, "x")) == 0.5
    assert cpulimit.usable_cpus(2, cpulimit.Limit(4.0, "x")) == 2  # a quota above the cores given
