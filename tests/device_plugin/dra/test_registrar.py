"""The registration socket in kubelet's plugins_registry: kubelet's handshake, and the socket made
again when it is deleted (kubelet deregisters the plugin then) or was not a socket, seen by inotify
or by polling."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import stat
from collections.abc import AsyncIterator

import pytest
from vgpu.core.dra import names
from vgpu_device_plugin import dirwatch
from vgpu_device_plugin.dra import registrar

from tests.device_plugin.builders import short_tmp
from tests.device_plugin.dra.fakedrakubelet import FakeDraKubelet


@pytest.fixture
def registry() -> AsyncIterator[pathlib.Path]:
    root = short_tmp()
    yield root / "plugins_registry"
    shutil.rmtree(root, ignore_errors=True)


def _registrar(
    registry: pathlib.Path, watcher: dirwatch.DirWatcher, *, poll_s: float = 0.05
) -> registrar.Registrar:
    service = registrar.RegistrationService(driver=names.DRIVER, endpoint=pathlib.Path("/p/dra.sock"))
    return registrar.Registrar(
        service, registry / names.REGISTRATION_SOCKET, watcher=watcher, node="n1", poll_s=poll_s
    )


def _leftover_file(registry: pathlib.Path) -> None:
    registry.mkdir(parents=True)
    (registry / names.REGISTRATION_SOCKET).write_text("left over")


def _is_socket(path: pathlib.Path) -> bool:
    return path.exists() and stat.S_ISSOCK(os.lstat(path).st_mode)


@pytest.mark.parametrize(
    ("watcher", "poll_s"),
    [(dirwatch.InotifyWatcher(), 3600.0), (dirwatch.NoWatcher(), 0.05)],
    ids=["inotify", "polling"],
)
async def test_a_deleted_socket_is_made_again_and_kubelet_registers_anew(
    registry: pathlib.Path, watcher: dirwatch.DirWatcher, poll_s: float
) -> None:
    reg = _registrar(registry, watcher, poll_s=poll_s)  # with inotify: never woken by polling
    task = asyncio.create_task(reg.run())
    kubelet = FakeDraKubelet()
    try:
        await asyncio.wait_for(reg.wait_served(1), 5)
        assert await kubelet.register(reg.socket_path) == "v1.DRAPlugin"
        reg.socket_path.unlink()  # what kubelet sees as the plugin going away
        await asyncio.wait_for(reg.wait_served(2), 5)
        assert _is_socket(reg.socket_path)
        assert await kubelet.register(reg.socket_path) == "v1.DRAPlugin"
        assert [s.plugin_registered for s in reg.service.statuses] == [True, True]
    finally:
        await kubelet.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not reg.socket_path.exists()  # removed on stop


async def test_a_file_that_is_not_a_socket_is_replaced(registry: pathlib.Path) -> None:
    _leftover_file(registry)
    reg = _registrar(registry, dirwatch.NoWatcher())
    task = asyncio.create_task(reg.run())
    try:
        await asyncio.wait_for(reg.wait_served(1), 5)
        assert _is_socket(reg.socket_path)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_get_info_answers_the_driver_and_versions_kubelet_136_expects(registry: pathlib.Path) -> None:
    reg = _registrar(registry, dirwatch.NoWatcher())
    info = await reg.service.GetInfo(registrar.api_pb2.InfoRequest(), None)
    assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
        "DRAPlugin",
        "gpu.kube-vgpu.io",
        "/p/dra.sock",
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    )


async def test_a_refusal_is_logged_with_kubelets_error(
    registry: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    reg = _registrar(registry, dirwatch.NoWatcher())
    status = registrar.api_pb2.RegistrationStatus(
        plugin_registered=False, error="endpoint already registered"
    )
    await reg.service.NotifyRegistrationStatus(status, None)
    assert not reg.service.registered
    assert (
        "kubelet refused DRA driver gpu.kube-vgpu.io (endpoint /p/dra.sock): endpoint already registered"
        in caplog.text
    )
    empty = registrar.api_pb2.RegistrationStatus(plugin_registered=False)
    await reg.service.NotifyRegistrationStatus(empty, None)
    assert "no reason given" in caplog.text
