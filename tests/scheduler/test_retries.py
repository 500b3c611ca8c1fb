"""Filter retries (retries.py): which pending pods are nudged when GPUs come free, how often, the
write, and that the state calls it when a pod's GPUs are let go of."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from vgpu.core import annotations as hami
from vgpu.core import fit, request
from vgpu.core.config import Config, SchedulerConfig
from vgpu.core.device import GpuUsage, GpuUuid
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_scheduler import retries
from vgpu_scheduler.pending import Ask, FilterReasons
from vgpu_scheduler.state import ClusterState

from tests.scheduler.scenario import Cluster, FakeClock, gpu_container
from tests.scheduler.test_dashboard import lease, node, pod

KEYS = hami.KEYS


class _Env:
    """n1: two 16000 MiB GPUs with a fresh Lease; n2: the same, no Lease (not schedulable)."""

    def __init__(self) -> None:
        self.config = Config()
        self.store = Store()
        self.clock = FakeClock()
        self.reasons = FilterReasons()
        self.state = ClusterState(self.config, clock=self.clock)
        self.state.apply("nodes", "ADDED", node("n1"))
        self.state.apply("leases", "ADDED", lease("n1"))
        self.state.apply("nodes", "ADDED", node("n2"))
        self.retries = self.paced(asyncio.sleep)
        self._created: set[str] = set()

    def failed(
        self,
        name: str,
        ago_s: float,
        *,
        mem: int = 1000,
        ns: str = "team",
        priority: int | None = None,
        parsed: bool = True,
        notes: dict[str, str] | None = None,
        init: list[dict[str, Any]] | None = None,
        gpus: int = 1,
        cores: int = 50,
        **kw: Any,
    ) -> None:
        """Pod ``name`` (asking ``gpus`` GPUs with ``mem`` MiB, after the ``init`` containers, with
        ``cores`` then) exists; its /filter failed ``ago_s`` ago."""
        app = gpu_container("main", gpu=gpus, mem=mem, cores=cores) if init else gpu_container(mem=mem)
        obj = pod(name, ns=ns, containers=[app])
        obj["metadata"]["annotations"].update(notes or {})
        if init:
            obj["spec"]["initContainers"] = init
        if priority is not None:
            obj["spec"]["priority"] = priority
        if name not in self._created:
            self.store.create("pods", {"metadata": {"name": name}, "spec": obj["spec"]}, namespace=ns)
            self._created.add(name)
        seen = pod(name, ns=ns, containers=obj["spec"]["containers"], **kw)  # as the watch shows it
        seen["spec"].update({k: v for k, v in obj["spec"].items() if k == "priority"})
        self.state.apply("pods", "MODIFIED", seen)
        ask = Ask(request.parse_pod(obj, self.config), self.config.scheduler.gpu_policy) if parsed else None
        self.reasons.failed(f"uid-{name}", "no GPU fits", now=self.clock() - ago_s, ask=ask)

    def paced(self, sleep: Callable[[float], Awaitable[None]]) -> retries.FilterRetries:
        """Retries over this state that pause with ``sleep`` (the sweep's pace)."""
        return retries.FilterRetries(
            api=LocalKubeApi(self.store),
            reasons=self.reasons,
            state=self.state,
            clock=self.clock,
            wall_clock=self.clock.wall,
            sleep=sleep,
        )

    def nudged(self, ns: str = "team") -> set[str]:
        return {
            p["metadata"]["name"]
            for p in self.store.list("pods", namespace=ns).items
            if retries.RETRY_ANNOTATION in (p["metadata"].get("annotations") or {})
        }


@pytest.fixture
def env() -> _Env:
    return _Env()


async def test_pending_pods_that_fit_the_freed_node_are_nudged_and_no_others(env: _Env) -> None:
    env.failed("long-ago", 120.0)  # raced a deletion our watch showed late (a relist after a lost watch)
    env.failed("recent", 1.5)
    env.failed("too-big", 1.0, mem=200_000)  # no GPU of n1 could ever take it
    env.failed("garbled", 0.9, parsed=False)  # its request did not parse: nothing to check
    env.failed("bound", 0.7, node_name="n1", devices="GPU-n1-0,NVIDIA,1000,0:;")
    env.failed("newest", 0.1)
    env.retries.freed("n1")
    await env.retries.flush()
    assert env.nudged() == {"long-ago", "recent", "newest"} and env.retries.sent == 3
    annotations = env.store.get("pods", "newest", namespace="team")["metadata"]["annotations"]
    assert annotations == {retries.RETRY_ANNOTATION: "2027-01-15T08:00:00Z"}


async def test_a_pod_with_gpu_selectors_is_fitted_in_full_and_alike_asks_once(
    env: _Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    fitted: list[str] = []
    real = Ask.fits

    def counting(self: Ask, view: Any) -> bool:
        fitted.append(str(self.request.selectors.use_types))
        return real(self, view)

    monkeypatch.setattr(Ask, "fits", counting)
    env.failed("t4-a", 0.3, notes={"nvidia.com/use-gputype": "T4"})  # n1's GPUs are T4s
    env.failed("t4-b", 0.2, notes={"nvidia.com/use-gputype": "T4"})
    env.failed("a100", 0.1, notes={"nvidia.com/use-gputype": "A100"})
    env.retries.freed("n1")
    await env.retries.flush()
    assert env.nudged() == {"t4-a", "t4-b"}
    assert sorted(fitted) == ["('a100',)", "('t4',)"]  # replicas asking alike: fitted once


def test_asks_alike_are_equal_and_hash_alike_and_only_simple_ones_have_the_quick_check() -> None:
    config = Config()
    one, two = (pod(n, containers=[gpu_container(mem=1000)]) for n in ("one", "two"))
    a, b = (Ask(request.parse_pod(p, config), config.scheduler.gpu_policy) for p in (one, two))
    assert a == b and hash(a) == hash(b) and a.simple is not None
    typed = pod("typed", containers=[gpu_container(mem=1000)])
    typed["metadata"]["annotations"]["nvidia.com/use-gputype"] = "T4"
    c = Ask(request.parse_pod(typed, config), config.scheduler.gpu_policy)
    assert c != a and c.simple is None and a != "not an ask"


async def test_after_a_pod_went_only_the_pods_that_failed_just_before_are_nudged(env: _Env) -> None:
    """kube-scheduler retries its parked pods itself when a pod goes; only one that failed in the
    window before our watch showed it may have raced that retry. GPUs that come back on a node are
    no reason for kube-scheduler to retry anything, so then every pending pod that fits is nudged."""
    env.failed("old", retries.WINDOW_S + 0.5)
    env.failed("raced", 0.3)
    env.retries.freed("n1", True)
    await env.retries.flush()
    assert env.nudged() == {"raced"}
    env.retries.freed("n1", False)  # say a GPU there was uncordoned
    await env.retries.flush()
    assert env.nudged() == {"raced", "old"}


async def test_nothing_is_nudged_for_a_node_that_cannot_take_pods(env: _Env) -> None:
    env.failed("p", 0.1)
    env.retries.freed("n2")  # no Lease: its device plugin is not known to be alive
    env.retries.freed("n3")  # not a node the state knows
    await env.retries.flush()
    assert env.retries.sent == 0


async def test_a_pod_its_namespace_quota_still_refuses_is_not_nudged(env: _Env) -> None:
    env.state.apply(
        "resourcequotas",
        "ADDED",
        {
            "metadata": {"name": "q", "namespace": "small"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "500"}},
        },
    )
    env.failed("over", 0.2, ns="small")  # 1000 MiB against a 500 MiB quota
    env.failed("free", 0.1, ns="team")
    env.retries.freed("n1")
    await env.retries.flush()
    assert env.nudged("small") == set() and env.nudged("team") == {"free"}


async def test_a_pod_no_placement_of_which_keeps_its_quota_is_not_nudged(env: _Env) -> None:
    """Other namespaces' pods leave n1's GPU 0 6,000 MiB free and GPU 1 15,000: an init container
    of 8,000 MiB fits only on GPU 1, and the app container (3,000 MiB on each of two GPUs), which
    kubelet hands its device on to, takes GPU 1 and GPU 0. The namespace would be charged 8,000 on
    GPU 1 and 3,000 on GPU 0, 11,000 MiB. A 10,000 MiB quota refuses that (as the filter would)
    though the pod-level total, 8,000, is within it; 20,000 does not."""
    for name, devices in (("x", "GPU-n1-0,NVIDIA,10000,0:;"), ("y", "GPU-n1-1,NVIDIA,1000,60:;")):
        env.state.apply(
            "pods", "ADDED", pod(name, node_name="n1", devices=devices, ns="other", phase="Running")
        )
    for ns, limit in (("small", "10000"), ("roomy", "20000")):
        quota = {
            "metadata": {"name": "q", "namespace": ns},
            "spec": {"hard": {"limits.nvidia.com/gpumem": limit}},
        }
        env.state.apply("resourcequotas", "ADDED", quota)
        setup = [gpu_container("setup", mem=8000, cores=0)]
        env.failed(f"job-{ns}", 0.1, ns=ns, mem=3000, gpus=2, cores=0, init=setup)
    env.retries.freed("n1")
    await env.retries.flush()
    assert env.nudged("small") == set() and env.nudged("roomy") == {"job-roomy"}


async def test_a_pod_is_nudged_once_per_interval(env: _Env) -> None:
    env.failed("p", 0.1)
    env.retries.freed("n1")
    env.retries.freed("n1")  # a second release at once: not again
    await env.retries.flush()
    assert env.retries.sent == 1
    env.clock.now += retries.MIN_INTERVAL_S
    env.failed("p", 0.1)  # failed again after the nudge, then GPUs come free again
    env.retries.freed("n1")
    await env.retries.flush()
    assert env.retries.sent == 2


async def test_nudges_are_capped_per_release_and_per_second_priority_then_latest_first(env: _Env) -> None:
    env.failed("vip", 30.0, priority=1000)  # failed long before the others, but comes first
    for i in range(retries.MAX_PER_RELEASE + 5):
        env.failed(f"p{i:02d}", 1.9 - i * 0.01)  # p24 failed last
    env.retries.freed("n1")
    await env.retries.flush()
    assert env.nudged() == {"vip"} | {f"p{i:02d}" for i in range(6, retries.MAX_PER_RELEASE + 5)}
    env.retries.freed("n1")  # within the same second: the budget is spent
    await env.retries.flush()
    assert env.retries.sent == retries.MAX_PER_RELEASE
    env.clock.now += 1.0
    env.retries.freed("n1")  # the six left out
    await env.retries.flush()
    assert env.retries.sent == retries.MAX_PER_RELEASE + 6


async def test_only_the_latest_failures_are_examined(env: _Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries, "MAX_EXAMINED", 3)
    env.failed("oldest", 0.4)
    for name in ("a", "b", "c"):
        env.failed(name, 0.3, mem=200_000)  # the three latest: none fits
    env.retries.freed("n1")
    await env.retries.flush()
    assert env.retries.sent == 0


async def test_a_pod_gone_from_the_api_server_is_logged_not_raised(
    env: _Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vgpu_scheduler.retries")
    env.failed("gone", 0.1)
    env.store.delete("pods", "gone", namespace="team")  # the watch has not shown it yet
    env.retries.freed("n1")
    await env.retries.flush()
    assert (env.retries.sent, env.retries.failed) == (0, 1)
    assert "pod team/gone: could not ask kube-scheduler to retry it" in caplog.text


async def test_the_state_asks_once_it_has_let_go_of_a_finished_pods_gpus(env: _Env) -> None:
    """Wired as app.py wires it: a pod finishing on the full node n1 makes room for the pending one."""
    env.state.on_freed = env.retries.freed
    for gpu in (0, 1):
        env.state.apply(
            "pods",
            "ADDED",
            pod(f"job{gpu}", node_name="n1", devices=f"GPU-n1-{gpu},NVIDIA,16000,0:;", phase="Running"),
        )
    env.failed("waiting", 0.5, mem=16_000)  # kube-scheduler retried it as job1 finished, before we saw it
    env.failed("parked", 10.0, mem=16_000, ns="other")  # failed long before: kube-scheduler retries it
    env.retries.freed("n1")  # a release that frees nothing it fits: no nudge
    await env.retries.flush()
    assert env.retries.sent == 0
    env.state.apply(
        "pods",
        "MODIFIED",
        pod("job1", node_name="n1", devices="GPU-n1-1,NVIDIA,16000,0:;", phase="Succeeded"),
    )
    await env.retries.flush()
    assert env.nudged() == {"waiting"} and env.nudged("other") == set()


def _parked(name: str, *, created: str, priority: int | None = None, **kw: Any) -> dict[str, Any]:
    """Pod ``name`` as the watch shows it once kube-scheduler has marked it unschedulable."""
    obj = pod(name, **kw)
    obj["metadata"]["creationTimestamp"] = created
    obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]
    if priority is not None:
        obj["spec"]["priority"] = priority
    return obj


def _ours(obj: dict[str, Any]) -> bool:
    return bool(obj["spec"].get("schedulerName") == "vgpu-scheduler")


def _seen(env: _Env, obj: dict[str, Any]) -> None:
    """``obj`` exists in the API server and the watch has shown it."""
    meta = obj["metadata"]
    env.store.create(
        "pods", {"metadata": {"name": meta["name"]}, "spec": obj["spec"]}, namespace=meta["namespace"]
    )
    env.state.apply("pods", "ADDED", obj)


async def test_after_a_start_each_parked_pod_of_ours_is_nudged_once_paced_priority_then_oldest_first(
    env: _Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retries, "SWEEP_PER_S", 2)
    seen: list[set[str]] = []

    async def one_second(s: float) -> None:  # the pace: what was nudged before each pause
        assert s == 1.0
        await env.retries.flush()
        seen.append(env.nudged())
        env.clock.now += s

    env.retries = env.paced(one_second)
    _seen(env, _parked("old", created="2026-11-28T01:00:00Z"))
    _seen(env, _parked("new", created="2026-11-28T03:00:00Z"))
    _seen(env, _parked("vip", created="2026-11-28T04:00:00Z", priority=1000))
    _seen(env, pod("queued"))  # not tried yet: in kube-scheduler's active queue
    _seen(env, _parked("other", created="2026-11-28T00:00:00Z", scheduler="default-scheduler"))
    _seen(
        env,
        _parked("bound", created="2026-11-28T00:00:00Z", node_name="n1", devices="GPU-n1-0,NVIDIA,1000,0:;"),
    )
    assert await env.retries.sweep(_ours) == 3
    await env.retries.flush()
    assert seen == [{"vip", "old"}] and env.nudged() == {"vip", "old", "new"}
    assert (env.retries.sent, env.retries.failed) == (3, 0)
    assert await env.retries.sweep(_ours) == 0  # at once again: each is nudged once per interval


async def test_a_pod_bound_during_the_sweeps_pause_is_not_nudged(
    env: _Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retries, "SWEEP_PER_S", 1)

    async def bind_second(s: float) -> None:  # kube-scheduler retried it meanwhile on its own
        env.state.apply("pods", "MODIFIED", pod("second", node_name="n1", devices="GPU-n1-0,NVIDIA,1000,0:;"))
        env.clock.now += s

    env.retries = env.paced(bind_second)
    _seen(env, _parked("first", created="2026-11-28T01:00:00Z"))
    _seen(env, _parked("second", created="2026-11-28T02:00:00Z"))
    assert await env.retries.sweep(_ours) == 1
    await env.retries.flush()
    assert env.nudged() == {"first"}


async def test_the_sweep_passes_over_pods_kube_scheduler_tried_since_the_start(env: _Env) -> None:
    for name in ("refiltered", "decided", "gone", "waiting"):
        _seen(env, _parked(name, created="2026-11-28T01:00:00Z"))
    env.reasons.failed("uid-refiltered", "no GPU fits", now=env.clock())  # its /filter failed just now
    placement = fit.Placement(devices=(), usage={GpuUuid("GPU-n1-1"): GpuUsage(1, 2000, 10)})
    env.state.reserve("uid-decided", namespace="team", node="n1", placement=placement, devices_raw="x")
    env.state.apply("pods", "DELETED", _parked("gone", created="2026-11-28T01:00:00Z"))
    assert await env.retries.sweep(_ours) == 1
    await env.retries.flush()
    assert env.nudged() == {"waiting"}


class _Backoffs:
    """A ``sleep`` for the retries that records each pause and lets the clock pass it, and may
    change the world at a pause (kube-scheduler acting meanwhile)."""

    def __init__(self, env: _Env) -> None:
        self.env = env
        self.pauses: list[float] = []
        self.during: Callable[[], None] | None = None

    async def __call__(self, s: float) -> None:
        self.pauses.append(s)
        self.env.clock.now += s
        if self.during is not None:
            self.during()


def _bind_failed_env(env: _Env, *names: str) -> _Backoffs:
    sleeps = _Backoffs(env)
    env.retries = env.paced(sleeps)
    for name in names:
        _seen(env, pod(name))
    return sleeps


async def test_a_failed_bind_is_nudged_after_a_back_off_that_doubles_per_failure_in_a_row(env: _Env) -> None:
    sleeps = _bind_failed_env(env, "blocked")
    delays = []
    for _ in range(6):  # each failure comes once the nudge for the one before has been sent
        delays.append(env.retries.bind_failed("uid-blocked"))
        await env.retries.flush()
    assert delays == sleeps.pauses == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert env.nudged() == {"blocked"} and env.retries.sent == 6
    env.clock.now += retries.BIND_FAILURES_FORGOTTEN_S  # a failure long after: counted from one again
    assert env.retries.bind_failed("uid-blocked") == 1.0
    await env.retries.flush()


async def test_a_failure_before_the_back_off_passed_replaces_the_waiting_nudge(env: _Env) -> None:
    _seen(env, pod("blocked"))
    pauses: list[float] = []
    waiting = asyncio.Event()

    async def first_never_passes(s: float) -> None:
        pauses.append(s)
        if len(pauses) == 1:
            waiting.set()
            await asyncio.Event().wait()  # cancelled by the second failure
        env.clock.now += s

    env.retries = env.paced(first_never_passes)
    env.retries.bind_failed("uid-blocked")
    await waiting.wait()
    env.retries.bind_failed("uid-blocked")
    await env.retries.flush()
    assert pauses == [1.0, 2.0] and env.retries.sent == 1


async def test_no_nudge_after_a_failed_bind_once_kube_scheduler_has_tried_the_pod_again(env: _Env) -> None:
    sleeps = _bind_failed_env(env, "bound", "decided", "refiltered", "gone", "waiting")

    def meanwhile() -> None:
        env.state.apply("pods", "MODIFIED", pod("bound", node_name="n1", devices="GPU-n1-0,NVIDIA,1000,0:;"))
        placement = fit.Placement(devices=(), usage={GpuUuid("GPU-n1-1"): GpuUsage(1, 2000, 10)})
        env.state.reserve("uid-decided", namespace="team", node="n1", placement=placement, devices_raw="x")
        env.reasons.failed("uid-refiltered", "no GPU fits", now=env.clock())
        env.state.apply("pods", "DELETED", pod("gone"))

    sleeps.during = meanwhile
    for name in ("bound", "decided", "refiltered", "gone", "waiting"):
        env.retries.bind_failed(f"uid-{name}")
    await env.retries.flush()
    assert env.nudged() == {"waiting"} and env.retries.sent == 1


async def test_nudges_after_failed_binds_wait_for_the_next_second_once_the_second_is_spent(
    env: _Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retries, "MAX_PER_S", 2)
    monkeypatch.setattr(retries, "BIND_RETRY_INITIAL_S", 0.5)
    for name in ("a", "b", "c"):
        _seen(env, pod(name))
    pauses: list[float] = []

    async def pause(s: float) -> None:  # the three back-offs pass at once; a wait for the budget takes 1 s
        pauses.append(s)
        env.clock.now += s if s == 1.0 else 0.0

    env.retries = env.paced(pause)
    for name in ("a", "b", "c"):
        env.retries.bind_failed(f"uid-{name}")
    await env.retries.flush()
    assert env.nudged() == {"a", "b", "c"}
    assert pauses == [0.5, 0.5, 0.5, 1.0]  # two nudges in the second, the third waited for the next


@pytest.fixture(params=[True, False], ids=["filterRetries", "filterRetries-false"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    c = Cluster(Config(scheduler=SchedulerConfig(filter_retries=request.param, bind_lock_wait_s=0.2)))
    c.add_node("node-a")
    c.add_node("node-b")
    await c.start()
    yield c
    await c.stop()


async def test_through_the_service_a_deleted_pod_gets_the_one_that_fits_retried(served: Cluster) -> None:
    """Real HTTP and the service's own watches: four pods fill node-a's and node-b's four GPUs, two
    more fail /filter, one of the four is deleted; only the pod that fits one free GPU is nudged,
    and none with ``filterRetries: false``."""
    cluster, wanted = served, served.config.scheduler.filter_retries
    for i in range(4):
        cluster.add_pod(f"p{i}", gpu_container(mem=16000))
        await cluster.synced()
        (node_name,) = (await cluster.filter(f"p{i}"))["NodeNames"]
        assert await cluster.bind(f"p{i}", node_name) == ""
        cluster.plugin_allocates(f"p{i}", node_name)
    cluster.add_pod("one", gpu_container(mem=16000))
    cluster.add_pod("two", gpu_container(gpu=2, mem=16000))
    await cluster.synced()
    assert (await cluster.filter("one"))["NodeNames"] == (await cluster.filter("two"))["NodeNames"] == []
    cluster.store.delete("pods", "p0", namespace="default")
    await cluster.synced()
    service = cluster.service
    assert service is not None
    await service.retries.flush()
    assert (retries.RETRY_ANNOTATION in cluster.pod("one")["metadata"]["annotations"]) is wanted
    assert retries.RETRY_ANNOTATION not in cluster.pod("two")["metadata"]["annotations"]
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/metrics") as resp:
        text = await resp.text()
    assert f'vgpu_scheduler_filter_retries_total{{result="sent"}} {float(wanted)}' in text
    assert 'vgpu_scheduler_filter_retries_total{result="failed"} 0.0' in text


async def test_through_the_service_a_pod_whose_bind_failed_is_nudged_after_its_back_off(
    served: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real HTTP: a bind that waited out a node lock held by a live pod fails, and once its back-off
    has passed the pod is nudged (``filterRetries: false``: not); a bind that succeeds is not."""
    monkeypatch.setattr(retries, "BIND_RETRY_INITIAL_S", 0.01)
    cluster, wanted = served, served.config.scheduler.filter_retries
    cluster.add_pod("fine", gpu_container(mem=1000))
    await cluster.synced()
    (node_name,) = (await cluster.filter("fine"))["NodeNames"]
    assert await cluster.bind("fine", node_name) == ""
    cluster.add_pod("holder", gpu_container(mem=1), annotations={KEYS.bind_phase: "allocating"})
    stamp = hami.format_rfc3339(cluster.clock.wall())
    for name in ("node-a", "node-b"):  # both nodes locked: the filter cannot pass over a busy one
        cluster.store.patch(
            "nodes", name, {"metadata": {"annotations": {KEYS.node_lock: f"{stamp},default,holder"}}}
        )
    cluster.add_pod("blocked", gpu_container(mem=1000))
    await cluster.synced()
    (node_name,) = (await cluster.filter("blocked"))["NodeNames"]
    assert "is locked by default/holder" in await cluster.bind("blocked", node_name)
    service = cluster.service
    assert service is not None
    await service.retries.flush()
    assert (retries.RETRY_ANNOTATION in cluster.pod("blocked")["metadata"]["annotations"]) is wanted
    assert retries.RETRY_ANNOTATION not in cluster.pod("fine")["metadata"]["annotations"]
