"""The preemption benchmark runs end to end (tiny size): every offered node gets exactly one victim."""

from __future__ import annotations

from bench import preempt_bench


async def test_bench_runs_and_answers_every_node() -> None:
    result = await preempt_bench.run(nodes=40, candidates=20, requests=5, alone_s=0.3)
    assert result["candidates"] == 20 and result["answered_min"] == 20
    assert result["filter_alone_p50_ms"] > 0  # the /filter caller (a process of its own) ran
    assert 0 < result["server_p50_ms"] <= result["server_p99_ms"]
    assert result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
