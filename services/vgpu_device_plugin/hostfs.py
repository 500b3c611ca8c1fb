"""The host files Allocate touches: per-container HAMi-core cache dirs, the lock dir, optional files.

Host paths are what kubelet hands to the container runtime (``<hook>/vgpu/...``, ``/dev/...``).
This process reaches them under ``root`` (``/`` when it runs on the host; the host mount of a
DaemonSet pod; a temp dir in tests), so nothing outside ``root`` is ever created.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shutil

from vgpu.core import allocation, errors, outside

log = logging.getLogger(__name__)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class HostFs:
    def __init__(self, root: pathlib.Path, *, hook_path: str) -> None:
        self.root = root
        self.hook_path = "/" + hook_path.strip("/") if hook_path.strip("/") else ""
        # the shared edits of the CDI spec the session wrote (``cdispecfile``); None: none written
        self.cdi: allocation.SharedEdits | None = None

    def _local(self, host_path: str) -> pathlib.Path:
        return self.root / host_path.lstrip("/")

    def container_dir(self, pod_uid: str, container: str) -> str:
        """(Re)create the container's cache dir (mode 0777); return its host path."""
        for what, value in (("pod UID", pod_uid), ("container name", container)):
            if not _SAFE_NAME.match(value) or ".." in value:
                raise errors.AllocationError(f"unsafe {what} {value!r} for a host directory name")
        host_path = f"{self.hook_path}/vgpu/containers/{pod_uid}_{container}"
        local = self._local(host_path)
        try:
            if local.exists():
                shutil.rmtree(local)
            local.mkdir(parents=True)
            os.chmod(local, 0o777)  # HAMi-core in the container runs as any user
            lock_dir = self._local(allocation.VGPU_LOCK_DIR)
            lock_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(lock_dir, 0o777)
        except OSError as exc:
            raise errors.AllocationError(f"cannot prepare host directory {host_path}: {exc}") from None
        return host_path

    def pod_uid_of_process(self, pid: int) -> str | None:
        """The pod whose cgroup holds host process ``pid`` (``<root>/proc/<pid>/cgroup``; the plugin
        runs with the host's PID namespace), or None: not in a pod, gone, or unreadable."""
        try:
            text = self._local(f"/proc/{int(pid)}/cgroup").read_text(errors="replace")
        except (OSError, ValueError):
            return None
        return outside.pod_uid_from_cgroup(text)

    def facts(self) -> allocation.HostFacts:
        license_present = self._local(f"{self.hook_path}/vgpu/license").exists()
        present = tuple(p for p in allocation.CONTROL_DEVICE_NODES if self._local(p).exists())
        return allocation.HostFacts(license_present=license_present, control_devices=present, cdi=self.cdi)
