"""The webhook benchmark runs end to end (tiny load): real server process, port 0, no errors."""

from __future__ import annotations

import pytest

from bench import webhook_bench


@pytest.mark.slow
def test_bench_runs_and_every_review_is_allowed() -> None:
    result = webhook_bench.run(seconds=0.3, clients=4, rate=100, server_core=None, client_core=None)
    closed, open_loop = result["phases"]
    assert closed["reviews"] > 0 and closed["errors"] == 0
    assert open_loop["errors"] == 0 and abs(open_loop["reviews"] - 30) <= 1  # rate x seconds
    assert closed["p50_ms"] <= closed["p99_ms"] <= closed["max_ms"]
    assert result["server_cpu_us_per_review"] > 0
    assert 0 < result["handler_cpu"]["p50_ms"] <= result["handler_cpu"]["p99_ms"]
    assert 0 < result["handler_wall"]["p50_ms"] <= result["handler_wall"]["p99_ms"]
