"""The tests marked ``realk8s`` run against a real etcd, kube-apiserver and kube-scheduler from the
directory ``VGPU_K8S_BIN`` names (``scripts/build-kubernetes.sh`` builds them from Debian's source
package); without it they are skipped, as the ``gpu`` tests are without a GPU."""

from __future__ import annotations

import datetime
import pathlib
from collections.abc import AsyncIterator

import pytest
from vgpu.kube import aioapi, client, kubeconfig

from bench import realk8s
from tests.realk8s import binaries


@pytest.fixture
def k8s_bin(request: pytest.FixtureRequest) -> pathlib.Path:
    """The binaries; a test marked ``dra`` is skipped where they are older than 1.34."""
    path = binaries.k8s_bin("kube-apiserver", "kube-scheduler", "etcd")
    if request.node.get_closest_marker("dra") is not None:
        binaries.needs_dra(path)
    return path


@pytest.fixture
async def plane(k8s_bin: pathlib.Path, tmp_path: pathlib.Path) -> AsyncIterator[realk8s.ControlPlane]:
    """etcd and kube-apiserver only: nothing else writes (ResourceSlices, DeviceClasses...)."""
    async with realk8s.control_plane(k8s_bin, tmp_path, now=datetime.datetime.now(datetime.UTC)) as started:
        yield started


@pytest.fixture
async def api(plane: realk8s.ControlPlane) -> AsyncIterator[aioapi.AioKubeApi]:
    """The scheduler's adapter on ``plane`` (modules with a whole stack define their own ``api``)."""
    async with aioapi.AioKubeApi(plane.url, token=plane.token, ca_file=str(plane.ca_file)) as adapter:
        yield adapter


@pytest.fixture
async def official(
    plane: realk8s.ControlPlane, tmp_path: pathlib.Path
) -> AsyncIterator[client.OfficialKubeApi]:
    """The device plugin's own adapter on ``plane`` (the official client, on worker threads)."""
    path = kubeconfig.write_kubeconfig(
        tmp_path / "plugin.kubeconfig", server=plane.url, token=plane.token, ca_pem=plane.ca_file.read_bytes()
    )
    adapter = client.OfficialKubeApi.from_kubeconfig(str(path))
    try:
        yield adapter
    finally:
        await adapter.close()
