"""End to end on the local cluster, with the chart's own files: the API server runs the rendered
MutatingWebhookConfiguration (its Service reference turned into the URL of our free port, the CA of
a throwaway certificate as caBundle), kube-scheduler's emulation runs the rendered
KubeSchedulerConfiguration (only the port substituted), our scheduler service runs the rendered
config file over HTTPS as the chart's container does, and a node reports its GPU and Lease through
the device plugin's real reporter. A plain GPU pod must be mutated by the webhook, then filtered and
bound through the extender entry, with the GPU accounting annotations written."""

from __future__ import annotations

import asyncio
import base64
import ssl
import urllib.parse

import pytest
from vgpu.core import annotations as hami
from vgpu.core import config
from vgpu.core.device import Gpu, GpuUuid
from vgpu.kube import informer
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.cluster import LocalCluster

from tests.deploy import rendering

trustme = pytest.importorskip("trustme")
reporter = pytest.importorskip("vgpu_device_plugin.reporter")
app = pytest.importorskip("vgpu_scheduler.app")

NODE = "gpu-node-1"
GPU = Gpu(
    uuid=GpuUuid("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"),
    index=0,
    count=10,
    memory_mib=40960,
    cores=100,
    type="NVIDIA-A100-SXM4-40GB",
)


def _serving_context(names: list[str]) -> tuple[ssl.SSLContext, bytes]:
    """A throwaway CA and serving certificate, like the certgen Job's; (server context, CA PEM)."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names, "127.0.0.1").configure_cert(context)
    return context, ca.cert_pem.bytes()


async def _bound(api: KubeApi, namespace: str, name: str, timeout_s: float) -> JsonObj:
    """The pod once it has a node (watched, not polled); TimeoutError after ``timeout_s``."""
    done = asyncio.Event()

    def on_event(change: informer.Change) -> None:
        meta = change.object["metadata"]
        if meta["name"] == name and change.object.get("spec", {}).get("nodeName"):
            done.set()

    pods = informer.Informer(api, "pods", namespace=namespace, on_event=on_event)
    task = asyncio.create_task(pods.run())
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
        obj = pods.get(namespace, name)
        assert obj is not None
        return obj
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_gpu_pod_is_filtered_and_bound_through_the_charts_extender_entry():
    rendered = rendering.render()
    ksc = rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-kube-scheduler"))
    cfg = config.load(rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")))
    cert = rendered.one("Job", f"{rendering.FULLNAME}-certgen-create")["spec"]["template"]["spec"]
    hosts = next(a for a in cert["containers"][0]["args"] if a.startswith("--host=")).partition("=")[2]
    context, ca_pem = _serving_context([h for h in hosts.split(",") if h != "127.0.0.1"])
    webhook_config = rendered.one("MutatingWebhookConfiguration")
    description = {"nodes": [{"name": NODE, "gpus": []}]}
    async with LocalCluster(
        description,
        scheduler_name=cfg.scheduler.scheduler_name,
        scheduler_initial_backoff_s=0.1,
        scheduler_max_backoff_s=0.5,
    ) as cluster:
        service = app.SchedulerService(cfg, cluster.api)
        try:
            address = await service.start(host="127.0.0.1", port=0, ssl_context=context)
            node_reporter = reporter.NodeReporter(
                cluster.api,
                node=NODE,
                keys=hami.Keys(cfg.annotation_prefix),
                lease_namespace=cfg.scheduler.lease_namespace,
                lease_duration_s=int(cfg.scheduler.lease_timeout_s),
                register_interval_s=cfg.device_plugin.register_interval_s,
            )
            await node_reporter.publish([GPU])
            await node_reporter.renew_lease()
            await service.wait_ready()

            (extender,) = ksc["extenders"]
            url = urllib.parse.urlsplit(extender["urlPrefix"])
            port = address.rpartition(":")[2]
            extender_port = service.extender_address.rpartition(":")[2]
            extender["urlPrefix"] = url._replace(netloc=f"{url.hostname}:{extender_port}").geturl()
            await cluster.start_scheduler(ksc)
            (hook,) = webhook_config["webhooks"]
            service_ref = hook["clientConfig"].pop("service")
            hook["clientConfig"]["url"] = f"https://127.0.0.1:{port}{service_ref['path']}"
            hook["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
            cluster.server.add_mutating_webhooks(webhook_config)

            limits = {cfg.resources.count: "1", cfg.resources.memory: "3000", cfg.resources.cores: "30"}
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "share-me", "namespace": "default"},
                # no schedulerName: the webhook must send the pod to our profile
                "spec": {"containers": [{"name": "cuda", "image": "cuda", "resources": {"limits": limits}}]},
            }
            # a client whose creates go through the API server's admission chain, as kubectl's do
            user = LocalKubeApi(cluster.store, admission=cluster.server.admission)
            await user.create("pods", pod, namespace="default")
            bound = await _bound(cluster.api, "default", "share-me", timeout_s=30)
        finally:
            await cluster.stop_scheduler()
            await service.stop()

    assert bound["spec"]["nodeName"] == NODE
    assert bound["spec"]["schedulerName"] == ksc["profiles"][0]["schedulerName"]
    keys = hami.Keys(cfg.annotation_prefix)
    notes = bound["metadata"]["annotations"]
    assert notes[keys.assigned_node] == NODE
    assert notes[keys.devices_allocated].startswith(f"{GPU.uuid},NVIDIA,3000,30:")
    assert notes[keys.bind_phase] == "allocating"
