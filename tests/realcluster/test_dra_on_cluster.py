"""The DRA mode on the real single-node cluster (docs/dra.md): the chart installed with
``scripts/cluster/values-dra.yaml`` on a node labelled ``kube-vgpu.io/mode=dra``, containerd 1.7 with
CDI. HAMi-style GPU pods are turned into ResourceClaims by the webhook, kube-controller-manager makes
the claims, kube-scheduler's own DRA plugin allocates the GPU shares, kubelet calls our kubelet
plugin's NodePrepareResources, and containerd applies the CDI spec it wrote: each container proves
HAMi-core's env and files. At every claim change no GPU's consumed memory or cores exceed it.

The module's fixture switches the session's install to the DRA mode and back to the extender mode
afterwards (the modules after it expect that)."""

from __future__ import annotations

import json
import pathlib
import re
import time
from collections.abc import Iterator

import pytest
from vgpu.core.dra import allocation, asked, names

from bench import throughput_dra
from tests.realcluster import flows, kube, workloads
from tests.realcluster.flows import NODE, RELEASE_NS
from tests.realcluster.kube import phase

pytestmark = [pytest.mark.realcluster, pytest.mark.slow, pytest.mark.timeout(1500)]

MODE_LABEL = f"{names.MODE_ANNOTATION}=dra"
CDI_DIR = pathlib.Path("/var/run/cdi")
PLUGIN_COMPONENT = "dra-kubelet-plugin"


def dra_values(cluster: kube.Cluster) -> str:
    return str(cluster.repo / "scripts" / "cluster" / "values-dra.yaml")


def node_slice(cluster: kube.Cluster) -> kube.Obj | None:
    items: list[kube.Obj] = cluster.get("resourceslices", "--field-selector", f"spec.nodeName={NODE}")[
        "items"
    ]
    ours = [s for s in items if s["spec"].get("driver") == names.DRIVER]
    return ours[0] if ours else None


def slice_uuids(cluster: kube.Cluster) -> dict[str, str]:
    """Device name -> the GPU's UUID, from the node's ResourceSlice."""
    published = node_slice(cluster)
    assert published is not None
    return {d["name"]: d["attributes"][names.ATTR_UUID]["string"] for d in published["spec"]["devices"]}


def plugin_pods(cluster: kube.Cluster) -> list[kube.Obj]:
    return flows.component_pods(cluster, PLUGIN_COMPONENT)


def webhook_admits(cluster: kube.Cluster, mode: str) -> bool:
    """A GPU pod's server-side dry run comes back admitted in ``mode``: the webhook answers over
    TLS with the certificate install.py just made (the scheduler pod reads the new Secret only
    once kubelet has synced its volume) and with the mode of the config just applied."""
    pod = workloads.pod("webhook-probe", limits=workloads.KINDS["memory"], labels={})
    out = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(pod), check=False
    )
    try:
        admitted = json.loads(out)
    except ValueError:
        return False  # the webhook's error (a certificate not yet served)
    if mode == names.MODE_DRA:
        return bool(admitted["spec"].get("resourceClaims"))
    return bool(admitted["spec"].get("schedulerName") == "vgpu-scheduler")


@pytest.fixture(scope="module")
def dra(installed: kube.Cluster) -> Iterator[kube.Cluster]:
    if not installed.cdi_enabled():
        pytest.skip(
            "containerd has no CDI (1.6): set VGPU_CONTAINERD_BIN to a containerd 1.7 "
            "(scripts/cluster/containerd-cdi.sh unpacks Debian 13's into /opt/containerd-1.7)"
        )
    installed.kubectl("label", "node", NODE, MODE_LABEL, "--overwrite")
    flows.install(installed, "--tls", "secret", "-f", dra_values(installed))
    try:
        kube.wait_until(
            "the DRA kubelet plugin Ready", lambda: flows.component_ready(installed, PLUGIN_COMPONENT)
        )
        kube.wait_until(
            "the node's ResourceSlice with its 6 GPUs",
            lambda: (
                len((node_slice(installed) or {"spec": {}})["spec"].get("devices") or [])
                == workloads.GPU_COUNT
            ),
        )
        kube.wait_until(
            "the extender's device plugin gone", lambda: not flows.component_pods(installed, "device-plugin")
        )
        kube.wait_until(
            "the webhook admitting GPU pods as DRA pods", lambda: webhook_admits(installed, "dra")
        )
        yield installed
    finally:
        installed.kubectl("delete", "pods", "-n", workloads.NAMESPACE, "--all", "--wait=true", check=False)
        installed.kubectl("label", "node", NODE, f"{names.MODE_ANNOTATION}-", check=False)
        flows.install(installed, "--uninstall", "-f", dra_values(installed))
        kube.wait_until(
            "the release's pods gone", lambda: not installed.get("pods", "-n", RELEASE_NS)["items"]
        )
        flows.install(installed, "--tls", "secret")
        kube.wait_until("the device plugin Ready", lambda: flows.component_ready(installed, "device-plugin"))
        kube.wait_until("the scheduler Ready", lambda: flows.component_ready(installed, "scheduler"))
        kube.wait_until("nvidia.com/gpu on the node", lambda: flows.capacity(installed) == flows.CAPACITY)
        kube.wait_until("the webhook admitting extender pods", lambda: webhook_admits(installed, "extender"))


@pytest.fixture
def claims(dra: kube.Cluster) -> Iterator[kube.ClaimWatch]:
    tracker = throughput_dra.ClaimTracker(capacity_mib=workloads.GPU_MEMORY_MIB)
    w = kube.ClaimWatch(dra, namespace=workloads.NAMESPACE, tracker=tracker)
    try:
        yield w
    finally:
        w.close()
        assert not tracker.violations, f"GPU overcommitted: {tracker.violations[:5]}"


def pod_claim(cluster: kube.Cluster, pod: kube.Obj) -> kube.Obj:
    statuses = pod["status"].get("resourceClaimStatuses") or []
    (status,) = [s for s in statuses if s["name"] == names.claim_name(0)]
    return cluster.get("resourceclaim", "-n", workloads.NAMESPACE, status["resourceClaimName"])


def check_dra_pod(
    cluster: kube.Cluster, pod: kube.Obj, uuids: dict[str, str]
) -> list[allocation.DeviceShare]:
    """The pod went through the webhook's conversion, the claim's allocation and our kubelet
    plugin's CDI spec: its container's env names the allocated GPUs with the claim's memory and
    cores, and it proved HAMi-core's files. Returns the claim's shares."""
    name = pod["metadata"]["name"]
    assert pod["metadata"]["annotations"][names.MODE_ANNOTATION] == names.MODE_DRA
    container = pod["spec"]["containers"][0]
    assert not any(r.startswith("nvidia.com/") for r in (container.get("resources", {}).get("limits") or {}))
    assert container["resources"]["claims"] == [{"name": names.claim_name(0)}]
    claim = pod_claim(cluster, pod)
    shares = allocation.shares(claim)
    assert shares and all(s.pool == NODE for s in shares)
    log = cluster.kubectl("logs", "-n", workloads.NAMESPACE, name)
    assert "READY" in log, log
    hook = cluster.dir / "hook" / "vgpu"
    assert f"preload-names={hook}/libvgpu.so" in log, log
    assert "hami-core stand-in preloaded" in log, log
    env = dict(line.split("=", 1) for line in log.splitlines() if re.match(r"^(CUDA|NVIDIA)_\w+=", line))
    assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == [uuids[s.device] for s in shares], (env, shares)
    for i, share in enumerate(shares):
        assert env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{share.memory_mib}m", (env, shares)
    # the SM limit is what the claim asked, not the 1 % floor every share consumes
    cores = {asked.cores(claim, request=s.request) for s in shares}
    if cores != {0}:
        assert env["CUDA_DEVICE_SM_LIMIT"] == str(max(cores)), (env, shares)
    else:
        assert "CUDA_DEVICE_SM_LIMIT" not in env, env
    assert env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "").endswith("/vgpu.cache"), env
    return shares


def cdi_specs_naming(uid: str) -> list[pathlib.Path]:
    return [p for p in CDI_DIR.glob("*") if p.is_file() and uid in p.read_text(errors="replace")]


def test_thirty_mixed_gpu_pods_run_through_dra(
    dra: kube.Cluster, watch: kube.PodWatch, claims: kube.ClaimWatch
) -> None:
    pods = workloads.mixed("dra", workloads.MIX, labels={"phase": "dra"})
    # the exclusive ones first: each needs an idle GPU, and shared pods may land on every GPU
    exclusive = [p for p in pods if "exclusive" in p["metadata"]["name"]]
    dra.apply(exclusive)
    watch.wait("the exclusive pods running", flows.all_running({p["metadata"]["name"] for p in exclusive}))
    dra.apply([p for p in pods if p not in exclusive])
    names_ = {p["metadata"]["name"] for p in pods}
    watch.wait("30 mixed GPU pods running", flows.all_running(names_), timeout_s=600)
    watch.wait("their logs", lambda ps: all(flows.ready(ps[n]) for n in names_), timeout_s=120)
    running = watch.snapshot()
    uuids = slice_uuids(dra)
    used: dict[str, list[allocation.DeviceShare]] = {}
    for name in sorted(names_):
        for share in check_dra_pod(dra, running[name], uuids):
            used.setdefault(share.device, []).append(share)
        assert cdi_specs_naming(pod_claim(dra, running[name])["metadata"]["uid"]), name
    # kube-scheduler packs (no spread policy in DRA); an exclusive pod has its GPU to itself
    for name in (n for n in names_ if "exclusive" in n):
        (share,) = allocation.shares(pod_claim(dra, running[name]))
        assert [s.memory_mib for s in used[share.device]] == [workloads.GPU_MEMORY_MIB], used[share.device]
        assert share.cores_percent == 100
    for device, shares in used.items():  # the claims' own allocations, after the fact too
        assert sum(s.memory_mib or 0 for s in shares) <= workloads.GPU_MEMORY_MIB, (device, shares)
        assert sum(s.cores_percent or 0 for s in shares) <= 100, (device, shares)
    assert len(allocation.shares(pod_claim(dra, running["dra-two-gpu-24"]))) == 2
    spans = [watch.running_at[n] - watch.first_seen[n] for n in names_]
    print(
        f"\n30 mixed DRA GPU pods, create->Running (median, max s): {sorted(spans)[15]:.2f}, {max(spans):.2f}"
    )
    flows.delete_work(dra, watch)


def test_a_pod_that_fits_no_gpu_is_explained_by_kube_scheduler(
    dra: kube.Cluster, watch: kube.PodWatch
) -> None:
    too_big = str(workloads.GPU_MEMORY_MIB + 1000)
    pod = workloads.pod(
        "dra-too-big", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": too_big}, labels={}
    )
    dra.apply([pod])

    def unschedulable() -> str:
        got = dra.get("pod", "-n", workloads.NAMESPACE, "dra-too-big")
        for c in got["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
                return str(c.get("message", ""))
        return ""

    kube.wait_until("kube-scheduler's verdict", lambda: bool(unschedulable()), timeout_s=120)
    message = unschedulable()
    assert "cannot allocate all claims" in message, message  # the DynamicResources plugin's reason
    events = dra.get(
        "events", "-n", workloads.NAMESPACE, "--field-selector", "involvedObject.name=dra-too-big"
    )
    failed = [e for e in events["items"] if e["reason"] == "FailedScheduling"]
    reporters = {e.get("reportingComponent") or (e.get("source") or {}).get("component") for e in failed}
    assert reporters == {"default-scheduler"}, failed
    assert any("cannot allocate all claims" in e.get("message", "") for e in failed), failed
    print(f"\nkube-scheduler: {message}")
    flows.delete_work(dra, watch)


def _identity(pods: dict[str, kube.Obj], names_: set[str]) -> dict[str, tuple[str, int]]:
    out = {}
    for name in names_:
        status = pods[name]["status"]["containerStatuses"][0]
        out[name] = (status["containerID"], status["restartCount"])
    return out


def _run(cluster: kube.Cluster, watch: kube.PodWatch, prefix: str, kinds: list[str]) -> set[str]:
    pods = workloads.mixed(prefix, kinds, labels={"phase": prefix})
    cluster.apply(pods)
    names_ = {p["metadata"]["name"] for p in pods}
    watch.wait(f"{prefix} pods running", flows.all_running(names_))
    watch.wait(f"{prefix} pods ready", lambda ps: all(flows.ready(ps[n]) for n in names_), timeout_s=120)
    uuids = slice_uuids(cluster)
    for name in names_:
        check_dra_pod(cluster, watch.snapshot()[name], uuids)
    return names_


# kubelet deletes every ResourceSlice of its node when it starts (DRAPluginManager: "no DRA driver
# has registered yet"), and the publisher (vgpu_device_plugin.dra.slicepub) writes the slice again
# only on an inventory change or its 300 s resync: for up to 5 minutes after a kubelet restart the
# node offers no GPU to DRA pods. Strict: the test says so once the publisher republishes promptly.
SLICE_BACK_S = 60


def test_kubelet_restart_keeps_dra_pods_and_new_ones_start(
    dra: kube.Cluster, watch: kube.PodWatch, claims: kube.ClaimWatch
) -> None:
    before = _run(dra, watch, "dra-pre-restart", ["memory", "cores", "two-gpu"])
    identity = _identity(watch.snapshot(), before)
    plugin_uid = plugin_pods(dra)[0]["metadata"]["uid"]
    published = node_slice(dra)
    assert published is not None
    dra.script("cluster.sh", "restart-kubelet")

    def wiped() -> bool:
        now = node_slice(dra)
        return now is None or now["metadata"]["uid"] != published["metadata"]["uid"]

    kube.wait_until("kubelet's start-up wipe of the node's ResourceSlices", wiped, timeout_s=120)
    try:
        kube.wait_until(
            "the node's ResourceSlice published again after kubelet's start-up wipe",
            lambda: node_slice(dra) is not None,
            timeout_s=SLICE_BACK_S,
        )
        _run(dra, watch, "dra-post-restart", ["memory", "percent"])  # the plugin registered again
        assert plugin_pods(dra)[0]["metadata"]["uid"] == plugin_uid
        assert _identity(watch.snapshot(), before) == identity  # untouched
    finally:
        # whatever happened, the next test needs the slice: a new plugin pod publishes it at start
        if node_slice(dra) is None:
            dra.kubectl(
                "delete", "pods", "-n", RELEASE_NS, "-l", f"app.kubernetes.io/component={PLUGIN_COMPONENT}"
            )
            kube.wait_until("the slice published by a new plugin pod", lambda: node_slice(dra) is not None)
        flows.delete_work(dra, watch)


def test_a_restarted_kubelet_plugin_unprepares_what_the_old_one_prepared(
    dra: kube.Cluster, watch: kube.PodWatch, claims: kube.ClaimWatch
) -> None:
    old_pods = _run(dra, watch, "dra-old-plugin", ["memory", "cores"])
    uids = {n: pod_claim(dra, watch.snapshot()[n])["metadata"]["uid"] for n in old_pods}
    assert all(cdi_specs_naming(u) for u in uids.values())
    old = plugin_pods(dra)[0]["metadata"]["name"]
    dra.kubectl("delete", "pod", "-n", RELEASE_NS, old, "--wait=true")
    kube.wait_until(
        "a new kubelet plugin pod Ready",
        lambda: (
            flows.component_ready(dra, PLUGIN_COMPONENT) and plugin_pods(dra)[0]["metadata"]["name"] != old
        ),
    )
    _run(dra, watch, "dra-new-plugin", ["memory", "exclusive"])
    assert all(phase(watch.snapshot()[n]) == "Running" for n in old_pods)
    # the old plugin's claims are unprepared by the new one (its checkpoint): their CDI specs go
    dra.kubectl("delete", "pods", "-n", workloads.NAMESPACE, *sorted(old_pods), "--wait=true")
    kube.wait_until(
        "the old claims' CDI specs removed", lambda: not any(cdi_specs_naming(u) for u in uids.values())
    )
    flows.delete_work(dra, watch)
    # every claim gone, every spec of ours with it
    kube.wait_until(
        "no CDI spec of ours left",
        lambda: not [p for p in CDI_DIR.glob("*") if names.CDI_KIND in p.read_text(errors="replace")],
    )


def allocated_health(cluster: kube.Cluster, name: str) -> list[tuple[str, str, str, str]]:
    """(resource name, resource ID, health, message) of every device kubelet reports in the pod's
    ``containerStatuses[].allocatedResourcesStatus`` (KEP-4680)."""
    pod = cluster.get("pod", "-n", workloads.NAMESPACE, name)
    return [
        (rs["name"], r["resourceID"], r.get("health", ""), r.get("message", ""))
        for cs in pod["status"].get("containerStatuses") or []
        for rs in cs.get("allocatedResourcesStatus") or []
        for r in rs.get("resources") or []
    ]


def test_kubelet_reports_a_dra_pods_gpu_health_from_our_health_stream(
    dra: kube.Cluster, watch: kube.PodWatch, claims: kube.ClaimWatch
) -> None:
    """kubelet 1.36 (ResourceHealthStatus, beta and on) streams NodeWatchResources from our
    kubelet plugin and writes each claim's devices into the pod status: Healthy while the GPU is,
    Unhealthy with our reason once the device plugin's health watcher marks it (HAMi-core's host
    files moved away: the node condition that holds every shared GPU), Healthy again once they
    are back. On a plugin that answers Unimplemented the devices stay Unknown."""
    (name,) = _run(dra, watch, "dra-health", ["memory"])
    claim = pod_claim(dra, watch.snapshot()[name])
    (share,) = allocation.shares(claim)
    resource = f"claim:{names.claim_name(0)}"  # the container's claim has no request named
    # the request's first device is named by its CDI id (kubelet's buildResourceHealth)
    resource_id = f"{names.CDI_KIND}={names.cdi_device(claim['metadata']['uid'], share.request)}"
    healthy = [(resource, resource_id, "Healthy", "")]
    kube.wait_until(
        "kubelet reporting the pod's GPU Healthy",
        lambda: allocated_health(dra, name) == healthy,
        timeout_s=90,
    )
    print(f"\nkubelet's allocatedResourcesStatus: {allocated_health(dra, name)}")
    library = dra.dir / "hook" / "vgpu" / "libvgpu.so"
    moved = library.with_name("libvgpu.so.moved-by-test")
    library.rename(moved)
    moved_at = time.monotonic()
    try:

        def unhealthy() -> bool:
            got = allocated_health(dra, name)
            return len(got) == 1 and got[0][:3] == (resource, resource_id, "Unhealthy")

        kube.wait_until("kubelet reporting the pod's GPU Unhealthy", unhealthy, timeout_s=90)
        message = allocated_health(dra, name)[0][3]
        print(f"Unhealthy after {time.monotonic() - moved_at:.1f} s: {allocated_health(dra, name)}")
        assert "HAMi-core file" in message and "libvgpu.so is missing" in message, message
    finally:
        moved.rename(library)
        back_at = time.monotonic()
    kube.wait_until(
        "kubelet reporting the pod's GPU Healthy again",
        lambda: allocated_health(dra, name) == healthy,
        timeout_s=90,
    )
    print(f"Healthy again after {time.monotonic() - back_at:.1f} s")
    flows.delete_work(dra, watch)
