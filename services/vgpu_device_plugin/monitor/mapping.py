"""Which pod and container each shared region belongs to.

Allocate gives every GPU container the host directory ``<hook>/vgpu/containers/<podUID>_<container>``
(``HostFs.container_dir``; HAMi's vGPU monitor reads the same names), and HAMi-core writes its
region file ``<id>.cache`` there. A directory counts only when its pod UID is one of the pods on
this node now (the device plugin's pod cache) and that pod has a container of that name: a
directory left by a pod that is gone, or made up by anyone, gives no series at all. Pod UIDs have
no ``_`` and container names (DNS labels) neither, so the first ``_`` splits the name.

``pods_on_node`` runs on the event loop (it reads cached pod objects); ``scan`` does the file
system work and runs in a worker thread.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,63}")  # what HostFs accepts, less "_"
_CONTAINER = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
CACHE_SUFFIX = ".cache"


@dataclass(frozen=True)
class PodRef:
    uid: str
    namespace: str
    name: str
    containers: frozenset[str]  # init and app containers


@dataclass(frozen=True)
class ContainerRegion:
    """A region file and whose it is."""

    pod: PodRef
    container: str
    path: pathlib.Path


@dataclass(frozen=True)
class Scan:
    regions: tuple[ContainerRegion, ...]
    not_ours: int  # directories of no pod on this node (gone pods, made-up names)
    empty: int  # directories of our pods with no region file yet (CUDA not used yet)


def pods_on_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, PodRef]:
    """Pod UID -> PodRef for the cached pods (objects of any shape: garbage is left out)."""
    out: dict[str, PodRef] = {}
    for pod in pods:
        meta = pod.get("metadata")
        spec = pod.get("spec")
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
            continue
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if not (isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str) and uid):
            continue
        names = set()
        for key in ("initContainers", "containers"):
            listed = spec.get(key)
            for c in listed if isinstance(listed, list) else ():
                if isinstance(c, Mapping) and isinstance(c.get("name"), str):
                    names.add(c["name"])
        out[uid] = PodRef(uid, namespace, name, frozenset(names))
    return out


def split_dir_name(name: str) -> tuple[str, str] | None:
    """``<podUID>_<container>`` -> (uid, container); None for any other name."""
    uid, sep, container = name.partition("_")
    if not sep or not _UID.fullmatch(uid) or not _CONTAINER.fullmatch(container):
        return None
    return uid, container


def _newest_cache(directory: str) -> pathlib.Path | None:
    newest: tuple[int, str] | None = None
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if not entry.name.endswith(CACHE_SUFFIX) or not entry.is_file(follow_symlinks=False):
                    continue  # symlinks, FIFOs and directories are not regions
                mtime = entry.stat(follow_symlinks=False).st_mtime_ns
                if newest is None or (mtime, entry.path) > newest:
                    newest = (mtime, entry.path)
    except OSError:
        return None
    return None if newest is None else pathlib.Path(newest[1])


def scan(containers_dir: pathlib.Path, pods: Mapping[str, PodRef]) -> Scan:
    """The region of every container of ``pods`` that has one under ``containers_dir``."""
    regions = []
    not_ours = empty = 0
    try:
        with os.scandir(containers_dir) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError:
        return Scan((), 0, 0)  # no GPU container has run here yet (or the host path is not mounted)
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        parts = split_dir_name(entry.name)
        pod = pods.get(parts[0]) if parts else None
        if parts is None or pod is None or parts[1] not in pod.containers:
            not_ours += 1
            continue
        path = _newest_cache(entry.path)
        if path is None:
            empty += 1
            continue
        regions.append(ContainerRegion(pod, parts[1], path))
    return Scan(tuple(regions), not_ours, empty)
