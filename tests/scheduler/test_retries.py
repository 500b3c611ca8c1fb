"""Filter retries (retries.py): which pods are nudged when GPUs come free, how often, and the write."""

from __future__ import annotations

import datetime
import logging
from typing import Any

import pytest
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu_scheduler import retries
from vgpu_scheduler.pending import FilterReasons

from tests.scheduler.scenario import FakeClock

WALL = datetime.datetime(2026, 11, 27, 7, 38, 8, tzinfo=datetime.UTC)


def _pod(name: str, *, node: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T07:38:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "cuda"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec}


class _Env:
    def __init__(self) -> None:
        self.store = Store()
        self.clock = FakeClock()
        self.reasons = FilterReasons()
        self.pods: dict[str, dict[str, Any]] = {}
        self.retries = retries.FilterRetries(
            api=LocalKubeApi(self.store),
            reasons=self.reasons,
            pods=self.pods.get,
            clock=self.clock,
            wall_clock=lambda: WALL,
        )

    def failed(self, name: str, ago_s: float, **kw: Any) -> None:
        """Pod ``name`` exists and its /filter failed ``ago_s`` before now."""
        if name not in self.pods:
            self.store.create("pods", _pod(name), namespace="default")
            self.pods[name] = _pod(name, **kw)  # as the scheduler's watch shows it
        self.reasons.failed(name, "no GPU fits", now=self.clock() - ago_s)

    def nudged(self) -> set[str]:
        return {
            p["metadata"]["name"]
            for p in self.store.list("pods", namespace="default").items
            if retries.RETRY_ANNOTATION in (p["metadata"].get("annotations") or {})
        }


@pytest.fixture
def env() -> _Env:
    return _Env()


async def test_the_pods_that_failed_just_before_are_nudged_and_no_others(env: _Env) -> None:
    env.failed("old", 2.5)  # failed before the window: kube-scheduler's own retry covers it
    env.failed("recent", 1.5)
    env.failed("bound", 1.0, node="n2")
    env.failed("going", 0.5, deleting=True)
    env.failed("newest", 0.1)
    env.retries.released("n1")
    await env.retries.flush()
    assert env.nudged() == {"recent", "newest"} and env.retries.sent == 2
    annotations = env.store.get("pods", "newest", namespace="default")["metadata"]["annotations"]
    assert annotations == {retries.RETRY_ANNOTATION: "2026-11-27T07:38:08Z"}


async def test_a_pod_is_nudged_once_per_interval(env: _Env) -> None:
    env.failed("p", 0.1)
    env.retries.released("n1")
    env.retries.released("n1")  # a second release at once: not again
    await env.retries.flush()
    assert env.retries.sent == 1
    env.clock.now += retries.MIN_INTERVAL_S
    env.failed("p", 0.1)  # failed again after the nudge, then GPUs come free again
    env.retries.released("n1")
    await env.retries.flush()
    assert env.retries.sent == 2


async def test_nudges_are_capped_per_release_and_per_second_newest_first(env: _Env) -> None:
    for i in range(retries.MAX_PER_RELEASE + 5):
        env.failed(f"p{i:02d}", 1.9 - i * 0.01)  # p24 failed last
    env.retries.released("n1")
    await env.retries.flush()
    assert env.nudged() == {f"p{i:02d}" for i in range(5, retries.MAX_PER_RELEASE + 5)}
    env.retries.released("n2")  # within the same second: the budget is spent
    await env.retries.flush()
    assert env.retries.sent == retries.MAX_PER_RELEASE
    env.clock.now += 1.0
    for i in range(5):
        env.failed(f"p{i:02d}", 0.5)
    env.retries.released("n2")
    await env.retries.flush()
    assert env.retries.sent == retries.MAX_PER_RELEASE + 5


async def test_a_pod_gone_from_the_api_server_is_logged_not_raised(
    env: _Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vgpu_scheduler.retries")
    env.failed("gone", 0.1)
    env.store.delete("pods", "gone", namespace="default")  # the watch has not shown it yet
    env.retries.released("n1")
    await env.retries.flush()
    assert env.retries.sent == 0
    assert "pod default/gone: could not ask kube-scheduler to retry it" in caplog.text
