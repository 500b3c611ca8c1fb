"""bench/dra_prepare_bench: every call of each phase answers without error (the bench asserts it)
and each phase is measured. Asserts behaviour only, never timings."""

from __future__ import annotations

import pytest

from bench import dra_prepare_bench


@pytest.mark.timeout(120)
async def test_the_bench_prepares_answers_again_and_unprepares_every_claim() -> None:
    figures = await dra_prepare_bench.run(5)
    assert set(figures) == {"prepare", "prepare-again", "unprepare"}
    assert all(0 < f["median_ms"] <= f["max_ms"] for f in figures.values())
