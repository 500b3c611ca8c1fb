"""Init containers through /filter and /bind: a sidecar (a restartable init container) shares its GPU
with the app containers for the pod's whole life, and a GPU init container placed on another GPU
than the app containers is charged to the namespace quota beside them; kubelet hands an init
container's devices on to the app container, so both go on one GPU or the node is a miss."""

from __future__ import annotations

from typing import Any

from vgpu.core import annotations
from vgpu.core.device import GpuUsage, GpuUuid

from tests.scheduler.scenario import Cluster, gpu_container, gpus

KEYS = annotations.KEYS
GPU = GpuUuid("GPU-node-s-0")
OVER_QUOTA = "namespace team: GPU memory quota exceeded (used 0 of 9000, requested 10000)"
APART = (
    "container main (kubelet gives it the devices of init container setup first): GPU-node-a-1 cannot "
    "take it; nor container setup (kubelet hands its devices on to container main): no GPU with 7000 "
    "MiB free: best has 6000"
)


def _sidecar(name: str, *, mem: int) -> dict[str, Any]:
    return {**gpu_container(name, mem=mem, cores=0), "restartPolicy": "Always"}


async def test_a_gpu_sidecar_is_not_overcommitted() -> None:
    """A GPU of 10,000 MiB. A sidecar of 4,000 runs beside an app container of 7,000: the pod does
    not fit. With an app of 6,000 it fits and holds the whole GPU (two slots), before and after its
    regular init container (8,000, run alone first) has finished: no other pod gets a MiB of it."""
    cluster = Cluster()
    cluster.add_node("node-s", gpus("node-s", 1, memory=10000))
    await cluster.start()
    try:
        cluster.add_pod("big", gpu_container("main", mem=7000, cores=0), init=[_sidecar("proxy", mem=4000)])
        await cluster.synced()
        body = await cluster.filter("big")
        assert body["NodeNames"] == []
        assert body["FailedNodes"] == {"node-s": "container main: no GPU with 7000 MiB free: best has 6000"}

        cluster.add_pod(
            "p",
            gpu_container("main", mem=6000, cores=0),
            init=[gpu_container("setup", mem=8000, cores=0), _sidecar("proxy", mem=4000)],
        )
        await cluster.synced()
        assert (await cluster.filter("p"))["NodeNames"] == ["node-s"]
        assert cluster.state.used("node-s") == {GPU: GpuUsage(2, 10000, 0)}
        assert await cluster.bind("p", "node-s") == ""
        cluster.plugin_allocates("p", "node-s")
        statuses = [
            {"name": "setup", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "proxy", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}},
        ]
        cluster.store.patch(
            "pods",
            "p",
            {"status": {"phase": "Running", "initContainerStatuses": statuses}},
            namespace="default",
            subresource="status",
        )
        await cluster.synced()  # the charge is read back from the watched pod now
        assert cluster.state.used("node-s") == {GPU: GpuUsage(2, 10000, 0)}
        cluster.add_pod("small", gpu_container(mem=1, cores=0))
        await cluster.synced()
        body = await cluster.filter("small")
        assert body["NodeNames"] == []
        assert body["FailedNodes"] == {"node-s": "no GPU with 1 MiB free: best has 0"}
    finally:
        await cluster.stop()


def _running(cluster: Cluster, name: str, node: str, devices: str) -> None:
    """A pod of another namespace running on ``node`` with ``devices``."""
    cluster.add_pod(name, gpu_container(mem=1), ns="other")
    notes = {
        KEYS.assigned_node: node,
        KEYS.assigned_time: str(int(cluster.clock.now)),
        KEYS.devices_to_allocate: devices,
        KEYS.devices_allocated: devices,
        KEYS.bind_phase: "success",
    }
    cluster.store.bind("other", name, node=node, annotations=notes)


async def _team_job(
    cluster: Cluster,
    held: dict[str, str],
    *,
    limit: int,
    init: tuple[int, int],
    app: tuple[int, int],
    app_gpus: int = 1,
) -> Cluster:
    """``cluster`` with other namespaces' pods holding ``held`` (pod name -> node, devices), a
    namespace ``team`` with a ``limit`` MiB GPU quota, and in it the pod ``job``: an init container
    ``setup`` of one GPU and an app container ``main`` of ``app_gpus``, each (MiB, cores) a GPU."""
    for name, (node, devices) in held.items():
        _running(cluster, name, node, devices)
    cluster.store.create(
        "resourcequotas",
        {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": str(limit)}}},
        namespace="team",
    )
    await cluster.start()
    await cluster.until(lambda: cluster.state.quota.quota_limits("team") != (None, None))
    cluster.add_pod(
        "job",
        gpu_container("main", gpu=app_gpus, mem=app[0], cores=app[1]),
        ns="team",
        init=[gpu_container("setup", mem=init[0], cores=init[1])],
    )
    await cluster.synced()
    return cluster


async def _apart_cluster() -> Cluster:
    """Two nodes of two 8,000 MiB GPUs and a namespace ``team`` with a 10,000 MiB quota. On node-a,
    other namespaces' pods leave GPU 0 6,000 MiB and GPU 1 7,000 MiB but 40 % of its cores: an
    init container of 7,000 fits only on GPU 1, an app container of 6,000 MiB and 50 % only on
    GPU 0. kubelet would give the app container the init container's device on GPU 1: node-a
    cannot take the pod. On the empty node-b both go on one GPU."""
    cluster = Cluster()
    cluster.add_node("node-a", gpus("node-a", 2, memory=8000))
    cluster.add_node("node-b", gpus("node-b", 2, memory=8000))
    held = {"x": ("node-a", "GPU-node-a-0,NVIDIA,2000,0:;"), "y": ("node-a", "GPU-node-a-1,NVIDIA,1000,60:;")}
    return await _team_job(cluster, held, limit=10000, init=(7000, 0), app=(6000, 50))


async def test_the_filter_fails_a_node_where_the_app_cannot_reuse_the_init_containers_gpu() -> None:
    """node-a fails with why (evicting pods there could help: not unresolvable), and the pod goes to
    node-b, where both containers share a GPU."""
    cluster = await _apart_cluster()
    try:
        body = await cluster.filter("job", nodes=["node-a", "node-b"], ns="team")
        assert body["NodeNames"] == ["node-b"]  # binpack would prefer the busier node-a
        assert body["FailedNodes"] == {"node-a": APART}
        assert cluster.decision("job", "team") == "GPU-node-b-0,NVIDIA,7000,0:;GPU-node-b-0,NVIDIA,6000,50:;"
        assert cluster.state.quota.namespace_gpu_usage("team") == (7000, 50)
    finally:
        await cluster.stop()


async def test_the_binds_refit_refuses_a_node_where_the_app_cannot_reuse_the_init_containers_gpu() -> None:
    cluster = await _apart_cluster()
    try:
        error = await cluster.bind("job", "node-a", ns="team")
        assert error.endswith(APART), error
        assert cluster.decision("job", "team") is None
        assert await cluster.bind("job", "node-b", ns="team") == ""
    finally:
        await cluster.stop()


async def _quota_cluster() -> Cluster:
    """One node of two 8,000 MiB GPUs and a namespace ``team`` with a 9,000 MiB quota; the pod's
    init container asks for 7,000 MiB on one GPU, its app container for 3,000 on each of two. The
    pod holds 7,000 at once, but placed it is charged 7,000 on the GPU both share and 3,000 on the
    other: 10,000, whatever GPUs it is given."""
    cluster = Cluster()
    cluster.add_node("node-a", gpus("node-a", 2, memory=8000))
    return await _team_job(cluster, {}, limit=9000, init=(7000, 0), app=(3000, 0), app_gpus=2)


async def test_the_filter_checks_the_quota_against_each_nodes_placement() -> None:
    cluster = await _quota_cluster()
    try:
        body = await cluster.filter("job", nodes=["node-a"], ns="team")
        assert body["NodeNames"] == []
        assert body["FailedAndUnresolvableNodes"] == {"node-a": OVER_QUOTA}
        assert cluster.state.quota.namespace_gpu_usage("team") == (0, 0)
    finally:
        await cluster.stop()


async def test_the_binds_refit_checks_the_quota_against_its_placement() -> None:
    """A bind with no decision held for its node fits the pod again there: that placement would
    charge the namespace 10,000 MiB, so the bind is refused and nothing is held."""
    cluster = await _quota_cluster()
    try:
        error = await cluster.bind("job", "node-a", ns="team")
        assert error.endswith(f"no decision held for node node-a and {OVER_QUOTA}"), error
        assert "nodeName" not in cluster.pod("job", "team")["spec"]
        assert cluster.decision("job", "team") is None
        assert cluster.state.quota.namespace_gpu_usage("team") == (0, 0)
    finally:
        await cluster.stop()


async def _sharing_cluster() -> Cluster:
    """One node of two 8,000 MiB GPUs and a namespace ``team`` with a 6,000 MiB quota. Other
    namespaces' pods hold 60 % of GPU 0's cores and 3,000 MiB and 30 % of GPU 1: by the GPU policy
    (spread) an init container of 2,000 MiB would go on the idler GPU 0, an app container of 5,000
    MiB and 50 % fits only on GPU 1. kubelet hands the init container's device on to the app
    container, so both go on GPU 1, and the namespace is charged 5,000."""
    cluster = Cluster()
    cluster.add_node("node-c", gpus("node-c", 2, memory=8000))
    held = {"x": ("node-c", "GPU-node-c-0,NVIDIA,1,60:;"), "y": ("node-c", "GPU-node-c-1,NVIDIA,3000,30:;")}
    return await _team_job(cluster, held, limit=6000, init=(2000, 0), app=(5000, 50))


SHARED = "GPU-node-c-1,NVIDIA,2000,0:;GPU-node-c-1,NVIDIA,5000,50:;"


async def test_the_filter_puts_the_init_container_beside_the_app() -> None:
    """The GPU policy alone would split them and break the quota; kubelet's reuse puts both on
    GPU 1, within it."""
    cluster = await _sharing_cluster()
    try:
        body = await cluster.filter("job", nodes=["node-c"], ns="team")
        assert body["NodeNames"] == ["node-c"], body
        assert cluster.decision("job", "team") == SHARED
        assert cluster.state.quota.namespace_gpu_usage("team") == (5000, 50)
        assert await cluster.bind("job", "node-c", ns="team") == ""
        assert cluster.pod("job", "team")["metadata"]["annotations"][KEYS.devices_to_allocate] == SHARED
    finally:
        await cluster.stop()


async def test_the_binds_refit_puts_the_init_container_beside_the_app() -> None:
    """A bind with no decision held fits the pod again: both on GPU 1, within the quota."""
    cluster = await _sharing_cluster()
    try:
        assert await cluster.bind("job", "node-c", ns="team") == ""
        assert cluster.pod("job", "team")["metadata"]["annotations"][KEYS.devices_to_allocate] == SHARED
        assert cluster.state.quota.namespace_gpu_usage("team") == (5000, 50)
    finally:
        await cluster.stop()
