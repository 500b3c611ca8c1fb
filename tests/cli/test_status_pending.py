"""``vgpu status`` lists the pending GPU pods of both modes: what each asks and why it waits, from
what the API server holds (a DRA pod as the dashboard lists it, ``vgpu.core.dra.waiting``; an
extender pod with kube-scheduler's condition message). ``tests/realk8s/test_dra_pending_real.py``
reads a real kube-scheduler's refusal through the same code."""

from __future__ import annotations

from typing import Any

from vgpu.core import config, errors
from vgpu.core.dra import convert, waiting
from vgpu.kube.port import Kind, ObjectList
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu.status import pendingpods, snapshot, table

from tests.cli import test_status as local
from tests.core.dra.test_waiting import UNSCHEDULABLE
from tests.scheduler.test_dashboard_dra_pending import claim, claim_spec, dra_pod, unschedulable

CFG = config.load(None)
FILTERED = "0/2 nodes are available: 2 no GPU with 900000 MiB free."  # the extender's, via kube-scheduler


class Lists(LocalKubeApi):
    """The local store, but the lists of ``overrides`` answer those objects (or raise them)."""

    def __init__(self, store: Store, overrides: dict[str, Any]):
        super().__init__(store)
        self.overrides = overrides

    async def list(self, kind: Kind, **kwargs: Any) -> ObjectList:
        if kind in self.overrides:
            got = self.overrides[kind]
            if isinstance(got, Exception):
                raise got
            return ObjectList(list(got), "1")
        return await super().list(kind, **kwargs)


def extender_pod(
    name: str, *, mem: int, scheduler: str = "vgpu-scheduler", message: str | None = None
) -> Any:
    body = local.pod(name, None, None)
    body["spec"]["schedulerName"] = scheduler
    body["spec"]["containers"] = [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}}}
    ]
    if message is not None:
        body["status"] = {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ],
        }
    return body


def _store() -> tuple[Store, str]:
    store = Store()
    spec = claim_spec(mem=4096, cores=30)
    template = convert.template_body(spec, namespace="default")
    name = template["metadata"]["name"]
    store.create("resourceclaimtemplates", template, namespace="default")
    unlabelled = {**template, "metadata": {"name": "not-ours", "namespace": "default"}}
    store.create("resourceclaimtemplates", unlabelled, namespace="default")
    store.create("pods", dra_pod("fresh", name), namespace="default")  # its claim not made yet
    refused = store.create("pods", dra_pod("refused", name), namespace="default")
    store.create("resourceclaims", claim("refused-vgpu-0-ab12c", spec), namespace="default")
    store.update(
        "pods",
        unschedulable(refused, "refused-vgpu-0-ab12c", UNSCHEDULABLE),
        namespace="default",
        subresource="status",
    )
    store.create("pods", dra_pod("theirs", "not-ours"), namespace="default")  # not a GPU pod of ours
    big = extender_pod("big", mem=900_000, message=FILTERED)
    created = store.create(
        "pods", big, namespace="default"
    )  # the status is set apart, as kube-scheduler does
    store.update("pods", {**created, "status": big["status"]}, namespace="default", subresource="status")
    store.create(
        "pods", extender_pod("elsewhere", mem=1000, scheduler="default-scheduler"), namespace="default"
    )
    store.create("pods", extender_pod("new", mem=1000), namespace="default")
    return store, name


ASK = waiting.Ask(gpus=1, memory_mib=4096, memory_percent=None, cores=30)


def _ask(mem: int) -> tuple[waiting.Ask, ...]:
    return (waiting.Ask(gpus=1, memory_mib=mem, memory_percent=None, cores=0),)


async def test_pending_gpu_pods_of_both_modes_with_their_ask_and_reason() -> None:
    store, _ = _store()
    snap = await snapshot.collect(LocalKubeApi(store), config=CFG, now=lambda: local.NOW)
    assert snap.pending == (
        pendingpods.PendingPod("default", "big", "extender", _ask(900_000), FILTERED),
        pendingpods.PendingPod(
            "default",
            "elsewhere",
            "extender",
            _ask(1000),
            "schedulerName is 'default-scheduler', not 'vgpu-scheduler': kube-vgpu does not place it",
        ),
        pendingpods.PendingPod(
            "default",
            "fresh",
            "dra",
            (ASK,),
            "waiting for its ResourceClaim: kube-controller-manager has not created vgpu-0 from its template yet",
        ),
        pendingpods.PendingPod("default", "new", "extender", _ask(1000), pendingpods.QUEUED),
        pendingpods.PendingPod("default", "refused", "dra", (ASK,), UNSCHEDULABLE),
    )
    text = table.render(snap)
    assert "pending GPU pods (5):" in text
    lines = text.splitlines()
    assert lines[lines.index("pending GPU pods (5):") + 1].split() == [
        "POD",
        "MODE",
        "ASKS",
        "WHY",
        "IT",
        "WAITS",
    ]
    assert f"  default/refused    DRA       1 GPU: 4096 MiB, 30 % cores  {UNSCHEDULABLE}" in lines
    assert f"  default/big        extender  1 GPU: 900000 MiB            {FILTERED}" in lines


async def test_the_list_is_capped_and_counted() -> None:
    store = Store()
    for i in range(table.PENDING_SHOWN + 3):
        store.create("pods", extender_pod(f"p{i:03d}", mem=1000), namespace="default")
    snap = await snapshot.collect(LocalKubeApi(store), config=CFG, now=lambda: local.NOW)
    text = table.render(snap)
    assert f"pending GPU pods ({table.PENDING_SHOWN + 3}):" in text
    assert text.count("default/p") == table.PENDING_SHOWN and "  ... and 3 more" in text.splitlines()


async def test_templates_not_listable_give_a_warning_and_the_rest() -> None:
    store, _ = _store()
    forbidden = errors.KubeError("resourceclaimtemplates is forbidden", status=403)
    snap = await snapshot.collect(
        Lists(store, {"resourceclaimtemplates": forbidden}), config=CFG, now=lambda: local.NOW
    )
    assert [p.name for p in snap.pending] == ["big", "elsewhere", "new", "refused"]  # "fresh" unknown
    assert any(w.startswith("what DRA pods whose claim is not made yet ask not shown") for w in snap.warnings)


async def test_garbage_objects_do_not_break_the_list() -> None:
    store, name = _store()
    junk = {"allocation": {"devices": {"results": "x"}}, "reservedFor": [{"uid": "x"}]}
    garbage: dict[str, Any] = {
        "resourceclaims": [
            claim("refused-vgpu-0-ab12c", claim_spec(mem=4096, cores=30), status=junk),
            {"metadata": "x"},
            "garbage",
            None,
        ],
        "resourceclaimtemplates": [{"metadata": {"name": name, "namespace": "default"}, "spec": "x"}, 3],
    }
    snap = await snapshot.collect(Lists(store, garbage), config=CFG, now=lambda: local.NOW)
    shown = {p.name: p.reason for p in snap.pending}
    assert shown["refused"] == UNSCHEDULABLE  # the junk allocation is not an allocation
    assert "fresh" not in shown  # its template is unreadable: not known as ours
    assert table.render(snap)
    evil = extender_pod("evil", mem=1000)
    created = store.create("pods", evil, namespace="default")
    condition = {"type": "PodScheduled", "status": "False", "message": "0/1 \x1b[2J\u202e nodes"}
    store.update(
        "pods", {**created, "status": {"conditions": [condition]}}, namespace="default", subresource="status"
    )
    text = table.render(await snapshot.collect(Lists(store, garbage), config=CFG, now=lambda: local.NOW))
    assert "0/1 \\x1b[2J\\u202e nodes" in text and "\x1b" not in text  # escaped, never sent to the terminal
    odd_pods = [None, "x", {"spec": "x"}, {"metadata": 3, "spec": {"resourceClaims": [None]}}]
    assert pendingpods.pending_pods(odd_pods, claims=[], templates=[], config=CFG) == ()
