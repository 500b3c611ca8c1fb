"""HAMi-core's host files for the demo, the fake backend and tests: through the chart's installer.

The device plugin refuses Allocate until ``<hook>/vgpu/libvgpu.so`` and ``ld.so.preload`` are
regular files on the host. On a cluster the chart's init container puts them there
(``deploy/helm/kube-vgpu/files/hami-core-installer.sh``, run from HAMi's image). Here the same
script runs against a stand-in of that image's layout (``bin/vgpu-init.sh`` and a versioned
``lib/nvidia/libvgpu.so.<v>`` that is a text file, not a library: emulated containers never load
it), into the node's stand-in host root; so the demo exercises the installer a node runs.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

from vgpu.core import allocation, errors

REPO = pathlib.Path(__file__).resolve().parents[3]
INSTALLER = REPO / "deploy" / "helm" / "kube-vgpu" / "files" / "hami-core-installer.sh"
STAND_IN_VERSION = "v0.0.0-stand-in"
_VGPU_INIT = '#!/bin/sh\n# stand-in for HAMi\'s vgpu-init.sh: copy the builds\nmkdir -p "$1"\ncp "$(dirname "$0")/../lib/nvidia/"* "$1"\n'


class InstallError(errors.VgpuError):
    """The installer is not there (an installed wheel, not a checkout) or failed."""


def stand_in_source(directory: pathlib.Path) -> pathlib.Path:
    """Lay out a stand-in of HAMi's image under ``directory`` (``HAMI_CORE_SOURCE``); return it."""
    lib = directory / "lib" / "nvidia"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / f"libvgpu.so.{STAND_IN_VERSION}").write_text("kube-vgpu stand-in for HAMi-core (not a library)\n")
    init = directory / "bin" / "vgpu-init.sh"
    init.parent.mkdir(parents=True, exist_ok=True)
    init.write_text(_VGPU_INIT)
    init.chmod(0o755)
    return directory


def install(
    host_root: pathlib.Path,
    *,
    hook_path: str,
    source: pathlib.Path,
    installer: pathlib.Path = INSTALLER,
    timeout_s: float = 30.0,
) -> pathlib.Path:
    """Run the chart's installer from ``source`` into ``<host_root><hook>/vgpu`` (ld.so.preload
    naming the path containers see); return that directory. Blocking (a subprocess)."""
    seen = allocation.hami_core_dir(hook_path)
    target = host_root / seen.lstrip("/")
    if not installer.is_file():
        raise InstallError(f"the HAMi-core installer {installer} is not there (run from a checkout)")
    done = subprocess.run(
        ["sh", str(installer), str(target), seen],
        env={**os.environ, "HAMI_CORE_SOURCE": str(source)},
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise InstallError(f"{installer} failed ({done.returncode}): {done.stderr.strip()}")
    return target


def install_stand_in(host_root: pathlib.Path, *, hook_path: str) -> pathlib.Path:
    """``install`` from a stand-in source laid out in ``host_root/.hami-image``."""
    source = stand_in_source(host_root / ".hami-image")
    return install(host_root, hook_path=hook_path, source=source)
