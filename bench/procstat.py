"""``cpu_seconds``: the CPU time a process has used, for the benchmarks that charge it per request
or per pod (a module of its own, so a bench's server process need not import another bench)."""

from __future__ import annotations

import os
import pathlib


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds a process has used so far (Linux ``/proc``); this process if None."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
