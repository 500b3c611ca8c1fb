"""The container runtime under the emulated kubelet: what starting a container does to the host.

A real runtime binds each mount of the device plugin's Allocate answer from the host into the
container. containerd's CRI plugin creates a missing bind-mount source as a directory (and the
container starts, with a directory where a file was meant): a plugin that answers with
``<hook>/vgpu/libvgpu.so`` before HAMi-core is installed leaves empty directories on the host and an
unenforced container. With a host root (the node's stand-in ``/``), the emulation does the same, so
the fast tests see what a real node does. Only the answer's own mounts (CRI mounts) are prepared:
the mounts a CDI spec adds (``cdiruntime``) go into the OCI spec as they are, and a runtime creates
no missing source for them, which is why the plugin's own spec never names a missing file
(``cdispecfile``).
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)


def _under(host_root: pathlib.Path, host_path: str) -> pathlib.Path | None:
    parts = [p for p in host_path.split("/") if p not in ("", ".")]
    if not host_path.startswith("/") or ".." in parts:
        return None
    return host_root.joinpath(*parts)


def start_container(host_root: pathlib.Path, mounts: Iterable[Mapping[str, Any]]) -> list[str]:
    """Prepare the bind mounts of one container as containerd does: each missing source becomes a
    directory (parents included). Returns the host paths it created. Blocking: call off the loop."""
    created = []
    for mount in mounts:
        host_path = str(mount.get("hostPath", ""))
        local = _under(host_root, host_path)
        if local is None:
            log.warning(
                "runtime: mount source %r is not an absolute path inside the host; skipped", host_path
            )
            continue
        if local.exists() or local.is_symlink():
            continue
        local.mkdir(parents=True, exist_ok=True)
        created.append(host_path)
        log.warning(
            "runtime: mount source %s did not exist; created it as a directory (as containerd does)",
            host_path,
        )
    return created
