"""The update guard end to end on the local cluster, with the chart's own files: the API server runs
the rendered MutatingWebhookConfiguration and ValidatingWebhookConfiguration (Service reference
turned into our free port), authenticates three bearer tokens (the scheduler's and the device
plugin's service accounts as the chart names them, and a user), and every client talks HTTP with
its own token through the official kubernetes client. The scheduler places a GPU pod, writing its
decision as itself; the user then cannot rewrite it, nor forge a node lock, but may relabel the pod."""

from __future__ import annotations

import base64
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from vgpu.core import annotations as hami
from vgpu.core import config, errors
from vgpu.kube.client import OfficialKubeApi
from vgpu.localcluster.cluster import LocalCluster

from tests.deploy import rendering
from tests.deploy.test_chart_e2e import GPU, NODE, _bound, _serving_context

reporter = pytest.importorskip("vgpu_device_plugin.reporter")
app = pytest.importorskip("vgpu_scheduler.app")

NS = rendering.NAMESPACE
SCHEDULER: dict[str, Any] = {
    "username": f"system:serviceaccount:{NS}:{rendering.FULLNAME}-scheduler",
    "groups": [],
}
PLUGIN: dict[str, Any] = {
    "username": f"system:serviceaccount:{NS}:{rendering.FULLNAME}-device-plugin",
    "groups": [],
}
ALICE = {"username": "alice", "groups": ["system:authenticated"]}
USERS = {"tok-scheduler": SCHEDULER, "tok-plugin": PLUGIN, "tok-alice": ALICE}


def _point_at(configuration: dict[str, Any], port: str, ca_pem: bytes) -> dict[str, Any]:
    for hook in configuration["webhooks"]:
        service = hook["clientConfig"].pop("service")
        hook["clientConfig"]["url"] = f"https://127.0.0.1:{port}{service['path']}"
        hook["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
    return configuration


async def _refused(call: Any) -> str:
    with pytest.raises(errors.KubeError) as exc:
        await call
    assert exc.value.status == 403, exc.value
    return str(exc.value)


@pytest.mark.slow
async def test_a_user_cannot_rewrite_a_gpu_decision_but_the_services_can(tmp_path: Path) -> None:
    rendered = rendering.render()
    ksc = rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-kube-scheduler"))
    cfg = config.load(rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")))
    assert SCHEDULER["username"] in cfg.webhook.trusted_users
    assert PLUGIN["username"] in cfg.webhook.node_bound_users
    cert = rendered.one("Job", f"{rendering.FULLNAME}-certgen-create")["spec"]["template"]["spec"]
    hosts = next(a for a in cert["containers"][0]["args"] if a.startswith("--host=")).partition("=")[2]
    context, ca_pem = _serving_context([h for h in hosts.split(",") if h != "127.0.0.1"])
    keys = hami.Keys(cfg.annotation_prefix)
    clients: list[OfficialKubeApi] = []
    async with LocalCluster(
        {"nodes": [{"name": NODE, "gpus": []}]},
        scheduler_name=cfg.scheduler.scheduler_name,
        scheduler_initial_backoff_s=0.1,
        scheduler_max_backoff_s=0.5,
        users=USERS,
    ) as cluster:

        def client(token: str) -> OfficialKubeApi:
            path = cluster.server.write_kubeconfig(tmp_path / token, token=token)
            clients.append(OfficialKubeApi.from_kubeconfig(str(path)))
            return clients[-1]

        scheduler_api, plugin_api, alice = client("tok-scheduler"), client("tok-plugin"), client("tok-alice")
        service = app.SchedulerService(cfg, scheduler_api)
        try:
            address = await service.start(host="127.0.0.1", port=0, ssl_context=context)
            port = address.rpartition(":")[2]
            cluster.server.add_mutating_webhooks(
                _point_at(rendered.one("MutatingWebhookConfiguration"), port, ca_pem)
            )
            cluster.server.add_validating_webhooks(
                _point_at(rendered.one("ValidatingWebhookConfiguration"), port, ca_pem)
            )
            node_reporter = reporter.NodeReporter(
                plugin_api,
                node=NODE,
                keys=keys,
                lease_namespace=cfg.scheduler.lease_namespace,
                lease_duration_s=int(cfg.scheduler.lease_timeout_s),
                register_interval_s=cfg.device_plugin.register_interval_s,
            )
            await node_reporter.publish([GPU])  # the device plugin writes the node register: allowed
            await node_reporter.renew_lease()
            await service.wait_ready()
            (extender,) = ksc["extenders"]
            url = urllib.parse.urlsplit(extender["urlPrefix"])
            extender_port = service.extender_address.rpartition(":")[2]  # the loopback listener
            extender["urlPrefix"] = url._replace(netloc=f"{url.hostname}:{extender_port}").geturl()
            await cluster.start_scheduler(ksc)

            limits = {cfg.resources.count: "1", cfg.resources.memory: "3000", cfg.resources.cores: "30"}
            pod = {
                "metadata": {"name": "share-me", "labels": {"app": "train"}},
                "spec": {"containers": [{"name": "cuda", "image": "cuda", "resources": {"limits": limits}}]},
            }
            await alice.create("pods", pod, namespace="default")
            bound = await _bound(cluster.api, "default", "share-me", timeout_s=30)
            decision = bound["metadata"]["annotations"]
            assert decision[keys.devices_to_allocate].startswith(
                f"{GPU.uuid},NVIDIA,3000,30:"
            )  # written by the scheduler (in its Binding)

            forged = decision[keys.devices_to_allocate].replace(",3000,30:", ",40960,100:")
            message = await _refused(
                alice.merge_patch(
                    "pods",
                    "share-me",
                    {"metadata": {"annotations": {keys.devices_to_allocate: forged}}},
                    namespace="default",
                )
            )
            assert (
                "denied the request: pod default/share-me: annotation hami.io/vgpu-devices-to-allocate"
                in message
            )
            assert "alice may not change it (allowed: users " in message
            assert SCHEDULER["username"] in message and PLUGIN["username"] in message
            shrunk = {keys.devices_allocated: "", keys.assigned_node: None}
            message = await _refused(
                alice.merge_patch(
                    "pods", "share-me", {"metadata": {"annotations": shrunk}}, namespace="default"
                )
            )
            assert (
                "annotation hami.io/vgpu-node, annotation hami.io/vgpu-devices-allocated are written"
                in message
            )
            after = await cluster.api.get("pods", "share-me", namespace="default")
            assert after["metadata"]["annotations"] == decision

            relabelled = await alice.merge_patch(
                "pods",
                "share-me",
                {"metadata": {"labels": {"app": "serve"}, "annotations": {"mine": "1"}}},
                namespace="default",
            )
            assert relabelled["metadata"]["labels"]["app"] == "serve"

            # the services' own writes pass: the plugin reports success, the scheduler patches the pod,
            # takes a node lock, the plugin releases it
            await plugin_api.merge_patch(
                "pods",
                "share-me",
                {"metadata": {"annotations": {keys.bind_phase: "success"}}},
                namespace="default",
            )
            patched = await scheduler_api.merge_patch(
                "pods",
                "share-me",
                {"metadata": {"annotations": {keys.bind_time: "1700000000"}}},
                namespace="default",
            )
            assert patched["metadata"]["annotations"][keys.bind_phase] == "success"
            assert patched["metadata"]["annotations"][keys.bind_time] == "1700000000"
            lock = "2026-01-01T00:00:00Z,default,other-pod"
            message = await _refused(
                alice.merge_patch("nodes", NODE, {"metadata": {"annotations": {keys.node_lock: lock}}})
            )
            assert f"node {NODE}: annotation hami.io/mutex.lock is written" in message
            await scheduler_api.merge_patch(
                "nodes", NODE, {"metadata": {"annotations": {keys.node_lock: lock}}}
            )
            await plugin_api.merge_patch("nodes", NODE, {"metadata": {"annotations": {keys.node_lock: None}}})
            node = await cluster.api.get("nodes", NODE)
            assert keys.node_lock not in node["metadata"].get("annotations", {})
        finally:
            await cluster.stop_scheduler()
            await service.stop()
            for c in clients:
                await c.close()
