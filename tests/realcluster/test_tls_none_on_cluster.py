"""The chart's other offline TLS mode, ``none`` (plain HTTP, no webhook; the update guard as a
ValidatingAdmissionPolicy), after the ``secret``
install of the other modules: uninstalled, installed again, and a GPU pod that names the scheduler
itself runs through kube-scheduler, the extender and Allocate. (``certgen`` and ``certManager`` need
an image or a controller from a registry this machine cannot reach.)"""

from __future__ import annotations

import pytest

from tests.realcluster import flows, kube, workloads

pytestmark = [pytest.mark.realcluster, pytest.mark.slow, pytest.mark.timeout(900)]


def test_tls_none_installs_and_gpu_pods_that_name_the_scheduler_run(
    installed: kube.Cluster, watch: kube.PodWatch
) -> None:
    flows.install(installed, "--uninstall")
    kube.wait_until(
        "the release's pods gone", lambda: not installed.get("pods", "-n", flows.RELEASE_NS)["items"]
    )
    flows.install(installed, "--tls", "none")
    assert not installed.get("mutatingwebhookconfigurations")["items"]
    policies = installed.get("validatingadmissionpolicies")["items"]  # the guard without a webhook
    assert {p["metadata"]["name"] for p in policies} >= {
        "gpu-kube-vgpu-guard-pods",
        "gpu-kube-vgpu-guard-nodes",
    }
    kube.wait_until("the device plugin Ready", lambda: flows.component_ready(installed, "device-plugin"))
    kube.wait_until("the scheduler Ready", lambda: flows.component_ready(installed, "scheduler"))
    kube.wait_until("nvidia.com/gpu on the node", lambda: flows.capacity(installed) == flows.CAPACITY)
    pod = workloads.pod("plain-http", limits=workloads.KINDS["cores"], labels={"phase": "tls-none"})
    pod["spec"]["schedulerName"] = "vgpu-scheduler"  # no webhook sets it now
    installed.apply([pod])
    watch.wait("the pod running", flows.all_running({"plain-http"}))
    watch.wait("its readiness", lambda ps: flows.ready(ps["plain-http"]), timeout_s=60)
    flows.check_gpu_pod(installed, watch.snapshot()["plain-http"])
    flows.delete_work(installed, watch)
