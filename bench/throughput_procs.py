"""The processes a throughput bench run starts, and the cluster objects they need first.

The API server (``control_plane``: the emulation, every write delayed by ``--write-latency-ms``,
or a real etcd and kube-apiserver from ``--k8s-bin``), kube-scheduler with our extender as the
chart renders it (``kube_scheduler``, ``kube_scheduler_config``), the real ``vgpu-scheduler``
over HTTPS (``VgpuSchedulerProcess``), the chart's admission webhooks (``register_webhooks``),
the Nodes as kubelet registers them (``setup_nodes``), and where the emulated nodes' host
directories go (``nodes_host_root``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import os
import pathlib
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import yaml
from vgpu.core import annotations as hami
from vgpu.core import config as configs
from vgpu.demo import webhookconfig
from vgpu.kube import aioapi
from vgpu.localcluster import certs, cluster, description
from vgpu.localcluster.serve import LocalProcess

from bench import realk8s
from bench.throughput_pods import NAMESPACE, gpu_pod


def kube_scheduler_config(
    url: str,
    config: configs.Config,
    *,
    percentage: int,
    api_version: str = "kubescheduler.config.k8s.io/v1",
    kubeconfig_path: pathlib.Path | None = None,
) -> dict[str, Any]:
    """What deploy/helm/kube-vgpu/templates/scheduler-kubeschedulerconfig.yaml renders (the extender
    on loopback, plain HTTP), with the default profile beside ours in one process. For a real
    kube-scheduler (``kubeconfig_path``): its client unthrottled (qps = burst = 5000, as issue 12's
    measurement ran it) and no leader election."""
    out: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {"schedulerName": "default-scheduler"},
            {"schedulerName": config.scheduler.scheduler_name},
        ],
        "extenders": [
            {
                "urlPrefix": url,
                "filterVerb": "filter",
                "bindVerb": "bind",
                "preemptVerb": "preempt",  # as the chart renders it
                "nodeCacheCapable": True,
                "enableHTTPS": False,
                "httpTimeout": "30s",
                "ignorable": False,
                "managedResources": [{"name": n, "ignoredByScheduler": True} for n in config.resources.all()],
            }
        ],
    }
    if percentage:
        out["percentageOfNodesToScore"] = percentage
    if kubeconfig_path is not None:
        out["clientConnection"] = {"kubeconfig": str(kubeconfig_path), "qps": 5000, "burst": 5000}
        out["leaderElection"] = {"leaderElect": False}
    return out


LOOP_STEPS_DIR = pathlib.Path(__file__).with_name("loopsteps")  # its sitecustomize.py


async def register_node(api: aioapi.AioKubeApi, node: dict[str, Any]) -> None:
    """Create ``node`` as kubelet registers it (status written after), untainted as the node
    lifecycle controller leaves a Ready node: a real API server's TaintNodesByCondition admission
    taints a new node not-ready, and no controller manager runs here to lift it."""
    name = node["metadata"]["name"]
    created = await api.create("nodes", node)
    if (created.get("spec") or {}).get("taints"):
        await api.merge_patch("nodes", name, {"spec": {"taints": None}})
    await api.merge_patch_status("nodes", name, {"status": node["status"]})


async def setup_nodes(
    api: aioapi.AioKubeApi, names: list[str], *, devices: dict[str, str], parallel: int = 64
) -> None:
    """Ready Nodes as kubelet registers them, with the device plugin's resource advertised, and
    untainted as the node lifecycle controller leaves a Ready node."""
    gate = asyncio.Semaphore(parallel)
    spec = {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", **devices}}

    async def one(name: str) -> None:
        node = cluster.node_object(description.NodeSpec(name=name, allocatable=spec["allocatable"]))
        async with gate:
            await register_node(api, node)

    await asyncio.gather(*(one(n) for n in names))


def watches_read(log: pathlib.Path) -> str:
    """Where the vgpu-scheduler's start-up line says it reads its watches ("by the helper" or
    "here"; "?" when the line is not there)."""
    found = re.search(r"watches read (by the helper|here) \(", log.read_text(errors="replace"))
    return found.group(1) if found else "?"


@dataclasses.dataclass(frozen=True)
class Plane:
    """The API server the phases run against: the emulation's, or a real one (``--k8s-bin``)."""

    url: str
    token: str | None
    ca_file: pathlib.Path | None
    pids: dict[str, int | None]  # its processes, for the CPU per pod
    # a real one's request counters; None: the emulation's /debug/requests (writes by client)
    server_counts: Callable[[], Awaitable[dict[str, float]]] | None = None


@contextlib.asynccontextmanager
async def control_plane(opts: argparse.Namespace, workdir: pathlib.Path) -> AsyncIterator[Plane]:
    if opts.k8s_bin:
        async with realk8s.control_plane(
            opts.k8s_bin, workdir, now=datetime.datetime.now(datetime.UTC)
        ) as real:

            async def counts() -> dict[str, float]:
                return realk8s.request_counts(await realk8s.scrape(real))

            yield Plane(real.url, real.token, real.ca_file, dict(real.pids), server_counts=counts)
        return
    async with LocalProcess.apiserver(
        write_latency_ms=opts.write_latency_ms, log_path=workdir / "logs" / "apiserver.log"
    ) as server:
        pid = server.proc.pid if server.proc else 0
        yield Plane(server.ready, None, None, {"apiserver": pid})


@dataclasses.dataclass(frozen=True)
class Scheduling:
    """The kube-scheduler a run uses: its pid, and for the real one its own cycle histograms
    (``realk8s.histogram_sums``); the emulation's cycle is read from its log instead."""

    pid: int
    cycle: Callable[[], Awaitable[dict[str, tuple[float, float]]]] | None


@contextlib.asynccontextmanager
async def kube_scheduler(
    opts: argparse.Namespace,
    workdir: pathlib.Path,
    *,
    extender_url: str,
    config: configs.Config,
    plane: Plane,
    kubeconfig_path: pathlib.Path,
) -> AsyncIterator[Scheduling]:
    """kube-scheduler (the emulation, or the real one of ``--k8s-bin``) with our extender."""
    sched_config = workdir / "kube-scheduler.yaml"
    log_path = workdir / "logs" / "kube-scheduler.log"
    percentage = opts.percentage_of_nodes_to_score
    if opts.k8s_bin:
        minor = await realk8s.kube_scheduler_minor(opts.k8s_bin)
        api_version = realk8s.scheduler_config_api(minor)
        rendered = kube_scheduler_config(
            extender_url,
            config,
            percentage=percentage,
            api_version=api_version,
            kubeconfig_path=kubeconfig_path,
        )
        rendered.update(realk8s.no_insecure_serving(api_version))
        sched_config.write_text(yaml.safe_dump(rendered))
        async with realk8s.kube_scheduler(
            opts.k8s_bin,
            config=sched_config,
            kubeconfig_path=kubeconfig_path,
            log_path=log_path,
            feature_gates=opts.scheduler_feature_gates,
        ) as real:
            token = plane.token or ""

            async def cycle() -> dict[str, tuple[float, float]]:
                return realk8s.histogram_sums(await real.metrics(token))

            yield Scheduling(real.proc.pid, cycle)
        return
    sched_config.write_text(
        yaml.safe_dump(kube_scheduler_config(extender_url, config, percentage=percentage))
    )
    extra = ["-v"] + (["--cprofile", opts.cprofile] if opts.cprofile else [])
    async with LocalProcess.kube_scheduler(
        server=plane.url, config=sched_config, extra=extra, log_path=log_path
    ) as emulated:
        yield Scheduling(emulated.proc.pid if emulated.proc else 0, None)


WEBHOOK_READY_S = 60.0  # kube-apiserver's informer picks up a new webhook configuration


async def register_webhooks(
    api: aioapi.AioKubeApi, url: str, ca_pem: bytes, config: configs.Config, *, guard: bool = True
) -> None:
    """The chart's mutating webhook at ``url``, and with ``guard`` its update guard (before 1.28);
    returns once the API server calls the mutating one (a dry-run create of a GPU pod comes back
    with our schedulerName: kube-apiserver's informer picks a new configuration up in a moment)."""
    base = "/apis/admissionregistration.k8s.io/v1"
    keys = hami.Keys(config.annotation_prefix)
    await api.request(
        "POST",
        f"{base}/mutatingwebhookconfigurations",
        body=webhookconfig.webhook_configuration(url, ca_pem, keys),
    )
    if guard:
        body = webhookconfig.guard_configuration(url, ca_pem, release_namespace="kube-vgpu")
        await api.request("POST", f"{base}/validatingwebhookconfigurations", body=body)
    probe = gpu_pod("webhook-probe", config=config, policy="binpack", webhook=True)
    deadline = time.monotonic() + WEBHOOK_READY_S
    while True:
        got = await api.request(
            "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=probe, query={"dryRun": "All"}
        )
        if got["spec"].get("schedulerName") == config.scheduler.scheduler_name:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API server never called the webhook at {url}")
        await asyncio.sleep(0.2)  # its informer's resync: nothing to wait on from here


class VgpuSchedulerProcess:
    """The real ``vgpu-scheduler`` as a subprocess over HTTPS; yields its address."""

    def __init__(
        self,
        workdir: pathlib.Path,
        kubeconfig_path: pathlib.Path,
        tls: certs.ServingCerts,
        *,
        nice: int = 0,
        loop_steps: pathlib.Path | None = None,
    ) -> None:
        """``nice``: run it (and so its writes helper, which inherits it) at that niceness, the
        bench's stand-in for the CPU share a pod's CPU request gives its container. ``loop_steps``:
        load ``bench/loopsteps/sitecustomize.py`` into it, writing its loop's steps there."""
        self._workdir, self._kubeconfig, self._tls = workdir, kubeconfig_path, tls
        self._nice = nice
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if loop_steps is not None:
            path = os.pathsep.join(p for p in (str(LOOP_STEPS_DIR), os.environ.get("PYTHONPATH")) if p)
            self._env |= {"PYTHONPATH": path, "VGPU_BENCH_LOOP_STEPS": str(loop_steps)}
        self._proc: asyncio.subprocess.Process | None = None

    service = ""  # host:port of the Service port, once started
    extender = ""  # host:port of the loopback extender listener

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc else 0

    async def __aenter__(self) -> str:
        await self._start(port=0, extender_port=0)
        return self.extender

    async def _start(self, *, port: int, extender_port: int, append: bool = False) -> None:
        ready = self._workdir / "scheduler.addr"
        ready.unlink(missing_ok=True)
        with (self._workdir / "logs" / "vgpu-scheduler.log").open("ab" if append else "wb") as out:
            niced = ["nice", "-n", str(self._nice)] if self._nice else []  # nice execs: the same pid
            self._proc = await asyncio.create_subprocess_exec(
                *niced, sys.executable, "-m", "vgpu_scheduler.main",
                "--kubeconfig", str(self._kubeconfig), "--config", str(self._workdir / "vgpu.yaml"),
                "--host", "127.0.0.1", "--port", str(port), "--extender-port", str(extender_port),
                "--tls-cert-file", str(self._tls.cert_file), "--tls-key-file", str(self._tls.key_file),
                "--ready-file", str(ready),
                stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                env=self._env,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (ready.exists() and len(ready.read_text().split()) >= 2):
            if self._proc.returncode is not None or time.monotonic() > deadline:
                await self.__aexit__()
                raise RuntimeError(f"vgpu-scheduler did not start; see {self._workdir / 'logs'}")
            await asyncio.sleep(0.05)
        # the Service port (HTTPS: webhook, /metrics), then the loopback extender listener
        self.service, self.extender = ready.read_text().split()[:2]

    async def kill(self) -> None:
        """SIGKILL it: no clean-up of any kind (a crash, an OOM kill)."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()

    async def restart(self) -> None:
        """Start it again on the same two ports (kube-scheduler and the webhook point at them)."""
        port, extender_port = (int(a.rpartition(":")[2]) for a in (self.service, self.extender))
        await self._start(port=port, extender_port=extender_port, append=True)

    async def __aexit__(self, *exc: object) -> None:
        if self._proc is not None:
            await realk8s.stop_process(self._proc)


SHM = pathlib.Path("/dev/shm")


def nodes_host_root(workdir: pathlib.Path) -> pathlib.Path:
    """Where the emulated nodes' host directories go (the device plugin's per-container HAMi-core
    cache dir, made in every Allocate): on tmpfs where there is one. A new directory on this VM's
    ext4 costs 0.4 ms of CPU (7 us on tmpfs), which 1,000 real nodes would spend on their own
    machines, not on the control plane's two cores (docs/benchmarks.md)."""
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        return pathlib.Path(tempfile.mkdtemp(prefix="vgpu-tput-host-", dir=SHM))
    return workdir / "host"
