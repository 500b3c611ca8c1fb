"""Faults of the real parts, with the chart installed (after test_chart_on_cluster.py in the same
session): kubelet restarted, the plugin's pod deleted, the scheduler's pod deleted during a stream
of GPU pods, the node drained and uncordoned. At every pod change no GPU is overcommitted (the
``watch`` fixture), and every pod that fits ends up Running."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.realcluster import flows, kube, workloads
from tests.realcluster.flows import CAPACITY, NODE, RELEASE_NS
from tests.realcluster.kube import phase

# kubelet's log line for a device plugin's Register call
REGISTERED = 'Got registration request from device plugin with resource" resourceName="nvidia.com/gpu"'

pytestmark = [pytest.mark.realcluster, pytest.mark.slow, pytest.mark.timeout(1200)]


def _running_identity(pods: dict[str, kube.Obj], names: set[str]) -> dict[str, tuple[str, int]]:
    out = {}
    for name in names:
        status = pods[name]["status"]["containerStatuses"][0]
        out[name] = (status["containerID"], status["restartCount"])
    return out


def _start(cluster: kube.Cluster, watch: kube.PodWatch, prefix: str, kinds: list[str]) -> set[str]:
    pods = workloads.mixed(prefix, kinds, labels={"phase": prefix})
    cluster.apply(pods)
    names = {p["metadata"]["name"] for p in pods}
    watch.wait(f"{prefix} pods running", flows.all_running(names))
    return names


def test_kubelet_restart_keeps_pods_and_the_plugin_registers_again(
    installed: kube.Cluster, watch: kube.PodWatch
) -> None:
    before = _start(installed, watch, "pre-restart", ["memory", "cores", "two-gpu"])
    identity = _running_identity(watch.snapshot(), before)
    plugin_uid = flows.component_pods(installed, "device-plugin")[0]["metadata"]["uid"]
    log = installed.dir / "logs" / "kubelet.log"
    registrations = log.read_text().count(REGISTERED)
    started = time.monotonic()
    installed.script("cluster.sh", "restart-kubelet")
    # kubelet removed the plugin's socket at its start; the plugin serves a new one and registers
    kube.wait_until("the plugin registered again", lambda: log.read_text().count(REGISTERED) > registrations)
    registered_s = time.monotonic() - started
    kube.wait_until("nvidia.com/gpu back on the node", lambda: flows.capacity(installed) == CAPACITY)
    print(f"\nkubelet restart -> plugin registered again: {registered_s:.1f} s")
    assert flows.component_pods(installed, "device-plugin")[0]["metadata"]["uid"] == plugin_uid
    assert _running_identity(watch.snapshot(), before) == identity  # untouched
    after = _start(installed, watch, "post-restart", ["memory", "percent"])
    for name in after:
        flows.check_gpu_pod(installed, watch.snapshot()[name])
    flows.delete_work(installed, watch)


def test_the_daemonset_brings_a_deleted_plugin_back_and_allocate_works(
    installed: kube.Cluster, watch: kube.PodWatch
) -> None:
    old = flows.component_pods(installed, "device-plugin")[0]["metadata"]["name"]
    installed.kubectl("delete", "pod", "-n", RELEASE_NS, old, "--wait=true")
    kube.wait_until(
        "a new plugin pod Ready",
        lambda: (
            flows.component_ready(installed, "device-plugin")
            and flows.component_pods(installed, "device-plugin")[0]["metadata"]["name"] != old
        ),
    )
    kube.wait_until("nvidia.com/gpu on the node", lambda: flows.capacity(installed) == CAPACITY)
    names = _start(installed, watch, "new-plugin", ["memory", "exclusive"])
    for name in names:
        flows.check_gpu_pod(installed, watch.snapshot()[name])
    flows.delete_work(installed, watch)


def test_a_stream_of_gpu_pods_survives_the_scheduler_pod_deleted(
    installed: kube.Cluster, watch: kube.PodWatch
) -> None:
    """Creates are retried while the webhook is away (failurePolicy Fail refuses them then), as a
    controller retries; every pod created runs, none overcommitted."""
    pods = workloads.mixed("stream", (workloads.MIX * 2)[:24], labels={"phase": "stream"})
    refused: list[str] = []

    def create_all() -> None:
        for pod in pods:
            deadline = time.monotonic() + 180
            while True:
                out = installed.kubectl("apply", "-f", "-", stdin=json.dumps(pod), check=False)
                if "created" in out or "unchanged" in out or "configured" in out:
                    break
                refused.append(out.strip())
                assert time.monotonic() < deadline, out
                time.sleep(1)  # a retry interval, as a controller's backoff

    creator = threading.Thread(target=create_all)
    creator.start()
    watch.wait("the stream started", lambda ps: len(ps) >= 4)
    old = flows.component_pods(installed, "scheduler")[0]["metadata"]["name"]
    installed.kubectl("delete", "pod", "-n", RELEASE_NS, old, "--wait=false")
    creator.join(300)
    assert not creator.is_alive()
    names = {p["metadata"]["name"] for p in pods}
    watch.wait("every streamed pod running", flows.all_running(names), timeout_s=600)
    print(f"\ncreates refused while the scheduler pod was replaced: {len(refused)}")
    assert flows.component_pods(installed, "scheduler")[0]["metadata"]["name"] != old
    flows.delete_work(installed, watch)


def test_drain_and_uncordon(installed: kube.Cluster, watch: kube.PodWatch) -> None:
    before = _start(installed, watch, "pre-drain", ["memory", "two-gpu"])
    installed.kubectl(
        "drain", NODE, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=180s",
        timeout_s=240,
    )  # fmt: skip
    watch.wait("the bare GPU pods evicted", lambda ps: not (before & set(ps)))
    assert installed.get("node", NODE)["spec"].get("unschedulable") is True
    installed.kubectl("uncordon", NODE)
    kube.wait_until("the scheduler back", lambda: flows.component_ready(installed, "scheduler"))
    kube.wait_until("nvidia.com/gpu on the node", lambda: flows.capacity(installed) == CAPACITY)
    after = _start(installed, watch, "post-drain", ["memory", "percent", "two-gpu"])
    for name in after:
        assert phase(watch.snapshot()[name]) == "Running"
    flows.delete_work(installed, watch)
