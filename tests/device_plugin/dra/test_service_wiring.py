"""``--mode dra`` in the device plugin's composition root: the slice publisher started with the
inventory, the kubelet DRA plugin registered and preparing claims, no device-plugin registration
and no extender node annotation, and SIGTERM stopping it all with its sockets removed."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import signal
from typing import Any

import pytest
import yaml
from vgpu.core.config import DevicePluginConfig
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster.client import LocalKubeApi
from vgpu_device_plugin import config, dirwatch, inventory, main
from vgpu_device_plugin.health import HealthMonitor

from tests.device_plugin.builders import NODE, cluster, installed_host, short_tmp
from tests.device_plugin.dra import claims as c
from tests.device_plugin.dra.fakedrakubelet import FakeDraKubelet

UID = "0123abcd-0000-0000-0000-000000000001"


class ClaimsApi(LocalKubeApi):
    """The local API server's door, with the claims of a ``FakeClaims``."""

    def __init__(self, store: Any, claims: c.FakeClaims) -> None:
        super().__init__(store)
        self.fake_claims = claims

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObj:
        return await self.fake_claims.get_resource_claim(namespace, name)


class Publisher:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.started = asyncio.Event()

    async def __call__(
        self,
        api: KubeApi,
        *,
        node: str,
        inv: inventory.Inventory,
        config: DevicePluginConfig,
        monitor: HealthMonitor,
    ) -> None:
        self.calls.append({"node": node, "gpus": [g.uuid for g in inv.gpus], "monitor": monitor})
        self.started.set()
        await asyncio.Event().wait()


def test_mode_flags_resolve_and_default_to_extender() -> None:
    s = config.resolve(["--node-name", "n"], {})
    assert (s.mode, s.registry_dir, s.dra_plugin_dir) == (
        "extender",
        pathlib.Path("/var/lib/kubelet/plugins_registry"),
        pathlib.Path("/var/lib/kubelet/plugins/gpu.kube-vgpu.io"),
    )
    s = config.resolve(
        ["--node-name", "n", "--mode", "dra", "--plugins-registry", "/r", "--dra-plugin-path", "/p"], {}
    )
    assert (s.mode, s.registry_dir, s.dra_plugin_dir) == ("dra", pathlib.Path("/r"), pathlib.Path("/p"))


def test_an_unknown_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        config.resolve(["--node-name", "n", "--mode", "both"], {})
    assert exited.value.code == 2
    assert "invalid choice: 'both'" in capsys.readouterr().err


async def test_dra_mode_publishes_registers_prepares_and_stops_on_sigterm() -> None:
    root = short_tmp()
    installed_host(root)
    gpus = root / "gpus.yaml"
    gpus.write_text(
        yaml.safe_dump({"gpus": [{"uuid": "GPU-main-1", "name": "NVIDIA L4", "memoryMib": 23034}]})
    )
    settings = config.resolve(
        [
            "--node-name",
            NODE,
            "--mode",
            "dra",
            "--backend",
            "fake",
            "--fake-gpus",
            str(gpus),
            "--host-root",
            str(root),
            "--device-plugin-path",
            str(root / "device-plugins"),
            "--plugins-registry",
            str(root / "registry"),
            "--dra-plugin-path",
            str(root / "plugin"),
        ],
        {},
    )
    store, _ = cluster()
    claims = c.FakeClaims(c.claim("one", UID, c.result(pool=NODE)))
    publisher = Publisher()
    kubelet = FakeDraKubelet()
    reg_socket = root / "registry" / "gpu.kube-vgpu.io-reg.sock"
    task = asyncio.create_task(
        main.run_dra(
            settings,
            api=ClaimsApi(store, claims),
            backend=main.build_backend(settings),
            publish=publisher,
            watcher=dirwatch.NoWatcher(),
        )
    )
    try:
        await asyncio.wait_for(publisher.started.wait(), 5)
        assert publisher.calls[0]["node"] == NODE and publisher.calls[0]["gpus"] == ["GPU-main-1"]
        assert await kubelet.register(reg_socket, wait_s=5.0) == "v1.DRAPlugin"
        answer = await kubelet.prepare((UID, "ns", "one"))
        assert answer.claims[UID].error == ""
        assert (root / "var/run/cdi" / f"kube-vgpu.io-claim_{UID}.json").is_file()
        assert (root / "plugin" / "checkpoint.json").is_file()
        # the extender mode's traces are absent: no device-plugin socket, no node annotation
        assert not (root / "device-plugins").exists()
        assert store.get("nodes", NODE)["metadata"].get("annotations") is None
        os.kill(os.getpid(), signal.SIGHUP)  # logged, not the end of the plugin
        assert (await kubelet.prepare((UID, "ns", "one"))).claims[UID].error == ""
        assert not task.done()
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(task, 10) == 0
        assert not reg_socket.exists() and not (root / "plugin" / "dra.sock").exists()
    finally:
        await kubelet.close()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        shutil.rmtree(root, ignore_errors=True)


async def test_a_plugin_dir_that_cannot_hold_the_socket_is_exit_code_1(
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = short_tmp()
    try:
        gpus = root / "gpus.yaml"
        gpus.write_text(
            yaml.safe_dump({"gpus": [{"uuid": "GPU-main-1", "name": "NVIDIA L4", "memoryMib": 23034}]})
        )
        (root / "plugin").write_text("a file where the plugin's directory should be")
        argv = ["--node-name", NODE, "--mode", "dra", "--backend", "fake", "--fake-gpus", str(gpus)]
        argv += ["--host-root", str(root), "--plugins-registry", str(root / "registry")]
        argv += ["--dra-plugin-path", str(root / "plugin")]
        settings = config.resolve(argv, {})
        store, _ = cluster()
        code = await main.run_dra(
            settings,
            api=ClaimsApi(store, c.FakeClaims()),
            backend=main.build_backend(settings),
            publish=Publisher(),
            watcher=dirwatch.NoWatcher(),
        )
        assert code == 1
        assert f"node {NODE}: cannot serve the DRA plugin on {root}/plugin/dra.sock" in caplog.text
    finally:
        shutil.rmtree(root, ignore_errors=True)
