"""Every node with GPUs in node-policy order, kept as usage changes, so that ``/filter`` can stop
at the first candidate that fits instead of deciding all of them.

kube-scheduler hands the filter hundreds of candidates per pod (420 of 1,000 nodes,
docs/protocol.md#how-kube-scheduler-calls-it) inside its serial cycle. Deciding each one costs
little, but under load most of that cost is memory traffic over hundreds of node summaries, and it grows with the cluster. The answer is the
best node by score (binpack: highest, spread: lowest, ties to the name that sorts first), so
walking the nodes in that order and taking the first candidate that fits gives the same node after
a handful of checks (``NodeInventory.pick_simple``).

Two sorted lists of ``(score, name)`` and ``(-score, name)`` (``bisect``; a change moves one entry,
a few microseconds at 5,000 nodes). The score is ``policy.node_score`` of the node's GPUs and
usage, the same figure its ``NodeGpus`` view carries; ``NodeInventory`` sets it wherever a node's
GPUs or usage change. A stale order could only make a worse choice, never an overcommit: the walk
checks each node's live view.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterator


class ScoreOrder:
    """Node names by score, both ways."""

    def __init__(self) -> None:
        self._low: list[tuple[float, str]] = []  # spread's order
        self._high: list[tuple[float, str]] = []  # binpack's: (-score, name)
        self._score: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._score)

    def set(self, name: str, score: float) -> None:
        """Place ``name`` at ``score`` (moving it when it had another)."""
        old = self._score.get(name)
        if old == score:
            return
        if old is not None:
            self._remove(name, old)
        self._score[name] = score
        bisect.insort(self._low, (score, name))
        bisect.insort(self._high, (-score, name))

    def discard(self, name: str) -> None:
        old = self._score.pop(name, None)
        if old is not None:
            self._remove(name, old)

    def score(self, name: str) -> float | None:
        return self._score.get(name)

    def _remove(self, name: str, score: float) -> None:
        for entries, key in ((self._low, (score, name)), (self._high, (-score, name))):
            at = bisect.bisect_left(entries, key)
            assert entries[at] == key, f"node {name} missing from the score order"
            del entries[at]

    def walk(self, *, binpack: bool) -> Iterator[str]:
        """Names best first: binpack highest score first, spread lowest; ties by name. The caller
        must not change the order while it walks."""
        return map(operator.itemgetter(1), self._high if binpack else self._low)
