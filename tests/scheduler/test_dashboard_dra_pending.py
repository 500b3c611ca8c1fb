"""DRA GPU pods waiting for an allocation in the dashboard: listed under ``pending`` beside the
extender's pods (``mode: "dra"``), with what they ask and why they wait as the cluster says it
(``vgpu.core.dra.waiting``), read from the pods' cache and the DRA views' claims and templates;
through ``/ui/events`` over real HTTP against the local store, and from a capture."""

from __future__ import annotations

from typing import Any

from vgpu.core import request
from vgpu.core.config import Config
from vgpu.core.dra import convert, names
from vgpu_scheduler import dashboard
from vgpu_scheduler.draviews import DraCapture
from vgpu_scheduler.pending import FilterReasons
from vgpu_scheduler.state import ClusterState

from tests.core.dra.test_waiting import IN_FLIGHT, UNSCHEDULABLE
from tests.scheduler.scenario import T0, Cluster, FakeClock, gpu_container
from tests.scheduler.test_ui import until_state


def claim_spec(*, mem: int = 0, cores: int = 0, count: int = 1) -> dict[str, Any]:
    ask = request.ContainerRequest("c", count, memory_mib=mem, cores=cores)
    return convert.claim_spec(
        ask, chosen=request.Selectors(), memory_sizes_mib=(), exclusive=False, field="c"
    )


def dra_pod(name: str, template: str, *, ns: str = "default", uid: str = "") -> dict[str, Any]:
    """A pod as the webhook's DRA conversion leaves it."""
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "annotations": {names.MODE_ANNOTATION: names.MODE_DRA},
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "resourceClaims": [{"name": "vgpu-0", "resourceClaimTemplateName": template}],
            "containers": [{"name": "c", "image": "cuda", "resources": {"claims": [{"name": "vgpu-0"}]}}],
        },
        "status": {"phase": "Pending"},
    }


def claim(name: str, spec: dict[str, Any], *, ns: str = "default", status: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": convert.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }
    if status is not None:
        body["status"] = status
    return body


def unschedulable(pod: dict[str, Any], claim_name: str, message: str | None) -> dict[str, Any]:
    """``pod`` with its claim made and kube-scheduler's PodScheduled=False condition."""
    condition: dict[str, Any] = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    if message is not None:
        condition["message"] = message
    status = {
        "phase": "Pending",
        "conditions": [condition],
        "resourceClaimStatuses": [{"name": "vgpu-0", "resourceClaimName": claim_name}],
    }
    return {**pod, "status": status}


def _row(snap: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((p for p in snap["pending"] if p["name"] == name), None)


def _reason(snap: dict[str, Any], name: str) -> str | None:
    row = _row(snap, name)
    return None if row is None else str(row["reason"])


async def test_a_waiting_dra_pod_is_listed_with_its_ask_and_the_clusters_reason(cluster: Cluster) -> None:
    assert cluster.session is not None and cluster.service is not None
    spec = claim_spec(mem=4096, cores=30)
    ours = convert.template_body(spec, namespace="default")
    cluster.store.create("resourceclaimtemplates", ours, namespace="default")
    # a template under another name, not labelled ours: its pod is not a GPU pod of kube-vgpu's
    theirs = {**ours, "metadata": {"name": "someone-elses", "namespace": "default"}}
    cluster.store.create("resourceclaimtemplates", theirs, namespace="default")
    cluster.store.create("pods", dra_pod("train", ours["metadata"]["name"]), namespace="default")
    cluster.store.create("pods", dra_pod("other", "someone-elses"), namespace="default")
    cluster.add_pod("huge", gpu_container(mem=10_000_000))  # an extender pod, beside them
    async with cluster.session.get(f"{cluster.url}/ui/events") as resp:
        snap = await until_state(resp, lambda s: _reason(s, "train") is not None)
        assert _row(snap, "train") == {
            "namespace": "default",
            "name": "train",
            "mode": "dra",
            "reason": "waiting for its ResourceClaim: kube-controller-manager has not created vgpu-0 "
            "from its template yet",
            "reasonAt": None,
            "asks": [{"gpus": 1, "memoryMib": 4096, "memoryPercent": None, "cores": 30}],
        }
        assert _row(snap, "other") is None  # not ours
        assert [p["mode"] for p in snap["pending"]] == ["extender", "dra"]  # huge, train
        assert snap["totals"]["pending"] == 2
        # kube-controller-manager makes the claim; kube-scheduler cannot allocate it
        cluster.store.create("resourceclaims", claim("train-vgpu-0-x7k2q", spec), namespace="default")
        current = cluster.store.get("pods", "train", namespace="default")
        cluster.store.update(
            "pods", unschedulable(current, "train-vgpu-0-x7k2q", UNSCHEDULABLE), namespace="default",
            subresource="status",
        )  # fmt: skip
        snap = await until_state(resp, lambda s: _reason(s, "train") == UNSCHEDULABLE)
        assert _row(snap, "train")["asks"] == [  # type: ignore[index]
            {"gpus": 1, "memoryMib": 4096, "memoryPercent": None, "cores": 30}
        ]
        # bound (its claim allocated meanwhile): no longer waiting
        cluster.store.bind("default", "train", node="node-a")
        snap = await until_state(resp, lambda s: _row(s, "train") is None)
        assert snap["totals"]["pending"] == 1
    async with cluster.session.get(f"{cluster.url}/ui/state") as resp:
        state = await resp.json()
    assert [p["name"] for p in state["pending"]] == ["huge"]


def _state_with(*pods: dict[str, Any]) -> ClusterState:
    state = ClusterState(Config(), clock=FakeClock())
    for pod in pods:
        state.apply("pods", "ADDED", pod)
    return state


def test_garbage_claims_conditions_and_templates_do_not_break_the_view() -> None:
    spec = claim_spec(mem=2000)
    template = convert.template_body(spec, namespace="default")
    name = template["metadata"]["name"]
    junk_allocation = {"allocation": {"devices": {"results": "x"}}, "reservedFor": [{"uid": "uid-a"}]}
    pods = [
        unschedulable(dra_pod("a", name), "a-claim", UNSCHEDULABLE),  # its claim's allocation is junk
        unschedulable(dra_pod("b", name), "b-claim", None),  # a condition without a message
        unschedulable(dra_pod("c", name), "c-claim", IN_FLIGHT),
        dra_pod("d", "not-a-template-we-know"),
        {"metadata": {"name": "e", "uid": "uid-e"}, "spec": {"resourceClaims": "x"}},
        {"metadata": {"name": "f", "uid": "uid-f"}, "spec": {"resourceClaims": [None, {"name": 3}]}},
    ]
    claims = [
        claim("a-claim", spec, status=junk_allocation),
        claim("b-claim", spec, status="x"),
        claim("c-claim", {"devices": "garbage"}),  # its spec unreadable: the template is not read then
        {"metadata": "x"},
        "garbage",
    ]
    templates: list[Any] = [template, {"metadata": {"name": "t"}, "spec": "x"}, None]
    cap = dashboard.capture(
        _state_with(*pods),
        FilterReasons(),
        now=T0,
        dra=DraCapture(1, (), claims, templates=templates),  # type: ignore[arg-type]
    )
    snap = dashboard.build(cap)
    assert {p["name"]: p["reason"] for p in snap["pending"]} == {
        "a": UNSCHEDULABLE,
        "b": "queued: kube-scheduler has not tried it yet",
    }
    assert snap["totals"]["pending"] == 2


def test_the_cap_and_the_total_count_dra_pods_as_extender_pods() -> None:
    spec = claim_spec(mem=1000)
    template = convert.template_body(spec, namespace="default")
    name = template["metadata"]["name"]
    pods = [dra_pod(f"d{i}", name) for i in range(3)]
    extender = {
        "metadata": {"name": "x", "namespace": "default", "uid": "uid-x"},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [gpu_container(mem=500)]},
        "status": {"phase": "Pending"},
    }
    state = _state_with(*pods, extender)
    cap = dashboard.capture(state, FilterReasons(), now=T0, dra=DraCapture(1, templates=[template]))
    snap = dashboard.build(cap, max_pending=2)
    assert [p["name"] for p in snap["pending"]] == ["d0", "d1"]
    assert snap["totals"]["pending"] == 4
    # without the DRA views (a scheduler built without them) the DRA pods are not known as ours
    alone = dashboard.build(dashboard.capture(state, FilterReasons(), now=T0))
    assert [p["name"] for p in alone["pending"]] == ["x"]


async def test_the_page_shows_what_each_pending_pod_asks(cluster: Cluster) -> None:
    assert cluster.session is not None
    async with cluster.session.get(f"{cluster.url}/ui") as resp:
        page = await resp.text()
    assert "p.asks" in page and "p.mode" in page
