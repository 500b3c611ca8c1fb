"""The chart installed on a real single-node cluster (real kubelet, containerd, runc, CNI) with fake
GPUs, as an operator installs it; GPU pods through the whole real path; faults of the real parts.

The tests share one cluster and one install, and run in file order (each leaves the cluster as the
next expects it)."""

from __future__ import annotations

import statistics

import pytest

from tests.realcluster import flows, kube, workloads
from tests.realcluster.flows import RELEASE_NS

pytestmark = [pytest.mark.realcluster, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_the_chart_installs_and_every_part_comes_up(installed: kube.Cluster) -> None:
    hook = installed.dir / "hook" / "vgpu"
    # the installer init container put HAMi-core's files on the host
    assert (hook / "libvgpu.so").is_file() and not (hook / "libvgpu.so").is_symlink()
    assert (hook / "ld.so.preload").read_text().strip() == f"{hook}/libvgpu.so"
    # the webhooks were registered over TLS with the Secret's CA
    mutating = installed.get("mutatingwebhookconfiguration", "gpu-kube-vgpu-webhook")
    assert all(w["clientConfig"].get("caBundle") for w in mutating["webhooks"])
    # the Service answers (kube-apiserver's proxy to its endpoints, over HTTPS)
    path = f"/api/v1/namespaces/{RELEASE_NS}/services/https:gpu-kube-vgpu-scheduler:443/proxy/readyz"
    assert installed.kubectl("get", "--raw", path).strip() != ""
    endpoints = installed.get(
        "endpointslices", "-n", RELEASE_NS, "-l", "kubernetes.io/service-name=gpu-kube-vgpu-scheduler"
    )
    assert any(e.get("addresses") for s in endpoints["items"] for e in s.get("endpoints") or [])


def test_gpu_pods_start_as_fast_as_plain_pods_within_measure(
    installed: kube.Cluster, watch: kube.PodWatch
) -> None:
    latencies: dict[str, list[float]] = {}
    for kind, limits in (("plain", None), ("gpu", workloads.KINDS["memory"])):
        pods = [
            workloads.pod(f"lat-{kind}-{i}", limits=limits, labels={"phase": "latency"}) for i in range(8)
        ]
        installed.apply(pods)
        names = {p["metadata"]["name"] for p in pods}
        watch.wait(f"{kind} pods running", flows.all_running(names))
        latencies[kind] = sorted(watch.running_at[n] - watch.first_seen[n] for n in names)
        flows.delete_work(installed, watch)
    summary = {k: (statistics.median(v), v[-1]) for k, v in latencies.items()}
    print(f"\ncreate->Running, 8 pods at once (median, max s): {summary}")
    assert summary["gpu"][0] < 60


def test_thirty_mixed_gpu_pods_run_through_the_real_path(
    installed: kube.Cluster, watch: kube.PodWatch
) -> None:
    pods = workloads.mixed("mix", workloads.MIX, labels={"phase": "mix"})
    # the exclusive ones first: each needs an idle GPU, and the default gpuPolicy (spread) puts the
    # shared pods on every GPU; created together in any order, they would rightly stay Pending
    exclusive = [p for p in pods if "exclusive" in p["metadata"]["name"]]
    installed.apply(exclusive)
    watch.wait("the exclusive pods running", flows.all_running({p["metadata"]["name"] for p in exclusive}))
    installed.apply([p for p in pods if p not in exclusive])
    names = {p["metadata"]["name"] for p in pods}
    watch.wait("30 mixed GPU pods running", flows.all_running(names), timeout_s=600)
    watch.wait("their logs", lambda ps: all(flows.ready(ps[n]) for n in names), timeout_s=120)
    running = watch.snapshot()
    spans = [watch.running_at[n] - watch.first_seen[n] for n in names]
    print(
        f"\n30 mixed GPU pods, create->Running (median, max s): {statistics.median(spans):.2f}, {max(spans):.2f}"
    )
    for name in names:
        flows.check_gpu_pod(installed, running[name])
    use = kube.gpu_use(list(running.values()))
    assert len(use) == workloads.GPU_COUNT
    two = running["mix-two-gpu-24"]
    assert len(kube.gpu_use([two])) == 2
    uids = [running[n]["metadata"]["uid"] for n in names]
    flows.delete_work(installed, watch)
    # the plugin removes HAMi-core's per-container directories of departed pods (checked every
    # 30 s, removed once missing for 60 s and a LIST confirms: at most about 2 minutes)
    containers = installed.dir / "hook" / "vgpu" / "containers"
    kube.wait_until(
        "HAMi-core's per-container directories removed",
        lambda: not any((containers / f"{u}_main").exists() for u in uids),
        timeout_s=240,
    )
