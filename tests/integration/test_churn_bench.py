"""bench/churn_bench on the demo stack, small: every freed GPU is taken by a waiting pod, and the
filter retries write only where they are on."""

import pytest

from bench import churn_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("retries", [True, False], ids=["retries", "no-retries"])
async def test_each_freed_gpu_goes_to_a_waiting_pod(retries: bool) -> None:
    got = await churn_bench.run(
        {"filterRetries": retries, "apiWatches": "process"}, nodes=1, gpus=2, rounds=2, stall_s=30.0
    )
    assert got["rounds"] == 2 and got["stalls"] == 0
    assert 0 <= got["p50_s"] <= got["max_s"] < 30.0
    if not retries:
        assert got["nudged"] == 0
