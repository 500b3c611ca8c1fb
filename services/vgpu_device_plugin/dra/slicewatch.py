"""Watches the node's own ResourceSlice and tells the publisher (``slicepub.run``) when someone
else deleted or changed it.

kubelet deletes every ResourceSlice of its node when it starts (``DRAPluginManager``'s startup
wipe, retried until it succeeds) and the slices of a driver 30 s after its last plugin
deregistered without coming back; an operator may delete or edit the slice too. Without a watch
the node's GPUs would be missing from kube-scheduler until the next resync. The watch is an
:class:`vgpu.kube.informer.Informer` on ``resourceslices`` with the field selector
``spec.driver=<our driver>,spec.nodeName=<node>`` (kube-apiserver 1.36 serves ``metadata.name``,
``spec.nodeName`` and ``spec.driver`` for resourceslices; ``spec.nodeName`` is the one its watch
cache indexes, so an event reaches only the watchers of its node, as the selector kubelet and the
upstream ResourceSlice controller use); changes of other slices it may see (ours under another
name, an older plugin's) are ignored. It lists, watches from the list's resourceVersion, resumes
after a lost watch with back-off, and re-lists on 410 Gone (a slice deleted meanwhile then comes
out as a DELETED).

A change of our slice sets :attr:`SliceWatch.changed` when it is a DELETED, or a version that is not what the
publisher last published (``Published.published``: not our own write's echo, not a change of
labels or annotations only), or a list that lacks the slice once the publisher has published
it. The publisher clears the flag before each sync, so changes during a sync cause one more.
Everything runs on the event loop through the ``KubeApi`` port; nothing here blocks it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from vgpu.core.dra import names
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi

log = logging.getLogger(__name__)


def field_selector(node: str) -> str:
    """The watch's selector: our driver's slices of ``node``."""
    return f"spec.driver={names.DRIVER},spec.nodeName={node}"


class Published(Protocol):
    """What the watch asks the publisher (``slicepub.SlicePublisher`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def has_published(self) -> bool: ...

    def published(self, obj: Mapping[str, Any]) -> bool: ...


class SliceWatch:
    """Sets :attr:`changed` when the slice ``publisher.name`` needs writing again (see the module
    docstring). :meth:`run` until cancelled."""

    def __init__(
        self,
        api: KubeApi,
        *,
        publisher: Published,
        node: str,
        watch_timeout_s: float = 300.0,
        backoff_max_s: float = 10.0,
    ) -> None:
        self._publisher = publisher
        self._node = node
        self.changed = asyncio.Event()
        self.kicks = 0  # how many changes asked for a write (tests, metrics)
        self.informer = informer.Informer(
            api,
            "resourceslices",
            field_selector=field_selector(node),
            on_event=self._on_change,
            on_listed=self._on_listed,
            watch_timeout_s=watch_timeout_s,
            backoff_max_s=backoff_max_s,
        )

    async def run(self) -> None:
        await self.informer.run()

    def _ours(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata")
        return isinstance(meta, Mapping) and meta.get("name") == self._publisher.name

    def _on_change(self, change: informer.Change) -> None:
        if not self._ours(change.object):
            return
        if change.type == "DELETED":
            self._kick("was deleted (kubelet deletes its node's slices when it starts)")
        elif not self._publisher.published(change.object):
            self._kick("was changed by someone else")

    def _on_listed(self, items: list[JsonObj]) -> None:
        if self._publisher.has_published and not any(self._ours(o) for o in items):
            self._kick("is gone (a list after a lost watch found none)")

    def _kick(self, what: str) -> None:
        self.kicks += 1
        log.info("node %s: ResourceSlice %s %s: writing it again", self._node, self._publisher.name, what)
        self.changed.set()
