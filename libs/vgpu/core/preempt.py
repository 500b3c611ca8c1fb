"""Choosing preemption victims on one node: the fewest lower-priority GPU pods to evict (issue 14).

A preemptor that fits nowhere asks, per candidate node, which pods must go so that it fits with the
same rules as ``/filter`` (``vgpu.core.fit``: count, memory or percent, cores, exclusive use, type and
UUID selectors, NUMA, slots, memory used outside kube-vgpu). Only pods of strictly lower priority
than the preemptor may be chosen; pods already terminating still hold their GPUs and are never
chosen (they are going anyway). kube-scheduler's own proposal (victims it needs for CPU, memory,
...) is always kept; GPU victims are added to it.

The choice, in this order of preference:

1. the lowest highest-victim priority (evict only the lowest tier that suffices);
2. the fewest PodDisruptionBudget violations, counted as kube-scheduler counts them (each matching
   budget's ``disruptionsAllowed`` is used up by the victims in turn; a victim that finds one at
   zero is a violation): kube-scheduler, too, would rather evict more pods than break a budget
   (its reprieve gives back the violating pods first, and its choice of node puts violations
   before everything else);
3. the fewest victims;
4. the least GPU memory taken away;
5. the most recently started victims (the oldest victim as young as possible).

The work per node is bounded (issue 49): kube-scheduler offers hundreds of candidate nodes, and
one call must not hold the event loop. Up to ``EXHAUSTIVE_MAX`` lower-priority pods on a node,
subsets are tried by size, each size in order of preference (the first that fits is the best of
its size), within ``CHECKS_PER_NODE`` fit checks: that finds the minimum whenever
it is one or two pods (every single, then every pair, of ten candidates is 55 checks) and, given
the room, larger ones. When the pool is larger, or the checks run out first, kube-scheduler's own
method is used as well: evict every pod of the tier, then reprieve them one by one while the
preemptor still fits (at most one check per pod), those whose eviction would break a budget
first, each group most valuable first, which gives a minimal (nothing can be given back) but not
always minimum set; the better of the two by the preference above is the answer.

Pure: no I/O, no clock (start times are parameters).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vgpu.core import fit, victimfit
from vgpu.core.config import Policy
from vgpu.core.device import GpuUsage, GpuUuid
from vgpu.core.request import PodRequest

EXHAUSTIVE_MAX = 10  # lower-priority pods on a node up to which subsets are tried by size
CHECKS_PER_NODE = 64  # fit checks the search by size may spend on one node (issue 49)


@dataclass(frozen=True)
class Resident:
    """A pod on the node that holds GPUs there.

    ``usage``: its collapsed footprint per GPU (``vgpu.core.usage.pod_usage``); ``start_s``: when it
    started (unix seconds, larger is younger); ``pdbs``: keys of the disruption budgets selecting it;
    ``evictable`` False: it holds its GPUs but is no candidate (its deletion has begun, or it is a
    decision not bound yet)."""

    uid: str
    priority: int
    usage: Mapping[GpuUuid, GpuUsage]
    start_s: float = 0.0
    pdbs: tuple[str, ...] = ()
    evictable: bool = True

    @functools.cached_property
    def memory_mib(self) -> int:
        return sum(u.memory_mib for u in self.usage.values())


@dataclass(frozen=True, slots=True)
class Victims:
    """The pods to evict on one node (kube-scheduler's proposal first), the budgets they break,
    and the fit checks spent finding them."""

    uids: tuple[str, ...]
    pdb_violations: int
    checks: int = field(default=0, compare=False)


@dataclass(frozen=True)
class NoVictims:
    """No victim set works on this node, and why (the node is dropped from the answer)."""

    reason: str


def pdb_violations(victims: Iterable[Resident], allowed: Mapping[str, int]) -> int:
    """How many of ``victims`` (in order) find a matching budget with no disruption left."""
    if not allowed:
        return 0
    left = dict(allowed)
    return sum(_breaks_budget(victim, left) for victim in victims)


def _breaks_budget(victim: Resident, left: dict[str, int]) -> bool:
    """Use up ``victim``'s disruption in each budget selecting it (``left``, in place); whether
    one of them had none left."""
    broke = False
    for key in victim.pdbs:
        if key in left:
            left[key] -= 1
            broke = broke or left[key] < 0
    return broke


def _key(
    victims: Sequence[Resident], allowed: Mapping[str, int], kept: Sequence[Resident] = ()
) -> tuple[int, int, int, int, float]:
    """``victims``' rank (smaller is better); budget violations are counted after ``kept``
    (kube-scheduler's own victims, which use up the budgets first). One pass: it is computed for
    every subset the search by size meets."""
    top = victims[0].priority
    oldest = victims[0].start_s
    memory = 0
    for v in victims:
        if v.priority > top:  # noqa: PLR1730 (no call per pod: this is the search's inner loop)
            top = v.priority
        if v.start_s < oldest:  # noqa: PLR1730
            oldest = v.start_s
        memory += v.memory_mib
    broken = pdb_violations([*kept, *victims], allowed) if allowed else 0
    return (top, broken, len(victims), memory, -oldest)


def select_victims(
    request: PodRequest,
    node: fit.NodeGpus,
    residents: Sequence[Resident],
    *,
    priority: int,
    gpu_policy: Policy,
    proposed: Sequence[str] = (),
    pdb_allowed: Mapping[str, int] | None = None,
    budget: int = CHECKS_PER_NODE,
) -> Victims | NoVictims:
    """The pods to evict on ``node`` so that ``request`` (of ``priority``) fits; see the module doc.

    ``node`` carries the node's full current usage (every resident, terminating ones included, and
    reservations). ``proposed``: kube-scheduler's own victims on this node, kept in the answer (the
    caller checks they are residents). The answer is never empty: a preemptor that fits without
    evicting anything gets ``NoVictims`` (kube-scheduler treats an empty list as an error).
    ``budget``: the fit checks the search by size may spend before the reprieve decides."""
    search = search_victims(
        request,
        node,
        residents,
        priority=priority,
        gpu_policy=gpu_policy,
        proposed=proposed,
        pdb_allowed=pdb_allowed,
        budget=budget,
    )
    while True:
        try:
            next(search)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


Search = Generator[None, None, "Victims | NoVictims"]


def search_victims(
    request: PodRequest,
    node: fit.NodeGpus,
    residents: Sequence[Resident],
    *,
    priority: int,
    gpu_policy: Policy,
    proposed: Sequence[str] = (),
    pdb_allowed: Mapping[str, int] | None = None,
    budget: int = CHECKS_PER_NODE,
) -> Search:
    """``select_victims`` as a generator that yields after every fit check (a few to tens of
    microseconds each) and returns the answer: a caller on an event loop gives the loop a turn
    between them, so one node with many residents does not hold it (``vgpu_scheduler.pacing``)."""
    allowed = pdb_allowed or {}
    check = victimfit.Checker(request, node, gpu_policy=gpu_policy)
    by_uid = {r.uid: r for r in residents}
    proposed = tuple(dict.fromkeys(proposed))  # a pod named twice is freed once
    kept = [by_uid[uid] for uid in proposed if uid in by_uid]
    fits = check.fits(kept)
    yield
    if fits:
        if not proposed:
            return NoVictims("fits without evicting anything")
        return Victims(tuple(proposed), pdb_violations(kept, allowed), check.checks)
    chosen = set(proposed)
    pool = [r for r in residents if r.priority < priority and r.evictable and r.uid not in chosen]
    if not pool:
        return NoVictims(f"no GPU pod of priority below {priority} to evict")
    fits = check.fits([*kept, *pool])
    yield
    if not fits:
        return NoVictims(f"does not fit even with every GPU pod of priority below {priority} evicted")
    tiers = sorted({r.priority for r in pool})
    low, high = 0, len(tiers) - 1  # the lowest tier whose eviction (with all below it) suffices
    while low < high:
        mid = (low + high) // 2
        fits = check.fits([*kept, *(r for r in pool if r.priority <= tiers[mid])])
        yield
        if fits:
            high = mid
        else:
            low = mid + 1
    pool = [r for r in pool if r.priority <= tiers[low]]
    found = (
        (yield from _minimum(check, kept, pool, allowed, budget=budget))
        if len(pool) <= EXHAUSTIVE_MAX
        else None
    )
    if found is not None and found[1]:
        extra = found[0]
    else:  # too many to try, or the checks ran out: the reprieve's set, unless the search beat it
        extra = yield from _reprieve(check, kept, pool, allowed)
        if found is not None and _key(found[0], allowed, kept) < _key(extra, allowed, kept):
            extra = found[0]
    victims = [*kept, *extra]
    return Victims(
        tuple(proposed) + tuple(v.uid for v in extra), pdb_violations(victims, allowed), check.checks
    )


_first = operator.itemgetter(0)


def _minimum(
    check: victimfit.Checker,
    kept: Sequence[Resident],
    pool: Sequence[Resident],
    allowed: Mapping[str, int],
    *,
    budget: int,
) -> Generator[None, None, tuple[list[Resident], bool] | None]:
    """Subsets of ``pool`` by size, the best by ``_key``, within ``budget`` fit checks: (the best
    found, whether it is the best of all), or None when none was found before the checks ran out.
    Every fitting subset holds a pod of the pool's top tier (the tiers below do not suffice: the
    caller checked), so the key is decided by budget violations (counted after ``kept``'s), then
    size: once the best so far breaks no budget beyond those ``kept`` breaks, no larger subset can
    beat it; until then larger ones are tried, and only those breaking fewer budgets are fitted."""
    best: tuple[Resident, ...] | None = None
    best_key: tuple[int, int, int, int, float] | None = None
    least = pdb_violations(kept, allowed)  # no subset breaks fewer than kube-scheduler's own victims
    limit = check.checks + budget
    for size in range(1, len(pool) + 1):
        # in preference order (a stable sort: ties keep the order of ``combinations``): the first
        # that fits is the best of its size, and every subset before it is one that must be tried
        keyed = sorted(
            ((_key(combo, allowed, kept), combo) for combo in itertools.combinations(pool, size)),
            key=_first,
        )
        for key, combo in keyed:
            if best_key is not None and key >= best_key:
                break
            if check.checks >= limit:
                return None if best is None else (list(best), False)
            fits = check.fits([*kept, *combo])
            yield
            if fits:
                best, best_key = combo, key
                break
        if best_key is not None and best_key[1] == least:
            break
    return None if best is None else (list(best), True)


def _reprieve(
    check: victimfit.Checker, kept: Sequence[Resident], pool: Sequence[Resident], allowed: Mapping[str, int]
) -> Generator[None, None, list[Resident]]:
    """kube-scheduler's way: evict all, then give back pods while it still fits, first those whose
    eviction would break a budget (as kube-scheduler's ``filterPodsWithPDBViolation`` tells them,
    most valuable first), then the rest; most valuable: highest priority, then most GPU memory,
    then oldest."""
    ranked = sorted(pool, key=lambda r: (-r.priority, -r.memory_mib, r.start_s, r.uid))
    left = dict(allowed)
    for pod in kept:  # kube-scheduler's own victims go in any case: they use up budgets first
        _breaks_budget(pod, left)
    violating: list[Resident] = []
    fine: list[Resident] = []
    for pod in ranked:
        (violating if _breaks_budget(pod, left) else fine).append(pod)
    gone = violating + fine
    index = 0
    while index < len(gone):
        trial = gone[:index] + gone[index + 1 :]
        fits = check.fits([*kept, *trial])
        yield
        if fits:
            gone = trial
        else:
            index += 1
    return gone


def pick_node(answers: Mapping[str, Victims], priority_of: Mapping[str, int]) -> str:
    """The node kube-scheduler's ``pickOneNodeForPreemption`` would take from ``answers`` (not
    empty): the fewest budget violations, then the lowest highest victim priority, the lowest sum
    of victim priorities, the fewest victims, then the name. ``priority_of``: victim uid -> priority."""

    def key(node: str) -> tuple[int, int, int, int, str]:
        prios = [priority_of.get(uid, 0) for uid in answers[node].uids]
        return (answers[node].pdb_violations, max(prios, default=0), sum(prios), len(prios), node)

    return min(answers, key=key)


def prefer_unviolating(answers: Mapping[str, Victims]) -> dict[str, Victims]:
    """The nodes whose victims break no disruption budget, when there is at least one; otherwise
    every node (kube-scheduler prefers candidates without violations the same way)."""
    clean = {node: v for node, v in answers.items() if v.pdb_violations == 0}
    return clean if clean else dict(answers)
