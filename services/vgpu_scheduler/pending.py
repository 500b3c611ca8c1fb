"""Why each pending GPU pod is not placed: the last reason ``/filter`` gave, per pod uid, in memory.

kube-scheduler records its own FailedScheduling event, and the extender a FilteringFailed one, but
both live in the API server; the dashboard reads memory only. The extender notes each failure here
(``failed``) and forgets the pod once a filter places it (``placed``). The record is bounded: past
``max_pods`` the oldest note is dropped (a pod then shows no reason until its next filter), and
``prune`` drops the notes of pods that are gone. A restarted scheduler starts empty and refills at
kube-scheduler's next retry of each pod.
"""

import math
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass

from vgpu.core import fit
from vgpu.core.config import Policy
from vgpu.core.request import PodRequest

DEFAULT_MAX_PODS = 10_000


class Ask:
    """What a pod that failed asked for, ready to be checked against GPUs that come free later
    (retries.py) without parsing the pod again: ``simple`` answers whether a node's view can take
    it in a few comparisons (a pod with one GPU container and no selectors, the common case; None
    otherwise: ``fit.fit_pod`` decides); the hash is computed once (asks key a memo)."""

    __slots__ = ("_hash", "gpu_policy", "request", "simple")

    def __init__(self, request: PodRequest, gpu_policy: Policy) -> None:
        self.request = request
        self.gpu_policy = gpu_policy
        container = fit.simple_container(request)
        self.simple = None if container is None else fit.simple_check(container)
        self._hash = hash((request, gpu_policy))

    def fits(self, view: fit.NodeGpus) -> bool:
        if self.simple is not None:
            return self.simple(view)
        return not isinstance(fit.fit_pod(self.request, view, gpu_policy=self.gpu_policy), fit.Miss)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Ask)
            and self._hash == other._hash
            and self.request == other.request
            and self.gpu_policy == other.gpu_policy
        )


@dataclass(frozen=True)
class Reason:
    """The last filter failure of one pod, when it happened (unix seconds), and what the pod asked
    for (None when its request did not parse)."""

    message: str
    at_s: float
    ask: Ask | None = None


class FilterReasons:
    """uid -> the last ``Reason``, oldest first (a dict keeps insertion order)."""

    def __init__(self, *, max_pods: int = DEFAULT_MAX_PODS) -> None:
        if max_pods < 1:
            raise ValueError(f"max_pods must be at least 1, not {max_pods}")
        self._max_pods = max_pods
        self._reasons: dict[str, Reason] = {}
        self.version = 0  # bumped at each change (readers cache on it)
        self.on_change: Callable[[], None] | None = None  # called then (the dashboard's feed)

    def failed(self, uid: str, message: str, *, now: float, ask: Ask | None = None) -> None:
        """The filter found no node for pod ``uid``, which asked for ``ask``; ``message`` says why."""
        self._changed()
        self._reasons.pop(uid, None)  # re-inserted: the newest note goes last
        self._reasons[uid] = Reason(message, now, ask)
        while len(self._reasons) > self._max_pods:
            del self._reasons[next(iter(self._reasons))]

    def placed(self, uid: str) -> None:
        """The filter chose a node for pod ``uid``: its old reason no longer holds."""
        if self._reasons.pop(uid, None) is not None:
            self._changed()

    def _changed(self) -> None:
        self.version += 1
        if self.on_change is not None:
            self.on_change()

    def get(self, uid: str) -> Reason | None:
        return self._reasons.get(uid)

    def newest(self) -> Iterator[tuple[str, Reason]]:
        """Every note, newest first."""
        return reversed(self._reasons.items())

    def copy(self) -> dict[str, Reason]:
        """uid -> reason, a copy (for a worker thread)."""
        return dict(self._reasons)

    def prune(self, alive: Container[str], *, failed_before: float = math.inf) -> int:
        """Forget the pods not in ``alive`` (uids) whose reason is older than ``failed_before``
        (a younger one may be of a pod the watch has not shown yet); returns how many."""
        gone = [uid for uid, r in self._reasons.items() if uid not in alive and r.at_s < failed_before]
        for uid in gone:
            del self._reasons[uid]
        if gone:
            self._changed()
        return len(gone)

    def __len__(self) -> int:
        return len(self._reasons)
