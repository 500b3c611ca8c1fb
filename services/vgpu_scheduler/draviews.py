"""The DRA mode's GPUs for the views (``/ui``, ``/metrics``): watch-fed caches of our driver's
ResourceSlices and of ResourceClaims, kept apart from ``ClusterState``.

kube-scheduler allocates DRA claims itself; nothing of it passes through ``/filter`` or the
webhook's decisions, so nothing of it is in the state those read. The two informers here only
keep the objects (claims slimmed to identity, owners, allocation results and ``reservedFor``:
``slim.claim_for_views``) and bump ``generation``; the usage is built from a ``capture`` only when
a view asks, in a worker thread (``DraCapture.usage``). Both kinds are ``unserved_ok`` (an API
server before Kubernetes 1.34 serves no ``resource.k8s.io/v1``) and neither holds the scheduler's
readiness: the views come without DRA nodes until they are listed.
"""

import dataclasses
from collections.abc import Callable, Sequence

from vgpu.core.dra import names, usage
from vgpu.kube import informer, slim
from vgpu.kube.port import JsonObj, KubeApi


@dataclasses.dataclass(frozen=True)
class DraCapture:
    """The cached objects at one moment (references: the informers replace objects, never change
    them) and the generation they show."""

    generation: int
    slices: Sequence[JsonObj] = ()
    claims: Sequence[JsonObj] = ()

    def usage(self) -> usage.DraUsage:
        """The DRA usage of this capture; pure, safe in a worker thread."""
        return usage.build(self.slices, self.claims)


def _ours(obj: JsonObj) -> bool:
    spec = obj.get("spec")
    return isinstance(spec, dict) and spec.get("driver") == names.DRIVER


class DraViews:
    """The two caches; ``on_change`` (the dashboard's poke) is called after each change."""

    def __init__(self, api: KubeApi) -> None:
        self.generation = 0
        self.on_change: Callable[[], None] | None = None
        self.slices = informer.Informer(api, "resourceslices", on_event=self._slice_changed, unserved_ok=True)
        self.claims = informer.Informer(
            api,
            "resourceclaims",
            on_event=self._claim_changed,
            transform=slim.claim_for_views,
            unserved_ok=True,
        )

    @property
    def informers(self) -> list[informer.Informer]:
        return [self.slices, self.claims]

    def _slice_changed(self, change: informer.Change) -> None:
        if _ours(change.object) or (change.old is not None and _ours(change.old)):
            self._changed()

    def _claim_changed(self, change: informer.Change) -> None:
        self._changed()

    def _changed(self) -> None:
        self.generation += 1
        if self.on_change is not None:
            self.on_change()

    def capture(self) -> DraCapture:
        """Call on the event loop: the objects of our driver, by reference."""
        return DraCapture(
            self.generation,
            [s for s in self.slices.items() if _ours(s)],
            self.claims.items(),
        )
