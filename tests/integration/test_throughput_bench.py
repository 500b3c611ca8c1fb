"""A small run of bench/throughput_bench: the API server and kube-scheduler emulation in processes of
their own, the real vgpu-scheduler over HTTPS, the node side running the device plugin's Allocate.
Asserts behaviour only (every pod bound, no GPU overcommitted, no Allocate failure), never timings."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import pytest

from bench import (
    throughput_bench,
    throughput_figures,
    throughput_options,
    throughput_phase,
    throughput_pods,
    throughput_report,
    throughput_shards,
)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("node_lock", "api_writer", "node_procs", "nice", "api_watches"),
    [
        ("always", "inline", 0, 0, "inline"),
        ("contended", "inline", 0, 0, "inline"),
        ("always", "process", 2, 3, "process"),
    ],
)
async def test_small_throughput_run_binds_every_pod_without_overcommit(
    node_lock: str, api_writer: str, node_procs: int, nice: int, api_watches: str
) -> None:
    """Also checks, for every Allocate, that the device plugin served the pod that was bound; with
    ``apiWriter: process``, that the scheduler's helper made its writes (node locks, Bindings);
    with ``--node-procs``, that the node shards between them served every node; with
    ``--scheduler-nice``, that the scheduler and its helper ran at that niceness; with
    ``--api-watches process``, that the helper read the watches."""
    opts = throughput_options.parse_args(
        [
            *(
                "--nodes",
                "20",
                "--pods",
                "60",
                "--write-latency-ms",
                "0",
                "--slots",
                "4",
                "--timeout-s",
                "240",
            ),
            *("--node-lock", node_lock, "--api-writer", api_writer, "--node-procs", str(node_procs)),
            *("--scheduler-nice", str(nice), "--api-watches", api_watches),
        ]
    )
    outcome = await throughput_bench.run(opts)
    helper = {"api-writer": nice} if api_writer == "process" else {}
    assert outcome.niceness == {"vgpu-scheduler": nice, **helper}
    assert outcome.watches == ("by the helper" if api_watches == "process" else "here")
    assert [(r["label"], r["bound"]) for r in outcome.results] == [
        ("plain", 60),
        ("gpu-binpack", 60),
        ("gpu-spread", 60),
    ]
    assert outcome.violations == [] and outcome.failures == []
    # the scheduler's counts of calls on new connections were read for every GPU phase
    assert outcome.results[0]["dialled"] == {}  # plain pods: no extender calls
    for result in outcome.results[1:]:
        assert set(result["dialled"]) == {"filter", "bind"}
        assert all(0.0 <= share <= 1.0 for share in result["dialled"].values())
    assert outcome.checks >= 120  # every GPU pod's devices were checked against its GPU's capacity
    # every pod went through its node's Allocate (GPU pods) to Running, whichever process had the node
    assert [r["settled"] for r in outcome.results] == [60, 60, 60]
    shards = {f"nodes-{i}" for i in range(node_procs)}
    own = {"bench"} | shards if node_procs else {"bench+nodes"}
    assert all(
        own <= r["cpu_ms"].keys() and not ({"bench+nodes", "bench"} - own) & r["cpu_ms"].keys()
        for r in outcome.results
    )
    assert all(r["cpu_ms"][shard] > 0 for r in outcome.results[1:] for shard in shards)
    # the cores each process kept busy over its phase: the vgpu-scheduler, one Python event loop,
    # worked on every GPU pod and cannot keep much more than one core busy
    for r in outcome.results:
        assert r["cores_used"].keys() == r["cpu_ms"].keys()
        assert all(n >= 0 for n in r["cores_used"].values())
    assert all(0 < r["cores_used"]["vgpu-scheduler"] < 1.2 for r in outcome.results[1:])
    # the helper process is there, and busy, exactly when asked for: it made every GPU pod's writes
    assert all(("api-writer" in r["cpu_ms"]) is (api_writer == "process") for r in outcome.results)
    if api_writer == "process":
        assert all(r["cpu_ms"]["api-writer"] > 0 for r in outcome.results[1:])
    # kube-scheduler's part of every pod's latency, from the emulation's log: each pod counted once
    assert [sorted((part, n) for part, (_, _, n) in r["split_ms"].items()) for r in outcome.results] == [
        [("binding", 60), ("cycle", 60), ("queued", 60)]
    ] * 3


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_hamis_device_plugin_finds_the_bound_pod_with_the_default_lock_mode() -> None:
    """HAMi's device plugin (v2.x) reads the node lock to find the pod an Allocate is for, and
    without one takes the first pending pod (LIST order) in bind phase ``allocating`` or
    ``success``. With containers slow to start (an image pull), a node packed by binpack holds
    such pods while the next one is handed over; with ``nodeLock: always`` (the default) every
    Allocate still serves the pod that was bound, since the lock names it from bind to Allocate.
    (``contended`` is for kube-vgpu's device plugin: docs/scheduler.md.)
    tests/device_plugin/test_hami_search_bench.py calls the search itself."""
    opts = throughput_options.parse_args(
        [
            *("--nodes", "10", "--pods", "60", "--write-latency-ms", "0", "--timeout-s", "240"),
            *("--policies", "binpack", "--plugin-search", "hami", "--start-delay-s", "0.3"),
            *("--node-lock", "always"),
        ]
    )
    outcome = await throughput_bench.run(opts)
    assert [(r["label"], r["bound"]) for r in outcome.results] == [("plain", 60), ("gpu-binpack", 60)]
    assert outcome.violations == [] and outcome.failures == []


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_with_the_charts_webhooks_gpu_pods_are_mutated_and_every_guarded_write_passes() -> None:
    """``--webhooks chart``: GPU pods are created without a schedulerName, so only the mutating
    webhook sends them to the vgpu-scheduler, and the update guard sees every lock write and the
    device plugin's bind-phase PATCH (all trusted: a refused one would leave a pod unbound or an
    Allocate failed)."""
    opts = throughput_options.parse_args(
        [
            *("--nodes", "10", "--pods", "30", "--write-latency-ms", "0", "--timeout-s", "240"),
            *("--policies", "binpack", "--node-lock", "always", "--webhooks", "chart"),
        ]
    )
    outcome = await throughput_bench.run(opts)
    assert [(r["label"], r["bound"]) for r in outcome.results] == [("plain", 30), ("gpu-binpack", 30)]
    gpu = outcome.results[1]["detail"]
    assert gpu["vgpu-scheduler POST pods/binding"] == 1.0 and gpu["vgpu-device-plugin PATCH pods"] == 1.0
    assert outcome.violations == [] and outcome.failures == []


def _phase(label: str, rate: float, p99: float, cpu_ms: float = 0.0, busy: float = 0.0) -> dict[str, object]:
    cpu = {"apiserver": cpu_ms / 2, "bench+nodes": cpu_ms / 2} if cpu_ms else {}
    return {"label": label, "rate": rate, "p99": p99, "bound": 10, "pods": 10, "cpu_ms": cpu, "busy": busy}


def test_repeat_summary_gives_median_and_range_of_each_phase_against_its_own_runs_plain() -> None:
    """Each run's GPU phase is compared with the plain phase of the same run, then summarised."""
    runs = [
        throughput_report.Outcome(
            [_phase("plain", 300, 0.1, 3.5), _phase("gpu-binpack", 240, 0.15)], [], [], 0
        ),
        throughput_report.Outcome(
            [_phase("plain", 200, 0.2, 5.0), _phase("gpu-binpack", 180, 0.2)], [], [], 0
        ),
        throughput_report.Outcome(
            [_phase("plain", 400, 0.1, 3.0), _phase("gpu-binpack", 200, 0.4)], [], [], 0
        ),
    ]
    assert throughput_report.summary(runs) == [
        "over 3 runs (median, range):",
        "plain phase's CPU per pod, all processes (the machine's speed): 3.5 ms (3.0-5.0); "
        "compare summaries only at similar figures",
        "gpu-binpack: 80 % of the plain rate (50-90), p99 1.5x plain (1.0-4.0)",
    ]
    # with how busy the cores were in each GPU phase, where every run measured it
    for run, busy in zip(runs, (0.92, 0.95, 0.88), strict=True):
        run.results[1]["busy"] = busy
    assert throughput_report.summary(runs)[-1] == (
        "gpu-binpack: 80 % of the plain rate (50-90), p99 1.5x plain (1.0-4.0), cores 92 % busy (88-95)"
    )


def test_repeat_below_one_is_refused() -> None:
    with pytest.raises(SystemExit):
        throughput_options.parse_args(["--repeat", "0"])


async def test_tracker_is_done_when_every_pod_of_the_phase_is_seen_bound() -> None:
    def seen(name: str, node: str | None, kind: str = "MODIFIED") -> SimpleNamespace:
        return SimpleNamespace(type=kind, object={"metadata": {"name": name}, "spec": {"nodeName": node}})

    tracker = throughput_phase.Tracker()
    tracker.on_pod(seen("early", "n1"))  # bound before its phase began: counts for that phase
    tracker.expect(["early", "a", "b"])
    for change in (
        seen("a", None, "ADDED"),
        seen("a", "n2"),
        seen("other", "n3"),
        seen("b", "n4", "DELETED"),
    ):
        tracker.on_pod(change)
    assert not tracker.done.is_set()  # b is not bound (its deletion does not count)
    tracker.on_pod(seen("b", "n4"))
    assert tracker.done.is_set()
    assert tracker.node == {"early": "n1", "a": "n2", "other": "n3", "b": "n4"}
    tracker.expect(["c"])  # a new phase: not done until c is bound
    assert not tracker.done.is_set()
    tracker.expect(["a", "b"])  # every one bound already: done at once
    assert tracker.done.is_set()


def test_a_policy_given_again_is_a_phase_of_its_own_with_pods_of_its_own() -> None:
    phases = throughput_pods.phase_labels(["binpack", "spread", "binpack", "binpack"])
    assert phases == [
        ("gpu-binpack", "binpack"),
        ("gpu-spread", "spread"),
        ("gpu-binpack-2", "binpack"),
        ("gpu-binpack-3", "binpack"),
    ]
    assert throughput_pods.phase_labels([]) == []


def test_offered_rate_is_how_fast_the_phase_pods_were_created() -> None:
    """Five creates 0.1 s apart: 10 pods/s, whatever other pods were created around them; a phase
    of one pod, or none seen, has no rate."""
    created = {f"p{i}": 7.0 + i * 0.1 for i in range(5)} | {"other": 100.0}
    assert throughput_figures.offered_rate(created, [f"p{i}" for i in range(5)]) == pytest.approx(10.0)
    assert throughput_figures.offered_rate(created, ["p0", "unseen"]) == 0.0
    assert throughput_figures.offered_rate(created, []) == 0.0


def test_scheduling_split_reads_the_phase_pods_lines_and_skips_the_rest() -> None:
    log = "\n".join(
        [
            "2026-11-27 09:00:00,001 INFO vgpu.localcluster.scheduler: scheduled pod default/a to node n1 "
            "(queued 1.5 ms, cycle 2.0 ms, binding 30.25 ms)",
            "... scheduled pod default/b to node n2 (queued 7 ms, cycle 3.0 ms, binding 40.0 ms)",
            "... scheduled pod default/a to node n3 (queued 0.5 ms, cycle 1.0 ms, binding 20.0 ms)",  # again
            "... scheduled pod other/c to node n1 (queued 9.0 ms, cycle 9.0 ms, binding 9.0 ms)",  # namespace
            "... scheduled pod default/d to node n1 (queued 9.0 ms, cycle 9.0 ms, binding 9.0 ms)",  # not asked
            "... scheduled pod default/e to node n1 (queued -1 ms, cycle x ms, binding 9.0 ms)",  # garbage
            "... scheduled pod default/f to node n1",  # an older line without the split
            "\x00\xff scheduled pod default/ to node (queued",
        ]
    )
    split = throughput_figures.scheduling_split(log, ["a", "b", "c", "e", "f", "missing"])
    assert {part: sorted(ms) for part, ms in split.items()} == {
        "queued": [0.5, 7.0],
        "cycle": [1.0, 3.0],
        "binding": [20.0, 40.0],
    }
    assert throughput_figures.scheduling_split("", ["a"]) == {"queued": [], "cycle": [], "binding": []}


async def test_reading_the_split_of_a_log_that_is_not_there_gives_nothing(tmp_path) -> None:
    got = await throughput_figures.read_split(tmp_path / "missing.log", ["a"], wait_s=0.0)
    assert got == {"queued": [], "cycle": [], "binding": []}


def _change(
    name: str, *, node: str = "", phase: str = "Pending", kind: str = "MODIFIED", bind_phase: str = ""
) -> SimpleNamespace:
    meta: dict[str, object] = {"name": name}
    if bind_phase:
        meta["annotations"] = {"hami.io/bind-phase": bind_phase}
    pod = {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}
    return SimpleNamespace(type=kind, object=pod)


async def test_tracker_settles_when_the_node_side_is_done_with_every_pod_not_when_bound() -> None:
    """The phase's CPU and request counts are read once every pod is Running or Failed: the last
    pods' Allocate and bind-phase write come after the bind the latency is measured to."""
    tracker = throughput_phase.Tracker()
    tracker.expect(["a", "b"])
    tracker.on_pod(_change("a", node="n1"))
    tracker.on_pod(_change("b", node="n2"))
    assert tracker.done.is_set() and not tracker.settled.is_set()
    assert set(tracker.bound) == {"a", "b"}
    tracker.on_pod(_change("a", node="n1", phase="Running"))
    tracker.on_pod(_change("x", node="n1", phase="Running"))  # not this phase's
    tracker.on_pod(_change("b", node="n2", phase="Pending", kind="DELETED"))
    assert not tracker.settled.is_set()
    tracker.on_pod(_change("b", node="n2", phase="Failed"))  # kubelet failed it: done with it too
    assert tracker.settled.is_set()
    tracker.expect(["a", "x"])  # pods seen bound and running before their phase: nothing to wait for
    assert tracker.done.is_set() and tracker.settled.is_set()
    tracker.expect(["y"])
    assert not tracker.done.is_set() and not tracker.settled.is_set()


async def test_a_running_gpu_pod_is_settled_only_once_its_bind_phase_is_written() -> None:
    """The device plugin writes the bind phase after answering Allocate, so the container can be
    Running while the phase still reads ``allocating``: its PATCH is part of the pod's way, and the
    counts are read after it (the chart-webhooks test once read 29 of 30)."""
    tracker = throughput_phase.Tracker()
    tracker.expect(["g"])
    tracker.on_pod(_change("g", node="n1", phase="Running", bind_phase="allocating"))
    assert tracker.done.is_set() and not tracker.settled.is_set()
    tracker.on_pod(_change("g", node="n1", phase="Running", bind_phase="success"))
    assert tracker.settled.is_set()


async def test_a_node_shard_that_cannot_start_is_an_error_naming_its_log(tmp_path: pathlib.Path) -> None:
    """Nothing listens at the URL: the shard's first register write fails and it exits without
    ``ready``; the bench says which shard and where its log is, and the other shard ends too."""
    config = tmp_path / "vgpu.yaml"
    config.write_text("scheduler: {}\n")
    opts = throughput_options.parse_args(["--nodes", "4", "--node-procs", "2"])
    args = throughput_shards.shard_args(
        opts, url="http://127.0.0.1:9", ca_file=None, config_file=config, host_root=tmp_path / "host"
    )
    shards = throughput_shards.Shards(2, args, token=None, log_dir=tmp_path)
    with pytest.raises(RuntimeError, match=r"node shard 0 did not start \(see nodes-0.log\)"):
        await shards.__aenter__()
    assert [proc.returncode is not None for proc in shards.procs] == [True, True]
    assert "Traceback" in (tmp_path / "nodes-0.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_loop_steps_are_counted_in_the_scheduler_by_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--loop-steps`` loads bench/loopsteps/sitecustomize.py into the vgpu-scheduler only; with no
    threshold every step counts, so each phase shows the informers' steps and, for GPU pods, the
    extender connection's reads, each /filter answered within one of them."""
    monkeypatch.setenv("VGPU_BENCH_LOOP_STEPS_MIN_MS", "0")
    opts = throughput_options.parse_args(
        [
            *("--nodes", "10", "--pods", "30", "--write-latency-ms", "0", "--slots", "4"),
            *("--policies", "binpack", "--loop-steps", "--timeout-s", "240"),
        ]
    )
    outcome = await throughput_bench.run(opts)
    assert outcome.ok
    plain, gpu = outcome.results
    kinds = {r["kind"]: r for r in gpu["loop_steps"]}
    filters = kinds["_SelectorSocketTransport._read_ready (Connection)"]
    assert filters["count"] >= 30 and filters["total_ms"] > 0
    assert any(k.startswith("task Informer.run") for k in kinds)
    assert not any("(Connection)" in r["kind"] for r in plain["loop_steps"])  # no /filter for plain pods
    assert all(r["p99_ms"] <= r["max_ms"] for r in gpu["loop_steps"])


def test_loop_step_summary_differences_two_readings_and_finds_the_p99_bucket() -> None:
    bounds = [0.2, 0.5, 1.0]
    before = {"buckets_ms": bounds, "kinds": {"a": {"buckets": [10, 0, 0, 0], "total_s": 0.001}}}
    after = {
        "buckets_ms": bounds,
        "kinds": {
            "a": {"buckets": [10 + 98, 1, 1, 0], "total_s": 0.031},  # 100 more, 2 of them long
            "b": {"buckets": [0, 0, 0, 3], "total_s": 0.9},  # new, all over the last bound
            "c": {"buckets": [5, 0, 0, 0], "total_s": 0.002},
        },
    }
    before["kinds"]["c"] = {"buckets": [5, 0, 0, 0], "total_s": 0.002}  # nothing new for c
    rows = throughput_figures.loop_step_summary(before, after)
    assert [r["kind"] for r in rows] == ["b", "a"]  # the longest total first; c had none this phase
    b, a = rows
    assert (b["count"], b["p99_ms"], b["max_ms"]) == (3, float("inf"), float("inf"))
    assert (a["count"], a["p99_ms"], a["max_ms"]) == (100, 0.5, 1.0)
    assert a["total_ms"] == pytest.approx(30.0)
    assert throughput_figures.loop_step_summary({}, {}) == []
    assert throughput_figures.loop_step_summary({}, after)[0]["kind"] == "b"  # no reading before: from 0


SCHEDULER_METRICS = """\
# TYPE vgpu_scheduler_filter_duration_seconds histogram
vgpu_scheduler_filter_duration_seconds_bucket{le="0.001",outcome="placed"} 8.0
vgpu_scheduler_filter_duration_seconds_count{outcome="placed"} 8.0
vgpu_scheduler_filter_duration_seconds_sum{outcome="placed"} 0.004
vgpu_scheduler_filter_duration_seconds_count{outcome="unschedulable"} 2.0
vgpu_scheduler_filter_duration_seconds_sum{outcome="unschedulable"} 0.006
vgpu_scheduler_bind_duration_seconds_count{outcome="bound"} 3.0
vgpu_scheduler_bind_duration_seconds_sum{outcome="bound"} 0.09
vgpu_scheduler_extender_requests_total{connection="new",path="/filter"} 6.0
vgpu_scheduler_extender_requests_total{connection="kept",path="/filter"} 4.0
vgpu_scheduler_extender_requests_total{connection="kept",path="/bind"} 3.0
vgpu_scheduler_filter_duration_seconds_sum{outcome="placed"} not-a-number
garbage {{{
"""


def test_the_schedulers_figures_sum_every_label_set_and_skip_garbage() -> None:
    samples = throughput_figures.extender_samples(SCHEDULER_METRICS)
    assert samples == {
        "filter count": 10.0,  # both outcomes, not the last one read
        "filter sum": 0.01,
        "bind count": 3.0,
        "bind sum": 0.09,
        "filter new": 6.0,
        "filter kept": 4.0,
        "bind kept": 3.0,
    }
    assert throughput_figures.served_ms(samples) == {"filter": 1.0, "bind": 30.0}
    assert throughput_figures.dialled_share(samples) == {"filter": 0.6, "bind": 0.0}
    assert throughput_figures.extender_samples("") == {}
    assert throughput_figures.served_ms({}) == {} and throughput_figures.dialled_share({}) == {}


def test_cpu_ceilings_divide_the_cores_by_each_groups_cpu_per_pod() -> None:
    cpu_ms = {
        "etcd": 5.0,
        "apiserver": 15.0,
        "kube-scheduler": 20.0,
        "kube-controller-manager": 5.0,
        "bench+nodes": 5.0,
    }
    ceilings = throughput_report.cpu_ceilings(cpu_ms, cores=2)
    assert ceilings == pytest.approx(
        {"every process": 2000 / 50, "control plane": 2000 / 45, "its writes alone": 2000 / 25}
    )
    # the emulation has no etcd nor kube-controller-manager: what it measured still counts
    assert throughput_report.cpu_ceilings({"apiserver": 4.0}, cores=1) == pytest.approx(
        {"every process": 250.0, "control plane": 250.0, "its writes alone": 250.0}
    )
    # a group that used no CPU, or no cores, has no ceiling
    assert throughput_report.cpu_ceilings({"bench+nodes": 2.0}, cores=2) == {"every process": 1000.0}
    assert throughput_report.cpu_ceilings(cpu_ms, cores=0) == {}
    assert throughput_report.cpu_ceilings({}, cores=2) == {}
