# mypy: disable-error-code="no-untyped-call"
# (the official client is untyped)
"""``kubectl get`` against the emulated API server: Tables over real HTTP, asked for by the official
client's raw request as kubectl asks, and by kubectl itself when one is installed."""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import kubernetes
import pytest
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

KUBECTL_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
    "application/json"
)


class Server:
    def __init__(self, store: Store, client: Any, kubeconfig: pathlib.Path) -> None:
        self.store = store
        self.client = client
        self.kubeconfig = kubeconfig

    async def get(self, path: str, *, accept: str = KUBECTL_ACCEPT, **query: str) -> tuple[int, Any]:
        status, body = await self.raw(path, accept=accept, **query)
        return status, json.loads(body)

    async def raw(self, path: str, *, accept: str = KUBECTL_ACCEPT, **query: str) -> tuple[int, bytes]:
        def call() -> tuple[int, bytes]:
            request = self.client.param_serialize(
                method="GET",
                resource_path=path,
                query_params=list(query.items()),
                header_params={"Accept": accept},
                auth_settings=["BearerToken"],
            )
            try:
                resp = self.client.call_api(*request)
            except kubernetes.client.exceptions.ApiException as exc:
                return exc.status, (exc.body or "null").encode()
            return resp.status, resp.read()

        return await asyncio.to_thread(call)


@pytest.fixture
async def server(tmp_path: pathlib.Path) -> AsyncIterator[Server]:
    store = Store()
    api = ApiServer(store)
    await api.start()
    path = api.write_kubeconfig(tmp_path / "kubeconfig")
    client = kubernetes.config.new_client_from_config(config_file=str(path))
    store.create(
        "nodes",
        {
            "metadata": {"name": "gpu-node-0"},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": "v1.30.0"},
            },
        },
    )
    for name, node in (("runs", "gpu-node-0"), ("waits", None)):
        pod: dict[str, Any] = {
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        if node:
            pod["spec"]["nodeName"] = node
        store.create("pods", pod, namespace="default")
    store.create(
        "leases",
        {"metadata": {"name": "vgpu-device-plugin-gpu-node-0"}, "spec": {"holderIdentity": "gpu-node-0"}},
        namespace="kube-system",
    )
    store.create(
        "events",
        {
            "metadata": {"name": "waits.1"},
            "involvedObject": {"kind": "Pod", "name": "waits", "namespace": "default"},
            "type": "Warning",
            "reason": "FailedScheduling",
            "message": "0/1 nodes are available",
            "count": 1,
        },
        namespace="default",
    )
    try:
        yield Server(store, client, path)
    finally:
        await asyncio.to_thread(client.close)
        await api.stop()


async def test_a_list_asked_as_kubectl_asks_is_a_table_of_the_real_columns(server: Server) -> None:
    status, table = await server.get("/api/v1/namespaces/default/pods")
    assert status == 200 and (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in table["columnDefinitions"]][:5] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    rows = {r["cells"][0]: r for r in table["rows"]}
    assert set(rows) == {"runs", "waits"}
    assert rows["runs"]["cells"][6] == "gpu-node-0" and rows["waits"]["cells"][6] == "<none>"
    meta = rows["runs"]["object"]
    assert meta["kind"] == "PartialObjectMetadata" and meta["metadata"]["namespace"] == "default"
    assert table["metadata"]["resourceVersion"] == str(server.store.list("pods").resource_version)


@pytest.mark.parametrize(
    ("path", "first_row"),
    [
        ("/api/v1/nodes", ["gpu-node-0", "Ready", "<none>"]),
        ("/api/v1/events", ["<unknown>", "Warning", "FailedScheduling", "pod/waits"]),
        (
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
            ["vgpu-device-plugin-gpu-node-0", "gpu-node-0"],
        ),
        ("/api/v1/namespaces/default/pods/waits", ["waits", "0/1", "Pending"]),  # a get is a one-row Table
    ],
)
async def test_nodes_events_leases_and_a_single_pod(server: Server, path: str, first_row: list[str]) -> None:
    status, table = await server.get(path)
    assert status == 200 and table["kind"] == "Table"
    assert table["rows"][0]["cells"][: len(first_row)] == first_row


async def test_plain_json_is_unchanged_and_include_object_is_checked(server: Server) -> None:
    status, listed = await server.get("/api/v1/namespaces/default/pods", accept="application/json")
    assert status == 200 and listed["kind"] == "PodList"
    status, table = await server.get("/api/v1/nodes", includeObject="Object")
    assert status == 200 and table["rows"][0]["object"]["kind"] == "Node"
    status, body = await server.get("/api/v1/nodes", includeObject="All")
    assert status == 400 and body["kind"] == "Status" and "includeObject" in body["message"]


async def test_a_watch_asked_as_kubectl_asks_streams_one_row_tables(server: Server) -> None:
    """`kubectl get -w`: every event's object is a one-row Table, the column definitions in the first."""
    status, body = await server.raw(
        "/api/v1/namespaces/default/pods", watch="true", resourceVersion="1", timeoutSeconds="1"
    )
    events = [json.loads(line) for line in body.splitlines()]
    assert status == 200 and [e["type"] for e in events] == ["ADDED", "ADDED"]
    first, second = (e["object"] for e in events)
    assert first["kind"] == "Table" and first["columnDefinitions"][0]["name"] == "Name"
    assert second["kind"] == "Table" and second["columnDefinitions"] == []
    assert [first["rows"][0]["cells"][0], second["rows"][0]["cells"][0]] == ["runs", "waits"]
    rv = second["rows"][0]["object"]["metadata"]["resourceVersion"]
    assert second["metadata"]["resourceVersion"] == rv
    status, body = await server.raw(
        "/api/v1/namespaces/default/pods", accept="application/json", watch="true", timeoutSeconds="0"
    )
    assert status == 200  # a plain watch is unchanged (the other watch tests cover it)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl (Debian: kubernetes-client)")
async def test_kubectl_prints_the_columns_of_a_real_server(server: Server) -> None:
    def kubectl(*args: str) -> str:
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={server.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "Unable to decode" not in result.stderr, result.stderr
        return result.stdout

    pods = (await asyncio.to_thread(kubectl, "get", "pods", "-o", "wide")).splitlines()
    assert pods[0].split() == [
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "IP",
        "NODE",
        "NOMINATED",
        "NODE",
        "READINESS",
        "GATES",
    ]
    assert pods[1].split()[:2] == ["runs", "0/1"] and "gpu-node-0" in pods[1]
    nodes = (await asyncio.to_thread(kubectl, "get", "nodes")).splitlines()
    assert nodes[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert nodes[1].split()[:3] == ["gpu-node-0", "Ready", "<none>"] and nodes[1].split()[-1] == "v1.30.0"
    leases = (await asyncio.to_thread(kubectl, "get", "leases", "-A")).splitlines()
    assert leases[0].split() == ["NAMESPACE", "NAME", "HOLDER", "AGE"]
    events = await asyncio.to_thread(kubectl, "get", "events")
    assert "pod/waits" in events and "FailedScheduling" in events

    def watch() -> str:
        proc = subprocess.Popen(
            ["kubectl", f"--kubeconfig={server.kubeconfig}", "get", "pods", "-w"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]  # the header and both pods, then it waits
        proc.kill()
        proc.communicate()
        return "".join(lines)

    watched = (await asyncio.to_thread(watch)).splitlines()
    assert watched[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], watched
    assert [line.split()[0] for line in watched[1:]] == ["runs", "waits"]
