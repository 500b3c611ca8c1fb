"""Removes the per-container HAMi-core directories of pods that are gone, as HAMi's monitor does.

Allocate gives every GPU container ``<hook>/vgpu/containers/<podUID>_<container>`` on the host
(HAMi-core's shared region and cache live there); nothing removed them, so on batch nodes they
filled the host's root filesystem. Every ``interval_s`` the reaper lists that directory and judges
each entry by the cluster's pods, never by local files alone:

* an entry whose pod UID the pod cache (this node's pods) shows is kept, whatever its phase;
* an entry whose UID the cache does not show becomes a candidate, and is removed only when it is
  still missing ``grace_s`` later (a pod kubelet admitted before our watch showed it) *and* a LIST
  of this node's pods from the API server, made then, does not show it either (a stale cache never
  removes a live pod's directory);
* an entry that is not ``<uid>_<container>`` is left alone; a symlink is unlinked, never followed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vgpu.core import errors
from vgpu.kube.port import KubeApi

from vgpu_device_plugin.allocator import Offload
from vgpu_device_plugin.hostfs import HostFs
from vgpu_device_plugin.podcache import ClusterView

log = logging.getLogger(__name__)

INTERVAL_S = 30.0
GRACE_S = 60.0
_ENTRY = re.compile(r"([A-Za-z0-9][A-Za-z0-9.-]*)_([A-Za-z0-9][A-Za-z0-9.-]*)")


def pod_uid(entry: str) -> str | None:
    """The pod UID of a ``<podUID>_<container>`` entry, or None for anything else."""
    match = _ENTRY.fullmatch(entry)
    return match.group(1) if match else None


def _uids(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    return {str((p.get("metadata") or {}).get("uid", "")) for p in pods}


def candidates(
    entries: Iterable[str],
    *,
    live_uids: set[str],
    first_missing: dict[str, float],
    now_s: float,
    grace_s: float,
) -> list[str]:
    """Entries whose pod has been missing for ``grace_s``; updates ``first_missing`` (entry → when
    first seen missing) and forgets entries that are back or gone. Pure."""
    entries = list(entries)
    out = []
    for entry in entries:
        uid = pod_uid(entry)
        if uid is None or uid in live_uids:
            first_missing.pop(entry, None)
            continue
        since = first_missing.setdefault(entry, now_s)
        if now_s - since >= grace_s:
            out.append(entry)
    for gone in set(first_missing) - set(entries):
        del first_missing[gone]
    return out


class ContainerDirReaper:
    def __init__(
        self,
        *,
        host: HostFs,
        view: ClusterView,
        api: KubeApi,
        node: str,
        clock: Callable[[], float],
        interval_s: float = INTERVAL_S,
        grace_s: float = GRACE_S,
        offload: Offload = asyncio.to_thread,
    ) -> None:
        self._host = host
        self._view = view
        self._api = api
        self._node = node
        self._clock = clock
        self._interval_s = interval_s
        self._grace_s = grace_s
        self._offload = offload
        self._first_missing: dict[str, float] = {}
        self.removed = 0

    async def sweep(self) -> list[str]:
        """One pass; returns the entries removed."""
        entries = await self._offload(self._host.container_dir_names)
        due = candidates(
            entries,
            live_uids=_uids(self._view.pods()),
            first_missing=self._first_missing,
            now_s=self._clock(),
            grace_s=self._grace_s,
        )
        if not due:
            return []
        try:  # the API server's word, not only our cache's, before anything is removed
            listed = await self._api.list("pods", field_selector=f"spec.nodeName={self._node}")
        except errors.KubeError as exc:
            log.warning(
                "node %s: not removing container directories: listing pods failed: %s", self._node, exc
            )
            return []
        live = _uids(listed.items)
        removed = []
        for entry in due:
            if pod_uid(entry) in live:
                self._first_missing.pop(entry, None)
                continue
            try:
                await self._offload(functools.partial(self._host.remove_container_dir, entry))
            except (OSError, errors.VgpuError) as exc:
                log.warning("node %s: removing container directory %s failed: %s", self._node, entry, exc)
                continue
            self._first_missing.pop(entry, None)
            removed.append(entry)
        if removed:
            self.removed += len(removed)
            log.info(
                "node %s: removed %d container director%s of pods that are gone: %s",
                self._node,
                len(removed),
                "y" if len(removed) == 1 else "ies",
                ", ".join(removed),
            )
        return removed

    async def run(self) -> None:
        """Sweep every ``interval_s`` until cancelled."""
        while True:
            try:
                await self.sweep()
            except Exception:  # a bug here must not stop the sweeps; it is logged with its trace
                log.exception("node %s: sweeping container directories failed", self._node)
            await asyncio.sleep(self._interval_s)
