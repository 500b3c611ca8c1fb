"""The admission decision, rule by rule: the exact patch, message and warnings for each case."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from vgpu.core import admission, config, jsonpatch

GPU = "nvidia.com/gpu"
MEM = "nvidia.com/gpumem"
PCT = "nvidia.com/gpumem-percentage"
CORES = "nvidia.com/gpucores"
PRIO = "nvidia.com/priority"
ANNOTATIONS = {
    "hami.io/gpu-type": "NVIDIA",
    "hami.io/node-scheduler-policy": "binpack",
    "hami.io/core-policy": "default",
}


def ctr(
    name: str = "c",
    *,
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    env: list[dict[str, Any]] | None = None,
    privileged: bool | None = None,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "cuda"}
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    if resources:
        c["resources"] = resources
    if env is not None:
        c["env"] = env
    if privileged is not None:
        c["securityContext"] = {"privileged": privileged}
    return c


def pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team"}
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    body: dict[str, Any] = {"schedulerName": "default-scheduler", **spec, "containers": list(containers)}
    if init is not None:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def cfg(**webhook: Any) -> config.Config:
    return config.load({"webhook": webhook})


def add(path: str, value: Any) -> dict[str, Any]:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> dict[str, Any]:
    return {"op": "replace", "path": path, "value": value}


SCHED = replace("/spec/schedulerName", "vgpu-scheduler")
ANN = add("/metadata/annotations", ANNOTATIONS)


def c0(suffix: str) -> str:
    return "/spec/containers/0" + suffix


@dataclass
class Case:
    id: str
    pod: Any
    patch: list[dict[str, Any]] = field(default_factory=list)
    config: config.Config = field(default_factory=cfg)
    facts: admission.Facts = field(default_factory=admission.Facts)
    allowed: bool = True
    message: str = ""
    code: int = 200
    warnings: list[str] = field(default_factory=list)


CASES = [
    # --- ours: the typical HAMi patch ------------------------------------------------------------
    Case(
        "bare-count-gets-exclusive-cores",
        pod(ctr(limits={GPU: "1"})),
        [
            add(c0("/resources/limits/nvidia.com~1gpucores"), "100"),
            add(c0("/resources/requests"), {GPU: "1", CORES: "100"}),
            SCHED,
            ANN,
        ],
    ),
    Case(
        "percent-100-is-a-whole-gpu",
        pod(ctr(limits={GPU: "1", PCT: "100"}, requests={GPU: "1", PCT: "100"})),
        [
            add(c0("/resources/limits/nvidia.com~1gpucores"), "100"),
            add(c0("/resources/requests/nvidia.com~1gpucores"), "100"),
            SCHED,
            ANN,
        ],
    ),
    Case(
        "memory-and-cores-given-only-requests-copied",
        pod(ctr(limits={GPU: "1", MEM: "3000", CORES: "30"}, requests={"cpu": "1", GPU: "1"})),
        [
            add(c0("/resources/requests/nvidia.com~1gpumem"), "3000"),
            add(c0("/resources/requests/nvidia.com~1gpucores"), "30"),
            SCHED,
            ANN,
        ],
    ),
    Case(
        "partial-memory-no-cores-is-shared",
        pod(ctr(limits={GPU: "2", MEM: "4Gi"})),
        [add(c0("/resources/requests"), {GPU: "2", MEM: "4Gi"}), SCHED, ANN],
    ),
    Case(
        "percent-50-is-shared",
        pod(ctr(limits={GPU: "1", PCT: "50"})),
        [add(c0("/resources/requests"), {GPU: "1", PCT: "50"}), SCHED, ANN],
    ),
    Case(
        "memory-without-count-gets-default-count",
        pod(ctr(limits={MEM: "1000"})),
        [
            add(c0("/resources/limits/nvidia.com~1gpu"), "1"),
            add(c0("/resources/requests"), {MEM: "1000", GPU: "1"}),
            SCHED,
            ANN,
        ],
    ),
    Case(
        "default-count-two",
        pod(ctr(limits={CORES: "20", MEM: "100"})),
        [
            add(c0("/resources/limits/nvidia.com~1gpu"), "2"),
            add(c0("/resources/requests"), {MEM: "100", CORES: "20", GPU: "2"}),
            SCHED,
            ANN,
        ],
        config=cfg(defaultGpuCount=2),
    ),
    Case(
        "own-scheduler-name-already-set",
        pod(
            ctr(limits={GPU: "1", CORES: "10"}, requests={GPU: "1", CORES: "10"}),
            schedulerName="vgpu-scheduler",
        ),
        [ANN],
    ),
    Case(
        "empty-scheduler-name-is-ours",
        pod(ctr(limits={GPU: "1", CORES: "10"}, requests={GPU: "1", CORES: "10"}), schedulerName=""),
        [SCHED, ANN],
    ),
    Case(
        "user-annotations-kept-missing-added",
        pod(
            ctr(limits={GPU: "1", CORES: "10"}, requests={GPU: "1", CORES: "10"}),
            annotations={"hami.io/node-scheduler-policy": "spread", "nvidia.com/use-gputype": " A100,H100 "},
        ),
        [
            SCHED,
            add("/metadata/annotations/hami.io~1gpu-type", "A100,H100"),
            add("/metadata/annotations/hami.io~1core-policy", "default"),
        ],
    ),
    Case(
        "priority-env",
        pod(ctr(limits={GPU: "1", CORES: "10", PRIO: "1"}, requests={GPU: "1", CORES: "10", PRIO: "1"})),
        [add(c0("/env"), [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]), SCHED, ANN],
    ),
    Case(
        "priority-env-replaces-an-entry-in-an-allowed-namespace",
        pod(
            ctr(
                limits={GPU: "1", CORES: "10", PRIO: "0"},
                requests={GPU: "1", CORES: "10", PRIO: "0"},
                env=[{"name": "A", "value": "1"}, {"name": "CUDA_TASK_PRIORITY", "valueFrom": {"x": {}}}],
            )
        ),
        [replace(c0("/env/1"), {"name": "CUDA_TASK_PRIORITY", "value": "0"}), SCHED, ANN],
        config=cfg(allowControlEnvNamespaces=["team"]),
    ),
    Case(
        "core-policy-env-on-gpu-containers-only",
        pod(
            ctr("cpu"),
            ctr(
                "gpu",
                limits={GPU: "1", CORES: "10"},
                requests={GPU: "1", CORES: "10"},
                env=[{"name": "A", "value": "1"}],
            ),
        ),
        [
            add("/spec/containers/1/env/1", {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}),
            SCHED,
            add("/metadata/annotations", {**ANNOTATIONS, "hami.io/core-policy": "force"}),
        ],
        config=cfg(gpuCorePolicy="force"),
    ),
    Case(
        "core-policy-annotation-wins",
        pod(
            ctr(limits={GPU: "1", CORES: "10"}, requests={GPU: "1", CORES: "10"}),
            annotations={"hami.io/core-policy": "None"},
        ),
        [
            add(c0("/env"), [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}]),
            SCHED,
            add("/metadata/annotations/hami.io~1gpu-type", "NVIDIA"),
            add("/metadata/annotations/hami.io~1node-scheduler-policy", "binpack"),
        ],
        config=cfg(gpuCorePolicy="force"),
    ),
    Case(
        "runtime-class-from-config",
        pod(ctr(limits={GPU: "1", CORES: "10"}, requests={GPU: "1", CORES: "10"})),
        [SCHED, add("/spec/runtimeClassName", "nvidia"), ANN],
        config=cfg(runtimeClassName="nvidia"),
    ),
    Case(
        "runtime-class-per-device-type",
        pod(
            ctr(limits={GPU: "1", CORES: "10"}, requests={GPU: "1", CORES: "10"}),
            annotations={"nvidia.com/use-gputype": "a100"},
        ),
        [
            SCHED,
            add("/spec/runtimeClassName", "nvidia-a100"),
            add("/metadata/annotations/hami.io~1gpu-type", "a100"),
            add("/metadata/annotations/hami.io~1node-scheduler-policy", "binpack"),
            add("/metadata/annotations/hami.io~1core-policy", "default"),
        ],
        config=cfg(runtimeClassName="x", runtimeClassByType={"A100": "nvidia-a100", "NVIDIA": "nvidia"}),
    ),
    Case(
        "runtime-class-users-kept",
        pod(ctr(limits={GPU: "1", CORES: "10"}, requests={GPU: "1", CORES: "10"}), runtimeClassName="kata"),
        [SCHED, ANN],
        config=cfg(runtimeClassByType={"NVIDIA": "nvidia"}),
    ),
    Case(
        "overwrite-env-hides-gpus-from-non-gpu-containers",
        pod(
            ctr("gpu", limits={GPU: "1", CORES: "10"}, requests={GPU: "1", CORES: "10"}),
            ctr("side", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
            init=[ctr("setup")],
        ),
        [
            add("/spec/initContainers/0/env", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]),
            replace("/spec/containers/1/env/0", {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}),
            SCHED,
            ANN,
        ],
        config=cfg(overwriteEnv=True),
    ),
    Case(
        "overwrite-env-on-a-pod-without-gpus",
        pod(ctr("a"), ctr("b", privileged=True)),
        [add(c0("/env"), [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}])],
        config=cfg(overwriteEnv=True),
    ),
    Case(
        "init-container-gpu",
        pod(ctr("app"), init=[ctr("init", limits={GPU: "1", MEM: "10"}, requests={GPU: "1", MEM: "10"})]),
        [SCHED, ANN],
    ),
    # --- not ours / left alone -------------------------------------------------------------------
    Case("no-gpu", pod(ctr(limits={"cpu": "1"})), []),
    Case(
        "priority-only-is-not-ours",
        pod(ctr(limits={PRIO: "1"})),
        [],
        warnings=["container c: nvidia.com/priority without a GPU has no effect"],
    ),
    Case("other-scheduler", pod(ctr(limits={GPU: "1"}), schedulerName="volcano"), []),
    Case(
        "default-scheduler-without-force",
        pod(ctr(limits={GPU: "1"})),
        [],
        config=cfg(forceOverwriteDefaultScheduler=False),
    ),
    Case("pod-label-ignore", pod(ctr(limits={GPU: "-1"}), labels={"hami.io/webhook": "ignore"}), []),
    Case(
        "namespace-label-ignore",
        pod(ctr(limits={GPU: "1"})),
        [],
        facts=admission.Facts(namespace_labels={"hami.io/webhook": "ignore"}),
    ),
    Case(
        "privileged-without-gpu-skipped",
        pod(
            ctr("gpu", limits={GPU: "1", CORES: "5"}, requests={GPU: "1", CORES: "5"}),
            ctr("p", privileged=True),
        ),
        [SCHED, ANN],
    ),
    # --- denied ----------------------------------------------------------------------------------
    Case("no-containers", pod(), allowed=False, code=400, message="pod has no containers"),
    Case(
        "privileged-gpu",
        pod(ctr("train", limits={GPU: "1"}, privileged=True)),
        allowed=False,
        code=403,
        message="container train is privileged: it would see every GPU on the node, so its GPU share cannot be "
        "enforced; drop privileged or the GPU request",
    ),
    Case(
        "node-name-set",
        pod(ctr(limits={GPU: "1"}), nodeName="n1"),
        allowed=False,
        code=403,
        message="pod has node assigned (spec.nodeName=n1): GPU pods must be placed by vgpu-scheduler; remove spec.nodeName",
    ),
    Case(
        "negative-count",
        pod(ctr(limits={GPU: "-1"})),
        allowed=False,
        code=400,
        message="container c: nvidia.com/gpu: must not be negative, got -1",
    ),
    Case(
        "negative-memory",
        pod(ctr(limits={GPU: "1", MEM: "-5"})),
        allowed=False,
        code=400,
        message="container c: nvidia.com/gpumem: must not be negative",
    ),
    Case(
        "percent-over-100",
        pod(ctr(limits={GPU: "1", PCT: "150"})),
        allowed=False,
        code=400,
        message="container c: nvidia.com/gpumem-percentage: must be between 0 and 100, got 150",
    ),
    Case(
        "cores-over-100",
        pod(ctr(limits={GPU: "1", CORES: "101"})),
        allowed=False,
        code=400,
        message="container c: nvidia.com/gpucores: must be between 0 and 100, got 101",
    ),
    Case(
        "memory-without-gpu",
        pod(ctr(limits={MEM: "1000"})),
        config=cfg(defaultGpuCount=0),
        allowed=False,
        code=400,
        message="container c: nvidia.com/gpu: GPU memory or cores requested without any GPU",
    ),
    Case(
        "memory-with-zero-gpus",
        pod(ctr(limits={GPU: "0", MEM: "1"})),
        allowed=False,
        code=400,
        message="container c: nvidia.com/gpu: GPU memory or cores requested with 0 GPUs",
    ),
    Case(
        "count-above-max",
        pod(ctr(limits={GPU: "17"})),
        allowed=False,
        code=400,
        message="container c: nvidia.com/gpu: asks for 17 GPUs, more than the maximum of 16",
    ),
    Case(
        "unparsable-memory",
        pod(ctr(limits={GPU: "1", MEM: "lots"})),
        allowed=False,
        code=400,
        message="container c: nvidia.com/gpumem: invalid quantity 'lots': expected a number with an optional suffix like Mi, Gi, G, m",
    ),
    Case(
        "fractional-count",
        pod(ctr(limits={GPU: "1.5"})),
        allowed=False,
        code=400,
        message="container c: nvidia.com/gpu: invalid quantity '1.5': must be a whole number",
    ),
    Case(
        "bad-core-policy",
        pod(ctr(limits={GPU: "1"}), annotations={"hami.io/core-policy": "max"}),
        allowed=False,
        code=400,
        message="annotation hami.io/core-policy: unknown core policy 'max': expected default, force or disable",
    ),
    Case(
        "forged-annotations",
        pod(
            ctr(limits={GPU: "1"}),
            annotations={
                "hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,1,1:;",
                "hami.io/bind-phase": "success",
            },
        ),
        allowed=False,
        code=403,
        message="pod sets hami.io/vgpu-devices-to-allocate, hami.io/bind-phase: only the scheduler and device plugin may",
    ),
    Case(
        "forged-even-when-ignored-or-not-ours",
        pod(ctr(), labels={"hami.io/vgpu-node": "n1", "hami.io/webhook": "ignore"}, schedulerName="other"),
        allowed=False,
        code=403,
        message="pod sets label hami.io/vgpu-node: only the scheduler and device plugin may",
    ),
    Case(
        "forged-stripped-when-configured",
        pod(
            ctr(limits={GPU: "1", CORES: "1"}, requests={GPU: "1", CORES: "1"}),
            annotations={"hami.io/vgpu-node": "n1", "keep": "x"},
            labels={"hami.io/vgpu-node": "n1"},
        ),
        [
            {"op": "remove", "path": "/metadata/annotations/hami.io~1vgpu-node"},
            {"op": "remove", "path": "/metadata/labels/hami.io~1vgpu-node"},
            SCHED,
            add("/metadata/annotations/hami.io~1gpu-type", "NVIDIA"),
            add("/metadata/annotations/hami.io~1node-scheduler-policy", "binpack"),
            add("/metadata/annotations/hami.io~1core-policy", "default"),
        ],
        config=cfg(stripForgedAnnotations=True),
        warnings=["removed scheduler-internal hami.io/vgpu-node, label hami.io/vgpu-node"],
    ),
    # --- undecodable objects ---------------------------------------------------------------------
    Case(
        "object-not-a-map", ["pod"], allowed=False, code=400, message="request.object: expected a Pod object"
    ),
    Case("no-spec", {"metadata": {}}, allowed=False, code=400, message="pod.spec: expected an object"),
    Case(
        "containers-not-list",
        {"spec": {"containers": {}}},
        allowed=False,
        code=400,
        message="pod.spec.containers: expected a list",
    ),
    Case(
        "container-not-object",
        {"spec": {"containers": [1]}},
        allowed=False,
        code=400,
        message="pod.spec.containers[0]: expected an object",
    ),
    Case(
        "env-not-list",
        {"spec": {"initContainers": [{"env": "x"}], "containers": []}},
        allowed=False,
        code=400,
        message="pod.spec.initContainers[0].env: expected a list",
    ),
    Case(
        "env-entry-without-name",
        {"spec": {"containers": [{"env": [{"value": "1"}]}]}},
        allowed=False,
        code=400,
        message="pod.spec.containers[0].env[0]: expected an object with a string name",
    ),
    Case(
        "limits-not-object",
        {"spec": {"containers": [{"resources": {"limits": []}}]}},
        allowed=False,
        code=400,
        message="pod.spec.containers[0].resources.limits: expected an object",
    ),
    Case(
        "labels-not-strings",
        {"metadata": {"labels": {"a": 1}}, "spec": {}},
        allowed=False,
        code=400,
        message="pod.metadata.labels: expected a map of strings",
    ),
    Case(
        "metadata-not-object",
        {"metadata": 3, "spec": {}},
        allowed=False,
        code=400,
        message="pod.metadata: expected an object",
    ),
    Case(
        "scheduler-name-not-string",
        {"spec": {"schedulerName": 1}},
        allowed=False,
        code=400,
        message="pod.spec.schedulerName: expected a string",
    ),
    Case(
        "container-name-not-string",
        {"spec": {"containers": [{"name": 1}]}},
        allowed=False,
        code=400,
        message="pod.spec.containers[0].name: expected a string",
    ),
    Case(
        "security-context-not-object",
        {"spec": {"containers": [{"securityContext": "x"}]}},
        allowed=False,
        code=400,
        message="pod.spec.containers[0].securityContext: expected an object",
    ),
    # --- warnings --------------------------------------------------------------------------------
    Case(
        "warn-memory-above-largest-gpu",
        pod(ctr(limits={GPU: "1", MEM: "90000", CORES: "0"}, requests={GPU: "1", MEM: "90000", CORES: "0"})),
        [SCHED, ANN],
        facts=admission.Facts(largest_gpu_memory_mib=81920),
        warnings=["container c: 90000 MiB per GPU is more than the largest GPU in the cluster (81920 MiB)"],
    ),
    Case(
        "warn-percent-and-mib",
        pod(
            ctr(
                limits={GPU: "1", MEM: "900", PCT: "10", CORES: "0"},
                requests={GPU: "1", MEM: "900", PCT: "10", CORES: "0"},
            )
        ),
        [SCHED, ANN],
        warnings=[
            "container c: nvidia.com/gpumem and nvidia.com/gpumem-percentage both set; percent ignored"
        ],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rule(case: Case) -> None:
    before = copy.deepcopy(case.pod)
    decision = admission.decide(case.pod, namespace="team", config=case.config, facts=case.facts)
    assert case.pod == before, "decide must not modify its input"
    assert decision.allowed is case.allowed
    assert decision.message == case.message
    assert decision.code == (case.code if not case.allowed else 200)
    assert list(decision.patch) == case.patch
    assert list(decision.warnings) == case.warnings
    for w in decision.warnings:
        assert len(w) < 120
    if case.allowed and case.patch:
        patched = jsonpatch.apply(case.pod, decision.patch)
        again = admission.decide(patched, namespace="team", config=case.config, facts=case.facts)
        assert again.allowed and again.patch == (), "mutation must be idempotent (reinvocation)"


def test_memory_factor_scales_memory_and_quota() -> None:
    conf = cfg(memoryFactor=10)
    p = pod(ctr(limits={GPU: "2", MEM: "100", CORES: "0"}, requests={GPU: "2", MEM: "100", CORES: "0"}))
    quota = admission.Quota(memory_limit_mib=300, used_memory_mib=1001)
    denied = admission.decide(p, namespace="team", config=conf, facts=admission.Facts(quota=quota))
    # 100 units x factor 10 = 1000 MiB per GPU, two GPUs; limit 300 x 10 = 3000 MiB
    assert denied.message == "namespace team: GPU memory quota exceeded (used 1001 of 3000, requested 2000)"
    assert denied.code == 403 and denied.reason == "Forbidden"
    fits = admission.Quota(memory_limit_mib=300, used_memory_mib=1000)
    assert admission.decide(p, namespace="team", config=conf, facts=admission.Facts(quota=fits)).allowed


QUOTA_CASES = [
    (
        "memory-over",
        admission.Quota(memory_limit_mib=8000, used_memory_mib=6000),
        pod(ctr(limits={GPU: "1", MEM: "3000"})),
        "namespace team: GPU memory quota exceeded (used 6000 of 8000, requested 3000)",
    ),
    (
        "memory-exact-fit",
        admission.Quota(memory_limit_mib=8000, used_memory_mib=5000),
        pod(ctr(limits={GPU: "1", MEM: "3000"})),
        "",
    ),
    (
        "cores-exclusive-counts-100-per-gpu",
        admission.Quota(cores_limit=150),
        pod(ctr(limits={GPU: "2"})),
        "namespace team: GPU cores quota exceeded (used 0 of 150, requested 200)",
    ),
    (
        "cores-over",
        admission.Quota(cores_limit=100, used_cores=80),
        pod(ctr(limits={GPU: "1", MEM: "10", CORES: "30"})),
        "namespace team: GPU cores quota exceeded (used 80 of 100, requested 30)",
    ),
    (
        "zero-limit-blocks",
        admission.Quota(memory_limit_mib=0),
        pod(ctr(limits={GPU: "1", MEM: "1"})),
        "namespace team: GPU memory quota exceeded (used 0 of 0, requested 1)",
    ),
    (
        "zero-request-not-blocked",
        admission.Quota(cores_limit=0, used_cores=50),
        pod(ctr(limits={GPU: "1", MEM: "1"})),
        "",
    ),
    (
        "percent-counted-at-largest-gpu",
        admission.Quota(memory_limit_mib=10000),
        pod(ctr(limits={GPU: "1", PCT: "50", CORES: "1"})),
        "namespace team: GPU memory quota exceeded (used 0 of 10000, requested 12000)",
    ),
    (
        "init-containers-take-the-max",
        admission.Quota(memory_limit_mib=5000),
        pod(
            ctr("a", limits={GPU: "1", MEM: "2000"}),
            ctr("b", limits={GPU: "1", MEM: "2000"}),
            init=[ctr("i", limits={GPU: "1", MEM: "5001"})],
        ),
        "namespace team: GPU memory quota exceeded (used 0 of 5000, requested 5001)",
    ),
    (
        "app-containers-sum",
        admission.Quota(memory_limit_mib=3999),
        pod(
            ctr("a", limits={GPU: "1", MEM: "2000"}),
            ctr("b", limits={GPU: "1", MEM: "2000"}),
            init=[ctr("i", limits={GPU: "1", MEM: "10"})],
        ),
        "namespace team: GPU memory quota exceeded (used 0 of 3999, requested 4000)",
    ),
    (
        "a-sidecar-adds-to-the-app-containers",
        admission.Quota(memory_limit_mib=9999),
        pod(
            ctr("a", limits={GPU: "1", MEM: "6000"}),
            init=[{**ctr("proxy", limits={GPU: "1", MEM: "4000"}), "restartPolicy": "Always"}],
        ),
        "namespace team: GPU memory quota exceeded (used 0 of 9999, requested 10000)",
    ),
    ("no-limits-set", admission.Quota(used_memory_mib=10**9), pod(ctr(limits={GPU: "1", MEM: "1"})), ""),
]


@pytest.mark.parametrize(
    ("quota", "p", "message"), [c[1:] for c in QUOTA_CASES], ids=[c[0] for c in QUOTA_CASES]
)
def test_quota(quota: admission.Quota, p: dict[str, Any], message: str) -> None:
    facts = admission.Facts(quota=quota, largest_gpu_memory_mib=24000)
    decision = admission.decide(p, namespace="team", config=cfg(), facts=facts)
    assert decision.message == message
    assert decision.allowed is (message == "")


def test_quota_ignores_pods_that_are_not_ours() -> None:
    facts = admission.Facts(quota=admission.Quota(memory_limit_mib=0, cores_limit=0, used_cores=10))
    assert admission.decide(pod(ctr()), namespace="team", config=cfg(), facts=facts).allowed


def test_custom_prefix_and_resource_names() -> None:
    conf = config.load(
        {
            "annotationPrefix": "vgpu.example.com",
            "resources": {"count": "example.com/vgpu", "cores": "example.com/vcores"},
            "scheduler": {"schedulerName": "mine", "nodePolicy": "spread"},
        }
    )
    decision = admission.decide(
        pod(ctr(limits={"example.com/vgpu": "1"})), namespace="ns", config=conf, facts=admission.Facts()
    )
    assert list(decision.patch) == [
        add(c0("/resources/limits/example.com~1vcores"), "100"),
        add(c0("/resources/requests"), {"example.com/vgpu": "1", "example.com/vcores": "100"}),
        replace("/spec/schedulerName", "mine"),
        add(
            "/metadata/annotations",
            {
                "vgpu.example.com/gpu-type": "NVIDIA",
                "vgpu.example.com/node-scheduler-policy": "spread",
                "vgpu.example.com/core-policy": "default",
            },
        ),
    ]
    forged = pod(ctr(), annotations={"vgpu.example.com/bind-phase": "success", "hami.io/bind-phase": "x"})
    denied = admission.decide(forged, namespace="ns", config=conf, facts=admission.Facts())
    assert denied.message == "pod sets vgpu.example.com/bind-phase: only the scheduler and device plugin may"


def test_long_warnings_are_cut_below_120_characters() -> None:
    name = "x" * 150
    p = pod(ctr(name, limits={PRIO: "1"}))
    (warning,) = admission.decide(p, namespace="ns", config=cfg(), facts=admission.Facts()).warnings
    assert len(warning) == 119 and warning.endswith("...")
