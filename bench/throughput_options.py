"""The throughput bench's command line (``python -m bench.throughput_bench``): its flags and their checks."""

from __future__ import annotations

import argparse
import pathlib

DESCRIPTION = "Throughput through kube-scheduler: plain pods vs GPU pods, 1,000 nodes x 8 GPUs (issue 12)."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000, help="pods per phase")
    parser.add_argument(
        "--policies",
        nargs="*",
        default=["binpack", "spread"],
        choices=["binpack", "spread"],
        help="a GPU phase per policy, in order; one given again is another phase (gpu-binpack-2), "
        "its pods added to those still bound: whether the rate holds as the cluster fills",
    )
    parser.add_argument(
        "--admission-delay-s", type=float, default=0.0, help="kubelet's delay before Allocate"
    )
    parser.add_argument(
        "--start-delay-s",
        type=float,
        default=0.0,
        help="from Allocate to Running (the containers starting: an image pull)",
    )
    parser.add_argument(
        "--plugin-search",
        choices=["kube-vgpu", "hami"],
        default="kube-vgpu",
        help="how each node's Allocate finds its pod: our device plugin's way or HAMi's",
    )
    parser.add_argument("--write-latency-ms", type=float, default=20.0, help="API server delay per write")
    parser.add_argument(
        "--percentage-of-nodes-to-score", type=int, default=0, help="0: kube-scheduler's adaptive"
    )
    parser.add_argument(
        "--scheduler-feature-gates",
        default="",
        help="the real kube-scheduler's --feature-gates (e.g. NominatedNodeNameForExpectation=false: "
        "no nominatedNodeName write before a DRA pod's PreBind)",
    )
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpu-memory-mib", type=int, default=40960)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per phase")
    parser.add_argument(
        "--create-rate",
        type=float,
        default=0.0,
        help="pods created per second (paced, open loop); 0: as fast as the 8 clients can",
    )
    parser.add_argument(
        "--api-workers", type=int, default=0, help="the scheduler's scheduler.apiWorkers (0: its default)"
    )
    parser.add_argument(
        "--node-lock", choices=["always", "contended"], help="the scheduler's scheduler.nodeLock"
    )
    parser.add_argument(
        "--node-locks",
        nargs="+",
        choices=["always", "contended"],
        help="the GPU phases once per lock mode, in this order, in one run (overrides --node-lock)",
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        help="a last phase of DRA GPU pods: ResourceSlices, kube-controller-manager's resourceclaim "
        "controller, kube-scheduler's DRA plugin (needs --k8s-bin with v1.34+ binaries)",
    )
    parser.add_argument(
        "--webhooks",
        choices=["none", "chart"],
        default="none",
        help="chart: the mutating webhook and the update guard as the chart installs them before 1.28",
    )
    parser.add_argument(
        "--api-client", choices=["asyncio", "threads"], help="the scheduler's scheduler.apiClient"
    )
    parser.add_argument(
        "--api-writer", choices=["inline", "process"], help="the scheduler's scheduler.apiWriter"
    )
    parser.add_argument(
        "--api-watches", choices=["inline", "process"], help="the scheduler's scheduler.apiWatches"
    )
    parser.add_argument(
        "--loop-steps",
        action="store_true",
        help="count the vgpu-scheduler's event-loop steps of 0.2 ms or more (its loop thread's CPU "
        "per callback, by kind: what a /filter arriving meanwhile waits for) and print the longest "
        "kinds per phase (bench/loopsteps/sitecustomize.py, loaded into it)",
    )
    parser.add_argument(
        "--label-assigned-pods",
        action="store_true",
        help="scheduler.labelAssignedPods: true (one more write)",
    )
    parser.add_argument(
        "--node-procs",
        type=int,
        default=0,
        help="stand in for the nodes from N processes of their own (a shard each, its own pods watch); "
        "0: from this one",
    )
    parser.add_argument(
        "--scheduler-nice",
        type=int,
        default=0,
        help="run the vgpu-scheduler and its writes helper at this niceness (below 0 needs root): "
        "the CPU share a CPU request gives its container where the cores are contended",
    )
    parser.add_argument("--cprofile", help="profile the kube-scheduler emulation into this file")
    parser.add_argument(
        "--k8s-bin",
        type=pathlib.Path,
        help="run against a real etcd, kube-apiserver and kube-scheduler from this directory "
        "(scripts/build-kubernetes.sh) instead of the emulation; --write-latency-ms does not apply",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="whole runs (fresh processes each); >1 adds a median summary"
    )
    parser.add_argument("--quick", action="store_true", help="100 nodes, 100 pods per phase")
    opts = parser.parse_args(argv)
    if opts.repeat < 1:
        parser.error("--repeat must be at least 1")
    if opts.node_procs < 0:
        parser.error("--node-procs must not be negative")
    if opts.dra and not opts.k8s_bin:
        parser.error("--dra needs --k8s-bin (the emulation has no kube-controller-manager)")
    if opts.quick:
        opts.nodes, opts.pods = min(opts.nodes, 100), min(opts.pods, 100)
    return opts
