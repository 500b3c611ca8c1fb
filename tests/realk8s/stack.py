"""The services on a real control plane, for the tests marked ``realk8s``: etcd and kube-apiserver
(``bench.realk8s``), the vgpu-scheduler binary with its webhook registered as the chart registers
it, and on request the real kube-scheduler with the chart's extender entry, and per node our
kubelet emulation (device manager and admission, over real gRPC on unix sockets) beside the
``vgpu-device-plugin`` binary on the fake backend. The services get a kubeconfig, nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime
import os
import pathlib
import sys
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import yaml
from vgpu.core import config as configs
from vgpu.demo import hamicore
from vgpu.kube import aioapi, kubeconfig
from vgpu.localcluster import certs, cluster, description
from vgpu.localcluster.kubelet import KubeletEmulator

from bench import realk8s
from bench.throughput_procs import (
    VgpuSchedulerProcess,
    kube_scheduler_config,
    register_node,
    register_webhooks,
)


@dataclasses.dataclass
class RealStack:
    api: aioapi.AioKubeApi
    workdir: pathlib.Path
    scheduler_url: str  # the vgpu-scheduler's Service port (webhook, dashboard), HTTPS
    ca_file: pathlib.Path  # the CA that signed its certificate
    scheduler: VgpuSchedulerProcess  # to kill and restart it


@contextlib.asynccontextmanager
async def _device_plugin(
    workdir: pathlib.Path,
    kube: pathlib.Path,
    config_path: pathlib.Path,
    spec: description.NodeSpec,
    socket_dir: pathlib.Path,
) -> AsyncIterator[None]:
    gpus_file = workdir / f"gpus-{spec.name}.yaml"
    gpus_file.write_text(yaml.safe_dump(spec.fake_gpus))
    host_root = workdir / "host" / spec.name
    host_root.mkdir(parents=True)
    hamicore.install_stand_in(host_root, hook_path="/usr/local")  # the chart's installer, stand-in source
    with (workdir / "logs" / f"device-plugin-{spec.name}.log").open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vgpu_device_plugin.main",
            "--node-name", spec.name, "--kubeconfig", str(kube), "--config", str(config_path),
            "--device-plugin-path", str(socket_dir), "--backend", "fake", "--fake-gpus", str(gpus_file),
            "--host-root", str(host_root), "-v",
            stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        yield
    finally:
        await realk8s.stop_process(proc)


@contextlib.asynccontextmanager
async def real_stack(
    k8s_bin: pathlib.Path,
    workdir: pathlib.Path,
    *,
    nodes: description.ClusterDescription | None = None,
    config_raw: dict[str, Any] | None = None,
) -> AsyncIterator[RealStack]:
    """The control plane, the vgpu-scheduler and its webhook; with ``nodes``, also kube-scheduler
    and per node a kubelet emulation and a device plugin."""
    now = datetime.datetime.now(datetime.UTC)
    raw = copy.deepcopy(config_raw) if config_raw else {"scheduler": {}}
    # the tests read the dashboard's streams without a token, as the demo does (scheduler.viewsAuth)
    raw.setdefault("scheduler", {}).setdefault("viewsAuth", "none")
    config = configs.load(raw)
    async with contextlib.AsyncExitStack() as stack:
        plane = await stack.enter_async_context(realk8s.control_plane(k8s_bin, workdir, now=now))
        kube = kubeconfig.write_kubeconfig(
            workdir / "kubeconfig", server=plane.url, token=plane.token, ca_pem=plane.ca_file.read_bytes()
        )
        config_path = workdir / "vgpu.yaml"
        config_path.write_text(yaml.safe_dump(raw))
        api = await stack.enter_async_context(
            aioapi.AioKubeApi(plane.url, token=plane.token, ca_file=str(plane.ca_file))
        )
        tls = certs.make_serving_certs(workdir / "certs", now=now)
        scheduler = VgpuSchedulerProcess(workdir, kube, tls)
        extender = await stack.enter_async_context(scheduler)
        service = (workdir / "scheduler.addr").read_text().split()[0]
        await register_webhooks(
            api, f"https://{service}/webhook", tls.ca_file.read_bytes(), config, guard=False
        )
        real = RealStack(
            api=api,
            workdir=workdir,
            scheduler_url=f"https://{service}",
            ca_file=tls.ca_file,
            scheduler=scheduler,
        )
        if nodes is not None:
            minor = await realk8s.kube_scheduler_minor(k8s_bin)
            api_version = realk8s.scheduler_config_api(minor)
            rendered = kube_scheduler_config(
                f"http://{extender}", config, percentage=0, api_version=api_version, kubeconfig_path=kube
            )
            rendered.update(realk8s.no_insecure_serving(api_version))
            sched_config = workdir / "kube-scheduler.yaml"
            sched_config.write_text(yaml.safe_dump(rendered))
            await stack.enter_async_context(
                realk8s.kube_scheduler(
                    k8s_bin,
                    config=sched_config,
                    kubeconfig_path=kube,
                    log_path=workdir / "logs" / "kube-scheduler.log",
                )
            )
            for spec in nodes.nodes:
                await register_node(api, cluster.node_object(spec))
                socket_dir = pathlib.Path(
                    tempfile.mkdtemp(prefix="vgpu-kubelet-", dir="/tmp")
                )  # short: sun_path
                stack.callback(_remove_dir, socket_dir)
                kubelet = KubeletEmulator(
                    api, node=spec.name, socket_dir=socket_dir, host_root=workdir / "host" / spec.name
                )
                await kubelet.start()
                stack.push_async_callback(kubelet.stop)
                await stack.enter_async_context(_device_plugin(workdir, kube, config_path, spec, socket_dir))
        yield real


def _remove_dir(path: pathlib.Path) -> None:
    for child in path.iterdir():
        child.unlink()
    path.rmdir()
