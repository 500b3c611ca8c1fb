"""``vgpu status`` through the real ``kubernetes`` client (``OfficialKubeApi``) against the local
cluster's HTTP API server, from a kubeconfig file, as an operator would run it."""

from __future__ import annotations

import asyncio
import datetime
import io
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from vgpu.core import annotations, config
from vgpu.core.device import Gpu, GpuUuid
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu.status import command, snapshot

from tests.cli import test_status as local

CFG = config.load(None)
KEYS = annotations.KEYS


def populate(store: Store, now: datetime.datetime) -> None:
    gpus = [Gpu(GpuUuid("GPU-a0"), 0, 10, 40960, 100, "NVIDIA-A100")]
    store.create("nodes", local.node("gpu-a", {KEYS.node_register: annotations.encode_node_register(gpus)}))
    store.create("nodes", local.node("gpu-b", {KEYS.node_register: "not json at all"}))
    store.create("leases", local.lease("gpu-a", now), namespace="kube-system")
    store.create(
        "leases", local.lease("gpu-b", now - datetime.timedelta(seconds=120)), namespace="kube-system"
    )
    store.create("pods", local.pod("p1", "gpu-a", "GPU-a0,NVIDIA,4000,30:;"), namespace="default")
    store.create(
        "pods", local.pod("p2", "gpu-a", "GPU-a0,NVIDIA,2000,20:;GPU-a0,NVIDIA,1000,0:;"), namespace="default"
    )


async def test_collect_over_http_matches_the_direct_door(tmp_path: Path) -> None:
    """The same store read through the official client and HTTP, and directly: same snapshot."""
    now = datetime.datetime.now(datetime.UTC)
    store = Store()
    populate(store, now)
    async with ApiServer(store) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        api = command._official_api(str(kubeconfig))
        try:
            over_http = await snapshot.collect(api, config=CFG, now=lambda: now)
        finally:
            await api.close()
    direct = await snapshot.collect(LocalKubeApi(store), config=CFG, now=lambda: now)
    assert over_http == direct
    a, b = over_http.nodes
    assert (a.gpus[0].used.memory_mib, a.gpus[0].used.cores, a.gpus[0].used.slots) == (7000, 50, 3)
    assert a.reporting is True and b.reporting is False
    assert b.problem.startswith("corrupt register annotation: ")


@pytest.fixture
def server_in_thread(tmp_path: Path) -> Iterator[tuple[Store, Path]]:
    """An ApiServer on its own event loop in a thread, so the synchronous CLI can call it."""
    store = Store()
    loop = asyncio.new_event_loop()
    server = ApiServer(store)
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="apiserver", daemon=True)
    thread.start()
    assert started.wait(10), "the API server did not start"
    try:
        yield store, server.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_run_status_cli_end_to_end(server_in_thread: tuple[Store, Path]) -> None:
    store, kubeconfig = server_in_thread
    populate(store, datetime.datetime.now(datetime.UTC))
    out, err = io.StringIO(), io.StringIO()
    code = command.run_status({"kubeconfig": str(kubeconfig)}, out=out, err=err)
    assert code == 0, err.getvalue()
    text = out.getvalue()
    row = next(line for line in text.splitlines() if line.startswith("gpu-a"))
    assert "reporting (" in row and "7000/40960" in row and "50/100" in row and "3/10" in row
    assert "default/p1,default/p2" in row
    row_b = next(line for line in text.splitlines() if line.startswith("gpu-b"))
    assert "NOT REPORTING (120s ago)" in row_b and "UNREADABLE" in row_b
    assert "  ! gpu-b: corrupt register annotation: " in text


def test_missing_kubeconfig_exits_2(tmp_path: Path) -> None:
    err = io.StringIO()
    assert command.run_status({"kubeconfig": str(tmp_path / "nope")}, out=io.StringIO(), err=err) == 2
    assert "kubeconfig" in err.getvalue() and "nope" in err.getvalue()


def test_unreachable_server_exits_1(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: x, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "contexts: [{name: x, context: {cluster: x, user: x}}]\nusers: [{name: x, user: {}}]\n"
    )
    err = io.StringIO()
    assert command.run_status({"kubeconfig": str(kubeconfig)}, out=io.StringIO(), err=err) == 1
    assert "cannot read the cluster" in err.getvalue()


def test_watch_ends_cleanly_on_ctrl_c(server_in_thread: tuple[Store, Path]) -> None:
    """``vgpu status --watch`` as a process: frames keep coming until SIGINT, then exit 0."""
    store, kubeconfig = server_in_thread
    populate(store, datetime.datetime.now(datetime.UTC))
    # Ctrl-C as in a terminal, however pytest was started: a shell starts a background job with
    # SIGINT ignored, and an ignored signal stays ignored across exec (the watch would never end)
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from vgpu import cli; sys.exit(cli.main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "status",
            "--kubeconfig",
            str(kubeconfig),
            "--watch",
            "--interval",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        frames = 0
        for line in proc.stdout:  # blocks on the child's output; bounded by the test timeout
            if line.startswith("kube-vgpu status at"):
                frames += 1
                if frames == 2:
                    break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert frames == 2
    assert proc.returncode == 0, err
    assert "Traceback" not in err
