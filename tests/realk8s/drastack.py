"""The real control plane the DRA differential tests run against: etcd, kube-apiserver,
kube-controller-manager (its resourceclaim controller only) and kube-scheduler's default profile,
v1.34 or newer from ``VGPU_K8S_BIN`` (skipped otherwise); fake nodes, no kubelet. And the wait
those tests share for what these other processes do."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import yaml
from vgpu.kube import aioapi, kubeconfig

from bench import realk8s
from tests.realk8s import binaries

SETTLE_S = 30.0


@contextlib.asynccontextmanager
async def dra_control_plane(workdir: pathlib.Path, *, user_agent: str) -> AsyncIterator[aioapi.AioKubeApi]:
    """The plane started in ``workdir`` (its logs under ``logs/``), and an adapter on it."""
    bin_dir = binaries.k8s_bin("kube-apiserver", "kube-scheduler", "kube-controller-manager", "etcd")
    binaries.needs_dra(bin_dir)
    async with contextlib.AsyncExitStack() as stack:
        plane = await stack.enter_async_context(
            realk8s.control_plane(bin_dir, workdir, now=datetime.datetime.now(datetime.UTC))
        )
        kube = kubeconfig.write_kubeconfig(
            workdir / "kubeconfig", server=plane.url, token=plane.token, ca_pem=plane.ca_file.read_bytes()
        )
        config = workdir / "scheduler.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "profiles": [{"schedulerName": "default-scheduler"}],
                    "clientConnection": {"kubeconfig": str(kube), "qps": 500, "burst": 500},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        await stack.enter_async_context(
            realk8s.kube_scheduler(
                bin_dir, config=config, kubeconfig_path=kube, log_path=workdir / "logs" / "kube-scheduler.log"
            )
        )
        with (workdir / "logs" / "kube-controller-manager.log").open("wb") as out:
            kcm = await asyncio.create_subprocess_exec(
                realk8s.binary(bin_dir, "kube-controller-manager"),
                "--kubeconfig", str(kube), "--controllers", "resourceclaim-controller",
                "--leader-elect=false", "--secure-port", "0", "--use-service-account-credentials=false",
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        stack.push_async_callback(realk8s.stop_process, kcm)
        yield await stack.enter_async_context(
            aioapi.AioKubeApi(plane.url, user_agent=user_agent, token=plane.token, ca_file=str(plane.ca_file))
        )


async def until(what: str, probe: Callable[[], Awaitable[Any]], *, timeout_s: float = SETTLE_S) -> Any:
    """``probe()``'s first truthy answer, asked every 50 ms (the real components are other
    processes); ``what`` names it when ``timeout_s`` runs out first."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                got = await probe()
                if got:
                    return got
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None
