"""Throughput through kube-scheduler: plain pods vs GPU pods, 1,000 nodes x 8 GPUs (issue 12).

Processes: the emulated API server (``vgpu.localcluster.serve apiserver``, every write delayed by
``--write-latency-ms``, etcd's commit), the kube-scheduler emulation (``serve kube-scheduler``:
profiles ``default-scheduler`` and ``vgpu-scheduler``, the extender as the chart renders it: filter
+ bind over plain HTTP to the loopback extender listener, nodeCacheCapable, our resources
ignoredByScheduler), the real ``vgpu-scheduler`` (its Service port over HTTPS, as the demo runs
it), and this one: the node side (``throughput_nodes``: per node the
device plugin's register annotation, a fresh Lease and its real Allocate after the kubelet's
admission delay, then Running; with ``--node-procs N`` from N processes of their own, each a shard
of the nodes with its own pods watch, so one Python core does not cap the nodes where cores are
spare), 8 concurrent clients creating the pods, and a watcher that checks no GPU is ever
overcommitted. Phases run in order: plain pods (default-scheduler), then GPU pods
(1 GPU + 1,000 MiB, vgpu-scheduler) with each node policy asked for.

    .venv/bin/python -m bench.throughput_bench [--nodes 1000] [--pods 1000] [--policies binpack spread]
        [--admission-delay-s 0] [--start-delay-s S] [--plugin-search {kube-vgpu,hami}]
        [--write-latency-ms 20] [--percentage-of-nodes-to-score N] [--quick]
        [--create-rate PODS_PER_S] [--api-workers N] [--label-assigned-pods] [--node-lock contended]
        [--api-client threads] [--api-writer inline|process] [--api-watches inline|process]
        [--node-procs N] [--loop-steps] [--webhooks none|chart] [--k8s-bin DIR]
        [--node-locks always contended] [--dra]

``--node-locks`` runs the GPU phases once per lock mode given, in order, in one run (the
vgpu-scheduler restarted with that ``nodeLock`` between them; labels ``gpu-binpack-contended``...).
``--dra`` (with ``--k8s-bin``) adds a last phase of DRA GPU pods (``throughput_dra``): every node
gets a ResourceSlice, a real kube-controller-manager runs the resourceclaim controller, and
kube-scheduler's own DRA plugin allocates the GPU shares; the phase also prints where a DRA pod's
time went (claim created, allocated, bound) and the overcommit check covers the claims.

Prints per phase: bound pods/s (pods / time from the first create to the last bind seen) and the
rate the clients created them at,
create -> bound latency p50/p99, distinct nodes, API writes per pod by client (leases excluded),
each process's CPU per pod, the vgpu-scheduler's answer time per verb and its share of calls on a
new connection, kube-scheduler's own cycle times (per extension point with ``--k8s-bin``), and the
overcommit check; exits 1 if any pod did not bind or any GPU was overcommitted.

``--webhooks chart`` registers the admission webhooks as the chart installs them on a cluster before
1.28 (the mutating webhook on every pod CREATE, and the update guard on every pod and node UPDATE;
``guard.mode: webhook``, no ``matchConditions``), pointed at the vgpu-scheduler's Service port,
creates the GPU pods without a ``schedulerName`` (the webhook sets it), and trusts
``system:masters`` (the chart's ``guard.extraGroups``), the bench's identity. By default there are
none, as in issue 12's setup.

Here the run itself (``run``: the processes started, the phases in order, the overcommit check);
its command line is ``throughput_options``, the processes and the objects they need first
``throughput_procs``, a phase ``throughput_phase`` (its pods ``throughput_pods``, its figures
``throughput_figures``), what is printed ``throughput_report``, the node side ``throughput_nodes``
and the DRA phase ``throughput_dra``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

import yaml
from vgpu import gcfreeze
from vgpu.core import config as configs
from vgpu.demo import hamicore
from vgpu.gcfreeze import SurvivorFreezer
from vgpu.kube import aioapi, kubeconfig
from vgpu.localcluster import certs

from bench import throughput_dra
from bench.procstat import children
from bench.throughput_nodes import NodeSide, fake_gpus, node_names
from bench.throughput_options import parse_args
from bench.throughput_phase import CLIENTS, SETTLE_TIMEOUT_S, Tracker, run_phase
from bench.throughput_pods import gpu_pod, phase_labels, plain_pod
from bench.throughput_procs import (
    VgpuSchedulerProcess,
    control_plane,
    kube_scheduler,
    nodes_host_root,
    register_webhooks,
    setup_nodes,
    watches_read,
)
from bench.throughput_report import Outcome, print_phase, summary, vs_plain
from bench.throughput_shards import Shards, shard_args


async def main_async(opts: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):  # unwind (stop the child processes), never die midway
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    outcomes: list[Outcome] = []
    try:
        for n in range(opts.repeat):
            if opts.repeat > 1:
                print(f"--- run {n + 1} of {opts.repeat}")
            outcomes.append(await run(opts))
    except asyncio.CancelledError:
        print("interrupted; the child processes were stopped", file=sys.stderr)
        return 130
    if len(outcomes) > 1:
        for line in summary(outcomes):
            print(line)
    return 0 if all(o.ok for o in outcomes) else 1


async def run(opts: argparse.Namespace) -> Outcome:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="vgpu-tput-", dir="/tmp"))
    host_root = nodes_host_root(workdir)
    # HAMi-core's files, as the chart's installer puts them on a node (Allocate refuses without them)
    hamicore.install_stand_in(host_root, hook_path=configs.DevicePluginConfig().hook_path)
    logs = workdir / "logs"
    logs.mkdir()
    # the bench reads the scheduler's /metrics without a token, as the demo does (scheduler.viewsAuth)
    config_raw: dict[str, Any] = {"scheduler": {"viewsAuth": "none"}}
    if opts.api_workers:
        config_raw["scheduler"]["apiWorkers"] = opts.api_workers
    if opts.label_assigned_pods:
        config_raw["scheduler"]["labelAssignedPods"] = True
    locks = opts.node_locks or [opts.node_lock]
    if locks[0]:
        config_raw["scheduler"]["nodeLock"] = locks[0]
    if opts.api_client:
        config_raw["scheduler"]["apiClient"] = opts.api_client
    if opts.api_writer:
        config_raw["scheduler"]["apiWriter"] = opts.api_writer
    if opts.api_watches:
        config_raw["scheduler"]["apiWatches"] = opts.api_watches
    if opts.webhooks == "chart":
        config_raw["webhook"] = {"trustedGroups": ["system:masters"]}  # the chart's guard.extraGroups
    config = configs.load(config_raw)
    (workdir / "vgpu.yaml").write_text(yaml.safe_dump(config_raw))
    names = node_names(opts.nodes)
    gpus = {  # the nodes this process stands in for: all of them, or none with --node-procs
        n: fake_gpus(n, count=opts.gpus_per_node, memory_mib=opts.gpu_memory_mib, slots=opts.slots)
        for n in (names if opts.node_procs == 0 else ())
    }
    results: list[dict[str, Any]] = []
    niceness: dict[str, int] = {}
    watches = ""
    started = time.monotonic()
    print(
        f"throughput: {opts.nodes} nodes x {opts.gpus_per_node} GPUs ({opts.gpu_memory_mib} MiB, {opts.slots} slots), "
        f"{opts.pods} pods per phase, {CLIENTS} clients, "
        + (
            f"real etcd, kube-apiserver and kube-scheduler from {opts.k8s_bin}, "
            if opts.k8s_bin
            else f"write latency {opts.write_latency_ms:g} ms, "
        )
        + f"admission delay {opts.admission_delay_s:g} s, start delay {opts.start_delay_s:g} s, "
        f"{opts.plugin_search} device plugin's pod search, "
        f"create rate {f'{opts.create_rate:g} pods/s' if opts.create_rate else 'unpaced'}; logs in {logs}"
        + (f", nodes' host files in {host_root}" if opts.keep else ""),
        flush=True,
    )
    try:
        async with contextlib.AsyncExitStack() as stack:
            plane = await stack.enter_async_context(control_plane(opts, workdir))
            kubeconfig_path = kubeconfig.write_kubeconfig(
                workdir / "kubeconfig",
                server=plane.url,
                token=plane.token,
                ca_pem=plane.ca_file.read_bytes() if plane.ca_file else None,
            )
            ca_file = str(plane.ca_file) if plane.ca_file else None
            api = await stack.enter_async_context(
                aioapi.AioKubeApi(plane.url, user_agent="bench/1", token=plane.token, ca_file=ca_file)
            )
            await setup_nodes(
                api, names, devices={config.resources.count: str(opts.gpus_per_node * opts.slots)}
            )
            tracker = Tracker()
            claims = throughput_dra.ClaimTracker(capacity_mib=opts.gpu_memory_mib)
            dra_bodies: list[dict[str, Any]] = []
            if opts.dra:
                # the extender phases' GPU pod (as a user writes it), converted by the webhook's code
                user_pod = gpu_pod("dra", config=config, policy="binpack", webhook=True)
                templates: dict[str, dict[str, Any]] = {}
                for i in range(opts.pods):
                    body, made = throughput_dra.dra_pod(f"dra-{i}", gpu_pod=user_pod, config=config)
                    dra_bodies.append(body)
                    templates.update((t["metadata"]["name"], t) for t in made)
                await throughput_dra.publish(
                    api,
                    names,
                    gpus=opts.gpus_per_node,
                    memory_mib=opts.gpu_memory_mib,
                    templates=templates.values(),
                )
                watching = asyncio.create_task(
                    throughput_dra.watch_claims(
                        plane.url, token=plane.token or "", ca_file=plane.ca_file, on_event=claims.on_event
                    )
                    if plane.ca_file
                    else asyncio.sleep(0)
                )
                stack.push_async_callback(_cancel, watching)
                dra_pid = await stack.enter_async_context(
                    throughput_dra.kube_controller_manager(
                        opts.k8s_bin,
                        kubeconfig_path=kubeconfig_path,
                        log_path=logs / "kube-controller-manager.log",
                    )
                )
            side = NodeSide(
                plane.url,
                on_pod=tracker.on_pod,
                config=config,
                gpus=gpus,
                admission_delay_s=opts.admission_delay_s,
                host_root=host_root,
                start_delay_s=opts.start_delay_s,
                plugin_search=opts.plugin_search,
                token=plane.token,
                ca_file=ca_file,
            )
            stack.push_async_callback(side.stop)
            await side.register()
            await side.start()
            shards = None
            if opts.node_procs:
                args = shard_args(
                    opts,
                    url=plane.url,
                    ca_file=ca_file,
                    config_file=workdir / "vgpu.yaml",
                    host_root=host_root,
                )
                shards = Shards(opts.node_procs, args, token=plane.token, log_dir=logs)
                # LIFO: this runs once the shards have exited and reported
                stack.callback(side.failures.extend, shards.failures)
                await stack.enter_async_context(shards)
            tls = certs.make_serving_certs(workdir / "certs", now=datetime.datetime.now(datetime.UTC))
            steps_file = workdir / "loop-steps.json" if opts.loop_steps else None
            vgpu_scheduler = VgpuSchedulerProcess(
                workdir, kubeconfig_path, tls, nice=opts.scheduler_nice, loop_steps=steps_file
            )
            address = await stack.enter_async_context(vgpu_scheduler)
            if opts.webhooks == "chart":
                ca_pem = tls.ca_file.read_bytes()
                await register_webhooks(api, f"https://{vgpu_scheduler.service}/webhook", ca_pem, config)
            scheduling = await stack.enter_async_context(
                kube_scheduler(
                    opts,
                    workdir,
                    extender_url=f"http://{address}",
                    config=config,
                    plane=plane,
                    kubeconfig_path=kubeconfig_path,
                )
            )
            pids: dict[str, int | None] = {
                **plane.pids,
                "kube-scheduler": scheduling.pid,
                "vgpu-scheduler": vgpu_scheduler.pid,
            }
            if opts.dra:
                pids["kube-controller-manager"] = dra_pid
            # its writes helper (apiWriter auto, the default, or process; started before it listens)
            for writer in children(vgpu_scheduler.pid)[:1]:
                pids["api-writer"] = writer
            for who in ("vgpu-scheduler", "api-writer"):
                if pids.get(who):
                    niceness[who] = os.getpriority(os.PRIO_PROCESS, pids[who] or 0)
            if any(niceness.values()):
                print(f"niceness: {', '.join(f'{who} {n}' for who, n in niceness.items())}", flush=True)
            watches = watches_read(logs / "vgpu-scheduler.log")
            if shards is None:
                pids["bench+nodes"] = None
            else:
                pids["bench"] = None
                pids.update({f"nodes-{i}": proc.pid for i, proc in enumerate(shards.procs)})
            phases: list[tuple[str, list[dict[str, Any]], str | None]] = [
                ("plain", [plain_pod(f"plain-{i}") for i in range(opts.pods)], None)
            ]
            for lock in locks:
                for base, policy in phase_labels(opts.policies):
                    label = f"{base}-{lock}" if len(locks) > 1 else base
                    bodies = [
                        gpu_pod(
                            f"{label}-{i}", config=config, policy=policy, webhook=opts.webhooks == "chart"
                        )
                        for i in range(opts.pods)
                    ]
                    phases.append((label, bodies, lock))
            if opts.dra:
                phases.append(("dra", dra_bodies, None))
            lock_now = locks[0]
            for label, bodies, lock in phases:
                if lock and lock != lock_now:  # the vgpu-scheduler again, with this node lock mode
                    config_raw["scheduler"]["nodeLock"] = lock_now = lock
                    (workdir / "vgpu.yaml").write_text(yaml.safe_dump(config_raw))
                    await vgpu_scheduler.kill()
                    await vgpu_scheduler.restart()
                    pids["vgpu-scheduler"] = vgpu_scheduler.pid
                    pids.pop("api-writer", None)
                    for writer in children(vgpu_scheduler.pid)[:1]:
                        pids["api-writer"] = writer
                    print(f"vgpu-scheduler restarted with nodeLock: {lock}", flush=True)
                result = await run_phase(
                    label,
                    bodies,
                    api=api,
                    tracker=tracker,
                    timeout_s=opts.timeout_s,
                    pids=pids,
                    create_rate=opts.create_rate,
                    scheduler_metrics=(vgpu_scheduler.service, tls.ca_file),
                    scheduler_log=None if opts.k8s_bin else logs / "kube-scheduler.log",
                    server_counts=plane.server_counts,
                    scheduler_cycle=scheduling.cycle,
                    settle_s=SETTLE_TIMEOUT_S + opts.admission_delay_s + opts.start_delay_s,
                    loop_steps=steps_file,
                )
                if label == "dra":
                    result["dra_split"] = throughput_dra.dra_split(
                        [b["metadata"]["name"] for b in bodies],
                        created=tracker.created,
                        bound=tracker.bound,
                        claims=claims,
                    )
                results.append(result)
                print_phase(result)
    finally:
        if not opts.keep:
            shutil.rmtree(workdir, ignore_errors=True)
            shutil.rmtree(host_root, ignore_errors=True)  # on tmpfs: not under workdir
    for r in results[1:]:
        percent, p99 = vs_plain(results[0], r)
        print(f"{r['label']}: {percent:.0f} % of the plain rate, p99 {p99:.1f}x plain")
    violations = side.watcher.violations + claims.violations
    print(
        f"overcommit={len(violations)} ({side.watcher.checks} GPU checks"
        + (f", {claims.checks} DRA claim shares" if opts.dra else "")
        + f"); allocate failures={len(side.failures)}; run {time.monotonic() - started:.0f} s"
    )
    for line in (violations + side.failures)[:10]:
        print("  " + line)
    return Outcome(results, list(violations), list(side.failures), side.watcher.checks, niceness, watches)


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    freezer = SurvivorFreezer()  # this process is the 1,000 nodes' kubelets: no 100 ms GC stalls
    freezer.install()
    return asyncio.run(gcfreeze.run_within(main_async(parse_args()), freezer))


if __name__ == "__main__":
    sys.exit(main())
