"""Cluster state: usage follows pods, restart rebuilds the same state, reservations expire."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime

import aiohttp
import pytest
from vgpu.core import annotations, lease
from vgpu.core.config import Config
from vgpu.core.device import GpuUsage, GpuUuid
from vgpu_scheduler.app import SchedulerService
from vgpu_scheduler.state import ClusterState

from tests.scheduler.scenario import Cluster, FakeClock, gpu_container, open_views

KEYS = annotations.KEYS


def _pod(
    uid: str,
    node: str,
    devices: str,
    *,
    phase: str = "Running",
    node_name: str | None = None,
    ann: dict[str, str] | None = None,
    init: int = 0,
) -> dict:
    annotations_ = {KEYS.assigned_node: node, KEYS.devices_allocated: devices, KEYS.assigned_time: "0"}
    annotations_.update(ann or {})
    spec = {"containers": [{"name": "c"}], "initContainers": [{"name": f"i{i}"} for i in range(init)]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "ns", "annotations": annotations_},
        "spec": spec,
        "status": {"phase": phase},
    }


def test_usage_follows_pod_lifecycle_and_namespace_totals() -> None:
    state = ClusterState(Config(), clock=FakeClock())
    state.apply("pods", "ADDED", _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n"))
    state.apply("pods", "ADDED", _pod("b", "n", "GPU-1,NVIDIA,2000,20:;", node_name="n"))
    assert state.used("n") == {GpuUuid("GPU-1"): GpuUsage(2, 3000, 30)}
    assert state.quota.namespace_gpu_usage("ns") == (3000, 30)
    state.apply(
        "pods", "MODIFIED", _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n", phase="Succeeded")
    )
    assert state.used("n") == {GpuUuid("GPU-1"): GpuUsage(1, 2000, 20)}
    state.apply("pods", "DELETED", _pod("b", "n", "GPU-1,NVIDIA,2000,20:;", node_name="n"))
    assert state.used("n") == {}
    assert state.quota.namespace_gpu_usage("ns") == (0, 0)


def test_corrupt_devices_annotation_is_ignored_not_fatal() -> None:
    state = ClusterState(Config(), clock=FakeClock())
    state.apply("pods", "ADDED", _pod("a", "n", "GPU-1,NVIDIA,lots,10:;", node_name="n"))
    assert state.used("n") == {}


def test_unbound_decision_expires_after_ttl_bound_one_does_not() -> None:
    clock = FakeClock(1000.0)
    state = ClusterState(Config(), clock=clock)
    state.apply(
        "pods", "ADDED", _pod("unbound", "n", "GPU-1,NVIDIA,1000,0:;", ann={KEYS.assigned_time: "1000"})
    )
    state.apply(
        "pods",
        "ADDED",
        _pod("bound", "n", "GPU-1,NVIDIA,500,0:;", ann={KEYS.assigned_time: "1000"}, node_name="n"),
    )
    assert state.used("n")[GpuUuid("GPU-1")].memory_mib == 1500
    clock.now += 61
    assert state.expire() == 1
    assert state.used("n")[GpuUuid("GPU-1")].memory_mib == 500
    # a restart after the TTL rebuilds the same thing from the objects alone
    fresh = ClusterState(Config(), clock=clock)
    fresh.apply(
        "pods", "ADDED", _pod("unbound", "n", "GPU-1,NVIDIA,1000,0:;", ann={KEYS.assigned_time: "1000"})
    )
    assert fresh.used("n") == {}


def test_quota_limits_and_namespace_labels() -> None:
    state = ClusterState(Config(), clock=FakeClock())
    assert state.quota.namespace_labels("team") is None
    state.apply("namespaces", "ADDED", {"metadata": {"name": "team", "labels": {"a": "b"}}})
    assert state.quota.namespace_labels("team") == {"a": "b"}
    state.apply(
        "resourcequotas",
        "ADDED",
        {
            "metadata": {"name": "q1", "namespace": "team"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "20000", "limits.nvidia.com/gpucores": "garbage"}},
        },
    )
    state.apply(
        "resourcequotas",
        "ADDED",
        {
            "metadata": {"name": "q2", "namespace": "team"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "10Gi", "limits.nvidia.com/gpucores": "300"}},
        },
    )
    assert state.quota.quota_limits("team") == (10240, 300)
    assert state.quota.quota_limits("other") == (None, None)


async def test_delete_frees_and_restart_rebuilds_the_same_state(cluster: Cluster) -> None:
    for i in range(4):
        cluster.add_pod(f"p{i}", gpu_container(mem=1000 * (i + 1), cores=10))
        await cluster.synced()
        (node,) = (await cluster.filter(f"p{i}"))["NodeNames"]
        assert await cluster.bind(f"p{i}", node) == ""  # the decision is written at bind
        cluster.plugin_allocates(f"p{i}", node)
    await cluster.synced()
    before = {n: dict(cluster.state.used(n)) for n in ("node-a", "node-b")}
    assert (
        sum(u.memory_mib for u in before["node-a"].values())
        + sum(u.memory_mib for u in before["node-b"].values())
        == 10000
    )
    await cluster.stop()
    await cluster.start()
    after = {n: dict(cluster.state.used(n)) for n in ("node-a", "node-b")}
    assert after == before
    for i in range(4):
        cluster.store.delete("pods", f"p{i}", namespace="default")
    await cluster.synced()
    assert cluster.state.used("node-a") == {} and cluster.state.used("node-b") == {}


async def test_reservation_of_a_pod_never_bound_expires(cluster: Cluster) -> None:
    cluster.add_pod("p", gpu_container(mem=16000))
    await cluster.synced()
    assert (await cluster.filter("p"))["NodeNames"] == ["node-a"]
    cluster.add_pod("q", gpu_container(gpu=2, mem=16000))
    await cluster.synced()
    assert (await cluster.filter("q", nodes=["node-a"]))["NodeNames"] == []
    cluster.clock.now += cluster.config.scheduler.reservation_ttl_s + 1
    cluster.renew_lease("node-a")
    await cluster.synced()
    await cluster.until(lambda: cluster.state.inventory.liveness_problem("node-a", cluster.clock.now) is None)
    assert (await cluster.filter("q", nodes=["node-a"]))["NodeNames"] == ["node-a"]


async def test_health_ready_and_metrics(cluster: Cluster) -> None:
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/healthz") as resp:
        assert resp.status == 200
    async with cluster.session.get(f"{cluster.url}/readyz") as resp:
        assert resp.status == 200
    cluster.add_pod("p", gpu_container(mem=3000, cores=25))
    await cluster.synced()
    await cluster.filter("p")
    await cluster.synced()
    async with cluster.session.get(f"{cluster.url}/metrics") as resp:
        text = await resp.text()
    line = [
        x
        for x in text.splitlines()
        if x.startswith("hami_gpu_memory_allocated_bytes{") and "GPU-node-a-0" in x
    ]
    assert line and float(line[0].rsplit(" ", 1)[1]) == 3000 * 2**20
    assert (
        'hami_gpu_shared_count{device_index="0",device_type="NVIDIA-Tesla-T4",device_uuid="GPU-node-a-0"'
        in text
    )
    assert 'vgpu_scheduler_nodes{state="schedulable"} 2.0' in text
    assert 'vgpu_scheduler_filter_duration_seconds_count{outcome="placed"} 1.0' in text
    assert (
        'hami_vgpu_memory_allocated_bytes{container_index="0",device_uuid="GPU-node-a-0",namespace="default"'
        in text
    )


class _GatedApi:
    """LocalKubeApi whose pod list waits for a gate: the first sync cannot finish before it opens."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.gate = asyncio.Event()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def list(self, kind, **kw):
        if kind == "pods":
            await self.gate.wait()
        return await self._inner.list(kind, **kw)


async def test_readyz_is_503_until_the_first_full_sync() -> None:
    c = Cluster()
    api = _GatedApi(c.api)
    service = SchedulerService(open_views(c.config), api, clock=c.clock)  # type: ignore[arg-type]
    address = await service.start(host="127.0.0.1", port=0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{address}/readyz") as resp:
                assert resp.status == 503
            api.gate.set()
            await service.wait_ready()
            async with session.get(f"http://{address}/readyz") as resp:
                assert resp.status == 200
    finally:
        await service.stop()


def _quota_obj(ns: str, name: str, hard: object) -> dict:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"hard": hard}}


def test_namespace_quota_counts_charges_and_reservations_but_not_the_pod_itself() -> None:
    from vgpu.core import fit
    from vgpu.core.annotations import ContainerDevice

    state = ClusterState(Config(), clock=FakeClock())
    assert state.quota.namespace_quota("ns") is None  # no quota: nothing to check
    state.apply("resourcequotas", "ADDED", _quota_obj("ns", "q", {"limits.nvidia.com/gpumem": "8000"}))
    state.apply("pods", "ADDED", _pod("a", "n", "GPU-1,NVIDIA,3000,10:;", node_name="n"))
    placement = fit.Placement(
        devices=((ContainerDevice(GpuUuid("GPU-1"), 2000, 5),),),
        usage={GpuUuid("GPU-1"): GpuUsage(1, 2000, 5)},
    )
    state.reserve("b", namespace="ns", node="n", placement=placement, devices_raw="GPU-1,NVIDIA,2000,5:;")
    got = state.quota.namespace_quota("ns")
    assert got is not None and (got.memory_limit_mib, got.used_memory_mib, got.used_cores) == (8000, 5000, 15)
    mine = state.quota.namespace_quota("ns", excluding="b")  # a re-filter of b does not count b twice
    assert mine is not None and (mine.used_memory_mib, mine.used_cores) == (3000, 10)
    other = state.quota.namespace_quota("ns", excluding="a-pod-of-no-charge")
    assert other is not None and other.used_memory_mib == 5000


GARBAGE_QUOTAS = [
    ("hard-not-an-object", {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": "lots"}}),
    ("spec-not-an-object", {"metadata": {"name": "q", "namespace": "ns"}, "spec": ["x"]}),
    ("unreadable-quantity", _quota_obj("ns", "q", {"limits.nvidia.com/gpumem": "many"})),
    ("no-hard", {"metadata": {"name": "q", "namespace": "ns"}}),
]


@pytest.mark.parametrize("obj", [c[1] for c in GARBAGE_QUOTAS], ids=[c[0] for c in GARBAGE_QUOTAS])
def test_garbage_quota_sets_no_limit_and_breaks_nothing(obj: dict) -> None:
    state = ClusterState(Config(), clock=FakeClock())
    state.apply("resourcequotas", "ADDED", _quota_obj("ns", "good", {"limits.nvidia.com/gpucores": "50"}))
    state.apply("resourcequotas", "ADDED", obj)
    assert state.quota.quota_limits("ns") == (None, 50)
    state.apply("resourcequotas", "DELETED", obj)
    state.apply("resourcequotas", "DELETED", _quota_obj("ns", "good", {}))
    assert state.quota.quota_limits("ns") == (None, None)


def _node(name: str, outside_raw: str | None) -> dict:
    from vgpu.core.device import Gpu

    ann = {
        KEYS.node_register: annotations.encode_node_register([Gpu(GpuUuid("GPU-1"), 0, 10, 16000, 100, "T4")])
    }
    if outside_raw is not None:
        ann[KEYS.node_outside_usage] = outside_raw
    return {"metadata": {"name": name, "annotations": ann}}


OUTSIDE_VALUES = [
    ("absent", None, {}, False),
    ("per-gpu", '{"GPU-1":2000}', {"GPU-1": 2000}, False),
    ("not-json", "2000", {}, True),
    ("negative", '{"GPU-1":-5}', {}, True),
    ("a-list", "[2000]", {}, True),
]


@pytest.mark.parametrize(
    ("raw", "want", "warned"), [c[1:] for c in OUTSIDE_VALUES], ids=[c[0] for c in OUTSIDE_VALUES]
)
def test_outside_usage_is_decoded_with_the_node(raw: str | None, want: dict, warned: bool) -> None:
    warnings: list[tuple[str, str]] = []
    state = ClusterState(Config(), clock=FakeClock(), on_node_warning=lambda o, r, m: warnings.append((r, m)))
    state.apply("nodes", "ADDED", _node("n", raw))
    state.apply("nodes", "MODIFIED", _node("n", raw))  # the same value warns once
    assert state.inventory.outside("n") == want
    view = state.inventory.view("n")
    assert view is not None and view.open[0][0] == 16000 - want.get("GPU-1", 0)
    assert state.nodes["n"].problem is None  # a bad value never makes the node unschedulable
    assert [r for r, _ in warnings] == (["InvalidGPUOutsideUsage"] if warned else [])
    if warned:
        assert "counted as 0" in warnings[0][1]


def test_outside_usage_change_rebuilds_the_view_and_can_be_switched_off() -> None:
    state = ClusterState(Config(), clock=FakeClock())
    state.apply("nodes", "ADDED", _node("n", '{"GPU-1":1000}'))
    first = state.inventory.view("n")
    state.apply("nodes", "MODIFIED", _node("n", '{"GPU-1":1000}'))
    assert state.inventory.view("n") is first  # unchanged: the summary is kept
    state.apply("nodes", "MODIFIED", _node("n", '{"GPU-1":5000}'))
    second = state.inventory.view("n")
    assert second is not first and second.open[0][0] == 11000
    off = Config(scheduler=dataclasses.replace(Config().scheduler, subtract_outside_usage=False))
    ignoring = ClusterState(off, clock=FakeClock())
    ignoring.apply("nodes", "ADDED", _node("n", '{"GPU-1":5000}'))
    assert ignoring.inventory.outside("n") == {} and ignoring.inventory.view("n").open[0][0] == 16000


def test_pod_updates_that_leave_its_charge_as_it_was_keep_the_nodes_summary() -> None:
    # a GPU pod's bind-phase and status updates change nothing it holds: the node's fit summary
    # (rebuilt by the next /filter that sees the node) must survive them; a real change must not
    state = ClusterState(Config(), clock=FakeClock())
    state.apply("nodes", "ADDED", _node("n", None))
    state.apply("pods", "ADDED", _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n", phase="Pending"))
    first = state.inventory.view("n")
    generation = state.usage_generation
    success = _pod(
        "a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n", phase="Pending", ann={KEYS.bind_phase: "success"}
    )
    state.apply("pods", "MODIFIED", success)
    state.apply("pods", "MODIFIED", _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n"))
    assert state.inventory.view("n") is first
    assert state.usage_generation == generation
    assert state.used("n") == {GpuUuid("GPU-1"): GpuUsage(1, 1000, 10)}
    state.apply("pods", "MODIFIED", _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n", phase="Failed"))
    assert state.inventory.view("n") is not first and state.used("n") == {}


def test_a_new_uid_under_a_known_name_drops_the_old_pods_charge() -> None:
    """Defence in depth for a missed delete: two pods cannot share a namespace/name at once."""
    state = ClusterState(Config(), clock=FakeClock())
    old = _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n")
    state.apply("pods", "ADDED", old)
    new = _pod("b", "n", "GPU-2,NVIDIA,500,5:;", node_name="n")
    new["metadata"]["name"] = "a"  # same name, new uid
    state.apply("pods", "MODIFIED", new)
    assert state.used("n") == {GpuUuid("GPU-2"): GpuUsage(1, 500, 5)}
    assert set(state.pods) == {"b"} and set(state.charges) == {"b"}
    assert state.quota.namespace_gpu_usage("ns") == (500, 5)


def test_live_views_answers_as_live_view_for_every_kind_of_node() -> None:
    # the filter's batch read must say exactly what live_view says, node by node
    state = ClusterState(Config(), clock=FakeClock())
    now = 1_000_000.0

    def lease_of(node: str, age_s: float) -> dict:
        stamp = lease.format_micro_time(datetime.datetime.fromtimestamp(now - age_s, datetime.UTC))
        return {"metadata": {"name": lease.name(node)}, "spec": {"renewTime": stamp}}

    for name in ("fresh", "stale", "no-lease", "built-later"):
        state.apply("nodes", "ADDED", _node(name, None))
    state.apply(
        "nodes", "ADDED", {"metadata": {"name": "corrupt", "annotations": {KEYS.node_register: "[{"}}}
    )
    for name, age in (("fresh", 1.0), ("stale", 41.0), ("built-later", 1.0), ("corrupt", 1.0)):
        state.apply("leases", "ADDED", lease_of(name, age))
    state.inventory.view("fresh")
    state.inventory.view("stale")  # built views: the batch's fast path; "built-later" is built on demand
    names = ["fresh", "stale", "no-lease", "built-later", "corrupt", "unknown", "fresh"]
    got = state.inventory.live_views(names, now)
    assert got == [state.inventory.live_view(n, now) for n in names]
    assert [v is not None for v in got] == [True, False, False, True, False, False, True]


def test_on_freed_names_the_node_when_a_pods_gpus_go_not_when_a_reservation_does() -> None:
    from vgpu.core import fit
    from vgpu.core.annotations import ContainerDevice

    state = ClusterState(Config(), clock=FakeClock())
    released: list[tuple[str, bool]] = []
    state.on_freed = lambda node, pod_went: released.append((node, pod_went))
    state.apply("pods", "ADDED", _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n"))
    state.apply("pods", "ADDED", _pod("b", "m", "GPU-2,NVIDIA,1000,10:;", node_name="m"))
    placement = fit.Placement(
        devices=((ContainerDevice(GpuUuid("GPU-1"), 2000, 5),),),
        usage={GpuUuid("GPU-1"): GpuUsage(1, 2000, 5)},
    )
    state.reserve("c", namespace="ns", node="n", placement=placement, devices_raw="GPU-1,NVIDIA,2000,5:;")
    state.release("c")  # a filter's decision dropped: nothing the watch showed was let go of
    assert released == []
    state.apply(
        "pods", "MODIFIED", _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n", phase="Succeeded")
    )
    state.apply("pods", "DELETED", _pod("b", "m", "GPU-2,NVIDIA,1000,10:;", node_name="m"))
    assert released == [("n", True), ("m", True)]  # a pod went: kube-scheduler sees that too


def test_on_freed_names_a_node_whose_gpus_come_back_not_one_that_only_moves() -> None:
    """kube-scheduler moves its unschedulable pods for none of these (annotations and Leases are
    not what it schedules by), so the state says each one."""
    clock = FakeClock()
    state = ClusterState(Config(), clock=clock)
    freed: list[str] = []

    def lease_of(node: str, age_s: float) -> dict:
        stamp = lease.format_micro_time(datetime.datetime.fromtimestamp(clock() - age_s, datetime.UTC))
        return {"metadata": {"name": lease.name(node)}, "spec": {"renewTime": stamp}}

    state.apply("nodes", "ADDED", _node("n", None))
    state.apply("leases", "ADDED", lease_of("n", 1.0))

    def on_freed(node: str, pod_went: bool) -> None:
        assert not pod_went  # nothing kube-scheduler would retry its pods for
        freed.append(node)

    state.on_freed = on_freed
    cordoned = _node("n", None)
    cordoned["metadata"]["annotations"][KEYS.device_cordon] = "GPU-1"
    state.apply("nodes", "MODIFIED", cordoned)  # a GPU cordoned: the view changes, so it is told too
    assert freed == ["n"]
    locked = _node("n", None)
    locked["metadata"]["annotations"][KEYS.device_cordon] = "GPU-1"
    locked["metadata"]["annotations"][KEYS.node_lock] = "2027-01-15T08:00:00Z,ns,p"
    state.apply("nodes", "MODIFIED", locked)  # HAMi's node lock: nothing about the GPUs
    state.apply("leases", "MODIFIED", lease_of("n", 0.5))  # a renewal of a live Lease
    state.apply("leases", "MODIFIED", {"metadata": {"name": "someone-else"}, "spec": {}})
    assert freed == ["n"]
    state.apply("nodes", "MODIFIED", _node("n", None))  # uncordoned
    assert freed == ["n", "n"]
    state.apply("leases", "MODIFIED", lease_of("n", 60.0))  # stale: the plugin stopped reporting
    state.apply("leases", "MODIFIED", lease_of("n", 0.0))  # reporting again
    assert freed == ["n", "n", "n"]
    state.apply("nodes", "MODIFIED", _node("n", '{"GPU-1":0}'))  # memory used outside measured
    assert freed == ["n", "n", "n", "n"]


def test_a_failing_on_freed_is_logged_and_the_state_is_whole(caplog: pytest.LogCaptureFixture) -> None:
    state = ClusterState(Config(), clock=FakeClock())
    state.apply("pods", "ADDED", _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n"))

    def broken(node: str) -> None:
        raise RuntimeError("no loop")

    state.on_freed = broken
    state.apply("pods", "DELETED", _pod("a", "n", "GPU-1,NVIDIA,1000,10:;", node_name="n"))
    assert state.used("n") == {} and "a" not in state.charges and "a" not in state.pods
    assert "node n: asking for retries of the pods that fit there failed" in caplog.text
