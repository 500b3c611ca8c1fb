"""/filter through real HTTP against a local cluster: decisions, reasons, both modes, garbage."""

from __future__ import annotations

import asyncio

import pytest
from vgpu.core import annotations
from vgpu.core.device import GpuUsage, GpuUuid

from tests.scheduler.scenario import Cluster, gpu_container, gpus

KEYS = annotations.KEYS


async def test_filter_reserves_in_memory_and_writes_nothing(cluster: Cluster) -> None:
    cluster.add_pod("p1", gpu_container(mem=4000, cores=30))
    await cluster.synced()
    before = cluster.pod("p1")["metadata"]["resourceVersion"]
    writes = cluster.store.resource_version
    body = await cluster.filter("p1")
    assert body["Error"] == ""
    assert body["NodeNames"] in (["node-a"], ["node-b"])
    node = body["NodeNames"][0]
    # kube-scheduler's serial cycle waits for no API round trip: the decision is only in memory
    assert cluster.pod("p1")["metadata"]["resourceVersion"] == before
    await cluster.service.events.drain()
    assert cluster.store.resource_version == str(int(writes) + 1)  # the FilteringSucceed event only
    assert cluster.decision("p1") == f"GPU-{node}-0,NVIDIA,4000,30:;"
    assert cluster.state.used(node) == {GpuUuid(f"GPU-{node}-0"): GpuUsage(1, 4000, 30)}
    assert [e["involvedObject"]["name"] for e in cluster.events("FilteringSucceed")] == ["p1"]


async def test_binpack_fills_one_node_spread_gpus_within_it(cluster: Cluster) -> None:
    chosen = []
    for i in range(3):
        cluster.add_pod(f"p{i}", gpu_container(mem=1000))
        await cluster.synced()
        body = await cluster.filter(f"p{i}")
        node = body["NodeNames"][0]
        chosen.append((node, cluster.decision(f"p{i}")))
        assert await cluster.bind(f"p{i}", node) == ""
        cluster.plugin_allocates(f"p{i}", node)
        await cluster.synced()
    # node binpack: all on the first node (ties broken by name); GPU spread: alternate GPUs
    assert [c[0] for c in chosen] == ["node-a"] * 3
    assert [str(c[1]).split(",")[0] for c in chosen] == ["GPU-node-a-0", "GPU-node-a-1", "GPU-node-a-0"]


async def test_a_node_with_a_bind_under_way_is_picked_only_when_nothing_else_fits(cluster: Cluster) -> None:
    cluster.add_node("small", gpus("small", 1, memory=2000))
    for name, mem in (("p0", 1000), ("p1", 1000), ("p2", 1000), ("big", 15000)):
        cluster.add_pod(name, gpu_container(mem=mem))
    await cluster.synced()
    assert (await cluster.filter("p0"))["NodeNames"] == ["node-a"]
    # p0's decision is not bound yet: binpack would pick node-a again, the next pod goes elsewhere
    assert (await cluster.filter("p1"))["NodeNames"] == ["node-b"]
    assert await cluster.bind("p0", "node-a") == ""
    await cluster.synced()
    # p0 is bound but its lock is held until the device plugin's Allocate: still busy
    assert cluster.state.busy_nodes() >= {"node-a", "node-b"}
    assert (await cluster.filter("p2"))["NodeNames"] == ["small"]
    # only busy nodes fit: the best of them is taken (the bind will wait for its lock)
    assert (await cluster.filter("big", nodes=["node-a", "node-b", "small"]))["NodeNames"] == ["node-a"]
    cluster.plugin_allocates("p0", "node-a")
    cluster.store.delete("pods", "big", namespace="default")  # its decision goes with it
    await cluster.synced()
    assert "node-a" not in cluster.state.busy_nodes()


async def test_strict_node_order_when_busy_nodes_are_not_avoided() -> None:
    import dataclasses

    from vgpu.core.config import Config

    config = Config()
    c = Cluster(
        dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler, avoid_busy_nodes=False))
    )
    for n in ("node-a", "node-b"):
        c.add_node(n)
    await c.start()
    try:
        for name in ("p0", "p1"):
            c.add_pod(name, gpu_container(mem=1000))
        await c.synced()
        assert (await c.filter("p0"))["NodeNames"] == ["node-a"]
        assert (await c.filter("p1"))["NodeNames"] == ["node-a"]
    finally:
        await c.stop()


async def test_pod_without_gpu_request_passes_through_untouched(cluster: Cluster) -> None:
    cluster.add_pod("cpu", {"name": "c", "image": "busybox"})
    await cluster.synced()
    before = cluster.pod("cpu")["metadata"]["resourceVersion"]
    body = await cluster.filter("cpu", nodes=["node-b", "node-a", "elsewhere"])
    assert body["NodeNames"] == ["node-b", "node-a", "elsewhere"]
    assert body["FailedNodes"] == {}
    assert cluster.pod("cpu")["metadata"]["resourceVersion"] == before


async def test_reasons_and_unresolvable_nodes(cluster: Cluster) -> None:
    cluster.add_node("stale")
    cluster.add_node("no-lease", lease=False)
    cluster.add_node("broken", register="[{not json")
    cluster.add_node("small", gpus("small", 1, memory=4096))
    await cluster.synced()
    cluster.clock.now += 57
    cluster.renew_lease("node-a")
    cluster.renew_lease("small")
    cluster.add_pod("big", gpu_container(mem=8000))
    await cluster.synced()
    others = ["stale", "no-lease", "broken", "small", "ghost"]
    body = await cluster.filter("big", nodes=["node-a", *others])
    # a node fits: it is the answer, found by walking the nodes in policy order, and the others'
    # reasons are not worked out (kube-scheduler has no use for them once a node passes)
    assert (body["NodeNames"], body["FailedNodes"], body["FailedAndUnresolvableNodes"]) == (
        ["node-a"],
        {},
        {},
    )
    body = await cluster.filter("big", nodes=others)  # none fits: every candidate's reason
    assert body["NodeNames"] == []
    unresolvable = body["FailedAndUnresolvableNodes"]
    assert unresolvable["stale"] == "device plugin not reporting for 57 s"
    assert unresolvable["no-lease"] == "device plugin not reporting (no lease)"
    assert unresolvable["broken"].startswith("corrupt register annotation: ")
    assert unresolvable["small"] == "no GPU with 8000 MiB free: best has 4096"
    assert unresolvable["ghost"] == "node unknown to the GPU scheduler"
    await cluster.service.events.drain()
    warnings = [e for e in cluster.events("InvalidGPURegister") if e["involvedObject"]["name"] == "broken"]
    assert len(warnings) == 1


async def test_corrupt_register_warns_once_per_value(cluster: Cluster) -> None:
    cluster.add_node("broken", register="garbage-without-separator")
    await cluster.synced()
    cluster.store.patch("nodes", "broken", {"metadata": {"labels": {"x": "1"}}})  # same value: no new warning
    await cluster.synced()
    cluster.store.patch("nodes", "broken", {"metadata": {"annotations": {KEYS.node_register: "[]"}}})
    await cluster.synced()
    await cluster.service.events.drain()
    assert len(cluster.events("InvalidGPURegister")) == 2


async def test_no_fit_anywhere_reports_every_node_and_an_event(cluster: Cluster) -> None:
    cluster.add_pod("huge", gpu_container(gpu=1, mem=999_999))
    await cluster.synced()
    body = await cluster.filter("huge")
    assert body["NodeNames"] == []
    assert set(body["FailedAndUnresolvableNodes"]) == {"node-a", "node-b"}
    assert KEYS.assigned_node not in cluster.pod("huge")["metadata"].get("annotations", {})
    await cluster.service.events.drain()
    (event,) = cluster.events("FilteringFailed")
    assert event["type"] == "Warning" and event["message"].startswith(
        "0/2 nodes fit: 2 no GPU with 999999 MiB"
    )


async def test_nodes_mode_returns_node_list_with_only_the_chosen_node(cluster: Cluster) -> None:
    cluster.add_pod("p", gpu_container(mem=1000))
    await cluster.synced()
    nodes = [cluster.node("node-b"), cluster.node("node-a")]
    status, body = await cluster.post(
        "filter", {"Pod": cluster.pod("p"), "Nodes": {"items": nodes}, "NodeNames": None}
    )
    assert status == 200
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["node-a"]


async def test_nodes_mode_never_believes_the_inventory_in_the_body(cluster: Cluster) -> None:
    """Issue 16: a caller's Node objects are names only; the inventory is our watch cache's."""
    cluster.add_pod("p", gpu_container(mem=30000))
    await cluster.synced()
    lying = cluster.node("node-b")
    bigger = annotations.encode_node_register(gpus("node-b", 1, memory=40000))
    lying["metadata"]["annotations"][KEYS.node_register] = bigger
    unknown = {"metadata": {"name": "node-x", "annotations": {KEYS.node_register: bigger}}}
    status, body = await cluster.post(
        "filter", {"Pod": cluster.pod("p"), "Nodes": {"items": [cluster.node("node-a"), lying, unknown]}}
    )
    assert status == 200
    assert body["Nodes"]["items"] == [], body
    assert body["FailedAndUnresolvableNodes"]["node-b"] == "no GPU with 30000 MiB free: best has 16000"
    assert body["FailedAndUnresolvableNodes"]["node-x"] == "no GPUs registered (no register annotation)"
    assert KEYS.devices_allocated not in cluster.pod("p")["metadata"]["annotations"]


async def test_nodes_mode_reply_carries_the_callers_own_objects(cluster: Cluster) -> None:
    cluster.add_pod("p", gpu_container(mem=1000))
    await cluster.synced()
    node = cluster.node("node-a")
    node["status"] = {"capacity": {"cpu": "64"}}  # a field our slim cache drops
    status, body = await cluster.post("filter", {"Pod": cluster.pod("p"), "Nodes": {"items": [node]}})
    assert status == 200
    assert body["Nodes"]["items"] == [node]


async def test_garbage_bodies_are_400_with_the_reason(cluster: Cluster) -> None:
    for raw, needle in [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b"{}", "extender args missing pod"),
        (b'{"Pod": {"metadata": {"name": "x"}}}', "metadata.uid"),
        (b'{"Pod": {"metadata": {"name": "x", "uid": "u"}}, "NodeNames": "node-a"}', "NodeNames"),
        (b'{"Pod": {"metadata": {"name": "x", "uid": "u"}}, "Nodes": {"items": [3]}}', "Nodes"),
    ]:
        status, body = await cluster.post("filter", raw)
        assert status == 400, raw
        assert needle in body["Error"], (raw, body)


async def test_invalid_request_is_an_error_result(cluster: Cluster) -> None:
    """A quantity no API server would store (it refuses the pod, 400) still gets an answer
    naming it when it comes in ExtenderArgs: the pod is only ever read from the request."""
    pod = cluster.add_pod("bad", gpu_container(mem=100, cores=None))
    await cluster.synced()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "x"
    status, body = await cluster.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["node-a"]})
    assert status == 200
    assert "nvidia.com/gpu" in body["Error"]


async def test_a_gpu_container_without_a_count_the_webhook_never_saw_is_refused_not_placed(
    cluster: Cluster,
) -> None:
    """Kubelet calls Allocate only for containers with the count in their limits: placed, the
    memory-only container's slice would be handed to the next GPU container (or to none). The
    webhook writes the count; a pod it never saw (excluded by label) names what is missing."""
    memory_only = {"name": "a", "image": "cuda", "resources": {"limits": {"nvidia.com/gpumem": "1000"}}}
    cluster.add_pod("p", memory_only, gpu_container("b", mem=5000))
    await cluster.synced()
    body = await cluster.filter("p")
    assert body["Error"].startswith("pod default/p: container a: nvidia.com/gpu: GPU memory or cores")
    assert cluster.decision("p") is None
    assert cluster.state.used("node-a") == {}


async def test_a_limit_stored_in_canonical_form_is_read_as_written(cluster: Cluster) -> None:
    """kube-apiserver (and the emulation, as it) stores 2000 as 2k: still 2,000 MiB, not bytes."""
    pod = cluster.add_pod("p", gpu_container(mem=2000, cores=None))
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "2k"
    await cluster.synced()
    assert (await cluster.filter("p", nodes=["node-a"]))["NodeNames"] == ["node-a"]
    assert sum(u.memory_mib for u in cluster.state.used("node-a").values()) == 2000


async def test_a_refilter_replaces_the_previous_reservation(cluster: Cluster) -> None:
    cluster.add_pod("p", gpu_container(mem=3000))
    await cluster.synced()
    assert (await cluster.filter("p", nodes=["node-a"]))["NodeNames"] == ["node-a"]
    assert (await cluster.filter("p", nodes=["node-b"]))["NodeNames"] == ["node-b"]
    assert cluster.state.used("node-a") == {}
    assert sum(u.memory_mib for u in cluster.state.used("node-b").values()) == 3000


async def test_fifty_concurrent_filters_never_overcommit() -> None:
    c = Cluster()
    for n in ("n1", "n2"):
        c.add_node(n, gpus(n, 2, memory=10000, count=4))
    await c.start()
    try:
        for i in range(50):
            c.add_pod(f"p{i}", gpu_container(mem=3000, cores=20))
        await c.synced()
        bodies = await asyncio.gather(*(c.filter(f"p{i}") for i in range(50)))
        placed = [b for b in bodies if b["NodeNames"]]
        assert len(placed) == 12  # 4 GPUs x 3 pods of 3000 MiB in 10000 MiB
        per_gpu: dict[str, list[int]] = {}
        for i in range(50):
            raw = c.decision(f"p{i}")
            assert (raw is not None) == bool(bodies[i]["NodeNames"])
            for container in annotations.decode_pod_devices(raw or ""):
                for d in container:
                    per_gpu.setdefault(d.uuid, []).append(d.memory_mib)
        assert all(sum(v) <= 10000 and len(v) <= 4 for v in per_gpu.values()), per_gpu
        await c.synced()
        for n in ("n1", "n2"):
            for used in c.state.used(n).values():
                assert used.memory_mib <= 10000 and used.slots <= 4 and used.cores <= 100
    finally:
        await c.stop()


async def test_remembered_misses_do_not_outlive_a_usage_change(cluster: Cluster) -> None:
    cluster.add_pod("big", gpu_container(gpu=2, mem=16000))
    await cluster.synced()
    assert (await cluster.filter("big", nodes=["node-a"]))["NodeNames"] == ["node-a"]
    await cluster.synced()
    cluster.add_pod("next", gpu_container(mem=8000))
    cluster.add_pod("next2", gpu_container(mem=8000))
    await cluster.synced()
    first = await cluster.filter("next", nodes=["node-a"])
    assert first["FailedNodes"] == {"node-a": "no GPU with 8000 MiB free: best has 0"}
    second = await cluster.filter("next2", nodes=["node-a"])  # same request shape: remembered
    assert second["FailedNodes"] == first["FailedNodes"]
    cluster.store.delete("pods", "big", namespace="default")
    await cluster.synced()
    assert (await cluster.filter("next", nodes=["node-a"]))["NodeNames"] == ["node-a"]


async def test_cordon_annotation_takes_gpus_out_and_back(cluster: Cluster) -> None:
    cluster.add_pod("p", gpu_container(mem=1000))
    cordon = {KEYS.device_cordon: " GPU-node-a-0 , GPU-node-a-1,"}
    cluster.store.patch("nodes", "node-a", {"metadata": {"annotations": cordon}})
    await cluster.synced()
    body = await cluster.filter("p", nodes=["node-a"])
    assert body["FailedAndUnresolvableNodes"] == {"node-a": "2/2 GPUs cordoned"}
    cluster.store.patch(
        "nodes", "node-a", {"metadata": {"annotations": {KEYS.device_cordon: "GPU-node-a-0"}}}
    )
    await cluster.synced()
    body = await cluster.filter("p", nodes=["node-a"])
    assert body["NodeNames"] == ["node-a"]
    assert str(cluster.decision("p")).startswith("GPU-node-a-1,")


async def test_a_plugin_running_without_gpus_says_why_and_raises_no_corrupt_warning(cluster: Cluster) -> None:
    # the plugin writes both in one patch (reporter.NodeReporter.publish)
    cluster.add_node(
        "no-driver", register="[]", extra={KEYS.node_plugin_error: "NVML not available: driver not loaded"}
    )
    cluster.add_pod("p", gpu_container(mem=1000))
    await cluster.synced()
    assert (await cluster.filter("p", nodes=["node-a", "no-driver"]))["NodeNames"] == ["node-a"]
    body = await cluster.filter("p", nodes=["no-driver"])
    assert body["NodeNames"] == []
    reason = body["FailedAndUnresolvableNodes"]["no-driver"]
    assert reason == "device plugin has no GPUs: NVML not available: driver not loaded"
    await cluster.service.events.drain()
    assert [
        e for e in cluster.events("InvalidGPURegister") if e["involvedObject"]["name"] == "no-driver"
    ] == []


QUOTA_CASES = [
    # (id, quota hard, pods already placed (mem), the new pod's container, reason or None)
    ("fits", {"limits.nvidia.com/gpumem": "8000"}, [3000], gpu_container(mem=5000), None),
    (
        "memory-over",
        {"limits.nvidia.com/gpumem": "8000"},
        [3000, 3000],
        gpu_container(mem=3000),
        "namespace team: GPU memory quota exceeded (used 6000 of 8000, requested 3000)",
    ),
    (
        "percent-counted-at-largest-gpu",
        {"limits.nvidia.com/gpumem": "20000"},
        [5000],
        {
            "name": "c",
            "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}},
        },
        "namespace team: GPU memory quota exceeded (used 5000 of 20000, requested 16000)",
    ),
    (
        "cores-over",
        {"limits.nvidia.com/gpucores": "50"},
        [1000],
        gpu_container(mem=1000, cores=30),
        "namespace team: GPU cores quota exceeded (used 30 of 50, requested 30)",
    ),
]


@pytest.mark.parametrize(
    ("hard", "placed", "container", "reason"), [c[1:] for c in QUOTA_CASES], ids=[c[0] for c in QUOTA_CASES]
)
async def test_namespace_quota_at_placement(
    cluster: Cluster, hard: dict[str, str], placed: list[int], container: dict, reason: str | None
) -> None:
    cluster.store.create(
        "resourcequotas", {"metadata": {"name": "gpu"}, "spec": {"hard": hard}}, namespace="team"
    )
    await cluster.until(lambda: cluster.state.quota.quota_limits("team") != (None, None))
    # filtered one after another with no watch event in between: reservations must count
    for i, mem in enumerate(placed):
        cluster.add_pod(f"old{i}", gpu_container(mem=mem, cores=30), ns="team")
    await cluster.synced()
    for i in range(len(placed)):
        assert (await cluster.filter(f"old{i}", ns="team"))["NodeNames"], f"old{i} should fit"
    cluster.add_pod("new", container, ns="team")
    await cluster.synced()
    body = await cluster.filter("new", ns="team")
    if reason is None:
        assert len(body["NodeNames"]) == 1
        again = await cluster.filter("new", ns="team")  # a re-filter does not count the pod twice
        assert len(again["NodeNames"]) == 1
        return
    assert body["NodeNames"] == []
    assert body["FailedNodes"] == {}
    assert body["FailedAndUnresolvableNodes"] == {"node-a": reason, "node-b": reason}
    assert KEYS.assigned_node not in cluster.pod("new", "team")["metadata"].get("annotations", {})
    await cluster.service.events.drain()
    assert [e["message"] for e in cluster.events("FilteringFailed")] == [reason]


async def test_quota_in_nodes_mode_names_every_given_node(cluster: Cluster) -> None:
    cluster.store.create(
        "resourcequotas",
        {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "100"}}},
        namespace="default",
    )
    await cluster.until(lambda: cluster.state.quota.quota_limits("default") != (None, None))
    cluster.add_pod("p", gpu_container(mem=1000))
    await cluster.synced()
    nodes = [cluster.node("node-b"), cluster.node("node-a")]
    status, body = await cluster.post(
        "filter", {"Pod": cluster.pod("p"), "Nodes": {"items": nodes}, "NodeNames": None}
    )
    assert status == 200
    assert body["Nodes"]["items"] == []
    assert set(body["FailedAndUnresolvableNodes"]) == {"node-a", "node-b"}


async def test_outside_usage_is_subtracted_and_named_in_the_reason(cluster: Cluster) -> None:
    outside = '{"GPU-small-0":2000}'
    cluster.add_node("small", gpus("small", 1, memory=16000), extra={KEYS.node_outside_usage: outside})
    cluster.add_pod("holder", gpu_container(mem=8000))
    cluster.add_pod("big", gpu_container(mem=8000))
    await cluster.synced()
    assert (await cluster.filter("holder", nodes=["small"]))["NodeNames"] == ["small"]
    body = await cluster.filter("big", nodes=["small"])
    assert body["NodeNames"] == []
    assert body["FailedNodes"] == {
        "small": "no GPU with 8000 MiB free: best has 6000 (2000 used outside kube-vgpu)"
    }


async def test_each_gpu_filter_counts_how_its_nodes_were_decided(cluster: Cluster) -> None:
    """``vgpu_scheduler_filter_paths_total``: the walk in policy order, or why every candidate was."""
    cluster.add_pod("small", gpu_container(mem=1000))
    cluster.add_pod("huge", gpu_container(mem=999999))
    cluster.add_pod("two", gpu_container("a", mem=1000), gpu_container("b", mem=1000))
    cluster.add_pod("cpu", {"name": "c", "image": "x"})
    await cluster.synced()
    assert (await cluster.filter("small"))["NodeNames"]  # placed by the walk
    assert (await cluster.filter("huge"))["NodeNames"] == []  # the walk found none; all decided
    assert (await cluster.filter("two"))["NodeNames"]  # two GPU containers: every candidate decided
    assert (await cluster.filter("cpu"))["NodeNames"] == ["node-a", "node-b"]  # no GPU: not counted
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/metrics") as resp:
        text = await resp.text()
    counted = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vgpu_scheduler_filter_paths_total{")
    }
    assert counted == {"walk": 1.0, "none_fit": 1.0, "not_simple": 1.0}
    succeeded = {e["involvedObject"]["name"]: e["message"] for e in cluster.events("FilteringSucceed")}
    assert succeeded["small"].startswith("find fit node(node-a), the best by binpack of 2 candidate nodes;")
    # node-a holds small's decision, not bound yet (busy): the other node wins
    assert succeeded["two"].startswith("find fit node(node-b), 0 nodes not fit, 2 nodes fit;")
