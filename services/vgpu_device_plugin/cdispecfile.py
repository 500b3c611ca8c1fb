"""Writes kube-vgpu's own CDI spec (``vgpu.core.cdispec``) for the CDI strategies.

At each session's start with ``deviceListStrategy`` ``cdi-annotations`` or ``cdi-cri``,
``publish`` writes ``<host root><cdiSpecDir>/kube-vgpu.io-hami-core.json`` (default
``/var/run/cdi``): HAMi-core's mounts whose host sources are usable, by the rules Allocate applies
(``HostFs``): ``libvgpu.so`` and ``ld.so.preload`` only as regular files (lstat: no symlink, not the
directory a runtime makes of a missing file), the lock directory ``<hook>/vgpu/vgpulock`` only when
``HostFs.lock_dir`` made or accepted it (root-owned, no symlink), and the env the config sets. A mount
whose source is not usable is left out and logged as an error: the spec never names a missing file.
Its mount stays in the Allocate answer, as with the other strategies, and Allocate itself is refused
while HAMi-core's files are missing (``hamicore``), so no container starts on such a spec; once the
files are installed the answers carry the left-out mounts until the next session rewrites the spec. The
file is written atomically: a dot-named temp file in the same directory (no ``.json`` ending, so a
runtime watching the directory never loads it half-written), fsync, then rename over the old one;
an identical file is left alone. The spec is validated before it is written. What ``publish``
returns (the edits written, or None when nothing could be written) goes into ``HostFs.cdi`` for the
answers: with None they carry every edit and name no spec of ours, as with the other strategies.
Blocking file work: call it off the event loop.
"""

import logging
import os
import pathlib
import tempfile

from vgpu.core import allocation, cdispec, errors
from vgpu.core.config import DevicePluginConfig

from vgpu_device_plugin.hostfs import HostFs

log = logging.getLogger(__name__)


def _present(host: HostFs, config: DevicePluginConfig) -> set[str]:
    """The host paths of the shared mounts that may be mounted: HAMi-core's files when regular
    files, the lock directory when ``HostFs.lock_dir`` made or accepted it."""
    present = {p for p in allocation.hami_core_files(config.hook_path) if host.is_regular(p)}
    try:
        present.add(host.lock_dir())
    except errors.AllocationError as exc:
        log.error("cannot prepare HAMi-core's lock directory: %s", exc)
    return present


def write_atomically(path: pathlib.Path, text: str) -> bool:
    """Write ``text`` to ``path`` through a temp file and a rename; False when ``path`` already
    holds exactly ``text``. OSError when the directory cannot be made or written."""
    try:
        if path.is_file() and path.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass  # unreadable or not text: replaced below
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return True


def publish(host: HostFs, *, config: DevicePluginConfig, node: str) -> allocation.SharedEdits | None:
    """Write the spec under ``host.root`` where a CDI strategy is configured; the edits it carries,
    or None (see the module docstring; every failure is logged, never raised)."""
    if config.device_list_strategy not in cdispec.STRATEGIES:
        return None
    root = host.root
    edits, missing = cdispec.select(config, present=_present(host, config))
    for mount in missing:
        log.error(
            "node %s: HAMi-core's %s is missing on the host or not usable (%s): left out of the CDI spec %s",
            node,
            mount.host_path,
            mount.container_path,
            cdispec.QUALIFIED_NAME,
        )
    if edits is None:
        log.error(
            "node %s: no CDI spec of kind %s written: nothing of HAMi-core to carry", node, cdispec.KIND
        )
        return None
    doc = cdispec.document(edits)
    problems = cdispec.validate(doc)
    if problems:
        log.error(
            "node %s: the CDI spec %s is invalid, not written: %s", node, cdispec.KIND, "; ".join(problems)
        )
        return None
    path = root / config.cdi_spec_dir.lstrip("/") / cdispec.FILE_NAME
    try:
        written = write_atomically(path, cdispec.encode(doc))
    except OSError as exc:
        log.error(
            "node %s: cannot write the CDI spec %s (%s): HAMi-core's mounts stay in the Allocate answers",
            node,
            path,
            exc,
        )
        return None
    log.info(
        "node %s: CDI spec %s %s (%s)",
        node,
        path,
        "written" if written else "unchanged",
        cdispec.QUALIFIED_NAME,
    )
    return edits
