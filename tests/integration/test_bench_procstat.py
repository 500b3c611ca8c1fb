"""bench/procstat: what the benchmarks read of a process and of the machine from /proc, and what
they make of files that are missing or do not parse (a missing figure, never a stopped bench)."""

from __future__ import annotations

import mmap
import os
import pathlib
import subprocess
import sys

import pytest

from bench import procstat


def _task(proc: pathlib.Path, pid: int, tid: int, schedstat: str) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    (task / "schedstat").write_text(schedstat)


def test_run_queue_wait_is_summed_over_the_threads_of_the_process(tmp_path: pathlib.Path) -> None:
    _task(tmp_path, 42, 42, "9000000 1500000000 120\n")  # on a core 9 ms, waited 1.5 s
    _task(tmp_path, 42, 43, "100 250000000 7\n")
    _task(tmp_path, 42, 44, "garbage\n")  # a line that does not parse counts nothing
    (tmp_path / "42" / "task" / "45").mkdir()  # a thread gone before its file was read
    _task(tmp_path, 7, 7, "1 999999999999 1\n")  # another process: not counted
    assert procstat.run_queue_seconds(42, proc=tmp_path) == pytest.approx(1.75)


def test_run_queue_wait_of_a_process_that_cannot_be_read_is_zero(tmp_path: pathlib.Path) -> None:
    assert procstat.run_queue_seconds(42, proc=tmp_path) == 0.0


def test_children_are_gathered_from_every_thread(tmp_path: pathlib.Path) -> None:
    for tid, children in ((42, "101 102\n"), (43, "103"), (44, "x 104 -5\n")):  # garbage skipped
        task = tmp_path / "42" / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "children").write_text(children)
    (tmp_path / "42" / "task" / "45").mkdir()  # a thread gone before its file was read
    assert procstat.children(42, proc=tmp_path) == [101, 102, 103, 104]
    assert procstat.children(7, proc=tmp_path) == []  # a process that cannot be read


@pytest.mark.skipif(not pathlib.Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_child_of_this_process_is_found() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert child.pid in procstat.children(os.getpid())
    finally:
        child.communicate(b"")
    assert child.pid not in procstat.children(os.getpid())


@pytest.mark.parametrize(
    ("text", "waited"),
    [
        ("5 7 9", 7),
        ("5 7", 7),
        ("", 0),
        ("5", 0),
        ("5 -7 9", 0),
        ("5 7.5 9", 0),
        ("\x00\xff", 0),
    ],
)
def test_schedstat_lines(text: str, waited: int) -> None:
    assert procstat.waited_ns(text) == waited


@pytest.mark.skipif(not pathlib.Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_this_process_is_read_from_the_real_proc() -> None:
    """The kernel's files have the shape the parsers expect, and the sum over this process's
    threads, read later, is at least what one of its threads had waited before."""
    tid = os.listdir("/proc/self/task")[0]
    text = pathlib.Path(f"/proc/self/task/{tid}/schedstat").read_text()
    assert len(text.split()) == 3 and all(f.isdigit() for f in text.split())
    one_thread = procstat.waited_ns(text) / 1e9
    assert procstat.run_queue_seconds(os.getpid()) >= one_thread
    assert procstat.run_queue_seconds(None) >= one_thread
    mine = procstat.machine_jiffies(os.sched_getaffinity(0))
    busy, total = procstat.machine_jiffies()
    assert 0 < busy < total
    assert 0 < mine[0] < mine[1] <= total  # some of the cpuN lines, read first: at most the cpu line


@pytest.mark.parametrize(
    ("stat", "jiffies"),
    [
        # user nice system idle iowait irq softirq steal guest guest_nice
        ("cpu  100 5 50 800 40 1 4 0 30 0\ncpu0 1 2 3 4\n", (160, 1000)),
        ("cpu  100 0 50 850\n", (150, 1000)),  # an old kernel: no iowait and later fields
        ("cpu0 100 0 50 850\n", (0, 0)),  # not the machine's line
        ("cpu  100 x 50 850\n", (0, 0)),
        ("cpu 1 2\n", (0, 0)),
        ("", (0, 0)),
    ],
)
def test_machine_cpu_line(stat: str, jiffies: tuple[int, int]) -> None:
    assert procstat.parse_cpu_lines(stat) == jiffies


_PER_CORE = (
    "cpu  300 0 100 1600 0 0 0 0\n"
    "cpu0 100 0 50 350 0 0 0 0\n"
    "cpu1 200 0 50 250 0 0 0 0\n"
    "cpu2 0 0 0 500 0 0 0 0\n"
    "cpu3 0 0 0 500 0 0 0 0\n"
    "intr 12345 0 0\n"
)


@pytest.mark.parametrize(
    ("stat", "cpus", "jiffies"),
    [
        (_PER_CORE, None, (400, 2000)),  # the machine's line
        (_PER_CORE, {0, 1}, (400, 1000)),  # pinned to two busy cores: busier than the machine
        (_PER_CORE, {2}, (0, 500)),
        (_PER_CORE, {1, 7}, (0, 0)),  # a core that /proc/stat does not list
        (_PER_CORE.replace("cpu1 200", "cpu1 2x0"), {0, 1}, (0, 0)),
        (_PER_CORE, set(), (0, 0)),
    ],
)
def test_the_cores_a_bench_is_pinned_to(stat: str, cpus: set[int] | None, jiffies: tuple[int, int]) -> None:
    assert procstat.parse_cpu_lines(stat, cpus) == jiffies


def test_pinned_cores_read_from_a_proc_tree(tmp_path: pathlib.Path) -> None:
    (tmp_path / "stat").write_text(_PER_CORE)
    busy, total = procstat.machine_jiffies({0, 1}, proc=tmp_path)
    assert procstat.busy_fraction((0, 0), (busy, total)) == pytest.approx(0.4)


def test_busy_fraction_between_two_readings() -> None:
    assert procstat.busy_fraction((100, 1000), (280, 1200)) == pytest.approx(0.9)
    assert procstat.busy_fraction((100, 1000), (100, 1000)) == 0.0  # nothing counted between them


def test_machine_that_cannot_be_read_gives_nothing(tmp_path: pathlib.Path) -> None:
    assert procstat.machine_jiffies(proc=tmp_path) == (0, 0)


@pytest.mark.parametrize(
    ("status", "mib"),
    [
        ("Name:\tpython\nVmPeak:\t  9000 kB\nVmRSS:\t   51200 kB\nThreads:\t4\n", 50.0),
        ("Name:\tpython\nThreads:\t4\n", 0.0),  # a kernel thread has no VmRSS
        ("VmRSS:\t  lots kB\n", 0.0),
        ("VmRSS:\n", 0.0),
        ("", 0.0),
    ],
)
def test_resident_memory(tmp_path: pathlib.Path, status: str, mib: float) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "status").write_text(status)
    assert procstat.rss_mib(42, proc=tmp_path) == mib
    assert procstat.rss_mib(43, proc=tmp_path) == 0.0  # gone


def test_resident_memory_of_this_process() -> None:
    before = procstat.rss_mib()
    # a fresh mapping, each page written, so resident: a bytes object of that size could reuse
    # memory the allocator already held from earlier tests and leave the RSS where it was
    size = 64 * 1024 * 1024
    with mmap.mmap(-1, size) as block:
        for offset in range(0, size, mmap.PAGESIZE):
            block[offset] = 1
        assert procstat.rss_mib(os.getpid()) >= before + 48
