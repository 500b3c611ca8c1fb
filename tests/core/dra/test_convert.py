"""HAMi pod specs as DRA claims: the claim spec per knob, the whole patch, the admission in DRA
mode, and garbage (convert.py, admission.decide's DRA branch)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from vgpu.core import admission, config, errors, jsonpatch, quantity, quota, request
from vgpu.core.dra import convert, mode, names

GPU = "nvidia.com/gpu"
MEM = "nvidia.com/gpumem"
PCT = "nvidia.com/gpumem-percentage"
CORES = "nvidia.com/gpucores"
PRIO = "nvidia.com/priority"
SIZES = (81559, 40960)
ATTRS = 'device.attributes["gpu.kube-vgpu.io"]'


def ctr(name: str = "c", **limits: Any) -> dict[str, Any]:
    """A container; keyword names: gpu, mem, pct, cores, prio (as strings on the wire)."""
    keys = {"gpu": GPU, "mem": MEM, "pct": PCT, "cores": CORES, "prio": PRIO}
    out: dict[str, Any] = {"name": name, "image": "cuda"}
    if limits:
        wire = {keys[k]: str(v) for k, v in limits.items()}
        out["resources"] = {"limits": dict(wire), "requests": dict(wire)}  # as defaulting leaves it
    return out


def pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team"}
    if annotations is not None:
        meta["annotations"] = annotations
    body: dict[str, Any] = {"schedulerName": "default-scheduler", **spec, "containers": list(containers)}
    if init is not None:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def cfg(**webhook: Any) -> config.Config:
    return config.load({"webhook": webhook})


def exactly(
    count: int = 1, *, memory: str | None = None, cores: str | None = None, **extra: Any
) -> dict[str, Any]:
    req: dict[str, Any] = {
        "deviceClassName": names.DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": count,
    }
    req.update(extra)
    amounts = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    if amounts:
        req["capacity"] = {"requests": amounts}
    return {"devices": {"requests": [{"name": "gpu", "exactly": req}]}}


def convert_pod(
    p: dict[str, Any], conf: config.Config | None = None, sizes: tuple[int, ...] = SIZES
) -> convert.Conversion:
    conf = conf or cfg()
    parsed = request.parse_pod(p, conf, default_count=True)
    return convert.convert(p, parsed, namespace="team", resources=conf.resources, memory_sizes_mib=sizes)


@dataclass(frozen=True)
class Case:
    id: str
    container: dict[str, Any]
    want: dict[str, Any]
    annotations: dict[str, str] = field(default_factory=dict)
    conf: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("memory-mib", ctr(gpu=1, mem=4000), exactly(memory="4000Mi")),
    Case(
        "memory-and-cores-two-gpus", ctr(gpu=2, mem=4000, cores=30), exactly(2, memory="4000Mi", cores="30")
    ),
    Case("whole-gpu-is-exclusive", ctr(gpu=1), exactly(cores="100")),
    Case("whole-gpu-with-cores-keeps-them", ctr(gpu=1, cores=50), exactly(cores="50")),
    Case("percent-100-is-exclusive", ctr(gpu=1, pct=100), exactly(cores="100")),
    Case("percent-100-with-cores", ctr(gpu=1, pct=100, cores=20), exactly(cores="20")),
    Case("cores-100-with-memory", ctr(gpu=1, mem=1000, cores=100), exactly(memory="1000Mi", cores="100")),
    Case("cores-0-asks-none", ctr(gpu=1, mem=1000, cores=0), exactly(memory="1000Mi")),
    Case("memory-factor", ctr(gpu=1, mem=3), exactly(memory="3Gi"), conf={"memoryFactor": 1024}),
    Case("default-memory", ctr(gpu=1), exactly(memory="2000Mi"), conf={"defaultMemoryMib": 2000}),
    Case("default-count", ctr(mem=1000), exactly(memory="1000Mi")),
    Case("binary-suffix", ctr(gpu=1, mem="4Gi"), exactly(memory="4Gi")),
    Case(
        "percent-first-available",
        ctr(gpu=1, pct=50, cores=10),
        {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {
                                "name": f"mem-{size}",
                                "deviceClassName": names.DEVICE_CLASS,
                                "allocationMode": "ExactCount",
                                "count": 1,
                                "selectors": [{"cel": {"expression": f"{ATTRS}.memoryMiB == {size}"}}],
                                "capacity": {
                                    "requests": {
                                        "memory": quantity.canonical(f"{size // 2}Mi"),
                                        "cores": "10",
                                    }
                                },
                            }
                            for size in sorted(SIZES)
                        ],
                    }
                ]
            }
        },
    ),
    Case(
        "use-gputype",
        ctr(gpu=1, mem=1000),
        exactly(
            memory="1000Mi",
            selectors=[
                {
                    "cel": {
                        "expression": f'{ATTRS}.model.lowerAscii().contains("a100") || '
                        f'{ATTRS}.model.lowerAscii().contains("h100")'
                    }
                }
            ],
        ),
        annotations={request.USE_GPUTYPE: "A100, H100"},
    ),
    Case(
        "nouse-gputype",
        ctr(gpu=1, mem=1000),
        exactly(
            memory="1000Mi",
            selectors=[{"cel": {"expression": f'!{ATTRS}.model.lowerAscii().contains("v100")'}}],
        ),
        annotations={request.NOUSE_GPUTYPE: "V100"},
    ),
    Case(
        "uuids",
        ctr(gpu=1, mem=1000),
        exactly(
            memory="1000Mi",
            selectors=[
                {"cel": {"expression": f'{ATTRS}.uuid in ["GPU-a", "GPU-b"]'}},
                {"cel": {"expression": f'!({ATTRS}.uuid in ["GPU-c"])'}},
            ],
        ),
        annotations={request.USE_GPUUUID: "GPU-b,GPU-a", request.NOUSE_GPUUUID: "GPU-c"},
    ),
    Case(
        "numa-bind-two-gpus",
        ctr(gpu=2, mem=1000),
        {
            "devices": {
                **exactly(2, memory="1000Mi")["devices"],
                "constraints": [{"requests": ["gpu"], "matchAttribute": "gpu.kube-vgpu.io/numaNode"}],
            }
        },
        annotations={request.NUMA_BIND: "true"},
    ),
    Case(
        "numa-bind-one-gpu-needs-none",
        ctr(gpu=1, mem=1000),
        exactly(memory="1000Mi"),
        {request.NUMA_BIND: "true"},
    ),
    Case(
        "selector-value-quoted",
        ctr(gpu=1, mem=1000),
        exactly(
            memory="1000Mi",
            selectors=[{"cel": {"expression": f'{ATTRS}.uuid in ["GPU-\\"x\\\\"]'}}],
        ),
        annotations={request.USE_GPUUUID: 'GPU-"x\\'},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_claim_spec_per_knob(case: Case) -> None:
    got = convert_pod(pod(case.container, annotations=case.annotations), cfg(**case.conf))
    (claim,) = got.claims
    assert claim.spec == case.want
    (template,) = got.templates
    assert template["spec"] == {"spec": case.want}
    assert template["metadata"]["name"] == claim.template == convert.template_name(case.want)


def test_the_patch_moves_the_ask_into_claims() -> None:
    p = pod(ctr("app", gpu=1, mem=4000, cores=30), ctr("side"), init=[ctr("prep", gpu=1, mem=1000)])
    p["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1"
    got = convert_pod(p)
    patched = jsonpatch.apply(p, got.patch)
    prep, app = got.claims
    assert (prep.claim, app.claim) == ("vgpu-0", "vgpu-1")
    assert patched["spec"]["resourceClaims"] == [
        {"name": "vgpu-0", "resourceClaimTemplateName": prep.template},
        {"name": "vgpu-1", "resourceClaimTemplateName": app.template},
    ]
    assert patched["spec"]["initContainers"][0]["resources"] == {
        "limits": {},
        "requests": {},
        "claims": [{"name": "vgpu-0"}],
    }
    assert patched["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1"},
        "requests": {},
        "claims": [{"name": "vgpu-1"}],
    }
    assert patched["spec"]["containers"][1] == p["spec"]["containers"][1]
    assert patched["metadata"]["annotations"] == {names.MODE_ANNOTATION: names.MODE_DRA}
    assert [t["metadata"]["name"] for t in got.templates] == [prep.template, app.template]


def test_the_same_ask_twice_makes_one_template_and_other_claims_stay() -> None:
    p = pod(ctr("a", gpu=1, mem=1000), ctr("b", gpu=1, mem=1000))
    p["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimName": "shared"}]
    got = convert_pod(p)
    assert len(got.templates) == 1
    patched = jsonpatch.apply(p, got.patch)
    assert [c["name"] for c in patched["spec"]["resourceClaims"]] == ["mine", "vgpu-0", "vgpu-1"]


def test_template_body_is_labelled_and_namespaced() -> None:
    spec = exactly(memory="1000Mi")
    body = convert.template_body(spec, namespace="team")
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["kind"] == "ResourceClaimTemplate"
    assert body["metadata"]["namespace"] == "team"
    assert body["metadata"]["labels"] == {names.TEMPLATE_LABEL: "true"}
    name = body["metadata"]["name"]
    assert name.startswith("vgpu-") and len(name) == len("vgpu-") + convert.HASH_CHARS
    assert convert.template_name(exactly(memory="1001Mi")) != name


@dataclass(frozen=True)
class Garbage:
    id: str
    pod: dict[str, Any]
    where: str
    sizes: tuple[int, ...] = SIZES
    conf: dict[str, Any] = field(default_factory=dict)


def _with(p: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(p)
    node = out
    for token in path[:-1]:
        node = node[token]
    node[path[-1]] = value
    return out


GARBAGE = [
    Garbage(
        "claim-name-taken",
        _with(pod(ctr(gpu=1)), ["spec", "resourceClaims"], [{"name": "vgpu-0"}]),
        "pod.spec.resourceClaims",
    ),
    Garbage(
        "pod-claims-not-a-list",
        _with(pod(ctr(gpu=1)), ["spec", "resourceClaims"], {"a": 1}),
        "pod.spec.resourceClaims",
    ),
    Garbage(
        "container-claims-not-a-list",
        _with(pod(ctr(gpu=1)), ["spec", "containers", 0, "resources", "claims"], "x"),
        "container c: resources.claims",
    ),
    Garbage("count-over-32", pod(ctr(gpu=33)), "container c", conf={"maxGpuCount": 64}),
    Garbage("percent-without-slices", pod(ctr(gpu=1, pct=30)), "container c", sizes=()),
    Garbage(
        "percent-with-nine-sizes",
        pod(ctr(gpu=1, pct=30)),
        "container c",
        sizes=tuple(range(1000, 10000, 1000)),
    ),
    Garbage(
        "selector-control-character",
        pod(ctr(gpu=1), annotations={request.USE_GPUTYPE: "a\x01b"}),
        f"annotation {request.USE_GPUTYPE}",
    ),
    Garbage(
        "selector-non-ascii",
        pod(ctr(gpu=1), annotations={request.NOUSE_GPUUUID: "GPU-é"}),
        f"annotation {request.NOUSE_GPUUUID}",
    ),
    Garbage(
        "selector-over-10kib",
        pod(ctr(gpu=1), annotations={request.USE_GPUUUID: ",".join(f"GPU-{i:08d}" for i in range(1000))}),
        f"annotation {request.USE_GPUUUID}",
    ),
    Garbage(
        "static-pod",
        pod(ctr(gpu=1), annotations={convert.MIRROR_ANNOTATION: "x"}),
        "pod.metadata.annotations",
    ),
]


@pytest.mark.parametrize("case", GARBAGE, ids=[g.id for g in GARBAGE])
def test_what_dra_cannot_say_is_refused_naming_the_field(case: Garbage) -> None:
    with pytest.raises(errors.RequestError) as caught:
        convert_pod(case.pod, cfg(**case.conf), case.sizes)
    assert caught.value.field == case.where


def test_claimed_reads_only_this_conversions_claims() -> None:
    spec = {
        "resourceClaims": [{"name": "vgpu-1"}, "junk"],
        "initContainers": [{"resources": {"claims": [{"name": "vgpu-0"}]}}],  # not in the pod's list
        "containers": [{"resources": {"claims": [{"name": "vgpu-1"}]}}, "junk", {"resources": "x"}],
    }
    assert convert.claimed(spec) == {1}
    assert convert.claimed({"resourceClaims": "x", "containers": []}) == set()


# --- the admission decision in DRA mode --------------------------------------------------------


def dra_facts(**extra: Any) -> admission.Facts:
    return admission.Facts(dra_memory_sizes_mib=SIZES, **extra)


def decide(
    p: dict[str, Any], conf: config.Config | None = None, facts: admission.Facts | None = None
) -> admission.Decision:
    return admission.decide(
        p, namespace="team", config=conf or cfg(defaultMode="dra"), facts=facts or dra_facts()
    )


@pytest.mark.parametrize(
    ("annotations", "labels", "default", "want"),
    [
        ({}, None, "extender", "extender"),
        ({}, None, "dra", "dra"),
        ({}, {names.MODE_ANNOTATION: "dra"}, "extender", "dra"),
        ({names.MODE_ANNOTATION: "extender"}, {names.MODE_ANNOTATION: "dra"}, "dra", "extender"),
        ({names.MODE_ANNOTATION: " DRA "}, None, "extender", "dra"),
    ],
    ids=["default-extender", "default-dra", "namespace-label", "pod-wins", "case-and-space"],
)
def test_mode_choice(
    annotations: dict[str, str], labels: dict[str, str] | None, default: str, want: str
) -> None:
    assert mode.choose(annotations, labels, default=config.AdmissionMode(default)) == want


@pytest.mark.parametrize(
    ("annotations", "labels", "field"),
    [
        ({names.MODE_ANNOTATION: "drq"}, None, f"annotation {names.MODE_ANNOTATION}"),
        ({}, {names.MODE_ANNOTATION: ""}, f"namespace label {names.MODE_ANNOTATION}"),
    ],
    ids=["pod-typo", "namespace-empty"],
)
def test_mode_garbage_names_where(
    annotations: dict[str, str], labels: dict[str, str] | None, field: str
) -> None:
    with pytest.raises(errors.RequestError) as caught:
        mode.choose(annotations, labels, default=config.AdmissionMode.EXTENDER)
    assert caught.value.field == field


def test_dra_admission_writes_claims_not_scheduler_and_is_idempotent() -> None:
    conf = cfg(defaultMode="dra", overwriteEnv=True, runtimeClassName="nvidia")
    p = pod(ctr("app", gpu=1, mem=1000, prio=1), ctr("side"))
    got = decide(p, conf)
    assert got.allowed and got.ours
    patched = jsonpatch.apply(p, got.patch)
    assert patched["spec"]["schedulerName"] == "default-scheduler"
    assert patched["spec"]["runtimeClassName"] == "nvidia"
    assert patched["metadata"]["annotations"] == {names.MODE_ANNOTATION: "dra"}
    app, side = patched["spec"]["containers"]
    assert app["resources"] == {"limits": {}, "requests": {}, "claims": [{"name": "vgpu-0"}]}
    assert app["env"] == [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]
    assert side["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]
    assert [t["metadata"]["name"] for t in got.templates] == [
        patched["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    ]
    again = decide(patched, conf)
    assert again.allowed and again.patch == () and again.templates == ()


def test_extender_mode_is_unchanged_by_default() -> None:
    got = decide(pod(ctr(gpu=1, mem=1000)), cfg())
    assert got.templates == ()
    assert any(op["path"] == "/spec/schedulerName" for op in got.patch)


def test_dra_takes_default_scheduler_pods_even_without_force_overwrite() -> None:
    got = decide(pod(ctr(gpu=1, mem=1000)), cfg(defaultMode="dra", forceOverwriteDefaultScheduler=False))
    assert got.ours and len(got.templates) == 1


def test_another_scheduler_is_left_alone_in_dra_mode() -> None:
    got = decide(pod(ctr(gpu=1, mem=1000), schedulerName="volcano"))
    assert got.allowed and got.patch == () and not got.ours


def test_bad_mode_refuses_only_gpu_pods() -> None:
    bad = {names.MODE_ANNOTATION: "sometimes"}
    refused = decide(pod(ctr(gpu=1), annotations=bad))
    assert not refused.allowed and refused.code == 400 and names.MODE_ANNOTATION in refused.message
    assert decide(pod(ctr(), annotations=bad)).allowed


def test_dra_refusal_is_a_400_naming_the_field() -> None:
    got = decide(pod(ctr(gpu=1, pct=30)), facts=admission.Facts())
    assert not got.allowed and got.code == 400
    assert got.message.startswith("container c: gpumem-percentage needs the GPUs' memory sizes")


def test_dra_quota_counts_every_claim_for_the_pods_life() -> None:
    # extender mode: the init container's 3000 collapses into the app's 2000 (3000 held at once);
    # DRA: both claims are allocated for the pod's life, 5000
    p = pod(ctr("app", gpu=1, mem=2000), init=[ctr("prep", gpu=1, mem=3000)])
    facts = dra_facts(quota=quota.Quota(memory_limit_mib=4000))
    refused = decide(p, facts=facts)
    assert not refused.allowed and refused.code == 403
    assert refused.message == "namespace team: GPU memory quota exceeded (used 0 of 4000, requested 5000)"
    assert decide(p, cfg(), facts).allowed


def test_dra_quota_counts_exclusive_cores_and_percent_at_the_largest_size() -> None:
    facts = dra_facts(quota=quota.Quota(memory_limit_mib=200000, cores_limit=150))
    refused = decide(pod(ctr("a", gpu=1), ctr("b", gpu=1, cores=60)), facts=facts)
    assert refused.message == "namespace team: GPU cores quota exceeded (used 0 of 150, requested 160)"
    facts = dra_facts(quota=quota.Quota(memory_limit_mib=40780))
    assert decide(pod(ctr("b", gpu=1, pct=50)), facts=facts).allowed  # 81559 * 50 // 100 = 40779
    refused = decide(pod(ctr("b", gpu=1, pct=51)), facts=facts)
    assert refused.message == "namespace team: GPU memory quota exceeded (used 0 of 40780, requested 41595)"


def test_dra_warns_about_what_kube_scheduler_decides() -> None:
    p = pod(
        ctr("app", gpu=1, mem=1000),
        init=[ctr("prep", gpu=1, mem=1000)],
        annotations={"hami.io/node-scheduler-policy": "spread"},
    )
    got = decide(p)
    assert got.warnings == (
        "hami.io/node-scheduler-policy has no effect in DRA mode: kube-scheduler places the pod",
        "init container prep: its GPU claim is held for the pod's whole life (DRA mode)",
    )


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"gpu": 1, "mem": -5}, "must not be negative"),
        ({"gpu": 1, "pct": 101}, "must be between 0 and 100"),
        ({"gpu": 100000}, "more than the maximum of 16"),
        ({"gpu": 1, "cores": 101}, "must be between 0 and 100"),
        ({"gpu": "1.5"}, "1.5"),
    ],
    ids=["negative-gpumem", "percent-101", "huge-count", "cores-101", "fractional-count"],
)
def test_dra_garbage_requests_are_400(limits: dict[str, Any], message: str) -> None:
    got = decide(pod(ctr(**limits)))
    assert not got.allowed and got.code == 400 and message in got.message
    assert got.templates == ()


def test_percent_zero_is_the_whole_gpu_as_in_extender_mode() -> None:
    got = decide(pod(ctr(gpu=1, pct=0)))
    assert got.allowed
    (template,) = got.templates
    assert template["spec"]["spec"] == exactly(cores="100")


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (exactly(2, memory="4000Mi", cores="30"), (8000, 60)),
        (exactly(1, cores="100"), (81559, 100)),
        (exactly(3), (3 * 81559, 0)),
        (exactly(1, memory="4Gi"), (4096, 0)),
        (
            {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "firstAvailable": [
                                exactly(1, memory="1000Mi", cores="5")["devices"]["requests"][0]["exactly"],
                                exactly(1, memory="3000Mi")["devices"]["requests"][0]["exactly"],
                            ],
                        }
                    ]
                }
            },
            (3000, 5),
        ),
        ({"devices": {"requests": [{"name": "gpu", "exactly": {"allocationMode": "All"}}]}}, (81559, 0)),
        (exactly(1, memory="lots", cores="-5"), (81559, 0)),
        ({"devices": {"requests": ["junk", {"name": "x"}, {"exactly": "x"}]}}, (0, 0)),
        ({"devices": "junk"}, (0, 0)),
        (None, (0, 0)),
    ],
    ids=[
        "memory-cores",
        "whole-exclusive",
        "whole-three",
        "binary",
        "first-available-max",
        "all-mode",
        "unreadable",
        "junk-requests",
        "junk-devices",
        "none",
    ],
)
def test_claim_charge_reads_what_a_claim_holds_at_most(spec: Any, want: tuple[int, int]) -> None:
    assert convert.claim_charge(spec, largest_gpu_memory_mib=81559) == want
