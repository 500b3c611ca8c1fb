"""The CPUs this process may use, read from the system: its affinity and its cgroup's CPU quota
(``vgpu.core.cpulimit`` parses what is read here)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vgpu.core import cpulimit


@dataclass(frozen=True)
class Usable:
    """``cpus`` this process may keep busy, from its ``affinity`` capped by its cgroup's ``limit``."""

    cpus: float
    affinity: int
    limit: cpulimit.Limit | None

    def describe(self) -> str:
        """For the log: how many, and where that came from."""
        if self.limit is not None and self.limit.cpus < self.affinity:
            return f"{self.cpus:g} CPUs usable (the cgroup's quota, {self.limit.source})"
        return f"{self.cpus:g} CPUs usable (affinity)"


def usable(proc: Path = Path("/proc/self")) -> Usable:
    """What this process may use now; ``proc`` is read for its cgroup and mounts."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cgroup, mountinfo = _read(str(proc / "cgroup")), _read(str(proc / "mountinfo"))
    limit = cpulimit.cpu_limit(cgroup or "", mountinfo or "", _read)
    return Usable(cpulimit.usable_cpus(affinity, limit), affinity, limit)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):  # absent, unreadable: no limit there, as the kernel's default
        return None
