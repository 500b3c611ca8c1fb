"""The DRA mode's GPUs for the views (``/ui``, ``/metrics``): watch-fed caches of our driver's
ResourceSlices and of ResourceClaims, kept apart from ``ClusterState``.

kube-scheduler allocates DRA claims itself; nothing of it passes through ``/filter`` or the
webhook's decisions, so nothing of it is in the state those read. The two informers here only
keep the objects (claims slimmed to identity, owners, allocation results and ``reservedFor``:
``slim.claim_for_views``) and bump ``generation``; the usage is built from a ``capture`` only when
a view asks, in a worker thread (``DraCapture.usage``), once per generation (the dashboard and
``/metrics`` share it), and what was read of each object (``usage.read_slice`` / ``read_claim``,
most of the cost) is kept until the informer replaces the object (``Readings``). Both kinds are
``unserved_ok`` (an API server before Kubernetes 1.34 serves no ``resource.k8s.io/v1``) and
``forbidden_ok`` (a chart without the DRA rules). The claims do not hold the scheduler's readiness:
the views come without DRA claims until they are listed. The slices' informer is the scheduler's
only watch of ResourceSlices: it also tells the webhook's GPU sizes (``on_slice``), which readiness
waits for (a percentage pod admitted before them would be refused for want of a published GPU).
A capture also holds our ResourceClaimTemplates (``templates``: the webhook's cache, ``dratemplates``),
from which the dashboard reads what a DRA pod whose claim is not made yet asks.
"""

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from vgpu.core.dra import names, usage
from vgpu.kube import informer, slim
from vgpu.kube.port import JsonObj, KubeApi

T = TypeVar("T")


class Memo(Generic[T]):
    """What was read of each object, by identity (an informer replaces an object when it changes,
    never changes it; the object is held, so its id is not reused while the entry lives)."""

    def __init__(self, read: Callable[[object], T]) -> None:
        self._read = read
        self._entries: dict[int, tuple[JsonObj, T]] = {}

    def all(self, objects: Sequence[JsonObj]) -> list[T]:
        """The readings of ``objects``; those of objects not among them are dropped."""
        fresh: dict[int, tuple[JsonObj, T]] = {}
        out: list[T] = []
        for obj in objects:
            entry = self._entries.get(id(obj))
            if entry is None or entry[0] is not obj:
                entry = (obj, self._read(obj))
            fresh[id(obj)] = entry
            out.append(entry[1])
        self._entries = fresh
        return out


class Readings:
    """Per-object readings and the last usage built, shared by the captures of one ``DraViews``;
    one build at a time (a lock: the dashboard and ``/metrics`` build in their own threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices = Memo(usage.read_slice)
        self._claims = Memo(usage.read_claim)
        self._last: tuple[int, usage.DraUsage] | None = None

    def usage(self, capture: "DraCapture") -> usage.DraUsage:
        with self._lock:
            if self._last is not None and self._last[0] == capture.generation:
                return self._last[1]
            built = usage.combine(self._slices.all(capture.slices), self._claims.all(capture.claims))
            self._last = (capture.generation, built)
            return built


@dataclasses.dataclass(frozen=True)
class DraCapture:
    """The cached objects at one moment (references: the informers replace objects, never change
    them) and the generation they show."""

    generation: int
    slices: Sequence[JsonObj] = ()
    claims: Sequence[JsonObj] = ()
    readings: Readings | None = None
    templates: Sequence[JsonObj] = ()  # our ResourceClaimTemplates (what waiting pods ask)

    def usage(self) -> usage.DraUsage:
        """The DRA usage of this capture; safe in a worker thread."""
        if self.readings is None:
            return usage.build(self.slices, self.claims)
        return self.readings.usage(self)


def _ours(obj: JsonObj) -> bool:
    spec = obj.get("spec")
    return isinstance(spec, dict) and spec.get("driver") == names.DRIVER


class DraViews:
    """The two caches; ``on_change`` (the dashboard's poke) is called after each change."""

    def __init__(
        self,
        api: KubeApi,
        *,
        on_slice: Callable[[informer.Change], None] | None = None,
        templates: Callable[[], Sequence[JsonObj]] | None = None,
    ) -> None:
        """``on_slice``: told every change of the slices' cache, of any driver, before the views
        see it (the webhook's GPU sizes, ``dratemplates``: one watch of ResourceSlices for both);
        ``templates``: our ResourceClaimTemplates now (the webhook's cache: ``dratemplates``)."""
        self.generation = 0
        self._templates = templates
        self.on_change: Callable[[], None] | None = None
        self._on_slice = on_slice
        self._readings = Readings()
        # a cluster before Kubernetes 1.34, or a local one without DRA: normal, said at INFO; a
        # chart without the DRA rules: said at WARNING, and the scheduler still becomes ready
        self.slices = informer.Informer(
            api,
            "resourceslices",
            on_event=self._slice_changed,
            unserved_ok=True,
            unserved_log_level=logging.INFO,
            forbidden_ok=True,
        )
        self.claims = informer.Informer(
            api,
            "resourceclaims",
            on_event=self._claim_changed,
            transform=slim.claim_for_views,
            unserved_ok=True,
            unserved_log_level=logging.INFO,
            forbidden_ok=True,
        )

    @property
    def informers(self) -> list[informer.Informer]:
        return [self.slices, self.claims]

    def _slice_changed(self, change: informer.Change) -> None:
        if self._on_slice is not None:
            self._on_slice(change)
        if _ours(change.object) or (change.old is not None and _ours(change.old)):
            self._changed()

    def _claim_changed(self, change: informer.Change) -> None:
        self._changed()

    def _changed(self) -> None:
        self.generation += 1
        if self.on_change is not None:
            self.on_change()

    def waiting_inputs(self) -> DraCapture:
        """Call on the event loop: the claims and our templates only, by reference (what the
        pending DRA pods are read from; the slices are not walked)."""
        return DraCapture(
            self.generation,
            (),
            self.claims.items(),
            None,
            self._templates() if self._templates is not None else (),
        )

    def capture(self) -> DraCapture:
        """Call on the event loop: the objects of our driver, by reference."""
        return DraCapture(
            self.generation,
            [s for s in self.slices.items() if _ours(s)],
            self.claims.items(),
            self._readings,
            self._templates() if self._templates is not None else (),
        )
