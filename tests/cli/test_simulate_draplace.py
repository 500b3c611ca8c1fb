"""``vgpu.simulate.draplace``: DRA pods placed as kube-scheduler's DynamicResources plugin places them
(the allocator, its Filter and Score), on slices partly held by the file's claims, never overcommitted."""

from __future__ import annotations

import decimal
from typing import Any

import pytest
from vgpu.core import fit
from vgpu.core.dra import allocinputs, names
from vgpu.simulate import drafacts, draplace
from vgpu.simulate.dra import DraObjects

from tests.cli.simdra import admitted, gpu_pod, held_claim, node_slice

MIB = decimal.Decimal(1024 * 1024)


def _capacity_left(side: draplace.DraSide, node: str) -> dict[str, dict[str, decimal.Decimal]]:
    """Per device of ``node``: each capacity's value minus what every claim holds (recomputed from
    the claims' allocations, not from the side's own bookkeeping)."""
    left: dict[str, dict[str, decimal.Decimal]] = {}
    for pool in allocinputs.pools(side.slices, node):
        for device in pool:
            left[device.id[2]] = {name: cap.value.value for name, cap in device.capacity.items()}
    for claim in side.claims:
        for r in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", ()):
            if r["pool"] != node:
                continue
            for name, raw in r.get("consumedCapacity", {}).items():
                left[r["device"]][name] -= allocinputs.amount(raw, field=name).value
    return left


def _place(side: draplace.DraSide, pod: dict[str, Any], sizes: tuple[int, ...]) -> Any:
    patched, templates = admitted(pod, sizes=sizes)
    return side.place(patched, templates=templates)


def test_pods_fill_a_partly_held_node_exactly_and_the_next_one_waits() -> None:
    objects = DraObjects(
        slices=(node_slice("dra-1", 16000, 16000),),
        claims=(held_claim("dra-1", 0, namespace="team", pod="old", memory_mib=6000, cores=30),),
    )
    side = draplace.DraSide(objects)
    sizes = (16000,)
    placed = [
        _place(side, gpu_pod(f"fill-{i}", memory=mem, cores=cores), sizes)
        for i, (mem, cores) in enumerate([(5000, 35), (5000, 35), (16000, 100)])
    ]
    assert all(isinstance(p, draplace.DraPlacement) and p.node == "dra-1" for p in placed)
    # first fit, device order: the two halves share GPU 0 with the held claim, the whole one GPU 1
    assert [[d.uuid for d in p.devices[0]] for p in placed] == [
        ["GPU-dra-1-0"],
        ["GPU-dra-1-0"],
        ["GPU-dra-1-1"],
    ]
    assert [(d.memory_mib, d.cores) for p in placed for d in p.devices[0]] == [
        (5000, 35),
        (5000, 35),
        (16000, 100),
    ]
    left = _capacity_left(side, "dra-1")
    assert {(dev, name): v for dev, caps in left.items() for name, v in caps.items() if name != "slots"} == {
        ("gpu-0", "memory"): 0,
        ("gpu-0", "cores"): 0,
        ("gpu-1", "memory"): 0,
        ("gpu-1", "cores"): 0,
    }
    missed = _place(side, gpu_pod("one-more", memory=1, cores=1), sizes)
    full = f"{draplace.CANNOT_ALLOCATE} (best GPU free: 0 MiB, 0% cores)"
    assert missed == {"dra-1": fit.Miss(full, unresolvable=True)}
    assert min(v for caps in _capacity_left(side, "dra-1").values() for v in caps.values()) >= 0


def test_an_unfitting_pod_holds_nothing_and_names_every_node() -> None:
    side = draplace.DraSide(DraObjects(slices=(node_slice("dra-1", 16000),)), other_nodes=["ext"])
    missed = _place(side, gpu_pod("huge", memory=20000), (16000,))
    assert set(missed) == {"dra-1", "ext"}
    assert {n: m.reason for n, m in missed.items()} == {
        "dra-1": f"{draplace.CANNOT_ALLOCATE} (best GPU free: 16000 MiB, 100% cores)",
        "ext": draplace.CANNOT_ALLOCATE,  # no GPU of ours there: kube-scheduler's words alone
    }
    assert side.claims == [] and side.holding.used == {}


def test_the_node_is_the_prioritized_list_score_then_fewest_pods_then_name() -> None:
    # a percentage becomes firstAvailable over the sizes, ascending: the small GPU's subrequest is
    # the first alternative, so kube-scheduler's DRA score prefers its node over the earlier name
    objects = DraObjects(slices=(node_slice("a-big", 40000), node_slice("b-small", 16000)))
    side = draplace.DraSide(objects)
    got = _place(side, gpu_pod("pct", percent=10), (16000, 40000))
    assert isinstance(got, draplace.DraPlacement) and got.node == "b-small"
    # equal scores (MiB asks are one request): the node holding fewer pods, then the name
    nodes = [_place(side, gpu_pod(f"m{i}", memory=1000), (16000, 40000)).node for i in range(3)]
    assert nodes == ["a-big", "a-big", "b-small"]


def test_prioritized_score_counts_each_allocated_subrequest() -> None:
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "firstAvailable": [{"name": "s0"}, {"name": "s1"}, {"name": "s2"}]}
                ]
            }
        }
    }
    allocation = {"devices": {"results": [{"request": "gpu/s1"}]}}
    assert drafacts.prioritized_score([claim], [allocation]) == drafacts.PRIORITIZED_MAX - 1
    assert drafacts.prioritized_score([{"spec": "junk"}], [{"devices": 3}]) == 0


def test_share_ids_are_deterministic_and_distinct() -> None:
    runs = []
    for _ in range(2):
        side = draplace.DraSide(DraObjects(slices=(node_slice("dra-1", 16000),)))
        for i in range(3):
            _place(side, gpu_pod(f"p{i}", memory=1000), (16000,))
        runs.append(
            [r["shareID"] for c in side.claims for r in c["status"]["allocation"]["devices"]["results"]]
        )
    assert runs[0] == runs[1] and len(set(runs[0])) == 3


def test_a_pod_naming_a_template_or_claim_of_the_file() -> None:
    _, templates = admitted(gpu_pod("x", memory=2000, cores=10), sizes=(16000,))
    [template] = templates
    template = {**template, "metadata": {**template["metadata"], "namespace": "team", "name": "mine"}}
    pending = held_claim("dra-1", 0, namespace="team", pod="shared", memory_mib=1, cores=1)
    del pending["status"]
    objects = DraObjects(
        slices=(node_slice("dra-1", 16000), node_slice("dra-2", 16000)),
        claims=(pending, held_claim("dra-2", 0, namespace="team", pod="elsewhere", memory_mib=1000, cores=5)),
        templates=(template,),
    )
    side = draplace.DraSide(objects)

    def pod(name: str, entry: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "team"},
            "spec": {
                "resourceClaims": [{"name": "g", **entry}],
                "containers": [{"name": "c", "resources": {"claims": [{"name": "g"}]}}],
            },
        }

    by_template = side.place(pod("t", {"resourceClaimTemplateName": "mine"}))
    assert isinstance(by_template, draplace.DraPlacement)
    assert [(d.memory_mib, d.cores) for d in by_template.devices[0]] == [(2000, 10)]
    by_claim = side.place(pod("c", {"resourceClaimName": "shared-vgpu-0"}))
    assert isinstance(by_claim, draplace.DraPlacement) and by_claim.claims == ("shared-vgpu-0",)
    # an allocated claim pins the pod to its node: the others are "not available on the node"
    pinned = side.place(pod("p", {"resourceClaimName": "elsewhere-vgpu-0"}))
    assert isinstance(pinned, draplace.DraPlacement) and pinned.node == "dra-2"
    for entry, message in [
        (
            {"resourceClaimTemplateName": "nope"},
            'ResourceClaim not created yet (resourceclaimtemplate "nope"',
        ),
        ({"resourceClaimName": "nope"}, 'resourceclaim.resource.k8s.io "nope" not found'),
        ({}, "none of the supported fields are set"),
    ]:
        missed = side.place(pod("m", entry))
        assert isinstance(missed, dict) and set(missed) == {"dra-1", "dra-2"}
        assert all(message in m.reason and m.unresolvable for m in missed.values())


def test_takes_is_the_allocator_on_one_device() -> None:
    objects = DraObjects(
        slices=(node_slice("dra-1", 16000, 16000),),
        claims=(held_claim("dra-1", 0, namespace="team", pod="old", memory_mib=12000, cores=30),),
    )
    side = draplace.DraSide(objects)
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": names.DEVICE_CLASS,
                        "capacity": {"requests": {"memory": "5000Mi"}},
                    },
                }
            ]
        }
    }
    assert not side.takes("dra-1", "gpu-0", spec)
    assert side.takes("dra-1", "gpu-1", spec)


SLICE = node_slice("dra-1", 16000)


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    import copy

    obj = copy.deepcopy(SLICE)
    target = obj
    for key in path[:-1]:
        target = target[key] if not isinstance(target, list) else target[int(key)]
    if isinstance(target, list):
        target[int(path[-1])] = value
    else:
        target[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        ("text", "not an object"),
        (_with(("metadata",), 7), "no metadata.name"),
        (_with(("spec", "driver"), None), "no spec.driver"),
        (_with(("spec", "pool"), "p"), "no spec.pool.name"),
        (_with(("spec", "pool", "generation"), "1"), "spec.pool.generation is not an integer"),
        (_with(("spec", "devices"), {"a": 1}), "spec.devices is not a list"),
        (_with(("spec", "devices", "0"), "gpu"), "spec.devices[0] has no name"),
        (
            _with(("spec", "devices", "0", "capacity"), {"memory": "16Gi"}),
            "spec.devices[0].capacity is not a map of objects",
        ),
        (_with(("spec", "devices", "0", "taints"), "bad"), "spec.devices[0].taints is not a list of objects"),
    ],
    ids=["not-object", "metadata", "driver", "pool", "generation", "devices", "device", "capacity", "taints"],
)
def test_a_garbage_slice_is_left_out_with_its_reason(obj: Any, why: str) -> None:
    assert drafacts.slice_problem(obj) == why
    side = draplace.DraSide(DraObjects(slices=(obj,)))
    assert side.slices == [] and len(side.problems) == 1 and why in side.problems[0]
    assert isinstance(_place(side, gpu_pod("p", memory=1000), (16000,)), dict)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["status"]["allocation"].update(devices={"results": 5}),
        lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
            consumedCapacity={"memory": "lots"}
        ),
        lambda c: c["status"].update(allocation=["x"]),
        lambda c: c["status"]["allocation"].update(nodeSelector="n"),
    ],
    ids=["results", "quantity", "allocation", "node-selector"],
)
def test_a_garbage_claim_is_counted_or_left_out_never_raises(mutate: Any) -> None:
    claim = held_claim("dra-1", 0, namespace="team", pod="old", memory_mib=6000, cores=30)
    mutate(claim)
    side = draplace.DraSide(DraObjects(slices=(SLICE,), claims=(claim, "junk", {"metadata": 3})))  # type: ignore[arg-type]
    got = _place(side, gpu_pod("p", memory=1000), (16000,))
    assert isinstance(got, draplace.DraPlacement | dict)


def test_a_bad_capacity_leaves_the_node_out_with_the_allocators_reason() -> None:
    bad = _with(("spec", "devices", "0", "capacity", "memory", "value"), "lots")
    side = draplace.DraSide(DraObjects(slices=(bad,)))
    assert len(side.problems) == 1 and side.problems[0].startswith("node dra-1: ")
    assert _place(side, gpu_pod("p", memory=1000), (16000,)) == {
        "dra-1": fit.Miss(draplace.CANNOT_ALLOCATE, unresolvable=True)
    }


def test_dra_pods_are_charged_to_their_namespace_quota_from_admission() -> None:
    """As the scheduler's ``draquota``: each DRA pod's claims count from its admission, so the webhook
    refuses the DRA pod that would pass the quota, and an extender pod of the namespace waits."""
    from vgpu.core.config import Policy
    from vgpu.simulate import engine, model

    from tests.cli.simdra import CFG

    cluster = model.load_cluster(
        {
            "nodes": [{"name": "ext", "gpus": [{"model": "T4", "memoryMib": 16000}]}],
            "quotas": {"team": {"memory": 10000}},
        },
        config=CFG,
    )
    # the extender pod comes first: admitted before the DRA pods are charged, then placed after
    pods = [gpu_pod("legacy", memory=3000, cores=10, mode="extender")]
    pods += [gpu_pod(f"d{i}", memory=4000, cores=10) for i in range(3)]
    workload = model.load_workload(pods, config=CFG)
    objects = DraObjects(slices=(node_slice("dra-1", 16000),))
    run = engine.simulate(
        cluster, workload, config=CFG, node_policy=Policy.BINPACK, gpu_policy=Policy.SPREAD, dra=objects
    )
    assert [p.pod.key for p in run.placed] == ["team/d0", "team/d1"]
    [rejected] = run.rejected
    assert rejected.pod.key == "team/d2" and "used 8000 of 10000, requested 4000" in rejected.message
    [pending] = run.pending
    assert pending.pod.key == "team/legacy"
    assert {m.reason for m in pending.reasons.values()} == {
        "namespace team: GPU memory quota exceeded (used 8000 of 10000, requested 3000)"
    }


def test_the_cache_gives_what_a_side_built_afresh_for_each_pod_gives() -> None:
    """Placing a mixed sequence with one side (feasibility cached per claim signature and node) picks
    the same node and devices as a side built from scratch, before each pod, from the claims held so
    far (nothing cached)."""
    slices = (node_slice("n1", 16000, 16000), node_slice("n2", 32000), node_slice("n3", 16000, 32000))
    sizes = (16000, 32000)
    shapes = [
        {"memory": 6000, "cores": 30},
        {"percent": 25},
        {"memory": 12000},
        {"memory": 3000, "cores": 60},
        {"cores": 100},
        {"memory": 6000, "cores": 30, "gpus": 2},
    ]
    cached = draplace.DraSide(DraObjects(slices=slices))
    outcomes = []
    for i in range(30):
        pod = gpu_pod(f"p{i}", **shapes[(i * 7) % len(shapes)])
        if i % 4 == 0:  # two GPU containers: two claims, one pod
            pod["spec"]["containers"].append({**pod["spec"]["containers"][0], "name": "second"})
        fresh = draplace.DraSide(DraObjects(slices=slices, claims=tuple(cached.claims)))
        expected, got = _place(fresh, pod, sizes), _place(cached, pod, sizes)
        outcomes.append(isinstance(got, draplace.DraPlacement))
        if isinstance(expected, dict):
            assert got == expected, pod["metadata"]["name"]
        else:
            assert isinstance(got, draplace.DraPlacement)
            assert (got.node, got.devices) == (expected.node, expected.devices), pod["metadata"]["name"]
    assert 5 < sum(outcomes) < len(outcomes)  # both placed and refused pods on the way


def test_a_node_in_both_modes_is_reported() -> None:
    side = draplace.DraSide(DraObjects(slices=(node_slice("both", 16000),)), other_nodes=["both", "ext"])
    assert side.problems == [
        f"node both is in the cluster file and publishes a ResourceSlice of {names.DRIVER}: "
        "both modes would hand out its GPUs"
    ]
