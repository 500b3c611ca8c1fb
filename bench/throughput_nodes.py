"""The node side of the throughput benchmark: 1,000 device plugins and kubelets, and an overcommit check.

``NodeSide`` stands in for every node at once, from one pods watch and one nodes watch (the pods
watch also feeds the bench's latency tracker, ``on_pod``):

* as a **device plugin**, it publishes each node's register annotation and keeps a Lease per node
  fresh (``NodeReporter``, the plugin's own code); when a GPU pod shows up bound to a node, it runs
  that node's real ``HamiAllocator.allocate`` (the plugin's Allocate: find the pod, PATCH
  ``bind-phase: success``, release the node lock owner-checked with a resourceVersion precondition)
  after the kubelet's admission delay, one pod at a time per node as kubelet's device manager does;
  with ``plugin_search="hami"`` the Allocate finds its pod the way HAMi's device plugin does
  (``throughput_hamisearch.HamiSearchAllocator``) instead of ours;
* as a **kubelet**, it then sets the pod ``Running`` (``Failed`` when Allocate failed), after
  ``start_delay_s`` (the containers starting: an image pull), pods of one node in parallel.

Each Allocate's answer is checked against the pod kubelet admitted (its devices, by UUID): the
device plugin must serve the pod that was bound, whatever node lock mode the scheduler uses.

``OvercommitWatcher`` follows every bound pod's ``vgpu-devices-allocated`` annotation and checks,
at every change, that no GPU holds more memory, cores or pods than its register annotation offers.

One process for 1,000 nodes becomes the limit where cores are spare (one Python core). Run as
``python -m bench.throughput_nodes`` (``throughput_bench --node-procs N``), a process stands in for
one shard of the nodes: every N-th node from its index, with a pods watch of its own as each
kubelet has (``throughput_shards.Shards`` starts them). It prints ``ready`` once its nodes are
registered and synced, runs until its stdin closes, then prints its Allocate failures as one JSON
line and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import pathlib
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import yaml
from vgpu import gcfreeze
from vgpu.core import allocation, errors
from vgpu.core import annotations as hami
from vgpu.core import config as configs
from vgpu.core.config import Config
from vgpu.core.device import Gpu, GpuUuid
from vgpu.gcfreeze import SurvivorFreezer
from vgpu.kube import aioapi, informer
from vgpu.kube.port import JsonObj
from vgpu_device_plugin import reporter
from vgpu_device_plugin.allocator import HamiAllocator
from vgpu_device_plugin.hostfs import HostFs

from bench.throughput_hamisearch import HamiSearchAllocator

log = logging.getLogger(__name__)

Key = tuple[str, str]
_T = TypeVar("_T")


def fake_gpus(node: str, *, count: int, memory_mib: int, slots: int) -> list[Gpu]:
    return [
        Gpu(
            uuid=GpuUuid(f"GPU-{node}-{i}"),
            index=i,
            count=slots,
            memory_mib=memory_mib,
            cores=100,
            type="NVIDIA-A100-SXM4-40GB",
        )
        for i in range(count)
    ]


def _key(pod: JsonObj) -> Key:
    meta = pod.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def _node_of(pod: JsonObj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


class _NodeView:
    """``ClusterView`` of one node over the shared watches (what the plugin's InformerView gives)."""

    def __init__(self, side: NodeSide, node: str) -> None:
        self._side = side
        self._node = node

    def pods(self) -> Iterable[JsonObj]:
        return list(self._side.on_node[self._node].values())

    def pod(self, namespace: str, name: str) -> JsonObj | None:
        return self._side.on_node[self._node].get((namespace, name))

    def node(self) -> JsonObj | None:
        return self._side.nodes.get(None, self._node)


class NodeSide:
    def __init__(
        self,
        url: str,
        *,
        config: Config,
        gpus: dict[str, list[Gpu]],
        admission_delay_s: float,
        host_root: pathlib.Path,
        on_pod: Callable[[informer.Change], None] | None = None,
        start_delay_s: float = 0.0,
        plugin_search: str = "kube-vgpu",
        token: str | None = None,
        ca_file: str | None = None,
        check_overcommit: bool = True,
    ) -> None:
        self.plugin_api = aioapi.AioKubeApi(
            url, user_agent="vgpu-device-plugin/standin", token=token, ca_file=ca_file
        )
        self.kubelet_api = aioapi.AioKubeApi(url, user_agent="kubelet/standin", token=token, ca_file=ca_file)
        self.config = config
        self.keys = hami.Keys(config.annotation_prefix)
        self.gpus = gpus
        self.delay_s = admission_delay_s
        self.start_delay_s = start_delay_s
        self._allocator_type = HamiSearchAllocator if plugin_search == "hami" else HamiAllocator
        self.host = HostFs(host_root, hook_path=config.device_plugin.hook_path)
        self.on_node: dict[str, dict[Key, JsonObj]] = collections.defaultdict(dict)
        self.pods = informer.Informer(self.plugin_api, "pods", on_event=self._on_pod)
        self.nodes = informer.Informer(self.plugin_api, "nodes")
        self.watcher = OvercommitWatcher(self.keys)
        self._check = check_overcommit  # one process checks: a shard's check would repeat it
        self.running_at: dict[str, float] = {}  # pod name -> when it was set Running
        self.failures: list[str] = []
        self._seen: set[str] = set()
        self._also = on_pod  # another reader of this pods watch (the bench's latency tracker)
        self._allocators: dict[str, HamiAllocator] = {}
        self._locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self._reporters = {
            node: reporter.NodeReporter(
                self.plugin_api,
                node=node,
                keys=self.keys,
                lease_namespace=config.scheduler.lease_namespace,
                lease_duration_s=int(config.scheduler.lease_timeout_s),
                register_interval_s=config.device_plugin.register_interval_s,
            )
            for node in gpus
        }
        self._tasks: set[asyncio.Task[None]] = set()

    # ----- the plugin's start: register annotation and Lease, then renewals -----

    async def register(self, *, parallel: int = 64) -> None:
        gate = asyncio.Semaphore(parallel)

        async def one(node: str) -> None:
            async with gate:
                await self._reporters[node].publish(self.gpus[node])
                await self._reporters[node].renew_lease()

        await asyncio.gather(*(one(n) for n in self.gpus))

    async def _renew_leases(self) -> None:
        """Every node's Lease renewed once per ``lease_renew_s``, spread evenly over that period."""
        period_s = self.config.device_plugin.lease_renew_s
        nodes = list(self._reporters)
        while nodes:
            started = time.monotonic()
            for i, node in enumerate(nodes):
                self._spawn(self._reporters[node].renew_lease())
                await asyncio.sleep(max(0.0, started + period_s * (i + 1) / len(nodes) - time.monotonic()))

    # ----- lifecycle -----

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        for loop_coro in (self.nodes.run(), self.pods.run(), self._renew_leases()):
            self._spawn(loop_coro)
        await self.nodes.synced.wait()
        await self.pods.synced.wait()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.plugin_api.close()
        await self.kubelet_api.close()

    # ----- pods -----

    def _on_pod(self, change: informer.Change) -> None:
        if self._also is not None:
            self._also(change)
        pod = change.object
        key, node = _key(pod), _node_of(pod)
        old_node = _node_of(change.old) if change.old else ""
        if old_node and (old_node != node or change.type == "DELETED"):
            self.on_node[old_node].pop(key, None)
        if self._check:
            self.watcher.update(key, None if change.type == "DELETED" else pod, self.nodes)
        if change.type == "DELETED" or node not in self.gpus:  # unbound, or another shard's node
            return
        self.on_node[node][key] = pod
        uid = str(pod["metadata"].get("uid"))
        if uid not in self._seen and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
            self._seen.add(uid)
            self._spawn(self._admit(node, pod))

    def _allocator(self, node: str) -> HamiAllocator:
        got = self._allocators.get(node)
        if got is None:
            refs = {g.uuid: allocation.GpuRef(g.uuid, g.index, g.index) for g in self.gpus[node]}
            got = self._allocators[node] = self._allocator_type(
                api=self.plugin_api,
                view=_NodeView(self, node),
                node=node,
                config=self.config.for_node(node),
                keys=self.keys,
                refs=refs,
                host=self.host,
                offload=_in_place,
            )
        return got

    async def _admit(self, node: str, pod: JsonObj) -> None:
        """kubelet: admission (one pod at a time per node), Allocate for GPU pods, then Running."""
        ns, name = _key(pod)
        phase = "Running"
        async with self._locks[node]:
            if self.delay_s > 0:
                await asyncio.sleep(self.delay_s)
            entry = _first_entry(pod, self.keys)
            if entry is not None:
                ids = [f"{d.uuid}-0" for d in entry]
                try:
                    (served,) = await self._allocator(node).allocate([ids])
                    visible = served.envs.get("NVIDIA_VISIBLE_DEVICES", "")
                    if visible != ",".join(d.uuid for d in entry):  # the Bind -> Allocate identity
                        self.failures.append(
                            f"{ns}/{name} on {node}: Allocate served {visible!r}, "
                            f"not this pod's {','.join(d.uuid for d in entry)!r} (another pod's devices)"
                        )
                except (errors.AllocationError, errors.KubeError, errors.VgpuError) as exc:
                    self.failures.append(f"{ns}/{name} on {node}: {exc}")
                    log.warning("Allocate failed for %s/%s on %s: %s", ns, name, node, exc)
                    phase = "Failed"
        if self.start_delay_s > 0 and phase == "Running":
            await asyncio.sleep(self.start_delay_s)  # the containers starting (an image pull)
        try:
            await self.kubelet_api.merge_patch_status(
                "pods", name, {"status": {"phase": phase}}, namespace=ns
            )
            self.running_at[name] = time.monotonic()
        except errors.KubeError as exc:
            self.failures.append(f"{ns}/{name}: setting {phase}: {exc}")


async def _in_place(func: Callable[[], _T]) -> _T:
    """The emulated plugins' host-file work, run on the bench's loop: on a real node it runs in that
    node's own worker thread, on that node's CPU; here the hop to a thread would be control-plane
    CPU that no real cluster spends (the files are on tmpfs: microseconds)."""
    return func()


def _first_entry(pod: JsonObj, keys: hami.Keys) -> hami.ContainerDevices | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.devices_to_allocate)
    if not raw:
        return None
    try:
        return next((e for e in hami.decode_pod_devices(raw) if e), None)
    except errors.AnnotationError:
        return None


class OvercommitWatcher:
    """Per GPU: memory, cores and pods handed out by bound pods vs what its register annotation offers."""

    def __init__(self, keys: hami.Keys) -> None:
        self._keys = keys
        self._held: dict[Key, list[tuple[str, str, int, int]]] = {}  # pod -> (node, uuid, mem, cores)
        self._used: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])  # uuid -> mem, cores, n
        self._capacity: dict[str, dict[str, Gpu]] = {}
        self.violations: list[str] = []
        self.checks = 0

    def _gpus(self, node: str, nodes: informer.Informer) -> dict[str, Gpu]:
        got = self._capacity.get(node)
        if got is None:
            obj = nodes.get(None, node) or {}
            raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(self._keys.node_register, "")
            got = {g.uuid: g for g in hami.decode_node_register(raw)} if raw else {}
            self._capacity[node] = got
        return got

    def update(self, key: Key, pod: JsonObj | None, nodes: informer.Informer) -> None:
        for _, uuid, mem, cores in self._held.pop(key, ()):
            used = self._used[uuid]
            used[0] -= mem
            used[1] -= cores
            used[2] -= 1
        if (
            pod is None
            or not _node_of(pod)
            or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        ):
            return
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(self._keys.devices_allocated)
        if not raw:
            return
        node = _node_of(pod)
        held = [(node, str(d.uuid), d.memory_mib, d.cores) for c in hami.decode_pod_devices(raw) for d in c]
        self._held[key] = held
        gpus = self._gpus(node, nodes)
        for _, uuid, mem, cores in held:
            used = self._used[uuid]
            used[0] += mem
            used[1] += cores
            used[2] += 1
            self.checks += 1
            gpu = gpus.get(uuid)
            if gpu is None:
                self.violations.append(f"{key[0]}/{key[1]}: GPU {uuid} is not on node {node}")
            elif used[0] > gpu.memory_mib or used[1] > gpu.cores or used[2] > gpu.count:
                self.violations.append(
                    f"{key[0]}/{key[1]}: GPU {uuid} on {node} overcommitted: {used[0]}/{gpu.memory_mib} MiB, "
                    f"{used[1]}/{gpu.cores} cores, {used[2]}/{gpu.count} pods"
                )


def node_names(count: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(count)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="one shard of the throughput bench's nodes")
    parser.add_argument("--url", required=True)
    parser.add_argument("--ca-file")
    parser.add_argument("--config", type=pathlib.Path, required=True, help="the scheduler's config file")
    parser.add_argument("--host-root", type=pathlib.Path, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--shard", type=int, required=True, help="this one's index, from 0")
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--gpu-memory-mib", type=int, required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--admission-delay-s", type=float, default=0.0)
    parser.add_argument("--start-delay-s", type=float, default=0.0)
    parser.add_argument("--plugin-search", choices=["kube-vgpu", "hami"], default="kube-vgpu")
    return parser


async def _shard(opts: argparse.Namespace) -> None:
    config = configs.load(yaml.safe_load(opts.config.read_text()))
    mine = node_names(opts.nodes)[opts.shard :: opts.shards]
    side = NodeSide(
        opts.url,
        config=config,
        gpus={
            n: fake_gpus(n, count=opts.gpus_per_node, memory_mib=opts.gpu_memory_mib, slots=opts.slots)
            for n in mine
        },
        admission_delay_s=opts.admission_delay_s,
        host_root=opts.host_root,
        start_delay_s=opts.start_delay_s,
        plugin_search=opts.plugin_search,
        token=os.environ.get("VGPU_BENCH_TOKEN") or None,
        ca_file=opts.ca_file,
        check_overcommit=False,
    )
    try:
        await side.register()
        await side.start()
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.buffer.read)  # until the bench closes our stdin
    finally:
        await side.stop()
    print(json.dumps({"failures": side.failures}), flush=True)


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    freezer = SurvivorFreezer()
    freezer.install()
    asyncio.run(gcfreeze.run_within(_shard(_parser().parse_args()), freezer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
