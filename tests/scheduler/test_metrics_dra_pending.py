"""``vgpu_scheduler_dra_pending_pods`` on ``/metrics``: the DRA mode's GPU pods still waiting for
their allocation, counted by where they stand (``vgpu.core.dra.waiting``'s stages), from the same
pods' cache and DRA views as the dashboard's pending list; absent without the DRA views."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from vgpu.core.config import Config
from vgpu.core.dra import convert
from vgpu.localcluster.store import Store
from vgpu_scheduler import draviews
from vgpu_scheduler.draviews import DraCapture
from vgpu_scheduler.metrics import Metrics
from vgpu_scheduler.state import ClusterState

from tests.core.dra.test_waiting import UNSCHEDULABLE
from tests.scheduler.scenario import FakeClock
from tests.scheduler.test_dashboard_dra_pending import claim, claim_spec, dra_pod, unschedulable
from tests.scheduler.test_views_dra import DraFeed

FAMILY = "vgpu_scheduler_dra_pending_pods"
SPEC = claim_spec(mem=1000)
TEMPLATE = convert.template_body(SPEC, namespace="default")
NAME = TEMPLATE["metadata"]["name"]
ALLOCATED = {
    "allocation": {
        "devices": {
            "results": [
                {"request": "gpu", "driver": "gpu.kube-vgpu.io", "pool": "n1", "device": "gpu-0"},
            ]
        }
    },
    "reservedFor": [{"resource": "pods", "name": "binding", "uid": "uid-binding"}],
}


def _state(*pods: dict[str, Any]) -> ClusterState:
    state = ClusterState(Config(), clock=FakeClock())
    for pod in pods:
        state.apply("pods", "ADDED", pod)
    return state


def _counts(body: bytes) -> dict[str, float] | None:
    for family in text_string_to_metric_families(body.decode()):
        if family.name == FAMILY:
            return {s.labels["stage"]: s.value for s in family.samples}
    return None


def _pods() -> list[dict[str, Any]]:
    bound = dra_pod("running", NAME) | {"spec": dra_pod("running", NAME)["spec"] | {"nodeName": "n1"}}
    return [
        dra_pod("fresh", NAME),  # its claim not made yet
        unschedulable(dra_pod("refused", NAME), "refused-claim", UNSCHEDULABLE),
        unschedulable(dra_pod("queued", NAME), "queued-claim", None),  # made, not tried yet
        unschedulable(dra_pod("binding", NAME), "binding-claim", None),
        bound,  # bound: not waiting
        {"metadata": {"name": "junk", "uid": "uid-junk"}, "spec": {"resourceClaims": "x"}},
    ]


def _claims() -> list[Any]:
    return [
        claim("refused-claim", SPEC),
        claim("queued-claim", SPEC),
        claim("binding-claim", SPEC, status=ALLOCATED),
        {"metadata": "x"},
    ]


def test_dra_pods_are_counted_by_stage_and_garbage_is_not() -> None:
    m = Metrics(_state(*_pods()), clock=FakeClock())
    snap = dataclasses.replace(m.snapshot(), dra=DraCapture(1, (), _claims(), templates=[TEMPLATE]))
    assert _counts(m.render(snap)) == {"claim_pending": 1, "queued": 1, "unschedulable": 1, "binding": 1}
    # every stage is there with nothing waiting
    empty = dataclasses.replace(m.snapshot(), dra=DraCapture(1))
    assert _counts(m.render(empty)) == {"claim_pending": 0, "queued": 0, "unschedulable": 0, "binding": 0}


def test_without_the_dra_views_there_is_no_family() -> None:
    m = Metrics(_state(*_pods()), clock=FakeClock())
    assert _counts(m.render(m.snapshot())) is None


async def test_the_scrape_reads_the_dra_views_caches() -> None:
    feed = DraFeed(Store(), {"resourceclaims": _claims()})
    views = draviews.DraViews(feed, templates=lambda: [TEMPLATE])
    tasks = [asyncio.create_task(inf.run()) for inf in views.informers]
    try:
        await asyncio.wait_for(asyncio.gather(*(inf.synced.wait() for inf in views.informers)), 5)
        m = Metrics(_state(*_pods()), clock=FakeClock(), dra=views)
        counts = _counts(m.render(m.snapshot()))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # the claims' cache keeps what waiting reads (slim.claim_for_views): the same counts as above
    assert counts == {"claim_pending": 1, "queued": 1, "unschedulable": 1, "binding": 1}
