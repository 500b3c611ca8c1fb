"""How many CPUs a process may use: the smaller of its CPU affinity and its cgroup's CPU quota.

A container's CPU limit (``resources.limits.cpu``) is a CFS quota on its cgroup, and a parent's
(the pod's) can be tighter still. Nothing in the process's CPU count shows it: a container limited
to one CPU on a 64-core node sees 64 CPUs in ``os.sched_getaffinity``. This module finds the quota
the way Go's runtime does for GOMAXPROCS (Go 1.25) and the JVM does for its processor count:

1. ``/proc/self/cgroup`` names the process's cgroup: ``0::<path>`` for cgroup v2, and
   ``<id>:<controllers>:<path>`` for each cgroup v1 hierarchy (the one whose controllers include
   ``cpu`` holds the quota).
2. ``/proc/self/mountinfo`` says where that hierarchy is mounted and which of its cgroups the
   mount shows as its root (in a container with a cgroup namespace, ``/``).
3. From the process's cgroup up to the mount point, each level's quota: v2 ``cpu.max`` (``<quota>
   <period>`` in microseconds, or ``max <period>`` for none), v1 ``cpu.cfs_quota_us`` (-1 for none)
   over ``cpu.cfs_period_us``. The smallest is the limit.

Pure: the caller reads the files (``read``: a path to its text, or None where there is none) and
passes the two ``/proc`` texts. Anything unreadable or malformed counts as no limit, the kernel's
own default, and is named in the result's ``source`` so the caller can log it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as \040


@dataclass(frozen=True)
class Mount:
    """One cgroup mount from ``/proc/self/mountinfo``."""

    root: str  # the cgroup the mount shows as its root
    point: str  # where it is mounted
    v2: bool
    controllers: frozenset[str]  # v1: the super options naming its controllers; v2: empty


@dataclass(frozen=True)
class Limit:
    """A CPU quota: ``cpus`` (e.g. 0.5), and the file and values it was read from."""

    cpus: float
    source: str


def parse_cgroups(text: str) -> dict[str, str]:
    """``/proc/self/cgroup``: each controller's cgroup path; the v2 (unified) one under ``""``."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        controllers = parts[1]
        if parts[0] == "0" and controllers == "":
            paths[""] = parts[2]
            continue
        for name in controllers.split(","):
            if name:
                paths[name] = parts[2]
    return paths


def parse_mounts(text: str) -> list[Mount]:
    """The cgroup mounts in ``/proc/self/mountinfo`` (other lines, and malformed ones, skipped)."""
    mounts = []
    for line in text.splitlines():
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 5 or len(tail) < 2 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        v2 = tail[0] == "cgroup2"
        options = frozenset() if v2 or len(tail) < 3 else frozenset(tail[2].split(","))
        mounts.append(
            Mount(root=_unescape(fields[3]), point=_unescape(fields[4]), v2=v2, controllers=options)
        )
    return mounts


def quota_v2(text: str | None) -> float | None:
    """``cpu.max``: CPUs (quota / period), None for ``max`` or anything unreadable."""
    parts = (text or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _ratio(parts[0], parts[1])


def quota_v1(quota: str | None, period: str | None) -> float | None:
    """``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``: CPUs, None for -1 or anything unreadable."""
    return _ratio((quota or "").strip(), (period or "").strip())


def cpu_limit(cgroup_text: str, mountinfo_text: str, read: Callable[[str], str | None]) -> Limit | None:
    """The tightest CPU quota over the process's cgroup and its parents, or None when none is set.
    v1's ``cpu`` hierarchy is used where there is one (a v2 hierarchy then has no ``cpu``)."""
    paths = parse_cgroups(cgroup_text)
    mounts = parse_mounts(mountinfo_text)
    if "cpu" in paths:
        found = [m for m in mounts if not m.v2 and "cpu" in m.controllers]
        limits = (
            (quota_v1(read(f"{d}/cpu.cfs_quota_us"), read(f"{d}/cpu.cfs_period_us")), f"{d}/cpu.cfs_quota_us")
            for d in _levels(paths["cpu"], found)
        )
    elif "" in paths:
        found = [m for m in mounts if m.v2]
        limits = ((quota_v2(read(f"{d}/cpu.max")), f"{d}/cpu.max") for d in _levels(paths[""], found))
    else:
        return None
    best: Limit | None = None
    for cpus, source in limits:
        if cpus is not None and (best is None or cpus < best.cpus):
            best = Limit(cpus, source)
    return best


def usable_cpus(affinity: int, limit: Limit | None) -> float:
    """The CPUs a process may keep busy: its affinity, capped by its quota."""
    return min(float(affinity), limit.cpus) if limit is not None else float(affinity)


def _levels(path: str, mounts: list[Mount]) -> Iterator[str]:
    """The directories from ``path``'s cgroup up to its mount point, deepest first (none when no
    mount shows the cgroup: it lies outside what this process can see)."""
    for mount in mounts:
        relative = _under(path, mount.root)
        if relative is None:
            continue
        here = posixpath.join(mount.point, relative) if relative else mount.point
        while True:
            yield here
            if here == mount.point or not here.startswith(mount.point):
                break
            here = posixpath.dirname(here)
        return


def _under(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` ("" for the root itself), or None when it is not under it."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    if root == "/":
        return path.lstrip("/")
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None
    return q / p


def _unescape(field: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)
