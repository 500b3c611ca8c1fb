"""The node's DRA path on the real runtime, before any kube-vgpu part: kubelet v1.36 + containerd 1.7
(CDI on) + runc on cgroup v1. A stand-in DRA driver (``drastandin``) registers with the real
kubelet; kube-scheduler allocates its one device to a ResourceClaim; kubelet calls its
NodePrepareResources, gets a CDI device id and hands it to containerd, which applies the
hand-written CDI spec in /var/run/cdi: the container sees the spec's env and mount. When the pod
goes, kubelet calls NodeUnprepareResources.

On containerd 1.6 (no CDI) the container starts without either (containerd cannot resolve the
id), so the test is skipped there, naming the remedy."""

from __future__ import annotations

import pathlib

import pytest

from tests.realcluster import drastandin, kube, workloads

pytestmark = [pytest.mark.realcluster, pytest.mark.slow, pytest.mark.timeout(600)]

NODE = "kvgpu-node"
NAMESPACE = "cdi-probe"
CDI_DIR = pathlib.Path("/var/run/cdi")


def test_a_dra_claims_cdi_device_reaches_the_container(cluster: kube.Cluster) -> None:
    if not cluster.cdi_enabled():
        pytest.skip(
            "containerd has no CDI (1.6): set VGPU_CONTAINERD_BIN to a containerd 1.7 "
            "(scripts/cluster/containerd-cdi.sh unpacks Debian 13's into /opt/containerd-1.7)"
        )
    host_file = cluster.dir / "cdi-probe.txt"
    host_file.write_text("mounted-by-cdi\n")
    spec = drastandin.write_spec(
        drastandin.cdi_spec(env={"CDI_PROBE": "from-the-cdi-spec"}, mounts={host_file: "/etc/cdi-probe"}),
        cdi_dir=CDI_DIR,
    )
    driver = drastandin.Driver(kubelet_root=cluster.kubelet_root, node=NODE)
    driver.start()
    try:
        assert driver.calls.registered.wait(60), "kubelet never registered the stand-in DRA driver"
        cluster.kubectl("create", "namespace", NAMESPACE)
        kube.wait_until(
            "the namespace's default service account",
            lambda: "default" in cluster.kubectl("get", "sa", "-n", NAMESPACE, "-o", "name", check=False),
        )
        cluster.apply(drastandin.objects(node=NODE, namespace=NAMESPACE, claim="probe"))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe", "namespace": NAMESPACE},
            "spec": {
                "resourceClaims": [{"name": "dev", "resourceClaimName": "probe"}],
                "containers": [
                    {
                        "name": "main",
                        "image": workloads.IMAGE,
                        "imagePullPolicy": "Never",
                        "command": [
                            "sh",
                            "-c",
                            "echo CDI_PROBE=$CDI_PROBE; cat /etc/cdi-probe; exec sleep 3600",
                        ],
                        "resources": {"claims": [{"name": "dev"}]},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        }
        cluster.apply([pod])
        kube.wait_until(
            "the probe pod's log",
            lambda: "mounted-by-cdi" in cluster.kubectl("logs", "-n", NAMESPACE, "probe", check=False),
            timeout_s=120,
        )
        log = cluster.kubectl("logs", "-n", NAMESPACE, "probe")
        assert "CDI_PROBE=from-the-cdi-spec" in log, log
        claim = cluster.get("resourceclaim", "-n", NAMESPACE, "probe")
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"], r["device"]) for r in results] == [
            (drastandin.DRIVER, NODE, drastandin.DEVICE)
        ]
        assert driver.calls.prepared == ["probe"]
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, "probe", "--wait=true")
        kube.wait_until("kubelet's NodeUnprepareResources", lambda: driver.calls.unprepared == ["probe"])
    finally:
        driver.stop()
        spec.unlink(missing_ok=True)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        for kind, name in (
            ("resourceslice", f"{NODE}-{drastandin.DRIVER}"),
            ("deviceclass", drastandin.DRIVER),
        ):
            cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
