"""``SurvivorFreezer``: survivors of a young collection frozen, garbage still collected, compaction."""

from __future__ import annotations

import asyncio
import gc
import mmap
import weakref
from collections.abc import Iterator

import pytest
from vgpu import gcfreeze
from vgpu.gcfreeze import SurvivorFreezer


class Node:
    """A tracked object that can hold a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def _cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


def _in_a_generation(obj: object) -> bool:
    return any(any(o is obj for o in gc.get_objects(generation=g)) for g in range(3))


@pytest.fixture
def freezer() -> Iterator[SurvivorFreezer]:
    f = SurvivorFreezer()
    f.install()
    try:
        yield f
    finally:
        f.uninstall()


def test_a_survivor_of_a_young_collection_is_never_scanned_again(freezer: SurvivorFreezer) -> None:
    kept = Node()
    assert _in_a_generation(kept)
    before = freezer.frozen()
    gc.collect(1)
    assert gc.is_tracked(kept) and not _in_a_generation(kept)  # in the permanent generation
    assert freezer.frozen() > before and freezer.freezes >= 1


def test_a_cycle_that_dies_young_is_still_collected(freezer: SurvivorFreezer) -> None:
    a, ref = _cycle()
    del a
    gc.collect(1)
    assert ref() is None


def test_a_frozen_object_without_a_cycle_is_freed_by_its_last_reference(freezer: SurvivorFreezer) -> None:
    kept = Node()
    ref = weakref.ref(kept)
    gc.collect(1)
    assert not _in_a_generation(kept)
    del kept
    assert ref() is None


def test_a_cycle_that_dies_frozen_waits_for_a_compaction(freezer: SurvivorFreezer) -> None:
    a, ref = _cycle()
    gc.collect(1)  # frozen while alive
    del a
    gc.collect()  # a full collection does not scan frozen objects
    assert ref() is not None
    installed_at = freezer.compacted_at
    done = freezer.compact()
    assert freezer.compacted_at > installed_at > 0  # when it last compacted (the scheduler's 6 h rule)
    assert ref() is None
    assert done.collected >= 2 and done.seconds >= 0
    assert freezer.compactions == 1 and freezer.frozen_after_compaction == freezer.frozen()


def test_uninstall_hands_everything_back_and_stops_freezing() -> None:
    f = SurvivorFreezer()
    f.install()
    assert f.installed and f.frozen() > 0
    f.uninstall()
    assert not f.installed and gc.get_freeze_count() == 0
    kept = Node()
    gc.collect(1)
    assert _in_a_generation(kept) and gc.get_freeze_count() == 0
    f.uninstall()  # twice is harmless


MIB = 1 << 20
BOUNDS = gcfreeze.Bounds(
    idle_growth=1.25, memory_slack_bytes=64 * MIB, memory_slack_ratio=0.25, overdue_s=3600.0
)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param((True, 1000, 100 * MIB, 100 * MIB, 0.0), None, id="idle-nothing-grew"),
        pytest.param((True, 1250, 100 * MIB, 100 * MIB, 0.0), "idle", id="idle-grew-a-quarter"),
        pytest.param((False, 5000, 100 * MIB, 100 * MIB, 0.0), None, id="busy-grew-a-lot"),
        pytest.param((None, None, 164 * MIB, 100 * MIB, 0.0), None, id="memory-at-the-slack"),
        pytest.param((False, 1000, 165 * MIB, 100 * MIB, 0.0), "memory", id="busy-memory-past-the-slack"),
        pytest.param((None, None, 1200 * MIB, 1000 * MIB, 0.0), None, id="big-process-within-a-quarter"),
        pytest.param((None, None, 1251 * MIB, 1000 * MIB, 0.0), "memory", id="big-process-past-a-quarter"),
        pytest.param((None, None, None, 100 * MIB, 0.0), None, id="memory-unknown"),
        pytest.param((False, 1000, 100 * MIB, None, 3600.0), "overdue", id="overdue"),
        pytest.param((None, None, 10 * MIB, 100 * MIB, 0.0), None, id="memory-shrank"),
    ],
)
def test_when_a_compaction_is_due(
    case: tuple[bool | None, int | None, int | None, int | None, float], expected: str | None
) -> None:
    """``case``: idle, frozen objects (1,000 after the last compaction), resident set now and after
    the last compaction, seconds since it."""
    idle, frozen, rss, rss_after, since_s = case
    reason = gcfreeze.due(
        BOUNDS, idle=idle, frozen=frozen, frozen_after=1000, rss=rss, rss_after=rss_after, since_s=since_s
    )
    assert reason == expected


def test_the_resident_set_is_read_from_the_process() -> None:
    before = gcfreeze.rss_bytes()
    assert before is not None and before > 0
    with mmap.mmap(-1, 32 * MIB) as block:  # fresh pages (malloc could reuse resident ones)
        for i in range(0, len(block), mmap.PAGESIZE):  # touch every page
            block[i] = 1
        after = gcfreeze.rss_bytes()
    assert after is not None and after - before >= 30 * MIB


def test_a_compaction_records_the_resident_set() -> None:
    sizes = iter([100 * MIB, 120 * MIB, 90 * MIB])
    f = SurvivorFreezer(rss=lambda: next(sizes))
    f.install()
    try:
        assert f.rss_after_compaction == 100 * MIB
        done = f.compact()
        assert (done.rss_before, done.rss_after, f.rss_after_compaction) == (120 * MIB, 90 * MIB, 90 * MIB)
    finally:
        f.uninstall()


async def test_keep_within_compacts_on_the_memory_bound_alone() -> None:
    resident = [100 * MIB]
    f = SurvivorFreezer(rss=lambda: resident[0])
    f.install()
    try:
        a, ref = _cycle()
        gc.collect(1)  # frozen while alive
        del a
        bounds = gcfreeze.Bounds(memory_slack_bytes=MIB, memory_slack_ratio=0.0)
        task = asyncio.create_task(gcfreeze.keep_within(f, bounds, every_s=0.001))
        resident[0] += 2 * MIB
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while f.compactions == 0:
            assert loop.time() < deadline, "no compaction"
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert ref() is None
    finally:
        f.uninstall()


async def test_run_within_returns_the_result_and_stops_holding_the_bounds(freezer: SurvivorFreezer) -> None:
    async def work() -> int:
        await asyncio.sleep(0)
        return 7

    assert await gcfreeze.run_within(work(), freezer) == 7
    # the bounds' task is gone with it (the suite checks that no task outlives a test)
