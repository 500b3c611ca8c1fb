"""The cluster description and ``LocalCluster``: start, compose, tear down without leaks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kubernetes
import pytest
from vgpu.core import errors
from vgpu.localcluster import description
from vgpu.localcluster.kubelet import ALLOCATIONS_ANNOTATION

RES = "example.com/gpu"  # the test plugin's resource (conftest.Plugin)


def test_description_loads_nodes_labels_allocatable_and_gpus(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(
        """
nodes:
  - name: a
    labels: {zone: west}
    cpu: "16"
    gpus:
      - {model: NVIDIA A100-SXM4-40GB, memoryMib: 40960, numa: 1, uuid: GPU-fixed}
      - {name: NVIDIA T4, memoryMib: 15360, count: 2}
  - name: b
"""
    )
    desc = description.load(path)
    a, b = desc.nodes
    assert (a.name, dict(a.labels), a.allocatable["cpu"], a.allocatable["memory"]) == (
        "a",
        {"zone": "west"},
        "16",
        "128Gi",
    )
    assert [g["name"] for g in a.gpus] == ["NVIDIA A100-SXM4-40GB", "NVIDIA T4", "NVIDIA T4"]
    assert a.gpus[0]["uuid"] == "GPU-fixed" and a.gpus[0]["numa"] == 1
    uuids = [g["uuid"] for g in a.gpus]
    assert len(set(uuids)) == 3 and all(u.startswith("GPU-") for u in uuids)
    assert description.load(path).nodes[0].gpus == a.gpus  # derived uuids are stable
    assert b.gpus == () and desc.node("b") is b
    assert a.fake_gpus == {"gpus": [dict(g) for g in a.gpus]}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([], "description"),
        ({}, "nodes"),
        ({"nodes": []}, "nodes"),
        ({"nodes": ["a"]}, "nodes[0]"),
        ({"nodes": [{"name": "Bad_Name"}]}, "nodes[0].name"),
        ({"nodes": [{"name": "a", "colour": "red"}]}, "nodes[0]"),
        ({"nodes": [{"name": "a", "labels": {"x": 1}}]}, "nodes[0].labels"),
        ({"nodes": [{"name": "a", "cpu": "lots"}]}, "nodes[0].cpu"),
        ({"nodes": [{"name": "a", "gpus": {}}]}, "nodes[0].gpus"),
        ({"nodes": [{"name": "a", "gpus": [{"memoryMib": 1}]}]}, "nodes[0].gpus"),
        ({"nodes": [{"name": "a", "gpus": [{"model": "x", "memoryMib": -1}]}]}, "nodes[0].gpus"),
        (
            {"nodes": [{"name": "a", "gpus": [{"model": "x", "memoryMib": 1, "count": 0}]}]},
            "nodes[0].gpus[0].count",
        ),
        (
            {"nodes": [{"name": "a", "gpus": [{"model": "x", "memoryMib": 1, "count": 2, "uuid": "GPU-1"}]}]},
            "nodes[0].gpus[0].uuid",
        ),
        (
            {"nodes": [{"name": "a", "gpus": [{"model": "x", "name": "y", "memoryMib": 1}]}]},
            "nodes[0].gpus[0].model",
        ),
        ({"nodes": [{"name": "a"}, {"name": "a"}]}, "nodes"),
        (
            {
                "nodes": [
                    {"name": "a", "gpus": [{"model": "x", "memoryMib": 1, "uuid": "GPU-1"}]},
                    {"name": "b", "gpus": [{"model": "x", "memoryMib": 1, "uuid": "GPU-1"}]},
                ]
            },
            "nodes",
        ),
    ],
    ids=[
        "not-mapping",
        "no-nodes",
        "empty-nodes",
        "node-string",
        "bad-name",
        "unknown-key",
        "label-int",
        "bad-cpu",
        "gpus-mapping",
        "gpu-no-model",
        "gpu-negative-memory",
        "count-zero",
        "count-with-uuid",
        "model-and-name",
        "duplicate-node",
        "duplicate-uuid",
    ],
)
def test_description_garbage_is_a_config_error_naming_the_field(raw: Any, field: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        description.load(raw)
    assert info.value.field == field


def test_description_file_that_is_not_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("nodes: [unclosed")
    with pytest.raises(errors.ConfigError, match="cannot read the cluster description"):
        description.load(path)
    with pytest.raises(errors.ConfigError, match="cannot read"):
        description.load(tmp_path / "missing.yaml")


def _list_nodes_with_official_client(kubeconfig_path: str) -> list[Any]:
    client = kubernetes.config.new_client_from_config(config_file=kubeconfig_path)  # type: ignore[no-untyped-call]
    try:
        return list(kubernetes.client.CoreV1Api(client).list_node().items)
    finally:
        client.close()


async def test_cluster_serves_ready_nodes_and_a_kubeconfig_for_the_official_client(local_cluster):
    cluster = await local_cluster()
    nodes = await asyncio.to_thread(_list_nodes_with_official_client, str(cluster.kubeconfig_path))
    by_name = {n.metadata.name: n for n in nodes}
    assert set(by_name) == {"gpu-a", "gpu-b"}
    assert by_name["gpu-a"].metadata.labels["zone"] == "a"
    assert by_name["gpu-a"].metadata.labels["kubernetes.io/hostname"] == "gpu-a"
    assert [(c.type, c.status) for c in by_name["gpu-b"].status.conditions] == [("Ready", "True")]
    assert by_name["gpu-b"].status.allocatable["cpu"] == "32"
    for name, node_dir in cluster.node_dirs.items():
        assert (node_dir / "kubelet.sock").is_socket(), name
        assert len(str(node_dir / "vgpu.sock")) < 100
    assert cluster.kubelets["gpu-b"].node == "gpu-b"
    assert cluster.description.node("gpu-b").fake_gpus["gpus"][1]["name"] == "NVIDIA T4"


async def test_pod_goes_from_pending_to_running_on_the_node_that_has_the_device(
    local_cluster, plugins, env_for
):
    cluster = await local_cluster(scheduler_initial_backoff_s=0.05, scheduler_max_backoff_s=0.2)
    env = env_for(cluster.store)
    plugin = plugins([("dev-0", "Healthy"), ("dev-1", "Healthy")])
    await plugin.serve(cluster.node_dirs["gpu-b"], "vgpu.sock")
    await plugin.register(cluster.node_dirs["gpu-b"], endpoint="vgpu.sock")

    await env.add_pod("job", limits={RES: 2})
    pod = await env.wait_for("pods", "job", lambda p: p.get("status", {}).get("phase") == "Running")
    assert pod["spec"]["nodeName"] == "gpu-b"  # gpu-a has no example.com/gpu: Insufficient
    recorded = json.loads(pod["metadata"]["annotations"][ALLOCATIONS_ANNOTATION])
    assert recorded["c0"]["devices"] == ["dev-0", "dev-1"]
    assert plugin.allocate_calls == [[["dev-0", "dev-1"]]]


async def test_scheduler_can_be_restarted_with_a_new_configuration(local_cluster, env_for):
    cluster = await local_cluster(scheduler_name="custom")
    env = env_for(cluster.store)
    bad = {
        "extenders": [
            {"urlPrefix": "http://127.0.0.1:9/none", "filterVerb": "filter", "httpTimeout": "100ms"}
        ]
    }
    await cluster.start_scheduler(bad)
    await env.add_pod("p", scheduler="custom")
    event = await env.wait_event("p", reason="FailedScheduling")
    assert event["message"].startswith('Post "http://127.0.0.1:9/none/filter"')
    await cluster.start_scheduler(None)
    pod = await env.wait_for("pods", "p", lambda p: bool(p["spec"].get("nodeName")))
    assert pod["spec"]["nodeName"] in {"gpu-a", "gpu-b"}


async def test_teardown_leaves_no_sockets_dirs_or_open_port(local_cluster):
    cluster = await local_cluster()
    workdir, url = cluster.workdir, cluster.url
    host, port = url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.close()
    await writer.wait_closed()
    await cluster.__aexit__(None, None, None)
    assert not workdir.exists()
    with pytest.raises(OSError):
        await asyncio.open_connection(host, int(port))
    # the fixture's own __aexit__ runs again at the end: stopping twice must be harmless


async def test_throughput_300_pods_from_pending_to_running(local_cluster, plugins, env_for):
    """Scheduler + kubelet emulation on one node: 300 one-device pods (about 0.5 s on the 2-core dev box)."""
    count = 300
    cluster = await local_cluster({"nodes": [{"name": "big", "pods": 1000}]})
    env = env_for(cluster.store)
    plugin = plugins([(f"d{i}", "Healthy") for i in range(count)])
    await plugin.serve(cluster.node_dirs["big"], "p.sock")
    await plugin.register(cluster.node_dirs["big"], endpoint="p.sock")
    await env.wait_for(
        "nodes", "big", lambda n: n["status"]["allocatable"].get(RES) == str(count), namespace=None
    )
    listed = await cluster.api.list("pods", namespace="default")
    loop = asyncio.get_running_loop()
    started = loop.time()
    for i in range(count):
        await env.add_pod(f"p{i}", limits={RES: 1})
    running: set[str] = set()
    async with asyncio.timeout(30):
        async for event in cluster.api.watch(
            "pods", resource_version=listed.resource_version, namespace="default"
        ):
            if event.object.get("status", {}).get("phase") == "Running":
                running.add(event.object["metadata"]["name"])
            if len(running) == count:
                break
    elapsed = loop.time() - started
    assert len(plugin.allocate_calls) == count
    assert len({ids[0][0] for ids in plugin.allocate_calls}) == count  # no device handed out twice
    assert elapsed < 20, f"{count} pods took {elapsed:.1f}s"
