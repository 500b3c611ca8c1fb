"""A small run of bench/throughput_bench: the API server and kube-scheduler emulation in processes of
their own, the real vgpu-scheduler over HTTPS, the node side running the device plugin's Allocate.
Asserts behaviour only (every pod bound, no GPU overcommitted, no Allocate failure), never timings."""

from __future__ import annotations

import pytest

from bench import throughput_bench


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("node_lock", ["always", "contended"])
async def test_small_throughput_run_binds_every_pod_without_overcommit(node_lock: str) -> None:
    """Also checks, for every Allocate, that the device plugin served the pod that was bound."""
    opts = throughput_bench.parse_args(
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
            *("--node-lock", node_lock),
        ]
    )
    outcome = await throughput_bench.run(opts)
    assert [(r["label"], r["bound"]) for r in outcome.results] == [
        ("plain", 60),
        ("gpu-binpack", 60),
        ("gpu-spread", 60),
    ]
    assert outcome.violations == [] and outcome.failures == []
    assert outcome.checks >= 120  # every GPU pod's devices were checked against its GPU's capacity
