"""The vgpu-scheduler binary: flags, clear startup errors, a real run against the emulated API server
through the official client (ready file, readiness, a filter, SIGTERM)."""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from vgpu.core import annotations, errors
from vgpu.core import config as core_config
from vgpu.kube.aioapi import AioKubeApi
from vgpu.kube.client import OfficialKubeApi
from vgpu.kube.kubeconfig import write_kubeconfig
from vgpu.kube.offload import OffloadedKubeApi
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store
from vgpu_scheduler import main as scheduler_main
from vgpu_scheduler import routes

from tests.adapters import offload_factories
from tests.scheduler.gated import GatedApiServer
from tests.scheduler.scenario import gpus


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--tls-cert-file", "/nonexistent.crt"], "give both or neither"),
        (["--tls-cert-file", "/nonexistent.crt", "--tls-key-file", "/nonexistent.key"], "cannot load"),
        (["--config", "/nonexistent.yaml"], "cannot read /nonexistent.yaml"),
        (["--extender-port", "70000"], "--extender-port: not a port: 70000"),
        (["--max-connections", "0"], "--max-connections: must be at least 1, got 0"),
        (["--extender-max-nodes", "-3"], "--extender-max-nodes: must be at least 1, got -3"),
    ],
    ids=["cert-alone", "cert-missing", "config-missing", "extender-port", "max-connections", "max-nodes"],
)
def test_startup_errors_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler_main.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_bad_config_key_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("scheduler:\n  leaseTimeoutS: -1\n")
    assert scheduler_main.main(["--config", str(bad)]) == 2
    assert "scheduler.leaseTimeoutS" in capsys.readouterr().err


def test_flags_override_config(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scheduler:\n  nodePolicy: spread\n  schedulerName: a\n")
    args = scheduler_main.build_parser().parse_args(
        ["--config", str(cfg), "--gpu-policy", "binpack", "--scheduler-name", "b"]
    )
    config = scheduler_main.load_config(args)
    assert (config.scheduler.node_policy, config.scheduler.gpu_policy, config.scheduler.scheduler_name) == (
        "spread",
        "binpack",
        "b",
    )


async def _start_on_one_gpu_node(
    store: Store, url: str, tmp_path: Path, ready: Path, *, config: Path | None = None
) -> asyncio.subprocess.Process:
    """A GPU node ``n1`` in ``store``, then the real binary against the API server at ``url`` on
    port 0 for both listeners (never the default 8888: another process may hold it), stderr piped."""
    store.create(
        "nodes",
        {
            "metadata": {
                "name": "n1",
                "annotations": {annotations.KEYS.node_register: annotations.encode_node_register(gpus("n1"))},
            }
        },
    )
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=url)
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vgpu_scheduler.main",
        "--kubeconfig", str(kubeconfig),
        "--host", "127.0.0.1", "--port", "0", "--extender-port", "0",
        "--ready-file", str(ready),
        *(["--config", str(config)] if config else []),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.slow
async def test_binary_serves_against_the_api_server(tmp_path: Path) -> None:
    store = Store()
    server = ApiServer(store, host="127.0.0.1", port=0)
    await server.start()
    proc = None
    try:
        ready = tmp_path / "ready"
        proc = await _start_on_one_gpu_node(store, server.url, tmp_path, ready)
        assert proc.stderr is not None
        lines = []
        while True:
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, "".join(lines)
            lines.append(line)
            text = "".join(lines)
            if "state synced" in text and "serving the webhook" in text:  # ready file written before
                break
        address, extender_address = ready.read_text().split()
        assert extender_address.startswith("127.0.0.1:")
        assert "resolved config" in "".join(lines)
        pod = store.create(
            "pods",
            {
                "metadata": {"name": "p"},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}},
                        }
                    ]
                },
            },
            namespace="default",
        )
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{address}/readyz") as resp:
                assert resp.status == 200
            async with session.post(
                f"http://{address}/filter", json={"Pod": pod, "NodeNames": ["n1"]}
            ) as resp:
                assert resp.status == 404  # the Service port serves no extender verbs
            async with session.post(
                f"http://{extender_address}/filter", json={"Pod": pod, "NodeNames": ["n1"]}
            ) as resp:
                body = await resp.json()
        # no lease for n1: the node is reported, and nothing was written
        assert body["FailedAndUnresolvableNodes"] == {"n1": "device plugin not reporting (no lease)"}
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop()


@pytest.mark.parametrize(
    ("scheduler", "usable_cpus", "adapter"),
    [
        ({}, 16, OffloadedKubeApi),  # the defaults: apiClient asyncio, apiWriter auto
        ({}, 2, OffloadedKubeApi),
        ({}, 1.5, AioKubeApi),  # auto under a CPU limit below 2: no core for a helper
        ({"apiWriter": "process"}, 1, OffloadedKubeApi),  # asked for: started whatever the CPUs
        ({"apiWatches": "process"}, 16, OffloadedKubeApi),
        ({"apiWatches": "inline"}, 16, OffloadedKubeApi),  # the writes' helper only
        ({"apiClient": "asyncio", "apiWriter": "inline"}, 16, AioKubeApi),
        ({"apiClient": "threads"}, 16, OfficialKubeApi),  # auto: inline, the official client's threads
        ({"apiClient": "threads", "apiWriter": "inline"}, 16, OfficialKubeApi),
    ],
)
async def test_api_client_and_writer_pick_the_adapter(
    tmp_path: Path, scheduler: dict[str, str], usable_cpus: float, adapter: type
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server="http://127.0.0.1:1")
    api = scheduler_main.make_api(
        core_config.load({"scheduler": scheduler}), str(kubeconfig), usable_cpus=usable_cpus
    )
    try:
        assert isinstance(api, adapter)
        if isinstance(api, OffloadedKubeApi):  # the helper reads them too unless apiWatches: inline
            assert api.watches_in_child is (scheduler.get("apiWatches") != "inline")
    finally:
        await api.close()
    with pytest.raises(errors.ConfigError, match="apiClient"):
        core_config.load({"scheduler": {"apiClient": "curl"}})
    with pytest.raises(errors.ConfigError, match="kubeconfig"):
        scheduler_main.make_api(core_config.load({}), str(tmp_path / "missing"), usable_cpus=16)


async def test_api_writer_process_offloads_the_writes_and_needs_the_asyncio_client(tmp_path: Path) -> None:
    store = Store()
    async with ApiServer(store) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        config = core_config.load({"scheduler": {"apiWriter": "process"}})
        api = scheduler_main.make_api(config, str(kubeconfig), usable_cpus=1)
        assert isinstance(api, OffloadedKubeApi)
        try:  # the child loaded the same kubeconfig: its write lands
            await api.create("nodes", {"metadata": {"name": "n1"}})
            assert api.writer_pid is not None and store.get("nodes", "n1") is not None
        finally:
            await api.close()
    for bad, message in (
        ({"apiWriter": "process", "apiClient": "threads"}, "scheduler.apiWriter: process needs apiClient"),
        ({"apiWriter": "elsewhere"}, "scheduler.apiWriter"),
        ({"apiWriter": 1}, "scheduler.apiWriter"),
    ):
        with pytest.raises(errors.ConfigError, match=message):
            core_config.load({"scheduler": bad})


def test_main_exits_1_at_start_when_its_writes_helper_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A helper whose configuration does not load: the scheduler says so and exits 1 before it
    listens, instead of serving binds that would all fail."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server="http://127.0.0.1:9")

    def broken_helper(
        config: core_config.Config, path: str | None, *, usable_cpus: float
    ) -> OffloadedKubeApi:
        reader = AioKubeApi("http://127.0.0.1:9")
        # the default wait for its start: its exit, however slow its imports, comes first
        return OffloadedKubeApi(reader, offload_factories.broken)

    monkeypatch.setattr(scheduler_main, "make_api", broken_helper)
    ready = tmp_path / "ready"
    code = scheduler_main.main(
        [
            *("--kubeconfig", str(kubeconfig), "--host", "127.0.0.1", "--port", "0"),
            *("--extender-port", "0", "--ready-file", str(ready)),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert "vgpu-scheduler: the API writer process" in err and "did not start" in err
    assert "exited with code 1" in err and "apiWriter: inline" in err
    assert not ready.exists()  # it never listened


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfd_open (Linux 5.3)")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_the_writes_helper_ends_with_the_scheduler(tmp_path: Path, stop: signal.Signals) -> None:
    """SIGTERM: the scheduler lets its helper finish and exits 0 after it. SIGKILL: the helper sees
    its socket close and exits by itself. Either way no helper is left behind."""
    store = Store()
    config = tmp_path / "vgpu.yaml"
    config.write_text("scheduler:\n  apiWriter: process\n")
    async with ApiServer(store, host="127.0.0.1", port=0) as server:
        proc = await _start_on_one_gpu_node(store, server.url, tmp_path, tmp_path / "ready", config=config)
        try:
            assert proc.stderr is not None
            lines: list[str] = []
            while not (started := re.search(r"API writer process started \(pid (\d+)\)", "".join(lines))):
                line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
                assert line, "".join(lines)
                lines.append(line)
            helper = int(started.group(1))
            exited = asyncio.get_running_loop().create_future()
            watch = os.pidfd_open(helper)  # readable once the helper has exited, wherever it is reaped
            asyncio.get_running_loop().add_reader(watch, lambda: exited.done() or exited.set_result(None))
            try:
                proc.send_signal(stop)
                code = await asyncio.wait_for(proc.wait(), 30)
                assert code == (0 if stop == signal.SIGTERM else -signal.SIGKILL)
                if stop == signal.SIGTERM:  # it was waited for before the scheduler exited
                    assert select.select([watch], [], [], 0)[0] == [watch]
                await asyncio.wait_for(exited, 30)
            finally:
                asyncio.get_running_loop().remove_reader(watch)
                os.close(watch)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def test_reservation_ttl_must_outlive_the_lock_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scheduler:\n  reservationTtlS: 10\n  bindLockWaitS: 20\n")
    assert scheduler_main.main(["--config", str(cfg)]) == 2
    assert "scheduler.reservationTtlS: must be greater than bindLockWaitS" in capsys.readouterr().err


def _pods_list_and_writes(method: str, path: str, query: str) -> bool:
    """A hung API server for pods: the pod LIST (a startup call), GETs and writes never answer."""
    pods = path.endswith("/pods") or "/pods/" in path
    return pods and "watch" not in query and method in ("GET", "PATCH", "POST")


@pytest.mark.slow
async def test_sigterm_stops_within_a_bound_while_api_calls_and_watches_are_blocked(tmp_path: Path) -> None:
    store = Store()
    server = GatedApiServer(store, hold=_pods_list_and_writes)
    await server.start()
    proc = None
    try:
        ready = tmp_path / "ready"
        proc = await _start_on_one_gpu_node(store, server.url, tmp_path, ready)
        assert proc.stderr is not None
        lines = []
        while "the extender on" not in "".join(lines):
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, "".join(lines)
            lines.append(line)
        await asyncio.wait_for(server.arrived.wait(), 30)  # the pod LIST hangs in an API thread
        found = re.search(
            r"serving the webhook and metrics on (\S+) .*the extender on (\S+) ", "".join(lines)
        )
        assert found is not None
        address, extender = found.group(1), found.group(2)
        binding = {"PodName": "p", "PodNamespace": "default", "PodUID": "u-p", "Node": "n1"}
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{address}/readyz") as resp:
                assert resp.status == 503  # never synced: the pod list is hung
            # not synced: the bind is refused at once (an empty pod cache could overcommit), as is
            # a filter, and both are remembered for the retry after the sync
            async with session.post(f"http://{extender}/bind", json=binding) as resp:
                assert (await resp.json())["Error"] == routes.NOT_READY
            # the list answers: synced; then the pod GETs and writes hang again
            server.gate.set()
            while "state synced" not in lines[-1]:
                line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
                assert line, "".join(lines)
                lines.append(line)
            server.gate.clear()
            # a bind reads the pod from the API (not in the pod cache): a request blocked in an
            # API call at SIGTERM
            held_before = server.held
            server.another.clear()
            binding_call = asyncio.ensure_future(session.post(f"http://{extender}/bind", json=binding))
            await asyncio.wait_for(server.another.wait(), 20)  # its GET of the pod is held
            assert not binding_call.done() and server.held == held_before + 1
            proc.send_signal(signal.SIGTERM)
            # well under the 30 s API request timeout the blocked calls would otherwise wait for
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            binding_call.cancel()
            await asyncio.gather(binding_call, return_exceptions=True)
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        server.gate.set()
        await server.stop()
