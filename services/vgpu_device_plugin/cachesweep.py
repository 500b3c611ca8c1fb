"""Removes HAMi-core's per-container directories whose pod has left the node (``vgpu.core.cachedirs``
decides), from the plugin's lease loop: the live pods come from the watch-fed view (no API call),
read on the event loop; the file work runs in a thread."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterable

from vgpu.core import cachedirs
from vgpu.kube.port import JsonObj

from vgpu_device_plugin.hostfs import HostFs

log = logging.getLogger(__name__)


def live_uids(pods: Iterable[JsonObj]) -> set[str]:
    """The UIDs of the pods the view holds (call on the event loop that feeds it)."""
    return {str(p.get("metadata", {}).get("uid", "")) for p in pods}


def sweep(
    host: HostFs, *, live_pod_uids: Collection[str], grace_s: float, clock: Callable[[], float] = time.time
) -> list[str]:
    """Remove the stale directories; return their names. Errors are logged, never raised (the
    next sweep tries again)."""
    containers = host.root / host.hook_path.lstrip("/") / "vgpu" / "containers"
    now = clock()
    entries = []
    try:
        with os.scandir(containers) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    entries.append(
                        cachedirs.CacheDir(entry.name, now - entry.stat(follow_symlinks=False).st_mtime)
                    )
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.error("cannot list %s: %s", containers, exc)
        return []
    removed = []
    for name in cachedirs.stale(entries, live_pod_uids=live_pod_uids, grace_s=grace_s):
        try:
            shutil.rmtree(containers / name)
        except OSError as exc:
            log.error("cannot remove HAMi-core's directory %s of a departed pod: %s", containers / name, exc)
            continue
        removed.append(name)
    if removed:
        log.info("removed %d HAMi-core container directories of departed pods", len(removed))
    return removed
