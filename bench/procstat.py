"""What the benchmarks read of a process and of the machine from Linux's ``/proc`` (a module of its
own, so a bench's server process need not import another bench):

* ``cpu_seconds``: the CPU time a process has used, charged per request or per pod;
* ``rss_mib``: a process's resident memory;
* ``children``: a process's child processes (a helper it started);
* ``run_queue_seconds``: how long its threads have waited on a run queue, runnable but not running
  (the kernel's schedstat): the part of every wake-up's latency that is the machine being full,
  not the process being slow;
* ``machine_jiffies``: (busy, total) CPU time of the machine's cores, or of the ones a bench may
  run on (``taskset``), for how busy they were over a phase.

Each answers 0 (or (0, 0)) where ``/proc`` cannot be read or does not parse: a figure missing from
a benchmark's output, never a benchmark that stops.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Collection

_IDLE_FIELDS = (3, 4)  # idle, iowait in /proc/stat's cpu line (after the label)


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


def children(pid: int, *, proc: pathlib.Path = pathlib.Path("/proc")) -> list[int]:
    """The pids of a process's children (every thread's ``children`` list, Linux 3.5+)."""
    try:
        tasks = sorted((proc / str(pid) / "task").iterdir())
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            text = (task / "children").read_text()
        except OSError:  # a thread gone before its file was read
            continue
        found += [int(field) for field in text.split() if field.isdigit()]
    return found


def rss_mib(pid: int | None = None, *, proc: pathlib.Path = pathlib.Path("/proc")) -> float:
    """Resident memory of a process (this one if None) in MiB, from ``VmRSS`` in its ``status``."""
    try:
        text = (proc / ("self" if pid is None else str(pid)) / "status").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "VmRSS:" and fields[1].isdigit():
            return int(fields[1]) / 1024  # kB
    return 0.0


def waited_ns(schedstat: str) -> int:
    """The run-queue wait of one ``/proc/.../schedstat`` ("<on cpu ns> <waited ns> <slices>"); 0
    when it does not parse."""
    fields = schedstat.split()
    if len(fields) < 2 or not fields[1].isdigit():
        return 0
    return int(fields[1])


def run_queue_seconds(pid: int | None, *, proc: pathlib.Path = pathlib.Path("/proc")) -> float:
    """Seconds the threads of a process (this one if None) have spent runnable on a run queue
    waiting for a core, summed over its threads (``/proc/<pid>/task/*/schedstat``)."""
    tasks = proc / ("self" if pid is None else str(pid)) / "task"
    total = 0
    try:
        entries = list(tasks.iterdir())
    except OSError:
        return 0.0
    for task in entries:
        try:
            total += waited_ns((task / "schedstat").read_text())
        except OSError:  # the thread ended between the listing and the read
            continue
    return total / 1e9


def _busy_total(fields: list[str]) -> tuple[int, int] | None:
    """(busy, total) of one ``/proc/stat`` cpu line's counters (``user nice system idle iowait irq
    softirq steal ...``); busy is everything but idle and iowait. None when they do not parse."""
    if len(fields) < 4 or not all(f.isdigit() for f in fields):
        return None
    values = [int(f) for f in fields[:8]]  # guest time is counted in user already
    idle = sum(values[i] for i in _IDLE_FIELDS if i < len(values))
    return sum(values) - idle, sum(values)


def parse_cpu_lines(stat: str, cpus: Collection[int] | None = None) -> tuple[int, int]:
    """(busy, total) jiffies from ``/proc/stat``: of the whole machine (its ``cpu`` line) when
    ``cpus`` is None, else summed over the lines ``cpu<N>`` of those cores. (0, 0) when a line
    wanted is missing or does not parse."""
    wanted = {"cpu"} if cpus is None else {f"cpu{n}" for n in cpus}
    busy = total = found = 0
    for line in stat.splitlines():
        fields = line.split()
        if not fields or fields[0] not in wanted:
            continue
        counted = _busy_total(fields[1:])
        if counted is None:
            return 0, 0
        busy, total, found = busy + counted[0], total + counted[1], found + 1
    return (busy, total) if found == len(wanted) else (0, 0)


def machine_jiffies(
    cpus: Collection[int] | None = None, *, proc: pathlib.Path = pathlib.Path("/proc")
) -> tuple[int, int]:
    """(busy, total) CPU time since boot, in jiffies, of every core, or of the cores ``cpus`` (a
    bench pinned with ``taskset`` passes ``os.sched_getaffinity(0)``); (0, 0) when unreadable."""
    try:
        return parse_cpu_lines((proc / "stat").read_text(), cpus)
    except OSError:
        return 0, 0


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    """How busy the cores were between two ``machine_jiffies`` readings (0.0-1.0; 0.0
    when nothing was counted)."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0
