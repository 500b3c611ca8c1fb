"""HAMi-core missing on a real node (issue 47's defect): the chart installed with its installer off
and a hook directory without HAMi-core's files. The device plugin logs the path and the remedy once
and reports its GPUs unhealthy: the real kubelet keeps capacity ``nvidia.com/gpu`` and drops
allocatable to 0, the extender filters the node out ("6/6 GPUs unhealthy"), and a GPU pod bound to
the node directly is refused by kubelet's admission (``UnexpectedAdmissionError``: no healthy
devices) before any Allocate. Nothing is created on the host where the files belong (a mount of a
missing file would make a directory there). Once the chart's installer script, run by hand on the
host, puts the files in place, the same plugin process reports the GPUs healthy again and a new GPU
pod runs with both files regular in its container. Afterwards the session's install
(``--tls secret``, installer on) is restored for the next module.

On a plugin without the check, the GPUs stay healthy (allocatable 20): the wait for them unhealthy
times out, and the pod would start with containerd's empty directories in the files' place."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
from vgpu.core import noderegister
from vgpu_device_plugin import hostfs

from tests.realcluster import flows, kube, workloads
from tests.realcluster.flows import NODE, RELEASE_NS

pytestmark = [pytest.mark.realcluster, pytest.mark.slow, pytest.mark.timeout(900)]

BARE = "hook-bare"  # the chart's hookPath for this test, under the cluster's directory


def node_status(cluster: kube.Cluster) -> tuple[str | None, str | None, list[bool] | None]:
    """(capacity, allocatable) of nvidia.com/gpu and the health of each GPU in the register annotation."""
    node = cluster.get("node", NODE)
    status = node["status"]
    raw = (node["metadata"].get("annotations") or {}).get(kube.KEYS.node_register)
    health = None if raw is None else [g.health for g in noderegister.decode_node_register(raw)]
    return (
        status.get("capacity", {}).get("nvidia.com/gpu"),
        status.get("allocatable", {}).get("nvidia.com/gpu"),
        health,
    )


def plugin_pod(cluster: kube.Cluster) -> kube.Obj:
    pods = flows.component_pods(cluster, "device-plugin")
    assert len(pods) == 1, pods
    return pods[0]


def plugin_log(cluster: kube.Cluster) -> str:
    name = plugin_pod(cluster)["metadata"]["name"]
    return cluster.kubectl("logs", "-n", RELEASE_NS, name, "-c", "device-plugin")


def pod_events(cluster: kube.Cluster, name: str) -> list[kube.Obj]:
    selector = f"involvedObject.name={name}"
    items: list[kube.Obj] = cluster.get("events", "-n", workloads.NAMESPACE, "--field-selector", selector)[
        "items"
    ]
    return items


def install_by_hand(cluster: kube.Cluster, core: pathlib.Path) -> str:
    """The chart's installer script run on the host, from a HAMI_CORE_SOURCE layout made here: the
    stand-in library (scripts/cluster/hami-core-standin) as lib/nvidia/libvgpu.so.<version> and a
    vgpu-init.sh that only makes the directory (the script copies the newest versioned build)."""
    source = cluster.dir / "hami-core-source"
    (source / "bin").mkdir(parents=True)
    (source / "lib" / "nvidia").mkdir(parents=True)
    init = source / "bin" / "vgpu-init.sh"
    init.write_text('#!/bin/sh\nset -e\nmkdir -p "$1"\n')
    init.chmod(0o755)
    standin = cluster.repo / "scripts" / "cluster" / "hami-core-standin" / "libvgpu-standin.c"
    library = source / "lib" / "nvidia" / "libvgpu.so.0.0.0-standin"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-o", str(library), str(standin)], check=True, timeout=120
    )
    script = cluster.repo / "deploy" / "helm" / "kube-vgpu" / "files" / "hami-core-installer.sh"
    done = subprocess.run(
        ["sh", str(script), str(core)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HAMI_CORE_SOURCE": str(source)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def restore_session_install(cluster: kube.Cluster, values: pathlib.Path) -> None:
    flows.install(cluster, "--uninstall", "-f", str(values))
    kube.wait_until("the release's pods gone", lambda: not cluster.get("pods", "-n", RELEASE_NS)["items"])
    flows.install(cluster, "--tls", "secret")
    kube.wait_until("the device plugin Ready", lambda: flows.component_ready(cluster, "device-plugin"))
    kube.wait_until("the scheduler Ready", lambda: flows.component_ready(cluster, "scheduler"))
    kube.wait_until("nvidia.com/gpu on the node", lambda: flows.capacity(cluster) == flows.CAPACITY)


def test_missing_hami_core_makes_gpus_unhealthy_until_installed_then_gpu_pods_run(
    installed: kube.Cluster, watch: kube.PodWatch
) -> None:
    core = installed.dir / BARE / "vgpu"
    files = [core / "libvgpu.so", core / "ld.so.preload"]
    values = installed.dir / "values-no-hami-core.yaml"
    values.write_text(
        json.dumps(
            {
                "devicePlugin": {"hamiCoreInstaller": {"enabled": False}},
                "config": {"devicePlugin": {"hookPath": str(installed.dir / BARE)}},
            }
        )
    )
    flows.install(installed, "--uninstall")
    kube.wait_until("the release's pods gone", lambda: not installed.get("pods", "-n", RELEASE_NS)["items"])
    try:
        flows.install(installed, "--tls", "secret", "-f", str(values))
        kube.wait_until("the device plugin Ready", lambda: flows.component_ready(installed, "device-plugin"))
        kube.wait_until("the scheduler Ready", lambda: flows.component_ready(installed, "scheduler"))
        plugin_uid = plugin_pod(installed)["metadata"]["uid"]

        # the plugin registered its GPUs with kubelet, all unhealthy: capacity stays, allocatable 0
        unhealthy = (flows.CAPACITY, "0", [False] * workloads.GPU_COUNT)
        kube.wait_until("the GPUs reported unhealthy", lambda: node_status(installed) == unhealthy)
        missing = f"HAMi-core file {files[0]} is missing on the host; {hostfs.REMEDY}"
        kube.wait_until("the plugin's error logged", lambda: missing in plugin_log(installed), timeout_s=60)
        assert plugin_log(installed).count(missing) == 1  # logged once

        pod = workloads.pod("no-hami-core", limits=workloads.KINDS["memory"], labels={"phase": "hami-core"})
        installed.apply([pod])
        # kube-scheduler leaves nvidia.com/gpu to the extender, which finds every GPU unhealthy
        unfit = "0/1 nodes are available: 1 6/6 GPUs unhealthy."
        extender = f"0/1 nodes fit: 1 6/6 GPUs unhealthy ({NODE})"
        kube.wait_until(
            "the GPU pod's scheduling events",
            lambda: (
                {"FailedScheduling", "FilteringFailed"}
                <= {e["reason"] for e in pod_events(installed, "no-hami-core")}
            ),
        )
        for e in pod_events(installed, "no-hami-core"):
            print(f"\nevent of the GPU pod: {e['reason']}: {e['message']}")
            if e["reason"] == "FailedScheduling":
                assert e["message"].startswith(unfit), e["message"]
            if e["reason"] == "FilteringFailed":
                assert e["message"] == extender and e["source"]["component"] == "vgpu-scheduler"
        # a GPU pod bound to the node directly (in the release namespace: the webhook, which refuses
        # such pods, skips it) never reaches Allocate either: kubelet's admission refuses it
        bound = workloads.pod("bound", limits=workloads.KINDS["memory"], labels={"phase": "hami-core"})
        bound["metadata"]["namespace"] = RELEASE_NS
        bound["spec"]["nodeName"] = NODE
        installed.apply([bound])
        kube.wait_until(
            "kubelet refusing the bound pod",
            lambda: kube.phase(installed.get("pod", "-n", RELEASE_NS, "bound")) == "Failed",
        )
        refused = installed.get("pod", "-n", RELEASE_NS, "bound")["status"]
        print(f"\nkubelet refused the bound GPU pod: {refused.get('reason')}: {refused.get('message')}")
        assert refused["reason"] == "UnexpectedAdmissionError", refused
        assert refused["message"] == (
            "Pod was rejected: Allocate failed due to no healthy devices present; "
            "cannot allocate unhealthy devices nvidia.com/gpu, which is unexpected"
        ), refused
        installed.kubectl("delete", "pod", "-n", RELEASE_NS, "bound", "--wait=true")
        pending = watch.snapshot()["no-hami-core"]
        assert kube.phase(pending) == "Pending" and not pending["spec"].get("nodeName")
        assert node_status(installed) == unhealthy
        # nothing was mounted from the missing files, so nothing was made on the host in their place
        assert not any(os.path.lexists(f) for f in files), [f for f in files if os.path.lexists(f)]
        flows.delete_work(installed, watch)

        print(install_by_hand(installed, core))
        assert all(f.is_file() and not f.is_symlink() for f in files)
        assert files[1].read_text().strip() == str(files[0])
        # the same plugin process sees them (no restart) and reports the GPUs healthy again
        healthy = (flows.CAPACITY, flows.CAPACITY, [True] * workloads.GPU_COUNT)
        kube.wait_until("the GPUs healthy again", lambda: node_status(installed) == healthy)
        plugin = plugin_pod(installed)
        assert plugin["metadata"]["uid"] == plugin_uid
        assert all(s["restartCount"] == 0 for s in plugin["status"]["containerStatuses"])
        assert "HAMi-core's files are in place again" in plugin_log(installed)

        installed.apply(
            [workloads.pod("with-hami-core", limits=workloads.KINDS["memory"], labels={"phase": "hami-core"})]
        )
        watch.wait("the GPU pod running", flows.all_running({"with-hami-core"}))
        watch.wait("its readiness", lambda ps: flows.ready(ps["with-hami-core"]), timeout_s=60)
        flows.check_gpu_pod(installed, watch.snapshot()["with-hami-core"], hook_path=BARE)
        flows.delete_work(installed, watch)
    finally:
        restore_session_install(installed, values)
