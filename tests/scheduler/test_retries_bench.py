"""bench/retries_bench runs and its release really nudges (or not) as its backlog says."""

from bench import retries_bench


async def test_the_bench_nudges_pods_that_fit_and_none_that_do_not() -> None:
    fit = await retries_bench.run("alike-fit", nodes=20, pending=100, releases=50)
    miss = await retries_bench.run("distinct-miss", nodes=20, pending=100, releases=50)
    # 50 releases 10 ms apart: 0.5 s, one per-second budget of 20 nudges
    assert fit["nudges"] == 20 and miss["nudges"] == 0
    assert 0 < fit["p50_us"] <= fit["p99_us"] and 0 < miss["p50_us"] <= miss["p99_us"]
