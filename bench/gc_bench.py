"""The cyclic garbage collector's pauses in the scheduler's state as the cluster fills up.

The scheduler freezes its state once it has synced (``gc.freeze``), but pods keep coming after
that. This benchmark starts from the synced state of an empty fleet (``--nodes`` nodes x 8 GPUs, as
in ``bench.fleet``), then adds 8 pods per node the way the pod watch does (each event's JSON parsed
into a fresh object and applied to ``ClusterState``), then replaces every pod once (a DELETED and
an ADDED, MODIFIED pair per pod: churn). A ``gc.callbacks`` hook times every collection. Each policy
runs in its own process, since the collector's state is the process's:

* ``start-up``: ``gc.collect(); gc.freeze()`` once, at sync (the scheduler up to 2026-11-26);
* ``survivors``: ``vgpu.gcfreeze.SurvivorFreezer`` (the scheduler now): also freeze whatever
  survives each young collection.

It prints, per phase, the collections, the full (generation 2) ones, the longest pause and the total,
then the process's peak RSS, the frozen objects, and what one compaction (unfreeze, full collection,
freeze) costs and finds at the end: the cyclic garbage a policy kept back.

    .venv/bin/python -m bench.gc_bench [--nodes 1000 5000] [--policies start-up survivors]
"""

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from typing import Any

from vgpu.core import annotations
from vgpu.core.config import Config
from vgpu.gcfreeze import SurvivorFreezer
from vgpu_scheduler.state import ClusterState

from bench import fleet

KEYS = annotations.KEYS
PODS_PER_NODE = 8
POLICIES = ("start-up", "survivors")


def pod_json(node: int, slot: int, serial: int) -> str:
    """A bound, running GPU pod as the API server sends it (a Job's pod: labels, owner, the
    service-account volume, conditions), serialised: the watch parses each event afresh."""
    name = fleet.node_name(node)
    gpu = fleet.gpus(node)[slot % fleet.GPUS_PER_NODE].uuid
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"job-{serial}",
            "namespace": "team-a",
            "uid": f"uid-{serial}",
            "resourceVersion": str(1000 + serial),
            "creationTimestamp": "2026-11-26T07:38:08Z",
            "labels": {"app": "trainer", "job": f"j{serial % 50}"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": f"j{serial % 50}", "uid": f"job-{serial % 50}",
                 "controller": True, "blockOwnerDeletion": True}
            ],
            "annotations": {
                KEYS.assigned_node: name,
                KEYS.devices_allocated: f"{gpu},NVIDIA,2000,10:;",
                KEYS.bind_phase: "success",
            },
        },
        "spec": {
            "nodeName": name,
            "schedulerName": "vgpu-scheduler",
            "containers": [
                {"name": "c", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                 "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}},
                 "volumeMounts": [{"name": "kube-api-access", "readOnly": True,
                                   "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}
            ],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
            "volumes": [{"name": "kube-api-access",
                         "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True"} for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {"name": "c", "ready": True, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-11-26T07:38:09Z"}}}
            ],
        },
    }  # fmt: skip
    return json.dumps(pod)


class Pauses:
    """Every collection's pause, from a ``gc.callbacks`` hook."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.ms.append((time.perf_counter() - self._started) * 1000)
        self.full += info["generation"] == 2

    def line(self, label: str) -> str:
        worst = max(self.ms, default=0.0)
        line = (
            f"  {label:<7} collections {len(self.ms):5d}, full {self.full:3d}, longest pause {worst:7.1f} ms"
        )
        line += f", all pauses {sum(self.ms):7.0f} ms"
        self.ms, self.full = [], 0
        return line


def child(policy: str, nodes: int) -> None:
    """One policy, one fleet size, in this process; prints its figures."""
    state = ClusterState(Config(), clock=time.time)
    fleet.feed(state, nodes, time.time(), placed=fleet.Placed(per_node=0))
    freezer = SurvivorFreezer()
    if policy == "survivors":
        freezer.install()
    else:
        gc.collect()
        gc.freeze()
    pauses = Pauses()
    gc.callbacks.append(pauses)  # after the freezer's hook: its freeze counts in the pause it follows
    slots = [(n, s) for n in range(nodes) for s in range(PODS_PER_NODE)]
    started = time.perf_counter()
    for serial, (n, s) in enumerate(slots):  # the cluster fills up after the scheduler started
        state.apply("pods", "ADDED", json.loads(pod_json(n, s, serial)))
    fill_s = time.perf_counter() - started
    print(f"{policy} at {nodes} nodes:")
    print(pauses.line("fill") + f" ({len(slots)} pods added in {fill_s:.1f} s)")
    started = time.perf_counter()
    for old, (n, s) in enumerate(slots):  # every pod replaced once
        state.apply("pods", "DELETED", json.loads(pod_json(n, s, old)))
        new = pod_json(n, s, old + len(slots))
        state.apply("pods", "ADDED", json.loads(new))
        state.apply("pods", "MODIFIED", json.loads(new))
    churn_s = time.perf_counter() - started
    print(pauses.line("churn") + f" ({len(slots)} pods replaced in {churn_s:.1f} s)")
    gc.callbacks.remove(pauses)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    frozen = gc.get_freeze_count()
    done = freezer.compact()
    print(
        f"  peak RSS {rss_mib:.0f} MiB, {frozen} objects frozen; one compaction at the end: "
        f"{done.seconds * 1000:.0f} ms, {done.collected} cyclic garbage found"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--child", choices=POLICIES, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child, opts.nodes[0])
        return
    for nodes in opts.nodes:
        for policy in opts.policies:
            cmd = [sys.executable, "-m", "bench.gc_bench", "--child", policy, "--nodes", str(nodes)]
            subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
