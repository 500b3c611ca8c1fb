"""The host files Allocate touches: per-container HAMi-core cache dirs, the lock dir, optional files.

Host paths are what kubelet hands to the container runtime (``<hook>/vgpu/...``, ``/dev/...``).
This process reaches them under ``root`` (``/`` when it runs on the host; the host mount of a
DaemonSet pod; a temp dir in tests), so nothing outside ``root`` is ever created.

Every source a response mounts must exist with the right type before kubelet gets the answer: a
container runtime creates a missing bind-mount source as a directory, so a missing
``libvgpu.so`` would silently become a directory and HAMi-core never load. ``hami_core_problem``
checks HAMi-core's files with ``lstat``: regular files, not symlinks (HAMi's installer copies
plain files; a symlink would let whoever can write its target choose what every GPU container
preloads). The lock dir (``<hook>/vgpu/vgpulock``, mounted at ``/tmp/vgpulock``) is opened with
``O_NOFOLLOW`` and used only when it and ``<hook>/vgpu`` are real directories owned by root
(``trusted_uids``: root and this process's own user).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import re
import shutil
import stat

from vgpu.core import allocation, errors, outside

log = logging.getLogger(__name__)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class HamiCoreMissing(errors.AllocationError):
    """HAMi-core's files are not on the host as regular files; the message names the path and the remedy."""


REMEDY = (
    "install HAMi-core on the node: the chart's hami-core-installer init container "
    "(devicePlugin.hamiCoreInstaller.enabled; restart the device plugin pod to rerun it), "
    "or deploy/helm/kube-vgpu/files/hami-core-installer.sh run by hand"
)


def _is_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)


class HostFs:
    def __init__(
        self, root: pathlib.Path, *, hook_path: str, trusted_uids: frozenset[int] | None = None
    ) -> None:
        """``trusted_uids``: who may own the lock dir and its parent (default: root and this process's
        user, which is root in the chart's DaemonSet)."""
        self.root = root
        self.hook_path = "/" + hook_path.strip("/") if hook_path.strip("/") else ""
        self.trusted_uids = trusted_uids if trusted_uids is not None else frozenset({0, os.geteuid()})
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
        except OSError as exc:
            raise errors.AllocationError(f"cannot prepare host directory {host_path}: {exc}") from None
        self.lock_dir()
        return host_path

    def hami_core_problem(self) -> str | None:
        """Why HAMi-core's files cannot be mounted (naming the path and the remedy), or None."""
        for host_path in allocation.hami_core_files(self.hook_path):
            try:
                st = os.lstat(self._local(host_path))
            except FileNotFoundError:
                return f"HAMi-core file {host_path} is missing on the host; {REMEDY}"
            except OSError as exc:
                return f"HAMi-core file {host_path} cannot be read: {exc}; {REMEDY}"
            if stat.S_ISLNK(st.st_mode):
                return f"HAMi-core file {host_path} is a symlink, not a regular file; {REMEDY}"
            if not _is_regular(st):
                kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
                return (
                    f"HAMi-core file {host_path} is {kind} (a runtime made it of a missing file?); {REMEDY}"
                )
        return None

    def check_hami_core(self) -> None:
        """Raise HamiCoreMissing when ``hami_core_problem`` finds one."""
        problem = self.hami_core_problem()
        if problem is not None:
            raise HamiCoreMissing(problem)

    def _trusted_dir(self, st: os.stat_result, host_path: str) -> None:
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise errors.AllocationError(
                f"{host_path} is not a directory (a symlink or a file?); refusing it"
            )
        if st.st_uid not in self.trusted_uids:
            raise errors.AllocationError(
                f"{host_path} is owned by uid {st.st_uid}, not root; refusing to share it with containers"
            )

    def lock_dir(self) -> str:
        """Create (mode 0777, as HAMi does) or check the lock dir; return its host path. Refuses a
        symlink, a non-directory, or one (or a parent ``<hook>/vgpu``) not owned by root."""
        parent = allocation.hami_core_dir(self.hook_path)
        host_path = allocation.vgpu_lock_host_dir(self.hook_path)
        try:
            self._trusted_dir(os.lstat(self._local(parent)), parent)
            local = self._local(host_path)
            with contextlib.suppress(FileExistsError):
                os.mkdir(local, 0o700)  # never follows a symlink; opened without following below
            fd = os.open(local, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            raise errors.AllocationError(f"cannot prepare the lock directory {host_path}: {exc}") from None
        try:
            self._trusted_dir(os.fstat(fd), host_path)
            if stat.S_IMODE(os.fstat(fd).st_mode) != 0o777:
                os.fchmod(fd, 0o777)  # HAMi-core in the container runs as any user
        except OSError as exc:
            raise errors.AllocationError(f"cannot prepare the lock directory {host_path}: {exc}") from None
        finally:
            os.close(fd)
        return host_path

    def _containers_local(self) -> pathlib.Path:
        return self._local(f"{allocation.hami_core_dir(self.hook_path)}/containers")

    def container_dir_names(self) -> list[str]:
        """The entries of ``<hook>/vgpu/containers`` (``<podUID>_<container>``), or [] when absent."""
        try:
            return sorted(entry.name for entry in os.scandir(self._containers_local()))
        except OSError:
            return []

    def remove_container_dir(self, name: str) -> None:
        """Remove one entry of ``<hook>/vgpu/containers``: a directory with its files, anything else
        (a planted symlink) by unlinking it; never followed out of the directory."""
        if not _SAFE_NAME.match(name) or ".." in name or "/" in name:
            raise errors.AllocationError(f"unsafe container directory name {name!r}")
        local = self._containers_local() / name
        st = os.lstat(local)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(local)
        else:
            local.unlink()

    def pod_uid_of_process(self, pid: int) -> str | None:
        """The pod whose cgroup holds host process ``pid`` (``<root>/proc/<pid>/cgroup``; the plugin
        runs with the host's PID namespace), or None: not in a pod, gone, or unreadable."""
        try:
            text = self._local(f"/proc/{int(pid)}/cgroup").read_text(errors="replace")
        except (OSError, ValueError):
            return None
        return outside.pod_uid_from_cgroup(text)

    def is_regular(self, host_path: str) -> bool:
        """Whether ``host_path`` is a regular file (lstat: a symlink is not)."""
        try:
            return _is_regular(os.lstat(self._local(host_path)))
        except OSError:
            return False

    def facts(self) -> allocation.HostFacts:
        # both mounted when there is a license: a missing one would become a directory
        license_present = self.is_regular(f"{self.hook_path}/vgpu/license") and self.is_regular(
            f"{self.hook_path}/vgpu/vgpuvalidator"
        )
        present = tuple(p for p in allocation.CONTROL_DEVICE_NODES if self._local(p).exists())
        return allocation.HostFacts(license_present=license_present, control_devices=present, cdi=self.cdi)
