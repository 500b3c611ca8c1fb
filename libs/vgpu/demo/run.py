"""Run the demo: start the stack, submit the workload through the API server, wait, and show what happened.

Exit status 0 only if every pod expected to run is Running with its GPUs, and every pod expected
to stay pending is Pending with the scheduler's reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from vgpu.core import annotations as hami
from vgpu.core import device, errors
from vgpu.core.device import Gpu
from vgpu.demo import drashow, drastack, preemption
from vgpu.demo.stack import Stack
from vgpu.demo.workload import DemoPod
from vgpu.kube.client import OfficialKubeApi

log = logging.getLogger(__name__)

ALLOCATIONS = "localcluster.kube-vgpu.io/allocations"  # what the kubelet emulation records per container
SHOWN_ENV = (
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_DEVICE_MEMORY_LIMIT_",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_TASK_PRIORITY",
)


@dataclass
class Outcome:
    """What became of one submitted pod."""

    pod: DemoPod
    phase: str = "Pending"
    node: str = ""
    devices: hami.PodDevices = ()
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    reason: str = ""  # FailedScheduling / failure message
    rejected: str = ""  # the API server (admission) refused the pod

    @property
    def settled(self) -> bool:
        if self.rejected or self.phase in ("Running", "Failed", "Succeeded"):
            return True
        return self.pod.expect_pending and bool(self.reason)

    @property
    def as_expected(self) -> bool:
        if self.pod.expect_pending:
            return self.phase == "Pending" and bool(self.reason) and not self.node
        return self.phase == "Running" and bool(self.devices) and not self.rejected


def _env(entry: Mapping[str, Any]) -> dict[str, str]:
    """A container's env as recorded: the device plugin's Allocate envs, then the CDI edits' env."""
    env = {str(k): str(v) for k, v in (entry.get("envs") or {}).items()}
    cdi = entry.get("cdi")
    for item in (cdi.get("env") or []) if isinstance(cdi, Mapping) else []:
        key, _, value = str(item).partition("=")
        env[key] = value
    return env


def _bar(used: int, total: int, width: int = 20) -> str:
    filled = 0 if total <= 0 else min(width, round(width * used / total))
    return "█" * filled + "░" * (width - filled)


class Demo:
    """One demo run against a started ``Stack``."""

    def __init__(self, stack: Stack, pods: Sequence[DemoPod], *, out: TextIO) -> None:
        self.stack = stack
        self.dra = stack.mode == "dra"
        self.pods = list(pods)
        self.out = out
        self.outcomes = {(p.namespace, p.name): Outcome(p) for p in self.pods}

    async def submit(self) -> None:
        """Create every pod through the HTTP API server with the official client (so admission runs)."""
        api = OfficialKubeApi.from_kubeconfig(str(self.stack.kubeconfig_path))
        try:
            for pod in self.pods:
                body = json.loads(json.dumps(pod.manifest))
                if self.dra:
                    body = drastack.with_mode_annotation(body)
                try:
                    await api.create("pods", body, namespace=pod.namespace)
                except errors.KubeError as exc:
                    self.outcomes[(pod.namespace, pod.name)].rejected = str(exc)
        finally:
            await api.close()

    def refresh(self) -> None:
        store = self.stack.cluster.store
        keys = self.stack.keys
        events = store.list("events").items
        claims = {
            (c["metadata"].get("namespace"), c["metadata"]["name"]): c
            for c in store.list("resourceclaims").items
        }
        uuids = drashow.device_uuids(self.inventories()) if self.dra else {}
        for (ns, name), outcome in self.outcomes.items():
            if outcome.rejected:
                continue
            try:
                pod = store.get("pods", name, namespace=ns)
            except errors.NotFound:
                outcome.phase, outcome.reason = "Deleted", "the pod was deleted"
                continue
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            annotations = meta.get("annotations") or {}
            outcome.phase = status.get("phase") or "Pending"
            outcome.node = (pod.get("spec") or {}).get("nodeName") or ""
            raw = annotations.get(keys.devices_allocated, "")
            outcome.devices = hami.decode_pod_devices(raw) if raw else ()
            if self.dra and not raw:
                in_ns = {name: c for (cns, name), c in claims.items() if cns == ns}
                outcome.devices = drashow.pod_devices(pod, in_ns, uuids)
            try:
                recorded = json.loads(annotations.get(ALLOCATIONS) or "{}")
            except json.JSONDecodeError:
                recorded = {}
            outcome.envs = {c: _env(v) for c, v in recorded.items() if isinstance(v, dict)}
            if outcome.phase == "Failed":
                outcome.reason = status.get("message") or status.get("reason") or "failed"
            else:
                mine = [
                    e
                    for e in events
                    if (e.get("involvedObject") or {}).get("name") == name
                    and (e.get("involvedObject") or {}).get("namespace", ns) == ns
                    and e.get("reason") in ("FailedScheduling", "FilteringFailed")
                ]
                # kube-scheduler's FailedScheduling (what `kubectl describe` shows) over our own
                # event, the latest last (a pod that waited for its claim is then refused by it)
                mine.sort(
                    key=lambda e: (
                        e.get("reason") == "FailedScheduling",
                        int((e.get("metadata") or {}).get("resourceVersion") or 0),
                    )
                )
                outcome.reason = str(mine[-1].get("message", "")) if mine else ""

    async def wait(self, *, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last = ""
        while True:
            self.refresh()
            running = sum(o.phase == "Running" for o in self.outcomes.values())
            pending = sum(o.phase == "Pending" for o in self.outcomes.values())
            line = f"  waiting: {running}/{len(self.outcomes)} running, {pending} pending"
            if line != last and self.out.isatty():
                self.out.write("\r" + line)
                self.out.flush()
            last = line
            if all(o.settled for o in self.outcomes.values()) or loop.time() > deadline:
                break
            await asyncio.sleep(0.1)
        if self.out.isatty():
            self.out.write("\r" + " " * len(last) + "\r")
        self.out.write(f"{last.strip()}\n")

    def inventories(self) -> dict[str, list[Gpu]]:
        store = self.stack.cluster.store
        if self.dra:
            return drashow.inventories(store.list("resourceslices").items)
        out: dict[str, list[Gpu]] = {}
        for node in store.list("nodes").items:
            raw = ((node.get("metadata") or {}).get("annotations") or {}).get(self.stack.keys.node_register)
            out[node["metadata"]["name"]] = hami.decode_node_register(raw) if raw else []
        return out

    def render(self) -> None:
        w = self.out.write
        inventories = self.inventories()
        models = {g.uuid: device.model_name(g.type) for gpus in inventories.values() for g in gpus}
        w("\nPods\n")
        for outcome in self.outcomes.values():
            name = outcome.pod.name
            if outcome.rejected:
                w(f"  {name:<18} REJECTED by the API server: {outcome.rejected}\n")
                continue
            if not outcome.node:
                w(f"  {name:<18} Pending: {outcome.reason or '(no reason recorded yet)'}\n")
                continue
            w(f"  {name:<18} {outcome.phase:<8} → {outcome.node}\n")
            containers = [c for c in (outcome.pod.manifest["spec"].get("initContainers") or [])] + list(
                outcome.pod.manifest["spec"].get("containers") or []
            )
            for container, devices in zip(containers, outcome.devices, strict=False):
                for d in devices:
                    w(
                        f"      {container['name']:<10} {d.uuid}  {models.get(d.uuid, '?'):<24} {d.memory_mib:>6} MiB  {d.cores:>3}% cores\n"
                    )
                env = outcome.envs.get(container["name"], {})
                shown = {k: v for k, v in sorted(env.items()) if k.startswith(SHOWN_ENV)}
                if shown:
                    w(f"      {'':<10} env: {' '.join(f'{k}={v}' for k, v in shown.items())}\n")
            if outcome.phase == "Failed":
                w(f"      failed: {outcome.reason}\n")
        w("\nGPUs (memory and cores handed out)\n")
        usage: dict[str, list[tuple[int, int, str]]] = {}
        for outcome in self.outcomes.values():
            if outcome.phase not in ("Pending", "Running") or not outcome.node:
                continue
            for devices in outcome.devices:
                for d in devices:
                    usage.setdefault(d.uuid, []).append((d.memory_mib, d.cores, outcome.pod.name))
        for node, gpus in inventories.items():
            w(f"  {node}\n")
            for gpu in gpus:
                used = usage.get(gpu.uuid, [])
                mem, cores = sum(u[0] for u in used), sum(u[1] for u in used)
                pods = ",".join(sorted({u[2] for u in used})) or "-"
                health = "" if gpu.health else "  UNHEALTHY"
                w(
                    f"    {gpu.index} {device.model_name(gpu.type):<24} mem {_bar(mem, gpu.memory_mib)} {mem:>6}/{gpu.memory_mib:<6} MiB"
                    f"  cores {_bar(cores, gpu.cores, 10)} {cores:>3}/{gpu.cores:<3}  {pods}{health}\n"
                )

    def ok(self) -> bool:
        return all(o.as_expected for o in self.outcomes.values())


async def run_demo(
    description: Mapping[str, Any],
    pods: Sequence[DemoPod],
    *,
    config: Mapping[str, Any],
    out: TextIO = sys.stdout,
    keep: bool = False,
    timeout_s: float = 90.0,
    preemption_act: bool = True,
    mode: str = "extender",
) -> int:
    started = time.monotonic()
    nodes = description["nodes"]
    gpus = sum(len(n.get("gpus") or []) for n in nodes)
    out.write(
        f"kube-vgpu demo: {len(nodes)} nodes, {gpus} fake GPUs; starting the local cluster and services...\n"
    )
    out.flush()
    async with Stack(description, config=config, termination_s=0.5, mode=mode) as stack:
        out.write(
            f"  up in {time.monotonic() - started:.1f} s: API server {stack.cluster.url}, "
            f"vgpu-scheduler {stack.scheduler_url}, {len(nodes)} device plugins\n"
        )
        demo = Demo(stack, pods, out=out)
        path = (
            "webhook → claims → kube-scheduler's DRA allocation → kubelet's DRA plugin"
            if mode == "dra"
            else "webhook → kube-scheduler → extender → kubelet"
        )
        out.write(f"  submitting {len(pods)} pods through the API server ({path})\n")
        await demo.submit()
        await demo.wait(timeout_s=timeout_s)
        demo.render()
        ok = demo.ok()
        bad = [o.pod.name for o in demo.outcomes.values() if not o.as_expected]
        if preemption_act and mode == "dra":
            out.write("\n(the preemption act is the extender mode's; skipped in DRA mode)\n")
        elif preemption_act and not await preemption.run_act(stack, out=out):
            ok = False
            bad.append("preemption act")
        out.write(f"\n{'OK' if ok else 'FAILED'}: {len(pods) - len(bad)}/{len(pods)} pods as expected")
        out.write(f" (not as expected: {', '.join(bad)})\n" if bad else "\n")
        if keep:
            out.write(
                f"\nThe cluster keeps running. Service logs: {stack.cluster.workdir / 'logs'}\n"
                f"  dashboard (live): {stack.dashboard_url}\n"
                f"    (its certificate is signed by a throwaway CA, {stack.ca_file}: accept the warning,\n"
                f"     or: curl --cacert {stack.ca_file} {stack.scheduler_url}/ui/state)\n"
                f"  KUBECONFIG={stack.kubeconfig_path} kubectl get pods -o wide\n"
                f"  vgpu status --kubeconfig {stack.kubeconfig_path}\n"
                "Press Ctrl-C to stop.\n"
            )
            out.flush()
            await asyncio.Event().wait()
        return 0 if ok else 1
