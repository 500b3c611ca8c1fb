"""The extender's untrusted ExtenderArgs: the node list the filter reads is the one made safe, whatever
spelling of its keys a body uses (Go decodes keys case-insensitively)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from vgpu.core import annotations
from vgpu_scheduler import extender, untrusted

from tests.scheduler.scenario import Cluster, gpu_container, gpus

KEYS = annotations.KEYS
CACHED = {"metadata": {"name": "node-b", "annotations": {KEYS.node_register: "ours"}}}
FORGED = {"metadata": {"name": "node-b", "annotations": {KEYS.node_register: "forged"}}}
POD = {"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}}


@pytest.mark.parametrize(
    "body",
    [
        {"Pod": POD, "nodes": {"items": [CACHED]}, "Nodes": {"items": [FORGED]}},
        {"Pod": POD, "nodenames": ["node-b"], "NodeNames": None, "Nodes": {"items": [FORGED]}},
        {"Pod": POD, "NodeNames": None, "nodes": {"items": [FORGED]}},
    ],
    ids=["decoy-nodes-first", "decoy-nodenames-first", "lowercase-only"],
)
def test_the_node_list_the_filter_reads_is_the_one_sanitised(body: dict[str, Any]) -> None:
    """``names_only`` must pick keys as ``extender.parse_args`` does (exact spelling first, then the
    first case-insensitive match), or a decoy key gets cleaned and the forged list is read."""
    cleaned, _ = untrusted.names_only(body, lambda name: CACHED if name == "node-b" else None)
    assert extender.parse_args(cleaned).nodes == [CACHED]


def _lying_node(cluster: Cluster, name: str) -> dict[str, Any]:
    node = cluster.node(name)
    node["metadata"]["annotations"][KEYS.node_register] = annotations.encode_node_register(
        gpus(name, 1, memory=40000)
    )
    return node


@pytest.mark.parametrize("decoy", ["nodes", "nodenames"])
async def test_a_decoy_key_does_not_smuggle_an_inventory_into_filter(cluster: Cluster, decoy: str) -> None:
    cluster.add_pod("p", gpu_container(mem=30000))
    await cluster.synced()
    lying = {"items": [_lying_node(cluster, "node-b")]}
    first: Any = {"items": [cluster.node("node-b")]} if decoy == "nodes" else ["node-b"]
    extra = {} if decoy == "nodes" else {"NodeNames": None}
    body = json.dumps({"Pod": cluster.pod("p"), decoy: first, **extra, "Nodes": lying})
    status, reply = await cluster.post("filter", body)
    assert status == 200, reply
    assert reply["Nodes"]["items"] == [], reply
    assert reply["FailedAndUnresolvableNodes"]["node-b"] == "no GPU with 30000 MiB free: best has 16000"
