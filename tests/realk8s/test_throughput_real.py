"""bench/throughput_bench against a real etcd, kube-apiserver and kube-scheduler (marked ``realk8s``):
the chart's extender configuration read by kube-scheduler itself, the Binding's annotations merged
by kube-apiserver itself, and the node lock's writes counted by the API server's own metrics.
Asserts behaviour only (every pod bound, no GPU overcommitted, each Allocate served the pod that
was bound, the writes each GPU pod costs), never timings."""

from __future__ import annotations

import pathlib

import pytest

from bench import throughput_bench, throughput_options

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("node_lock", "api_writer"), [("always", "inline"), ("contended", "inline"), ("always", "process")]
)
async def test_real_kube_scheduler_binds_every_gpu_pod_through_the_extender(
    k8s_bin: pathlib.Path, node_lock: str, api_writer: str
) -> None:
    """With ``apiWriter: process`` the helper makes the same writes, counted by the API server."""
    opts = throughput_options.parse_args(
        [
            *("--k8s-bin", str(k8s_bin), "--nodes", "20", "--pods", "40", "--slots", "4"),
            *("--timeout-s", "240", "--node-lock", node_lock, "--api-writer", api_writer),
        ]
    )
    outcome = await throughput_bench.run(opts)
    assert [(r["label"], r["bound"]) for r in outcome.results] == [
        ("plain", 40),
        ("gpu-binpack", 40),
        ("gpu-spread", 40),
    ]
    assert outcome.violations == [] and outcome.failures == []
    assert outcome.checks >= 80
    plain, *gpu = outcome.results
    assert plain["detail"]["POST pods/binding"] == 1.0  # kube-scheduler binds plain pods itself
    assert "PATCH pods" not in plain["detail"]
    for phase in gpu:
        writes = phase["detail"]
        # the extender's bind sends one Binding carrying the decision (kube-apiserver merges its
        # annotations into the pod); the device plugin's Allocate writes bind phase success once
        assert writes["POST pods/binding"] == 1.0
        assert writes["PATCH pods"] == 1.0
        # the node lock: taken and released per pod with `always` (a take-over that races the
        # release on a node reused at once is refused by its resourceVersion and tried again, so
        # a small cluster sees a few more), never written with `contended`
        if node_lock == "always":
            assert writes["PATCH nodes"] >= 2.0
        else:
            assert "PATCH nodes" not in writes
        assert ("api-writer" in phase["cpu_ms"]) is (api_writer == "process")
