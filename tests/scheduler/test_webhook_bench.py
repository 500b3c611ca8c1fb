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


@pytest.mark.slow
@pytest.mark.parametrize("review", ["pod-update", "node-update"])
def test_update_reviews_take_the_guards_allowed_path(review: str) -> None:
    result = webhook_bench.run(
        seconds=0.2, clients=2, rate=50, server_core=None, client_core=None, review=review
    )
    assert result["review"] == review
    assert all(p["reviews"] > 0 and p["errors"] == 0 for p in result["phases"])


def test_update_review_bodies_are_updates_the_guard_allows() -> None:
    import json

    from vgpu.core import guard
    from vgpu.core.annotations import Keys

    cases: tuple[tuple[str, guard.Resource], ...] = (("pod-update", "pods"), ("node-update", "nodes"))
    for review, resource in cases:
        req = json.loads(webhook_bench.review_body(7, review))["request"]
        assert req["operation"] == "UPDATE" and req["object"] != req["oldObject"]
        decision = guard.decide(
            resource, obj=req["object"], old=req["oldObject"], user_info=req["userInfo"],
            keys=Keys(), trusted=guard.Trusted(),
        )  # fmt: skip
        assert decision.allowed
