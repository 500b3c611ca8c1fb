"""The composition root: flag/env/config resolution, exit codes, and a real run stopped by SIGTERM."""

import asyncio
import logging
import os
import pathlib
import shutil
import signal

import pytest
import yaml
from vgpu.core import errors
from vgpu.gpu import fake
from vgpu.localcluster.client import LocalKubeApi
from vgpu_device_plugin import config, main

from tests.device_plugin.builders import KEYS, NODE, cluster, notes_of, short_tmp
from tests.device_plugin.fakekubelet import FakeKubelet

GPUS = {"gpus": [{"uuid": "GPU-main-1", "name": "NVIDIA L4", "memoryMib": 23034}]}


def write(tmp_path: pathlib.Path, name: str, data: object) -> pathlib.Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_resolve_flags_env_and_node_overrides(tmp_path: pathlib.Path) -> None:
    cfg = write(
        tmp_path,
        "c.yaml",
        {"devicePlugin": {"deviceSplitCount": 4}, "nodes": {"n7": {"deviceSplitCount": 2}}},
    )
    s = config.resolve(
        ["--config", str(cfg), "--backend", "fake", "--fake-gpus", "g.yaml", "--fail-on-init-error=false"],
        {"NODE_NAME": "n7"},
    )
    assert (s.node, s.backend, s.fail_on_init_error) == ("n7", "fake", False)
    assert s.device_plugin.device_split_count == 2
    assert s.plugin_dir == pathlib.Path("/var/lib/kubelet/device-plugins/")
    assert config.resolve(["--node-name", "x"], {"NODE_NAME": "y"}).node == "x"


@pytest.mark.parametrize(
    ("argv", "env", "field"),
    [
        ([], {}, "--node-name"),
        (["--backend", "fake"], {"NODE_NAME": "n"}, "--fake-gpus"),
        (["--config", "CFG"], {"NODE_NAME": "n"}, "devicePlugin.deviceSplitCount"),
        (["--config", "HOOK"], {"NODE_NAME": "n"}, "devicePlugin.hookPath"),
        (["--config", "MISSING"], {"NODE_NAME": "n"}, "--config"),
        (["--config", "GARBAGE"], {"NODE_NAME": "n"}, "--config"),
    ],
    ids=["no-node", "fake-without-file", "bad-value", "relative-hook", "missing-file", "not-yaml"],
)
def test_resolve_errors_name_the_input(tmp_path: pathlib.Path, argv, env, field) -> None:
    files = {
        "CFG": str(write(tmp_path, "bad.yaml", {"devicePlugin": {"deviceSplitCount": 0}})),
        "HOOK": str(write(tmp_path, "hook.yaml", {"devicePlugin": {"hookPath": "usr/local"}})),
        "MISSING": str(tmp_path / "nope.yaml"),
        "GARBAGE": str(write(tmp_path, "garbage.yaml", "devicePlugin: [unclosed")),
    }
    with pytest.raises(errors.ConfigError) as info:
        config.resolve([files.get(a, a) for a in argv], env)
    assert info.value.field == field


def test_main_exit_codes(tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    assert main.main(["--node-name", "n", "--config", str(tmp_path / "missing.yaml")]) == 2
    broken = write(tmp_path, "broken.yaml", {"failInit": "driver not loaded"})
    with caplog.at_level(logging.ERROR):
        assert main.main(["--node-name", "n", "--backend", "fake", "--fake-gpus", str(broken)]) == 1
    assert "NVML not available: driver not loaded" in caplog.text
    assert "--fail-on-init-error=false" in caplog.text


async def test_run_serves_until_sigterm_then_cleans_up(tmp_path: pathlib.Path) -> None:
    plugin_dir = short_tmp()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    store, api = cluster()
    gpus = write(tmp_path, "gpus.yaml", GPUS)
    settings = config.resolve(
        [
            "--node-name",
            NODE,
            "--backend",
            "fake",
            "--fake-gpus",
            str(gpus),
            "--device-plugin-path",
            str(plugin_dir),
            "--host-root",
            str(tmp_path),
        ],
        {},
    )
    try:
        task = asyncio.create_task(main.run(settings, api=api, backend=main.build_backend(settings)))
        await kubelet.wait_registrations(1)
        assert [d for d, _ in await kubelet.next_list()] == [f"GPU-main-1-{i}" for i in range(10)]
        os.kill(os.getpid(), signal.SIGHUP)  # restart: re-serve and re-register
        await kubelet.wait_registrations(2)
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(task, 10) == 0
        assert not (plugin_dir / "nvidia-gpu.sock").exists()
        assert store.list("leases", namespace="kube-system").items == []
    finally:
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


async def test_sigterm_while_the_api_is_unreachable_still_stops(tmp_path: pathlib.Path) -> None:
    store, _ = cluster()

    class DownApi(LocalKubeApi):
        async def list(self, kind, **kw):
            raise errors.KubeError("connection refused", status=0)

    gpus = write(tmp_path, "gpus.yaml", GPUS)
    settings = config.resolve(
        ["--node-name", NODE, "--backend", "fake", "--fake-gpus", str(gpus), "--host-root", str(tmp_path)], {}
    )
    task = asyncio.create_task(main.run(settings, api=DownApi(store), backend=main.build_backend(settings)))
    await asyncio.sleep(0)  # let run() install its signal handlers
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(task, 10) == 0


async def test_without_a_driver_the_node_annotation_says_why(tmp_path: pathlib.Path) -> None:
    """--fail-on-init-error=false: zero devices, and the reason stands beside the empty inventory."""
    plugin_dir = short_tmp()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    store, api = cluster()
    settings = config.resolve(
        ["--node-name", NODE, "--device-plugin-path", str(plugin_dir), "--host-root", str(tmp_path)], {}
    )
    try:
        task = asyncio.create_task(
            main.run(
                settings,
                api=api,
                backend=fake.FakeGpuBackend([]),
                init_error="NVML not available: NVML Shared Library Not Found",
            )
        )
        await kubelet.wait_registrations(1)
        assert await kubelet.next_list() == []
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(task, 10) == 0
        notes = notes_of(store, "nodes", NODE)
        assert notes[KEYS.node_register] == "[]"
        assert notes[KEYS.node_plugin_error] == "NVML not available: NVML Shared Library Not Found"
    finally:
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
