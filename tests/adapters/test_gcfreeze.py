"""``SurvivorFreezer``: survivors of a young collection frozen, garbage still collected, compaction."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
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
