"""DRA GPU pods waiting for an allocation (``vgpu.core.dra.waiting``): whose they are, what they
ask (from the claim, else the template the webhook's conversion names) and why they wait, in the
words of the cluster (kube-scheduler 1.36's condition messages, as ``tests/realk8s`` read them)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from vgpu.core import request
from vgpu.core.dra import convert, names, waiting

# the real kube-scheduler 1.36's PodScheduled=False message for a DRA pod no GPU can take
# (tests/realk8s/test_dra_pending_real.py reads it from the real one)
UNSCHEDULABLE = (
    "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, "
    "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
)
# its PreFilter, when a claim's allocation is in flight for another pod (dynamicresources.go)
IN_FLIGHT = "0/2 nodes are available: resource claim team/other-vgpu-0 is in the process of being allocated."


def spec(*, count: int = 1, mem: int = 0, percent: int | None = None, cores: int = 0) -> dict[str, Any]:
    """The claim spec the webhook's conversion writes for one container's ask."""
    ask = request.ContainerRequest("c", count, memory_mib=mem, memory_percent=percent, cores=cores)
    return convert.claim_spec(
        ask,
        chosen=request.Selectors(),
        memory_sizes_mib=(16384, 40960),
        exclusive=mem == 0 and percent in (None, 100) and cores == 0,
        field="c",
    )


def template(name: str, claim_spec: dict[str, Any]) -> dict[str, Any]:
    return convert.template_body(claim_spec, namespace="team") | {
        "metadata": {"name": name, "namespace": "team"}
    }


def pod(
    *,
    statuses: list[Any] | None = None,
    condition: dict[str, Any] | None = None,
    claims: list[Any] | None = None,
    node: str | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if statuses is not None:
        status["resourceClaimStatuses"] = statuses
    if condition is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", **condition}]
    out: dict[str, Any] = {
        "metadata": {"name": "train", "namespace": "team", "uid": "u-train"},
        "spec": {
            "resourceClaims": claims
            if claims is not None
            else [{"name": "vgpu-0", "resourceClaimTemplateName": "vgpu-t"}],
            "containers": [{"name": "c", "resources": {"claims": [{"name": "vgpu-0"}]}}],
        },
        "status": status,
    }
    if node:
        out["spec"]["nodeName"] = node
    return out


MADE = [{"name": "vgpu-0", "resourceClaimName": "train-vgpu-0-x7k2q"}]


def claim(
    claim_spec: dict[str, Any], *, allocation: Any = None, reserved: list[Any] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": "train-vgpu-0-x7k2q", "namespace": "team"},
        "spec": claim_spec,
        "status": {},
    }
    if allocation is not None:
        out["status"]["allocation"] = allocation
    if reserved is not None:
        out["status"]["reservedFor"] = reserved
    return out


def allocated(node: str = "n1") -> dict[str, Any]:
    result = {"request": "gpu", "driver": names.DRIVER, "pool": node, "device": "gpu-0"}
    return {"devices": {"results": [{**result, "consumedCapacity": {"memory": "4Gi", "cores": "30"}}]}}


ASK = waiting.Ask(gpus=1, memory_mib=4096, memory_percent=None, cores=30)
MINE = [{"resource": "pods", "name": "train", "uid": "u-train"}]


@pytest.mark.parametrize(
    ("the_pod", "claims", "reason"),
    [
        (
            pod(),
            [],
            "waiting for its ResourceClaim: kube-controller-manager has not created vgpu-0 from its template yet",
        ),
        (pod(statuses=MADE), [], "waiting for its ResourceClaim train-vgpu-0-x7k2q (not seen yet)"),
        (
            pod(statuses=MADE),
            [claim(spec(mem=4096, cores=30))],
            "queued: kube-scheduler has not tried it yet",
        ),
        (
            pod(statuses=MADE, condition={"reason": "Unschedulable", "message": UNSCHEDULABLE}),
            [claim(spec(mem=4096, cores=30))],
            UNSCHEDULABLE,
        ),
        (
            pod(statuses=MADE, condition={"reason": "Unschedulable", "message": IN_FLIGHT}),
            [claim(spec(mem=4096, cores=30))],
            IN_FLIGHT,
        ),
        (  # allocated and reserved: the condition is stale, the binding cycle is under way
            pod(statuses=MADE, condition={"reason": "Unschedulable", "message": UNSCHEDULABLE}),
            [claim(spec(mem=4096, cores=30), allocation=allocated(), reserved=MINE)],
            "claims allocated on n1; waiting for the bind",
        ),
        (  # allocated for another pod (a shared claim): this one is not being bound
            pod(statuses=MADE),
            [claim(spec(mem=4096, cores=30), allocation=allocated(), reserved=[{"uid": "other"}])],
            "queued: kube-scheduler has not tried it yet",
        ),
        (  # a condition without a message says nothing
            pod(statuses=MADE, condition={"reason": "Unschedulable"}),
            [claim(spec(mem=4096, cores=30))],
            "queued: kube-scheduler has not tried it yet",
        ),
        (
            pod(statuses=MADE, condition={"reason": "Unschedulable", "message": "  \n"}),
            [claim(spec(mem=4096, cores=30))],
            "queued: kube-scheduler has not tried it yet",
        ),
    ],
    ids=[
        "claim-not-made",
        "claim-not-seen",
        "queued",
        "cannot-allocate",
        "prefilter-in-flight",
        "allocated-binding",
        "allocated-for-another",
        "condition-without-message",
        "blank-message",
    ],
)
def test_why_a_dra_pod_waits(
    the_pod: dict[str, Any], claims: list[dict[str, Any]], reason: str, request: pytest.FixtureRequest
) -> None:
    templates = waiting.index([template("vgpu-t", spec(mem=4096, cores=30))])
    found = waiting.waiting(the_pod, claims=waiting.index(claims), templates=templates)
    stage = STAGE_OF_CASE[request.node.callspec.id]
    assert found == waiting.Waiting(
        namespace="team", name="train", uid="u-train", asks=(ASK,), reason=reason, stage=stage
    )


# the stage each case above counts under (vgpu_scheduler_dra_pending_pods' label)
STAGE_OF_CASE = {
    "claim-not-made": "claim_pending",
    "claim-not-seen": "claim_pending",
    "queued": "queued",
    "cannot-allocate": "unschedulable",
    "prefilter-in-flight": "unschedulable",
    "allocated-binding": "binding",
    "allocated-for-another": "queued",
    "condition-without-message": "queued",
    "blank-message": "queued",
}


def test_every_stage_is_one_of_the_stages() -> None:
    assert set(STAGE_OF_CASE.values()) == set(waiting.STAGES)


@pytest.mark.parametrize(
    ("claim_spec", "ask", "shown"),
    [
        (spec(mem=4096, cores=30), ASK, "1 GPU: 4096 MiB, 30 % cores"),
        (
            spec(count=2, mem=8000),
            waiting.Ask(gpus=2, memory_mib=8000, memory_percent=None, cores=0),
            "2 GPUs: 8000 MiB",
        ),
        (
            spec(),
            waiting.Ask(gpus=1, memory_mib=None, memory_percent=None, cores=100),
            "1 GPU: whole memory, 100 % cores",
        ),
        (
            spec(percent=50, cores=20),
            waiting.Ask(gpus=1, memory_mib=None, memory_percent=50, cores=20),
            "1 GPU: 50 % of memory, 20 % cores",
        ),
    ],
    ids=["memory-cores", "two-gpus", "whole-gpu", "percentage"],
)
def test_what_it_asks_comes_from_the_template_the_conversion_wrote(
    claim_spec: dict[str, Any], ask: waiting.Ask, shown: str
) -> None:
    assert waiting.asks(claim_spec) == (ask,)
    assert ask.shown == shown
    found = waiting.waiting(pod(), claims={}, templates=waiting.index([template("vgpu-t", claim_spec)]))
    assert found is not None and found.asks == (ask,)


def test_the_claim_says_what_is_asked_once_it_is_made() -> None:
    templates = waiting.index([template("vgpu-t", spec(mem=1000))])  # changed since: the claim wins
    found = waiting.waiting(
        pod(statuses=MADE), claims=waiting.index([claim(spec(mem=4096, cores=30))]), templates=templates
    )
    assert found is not None and found.asks == (ASK,)


def test_a_claim_named_directly_and_several_claims() -> None:
    direct = claim(spec(mem=4096, cores=30))
    the_pod = pod(
        claims=[
            {"name": "vgpu-0", "resourceClaimName": "train-vgpu-0-x7k2q"},
            {"name": "vgpu-1", "resourceClaimTemplateName": "vgpu-two"},
            {"name": "skipped", "resourceClaimTemplateName": "vgpu-t"},  # status: intentionally none
        ],
        statuses=[{"name": "skipped", "resourceClaimName": None}],
    )
    templates = waiting.index([template("vgpu-two", spec(count=2, mem=8000)), template("vgpu-t", spec())])
    found = waiting.waiting(the_pod, claims=waiting.index([direct]), templates=templates)
    assert found is not None
    assert found.asks == (ASK, waiting.Ask(gpus=2, memory_mib=8000, memory_percent=None, cores=0))
    assert found.reason.endswith("has not created vgpu-1 from its template yet")


def other_class(claim_spec: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(claim_spec)
    out["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    return out


@pytest.mark.parametrize(
    ("the_pod", "claims", "templates"),
    [
        (pod(node="n1"), [], [template("vgpu-t", spec())]),  # bound
        (pod(phase="Failed"), [], [template("vgpu-t", spec())]),
        (pod(), [], []),  # its template is not known (not ours, or not seen)
        (pod(), [], [template("vgpu-t", other_class(spec(mem=10)))]),  # another DeviceClass
        (pod(statuses=MADE), [claim(other_class(spec(mem=10)))], [template("vgpu-t", spec())]),
        (pod(claims=[]), [], [template("vgpu-t", spec())]),
        ({"spec": {"containers": []}}, [], []),  # no claims at all
    ],
    ids=[
        "bound",
        "finished",
        "template-unknown",
        "template-not-ours",
        "claim-not-ours",
        "no-claims",
        "plain-pod",
    ],
)
def test_pods_that_are_not_waiting_dra_gpu_pods_of_ours(
    the_pod: dict[str, Any], claims: list[dict[str, Any]], templates: list[dict[str, Any]]
) -> None:
    assert waiting.waiting(the_pod, claims=waiting.index(claims), templates=waiting.index(templates)) is None


GARBAGE_PODS: list[Any] = [
    None,
    "x",
    {"spec": "x"},
    {"spec": {"resourceClaims": "x"}},
    {"spec": {"resourceClaims": [None, 3, {"name": 5}, {"name": "a", "resourceClaimTemplateName": 7}]}},
    {
        "metadata": "x",
        "spec": {"resourceClaims": [{"name": "vgpu-0", "resourceClaimTemplateName": "vgpu-t"}]},
    },
    pod(statuses="x"),  # type: ignore[arg-type]
    pod(statuses=[None, {"name": 3}, {"name": "vgpu-0", "resourceClaimName": 7}]),
]


@pytest.mark.parametrize("the_pod", GARBAGE_PODS, ids=range(len(GARBAGE_PODS)))
def test_garbage_pods_never_raise(the_pod: Any) -> None:
    found = waiting.waiting(the_pod, claims={}, templates=waiting.index([template("vgpu-t", spec())]))
    assert found is None or found.reason


GARBAGE_SPECS: list[Any] = [
    None,
    "x",
    {"devices": "x"},
    {"devices": {"requests": [None, "x", {"exactly": "x"}, {"firstAvailable": ["x", None]}]}},
    {"devices": {"requests": [{"exactly": {"deviceClassName": names.DEVICE_CLASS, "count": "two"}}]}},
    {
        "devices": {
            "requests": [
                {
                    "exactly": {
                        "deviceClassName": names.DEVICE_CLASS,
                        "capacity": {"requests": {"memory": "lots", "cores": -5}},
                    }
                }
            ]
        }
    },
    {
        "devices": {
            "requests": [
                {
                    "firstAvailable": [
                        {"name": "mem-x", "deviceClassName": names.DEVICE_CLASS, "capacity": "x"},
                        {"name": 3, "deviceClassName": names.DEVICE_CLASS},
                    ]
                }
            ]
        }
    },
]


@pytest.mark.parametrize("claim_spec", GARBAGE_SPECS, ids=range(len(GARBAGE_SPECS)))
def test_garbage_specs_ask_what_can_be_read(claim_spec: Any) -> None:
    for ask in waiting.asks(claim_spec):
        assert ask.gpus >= 0 and ask.cores >= 0 and ask.shown


@pytest.mark.parametrize(
    "allocation",
    [
        "x",
        {"devices": "x"},
        {"devices": {"results": [{"pool": 3, "device": None}]}},
        {"devices": {"results": "x"}},
    ],
    ids=["string", "devices", "result", "results"],
)
def test_a_malformed_allocation_is_not_an_allocation(allocation: Any) -> None:
    claims = waiting.index([claim(spec(mem=4096, cores=30), allocation=allocation, reserved=MINE)])
    found = waiting.waiting(
        pod(statuses=MADE, condition={"message": UNSCHEDULABLE}), claims=claims, templates={}
    )
    assert found is not None and found.reason == UNSCHEDULABLE


def test_a_long_message_is_cut() -> None:
    long = "0/5000 nodes are available: " + "x" * 5000
    found = waiting.waiting(
        pod(statuses=MADE, condition={"message": long}),
        claims=waiting.index([claim(spec(mem=4096, cores=30))]),
        templates={},
    )
    assert found is not None and len(found.reason) == waiting.MAX_MESSAGE_CHARS
    assert found.reason.startswith("0/5000 nodes are available: ")
