"""The full stack on one machine: the local cluster plus the real services as separate processes.

``async with Stack(description, config=...) as stack:`` starts
1. a ``LocalCluster`` (API server over HTTPS-less HTTP on 127.0.0.1, kube-scheduler and kubelet
   emulations);
2. ``vgpu-scheduler`` as a subprocess on 127.0.0.1 (its Service port HTTPS with a throwaway CA,
   its extender listener plain HTTP on loopback), then points the kube-scheduler emulation at the
   extender listener (filter + bind + preempt, nodeCacheCapable, managed resources ignored by the scheduler:
   docs/protocol.md#the-extender-entry) and registers its ``/webhook`` as a MutatingWebhookConfiguration with the CA
   as caBundle;
3. one ``vgpu-device-plugin --backend fake`` subprocess per node, serving the node's fake GPUs to
   that node's kubelet emulation;
and waits until every node advertises its GPUs and the scheduler holds them. The services are the
same binaries a real cluster runs; they reach the emulated API server through a kubeconfig.
Process output goes to ``<workdir>/logs/*.log``. ``kill(name)`` and ``restart(name)`` SIGKILL a
process and start it again with the same arguments and ports (crash tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import pathlib
import signal
import ssl
import sys
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import yaml

from vgpu.core import annotations as hami
from vgpu.core import config as configs
from vgpu.core import errors, quantity
from vgpu.demo import drastack, hamicore, webhookconfig
from vgpu.kube.port import JsonObj
from vgpu.localcluster import certs
from vgpu.localcluster.cluster import LocalCluster

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0


class StackError(errors.VgpuError):
    """A component of the stack did not come up; the message says which and points at its log."""


def _python_module(module: str) -> list[str]:
    return [sys.executable, "-m", module]


async def until_dashboard(url: str, ca_file: pathlib.Path, done: Callable[[JsonObj], bool]) -> JsonObj:
    """Read the scheduler's dashboard event stream (``GET /ui/events`` on its Service port at
    ``url``, signed by ``ca_file``) until a frame satisfies ``done``; returns that frame."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/ui/events", ssl=ctx, timeout=aiohttp.ClientTimeout(total=None)) as resp,
    ):
        resp.raise_for_status()
        async for line in resp.content:
            if line.startswith(b"data: ") and done(frame := json.loads(line[len(b"data: ") :])):
                return frame  # type: ignore[no-any-return]
    raise StackError(f"the dashboard's event stream at {url} ended")


class Stack:
    """See the module docstring."""

    def __init__(
        self,
        description: Mapping[str, Any],
        *,
        config: Mapping[str, Any] | None = None,
        admission_delay_s: float = 0.0,
        scheduler_backoff_s: tuple[float, float] = (0.5, 4.0),
        termination_s: float = 0.0,
        scheduler_version: str = "1.36",
        mode: str = "extender",
    ) -> None:
        """``scheduler_version``: the kube-scheduler whose preemption is emulated (1.N or pr135486);
        ``mode``: ``extender``, or ``dra`` (``drastack``: the device plugins are DRA drivers)."""
        if mode not in drastack.MODES:
            raise StackError(f"mode must be one of {', '.join(drastack.MODES)}, got {mode!r}")
        self.mode = mode
        self.config_raw: dict[str, Any] = dict(config or {})
        # the demo's views are open unless asked otherwise: a browser sends no bearer token, and
        # the demo serves on loopback only (scheduler.viewsAuth, docs/configuration.md)
        scheduler = dict(self.config_raw.get("scheduler") or {})
        scheduler.setdefault("viewsAuth", "none")
        self.config_raw["scheduler"] = scheduler
        self.config = configs.load(self.config_raw)
        self.keys = hami.Keys(self.config.annotation_prefix)
        self.cluster = LocalCluster(
            description,
            scheduler_name=self.config.scheduler.scheduler_name,
            admission_delay_s=admission_delay_s,
            scheduler_initial_backoff_s=scheduler_backoff_s[0],
            scheduler_max_backoff_s=scheduler_backoff_s[1],
            termination_s=termination_s,
            scheduler_version=scheduler_version,
            dra=mode == "dra",
        )
        self.scheduler_url = ""  # the Service port (webhook, metrics, dashboard), HTTPS
        self.ca_file = pathlib.Path()  # the throwaway CA that signed the Service port's certificate
        self.extender_url = ""  # the loopback extender listener (filter, bind), HTTP
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self._argv: dict[str, list[str]] = {}
        self.logs: dict[str, pathlib.Path] = {}
        self._killed: set[str] = set()  # by ``kill``, not yet restarted: not a death ``until`` reports
        self._workdir = pathlib.Path()

    @property
    def api(self) -> Any:
        return self.cluster.api

    @property
    def dashboard_url(self) -> str:
        """The live dashboard on the scheduler's Service port (``GET /ui``)."""
        return f"{self.scheduler_url}/ui"

    @property
    def kubeconfig_path(self) -> pathlib.Path:
        return self.cluster.kubeconfig_path

    async def until_dashboard(
        self, done: Callable[[JsonObj], bool], what: str, timeout_s: float = READY_TIMEOUT_S
    ) -> JsonObj:
        """Until a frame of the scheduler's live dashboard satisfies ``done``: what the scheduler
        itself now holds (its node and pod caches), as its ``/filter`` reads it."""
        try:
            return await asyncio.wait_for(until_dashboard(self.scheduler_url, self.ca_file, done), timeout_s)
        except TimeoutError:
            raise StackError(
                f"timed out after {timeout_s:.0f} s waiting for the scheduler to show {what}; "
                f"logs in {self._workdir / 'logs'}"
            ) from None

    async def __aenter__(self) -> Stack:
        await self.cluster.__aenter__()
        try:
            await self._start()
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()

    async def _start(self) -> None:
        self._workdir = self.cluster.workdir
        (self._workdir / "logs").mkdir(exist_ok=True)
        config_path = self._workdir / "vgpu-config.yaml"
        config_path.write_text(yaml.safe_dump(self.config_raw))
        tls = certs.make_serving_certs(self._workdir / "certs", now=datetime.datetime.now(datetime.UTC))
        self.ca_file = tls.ca_file
        ready_file = self._workdir / "scheduler.addr"
        await self._spawn(
            "vgpu-scheduler",
            [
                *_python_module("vgpu_scheduler.main"),
                "--kubeconfig", str(self.kubeconfig_path),
                "--config", str(config_path),
                "--host", "127.0.0.1",
                "--port", "0",
                "--extender-port", "0",
                "--tls-cert-file", str(tls.cert_file),
                "--tls-key-file", str(tls.key_file),
                "--ready-file", str(ready_file),
                "-v",
            ],
        )  # fmt: skip
        address, extender_address = (await self._wait_for_file(ready_file, "vgpu-scheduler")).split()
        self.scheduler_url = f"https://{address}"
        self.extender_url = f"http://{extender_address}"
        # a restart must come back on the same ports: kube-scheduler and the webhook point at them
        argv = self._argv["vgpu-scheduler"]
        argv[argv.index("--port") + 1] = address.rpartition(":")[2]
        argv[argv.index("--extender-port") + 1] = extender_address.rpartition(":")[2]
        await self.cluster.start_scheduler(self.scheduler_configuration())
        self.cluster.server.add_mutating_webhooks(self.webhook_configuration(tls.ca_pem()))
        if self.mode == "dra":
            self.cluster.store.create("deviceclasses", drastack.device_class())
        for spec in self.cluster.description.nodes:
            gpus_file = self._workdir / f"gpus-{spec.name}.yaml"
            gpus_file.write_text(yaml.safe_dump(spec.fake_gpus))
            host_root = self.cluster.host_roots[spec.name]
            # HAMi-core's files, put there by the chart's own installer (stand-in source)
            hook_path = self.config.for_node(spec.name).hook_path
            await asyncio.to_thread(hamicore.install_stand_in, host_root, hook_path=hook_path)
            await self._spawn(
                f"device-plugin-{spec.name}",
                [
                    *_python_module("vgpu_device_plugin.main"),
                    "--node-name", spec.name,
                    "--kubeconfig", str(self.kubeconfig_path),
                    "--config", str(config_path),
                    "--device-plugin-path", str(self.cluster.node_dirs[spec.name]),
                    "--backend", "fake",
                    "--fake-gpus", str(gpus_file),
                    "--host-root", str(host_root),
                    "-v",
                    *(drastack.plugin_args(self.cluster, spec.name) if self.mode == "dra" else []),
                ],
            )  # fmt: skip
        await self._wait_for_nodes()

    def scheduler_configuration(self) -> dict[str, Any]:
        """The KubeSchedulerConfiguration a real cluster would give kube-scheduler (docs/protocol.md#the-extender-entry):
        the extender on its loopback listener, plain HTTP, as the chart configures it."""
        return {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [{"schedulerName": self.config.scheduler.scheduler_name}]
            + ([{"schedulerName": drastack.DEFAULT_SCHEDULER}] if self.mode == "dra" else []),
            "extenders": [
                {
                    "urlPrefix": self.extender_url,
                    "filterVerb": "filter",
                    "bindVerb": "bind",
                    "preemptVerb": "preempt",
                    "enableHTTPS": False,
                    "nodeCacheCapable": True,
                    "httpTimeout": "30s",
                    "managedResources": [
                        {"name": name, "ignoredByScheduler": True} for name in self.config.resources.all()
                    ],
                }
            ],
        }

    def webhook_configuration(self, ca_pem: bytes) -> JsonObj:
        """The MutatingWebhookConfiguration the Helm chart installs, pointed at our process."""
        return webhookconfig.webhook_configuration(f"{self.scheduler_url}/webhook", ca_pem, self.keys)

    async def kill(self, name: str) -> None:
        """SIGKILL one process of the stack (``vgpu-scheduler``, ``device-plugin-<node>``): no
        clean-up of any kind, as after an OOM kill or a node crash."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        self._killed.add(name)
        log.info("killed %s (pid %d)", name, proc.pid)

    async def restart(self, name: str) -> None:
        """Start a killed process again with the same arguments (and ports); returns once it is
        listening (the scheduler) or started (a device plugin). Its log is appended to."""
        if self.procs[name].returncode is None:
            raise StackError(f"{name} is still running; kill it first")
        ready_file = self._workdir / "scheduler.addr"
        if name == "vgpu-scheduler":
            ready_file.unlink(missing_ok=True)
        await self._spawn(name, self._argv[name], append=True)
        self._killed.discard(name)
        if name == "vgpu-scheduler":
            await self._wait_for_file(ready_file, "vgpu-scheduler")

    async def _spawn(self, name: str, argv: list[str], *, append: bool = False) -> None:
        path = self._workdir / "logs" / f"{name}.log"
        self.logs[name] = path
        self._argv[name] = argv
        with path.open("ab" if append else "wb") as out:
            self.procs[name] = await asyncio.create_subprocess_exec(
                *argv,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        log.info("started %s (pid %d), log %s", name, self.procs[name].pid, path)

    def _died(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.returncode is not None and name not in self._killed:
                tail = self.logs[name].read_text(errors="replace")[-2000:]
                return f"{name} exited with code {proc.returncode}; its log ({self.logs[name]}) ends:\n{tail}"
        return None

    async def until(self, done: Callable[[], bool], what: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll ``done`` (cheap, in-memory or a stat) until true; fail fast if a process dies (one
        ``kill`` stopped is not reported until it is restarted)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not done():
            if (died := self._died()) is not None:
                raise StackError(f"while waiting for {what}: {died}")
            if loop.time() > deadline:
                raise StackError(
                    f"timed out after {timeout_s:.0f} s waiting for {what}; logs in {self._workdir / 'logs'}"
                )
            await asyncio.sleep(0.05)

    async def _wait_for_file(self, path: pathlib.Path, what: str) -> str:
        def content() -> str:  # a few bytes on local disk: cheap enough to read on the loop
            return path.read_text().strip() if path.exists() else ""

        await self.until(lambda: content() != "", f"{what} to listen")
        return content()

    async def _wait_for_nodes(self) -> None:
        if self.mode == "dra":
            await self.until(
                lambda: drastack.nodes_ready(self.cluster), "every node's ResourceSlice and DRA plugin"
            )
            return
        store = self.cluster.store
        resource = self.config.device_plugin.resource_name

        def ready() -> bool:
            for spec in self.cluster.description.nodes:
                if not spec.gpus:
                    continue
                node = store.get("nodes", spec.name)
                allocatable = (node.get("status") or {}).get("allocatable") or {}
                annotations = (node.get("metadata") or {}).get("annotations") or {}
                if (
                    quantity.parse(allocatable.get(resource) or "0", field=resource) == 0
                    or self.keys.node_register not in annotations
                ):
                    return False
            return True

        await self.until(ready, "every node's device plugin to register its GPUs")
        registered = {
            spec.name: len(
                hami.decode_node_register(
                    store.get("nodes", spec.name)["metadata"]["annotations"][self.keys.node_register]
                )
            )
            for spec in self.cluster.description.nodes
            if spec.gpus
        }

        def held(frame: JsonObj) -> bool:
            gpus = {n["name"]: len(n["gpus"]) for n in frame["nodes"]}
            return all(gpus.get(name) == count for name, count in registered.items())

        # and until the scheduler's own caches hold them, as its /filter reads them: its watch may
        # lag the store (the more so on a loaded machine), and a pod it refused meanwhile waits
        # among kube-scheduler's unschedulable pods for an event that may not come
        await self.until_dashboard(held, "every node's GPUs")

    async def _stop(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except TimeoutError:
                log.warning("%s did not stop on SIGTERM; killing it", name)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        await self.cluster.__aexit__(None, None, None)
