# mypy: disable-error-code="union-attr,no-untyped-call,arg-type,index"
"""The Binding subresource as kube-apiserver's BindingREST does it, the write latency, the request
counts, and the API server and kube-scheduler emulation in processes of their own."""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from vgpu.core import errors
from vgpu.kube import aioapi
from vgpu.localcluster import apistats
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.serve import LocalProcess, parse_args
from vgpu.localcluster.store import Store


def pod_body(name: str, *, scheduler: str = "default-scheduler") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {"keep": "me"}},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "busybox"}]},
    }


@pytest.fixture
async def server(tmp_path: pathlib.Path) -> AsyncIterator[ApiServer]:
    async with ApiServer(Store()) as srv:
        yield srv


async def test_official_client_binding_carries_annotations_onto_the_pod(
    server: ApiServer, tmp_path: pathlib.Path
) -> None:
    client = kubernetes.config.new_client_from_config(
        config_file=str(server.write_kubeconfig(tmp_path / "kc"))
    )
    core = kubernetes.client.CoreV1Api(client)
    try:
        created = server.store.create("pods", pod_body("a"), namespace="default")
        binding = kubernetes.client.V1Binding(
            metadata=kubernetes.client.V1ObjectMeta(
                name="a", uid=created["metadata"]["uid"], annotations={"hami.io/bind-phase": "allocating"}
            ),
            target=kubernetes.client.V1ObjectReference(kind="Node", name="n1"),
        )
        await asyncio.to_thread(
            core.create_namespaced_pod_binding, "a", "default", binding, _preload_content=False
        )
        pod = await asyncio.to_thread(core.read_namespaced_pod, "a", "default")
        assert pod.spec.node_name == "n1"
        assert pod.metadata.annotations == {"keep": "me", "hami.io/bind-phase": "allocating"}
        assert [(c.type, c.status) for c in pod.status.conditions] == [("PodScheduled", "True")]
        with pytest.raises(ApiException) as exc:  # already bound: 409 naming the node
            await asyncio.to_thread(
                core.create_namespaced_pod_binding, "a", "default", binding, _preload_content=False
            )
        assert exc.value.status == 409
        assert 'pod a is already assigned to node "n1"' in json.loads(exc.value.body)["message"]
    finally:
        await asyncio.to_thread(client.close)


async def test_http_binding_honours_the_uid_precondition_and_refuses_garbage(server: ApiServer) -> None:
    server.store.create("pods", pod_body("a"), namespace="default")
    async with aioapi.AioKubeApi(server.url) as api:
        with pytest.raises(errors.Conflict, match="Precondition failed: UID"):
            await api.bind_pod("default", "a", node="n1", uid="someone-else", annotations={"x": "y"})
        assert not server.store.get("pods", "a", namespace="default")["spec"].get("nodeName")
        target = "/api/v1/namespaces/default/pods/a/binding"
        for notes, status in ((["x"], 400), ({"x": 1}, 422)):  # not a map: undecodable; not strings: invalid
            body = {"metadata": {"name": "a", "annotations": notes}, "target": {"name": "n1"}}
            with pytest.raises(errors.KubeError) as info:
                await api.request("POST", target, body=body)
            assert info.value.status == status and "annotations" in str(info.value)
        await api.bind_pod("default", "a", node="n1", annotations={"x": "y"})
        pod = await api.get("pods", "a", namespace="default")
    assert pod["spec"]["nodeName"] == "n1" and pod["metadata"]["annotations"] == {"keep": "me", "x": "y"}


def test_direct_binding_merges_annotations_and_checks_preconditions() -> None:
    store = Store()
    created = store.create("pods", pod_body("a"), namespace="default")
    with pytest.raises(errors.Conflict, match="ResourceVersion"):
        store.bind("default", "a", node="n1", resource_version="1")
    bound = store.bind(
        "default",
        "a",
        node="n1",
        resource_version=created["metadata"]["resourceVersion"],
        annotations={"k": "v"},
    )
    assert bound["metadata"]["annotations"] == {"keep": "me", "k": "v"}


async def test_write_latency_delays_writes_without_blocking_reads() -> None:
    async with (
        ApiServer(Store(), write_latency_s=30.0) as slow,
        aioapi.AioKubeApi(slow.url, user_agent="t/1") as api,
    ):
        write = asyncio.create_task(api.create("nodes", {"metadata": {"name": "n1"}}))
        listed = await asyncio.wait_for(api.list("nodes"), 10)  # answered while the write is held
        assert listed.items == [] and not write.done()
        write.cancel()
        await asyncio.gather(write, return_exceptions=True)
        counts = await api.request("GET", apistats.DEBUG_PATH)
        assert {"client": "t", "verb": "POST", "resource": "nodes", "count": 1} in counts["requests"]
        assert {"client": "t", "verb": "GET", "resource": "nodes", "count": 1} in counts["requests"]
        await api.request("DELETE", apistats.DEBUG_PATH)
        assert slow.stats.writes() == 0


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/default/pods/a/binding", "pods/binding"),
        ("/api/v1/namespaces/default/pods", "pods"),
        ("/api/v1/nodes/n1/status", "nodes/status"),
        ("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l", "leases"),
        ("/api/v1/namespaces/team-a", "namespaces"),
        ("/healthz", None),
        ("/api/v1", None),
    ],
)
def test_requests_are_counted_per_resource(path: str, resource: str | None) -> None:
    assert apistats.resource_of(path) == resource


def test_negative_write_latency_is_refused() -> None:
    with pytest.raises(ValueError, match="write latency"):
        apistats.RequestStats(write_latency_s=-1)
    with pytest.raises(SystemExit):
        parse_args(["apiserver", "--ready-file", "f", "--write-latency-ms", "-5"])
    with pytest.raises(SystemExit):
        parse_args(["kube-scheduler", "--ready-file", "f"])  # no --server, no --config


@pytest.mark.slow
async def test_api_server_and_kube_scheduler_in_processes_of_their_own(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "sched.yaml"
    config.write_text(yaml.safe_dump({"profiles": [{"schedulerName": "default-scheduler"}]}))
    async with LocalProcess.apiserver(write_latency_ms=5) as server:
        assert server.ready.startswith("http://127.0.0.1:")
        async with aioapi.AioKubeApi(server.ready) as api:
            node = {
                "metadata": {"name": "n1"},
                "status": {
                    "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
            await api.create("nodes", node)
            await api.merge_patch_status("nodes", "n1", {"status": node["status"]})
            async with LocalProcess.kube_scheduler(server=server.ready, config=config) as sched:
                assert sched.ready == "ready"
                created = await api.create("pods", pod_body("p"), namespace="default")
                rv = created["metadata"]["resourceVersion"]
                async with asyncio.timeout(30):
                    async for event in api.watch("pods", resource_version=rv, namespace="default"):
                        if event.object["spec"].get("nodeName"):
                            break
                assert event.object["spec"]["nodeName"] == "n1"
            counts = (await api.request("GET", apistats.DEBUG_PATH))["requests"]
    by_client = {(r["client"], r["verb"], r["resource"]) for r in counts}
    assert ("kube-scheduler", "POST", "pods/binding") in by_client
