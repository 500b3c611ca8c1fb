"""Properties of the admission decision over generated pods (valid, odd and garbage).

For every generated pod: ``decide`` returns (never raises); a denial has a 4xx code and a message;
an allowed patch applies cleanly to the pod, is JSON, and deciding again on the patched pod gives
an empty patch (idempotent, as ``reinvocationPolicy: IfNeeded`` needs).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vgpu.core import admission, config, jsonpatch

RESOURCES = [
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
    "cpu",
]
KEYS = [
    "hami.io/core-policy",
    "hami.io/node-scheduler-policy",
    "hami.io/gpu-scheduler-policy",
    "hami.io/gpu-type",
    "hami.io/webhook",
    "nvidia.com/use-gputype",
    "app",
]
ODD_KEYS = [*KEYS, "hami.io/vgpu-node", "hami.io/bind-phase"]
GOOD_QUANTITIES = st.sampled_from(["0", "1", "2", "10", "50", "100", "3000", "4Gi", "1e3", 1, 30])
BAD_QUANTITIES = st.one_of(
    st.sampled_from(["101", "-1", "1.5", "16G", "500m", "x", "", "17"]),
    st.integers(-5, 200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=1),
)


def pod_strategy(*, odd: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Well-shaped pods with mostly valid requests, or (``odd``) anything pod-like."""
    quantities = st.one_of(GOOD_QUANTITIES, BAD_QUANTITIES) if odd else GOOD_QUANTITIES
    resource_maps = st.dictionaries(st.sampled_from(RESOURCES), quantities, max_size=4)
    env_entries = st.fixed_dictionaries(
        {"name": st.sampled_from(["CUDA_TASK_PRIORITY", "NVIDIA_VISIBLE_DEVICES", "A"])},
        optional={"value": st.text(max_size=3), "valueFrom": st.just({"fieldRef": {"fieldPath": "x"}})},
    )
    gpu_limits = st.fixed_dictionaries(
        {"nvidia.com/gpu": st.sampled_from(["1", "2", 1])},
        optional={
            "nvidia.com/gpumem": st.sampled_from(["1000", "4Gi", 3000]),
            "nvidia.com/gpumem-percentage": st.sampled_from(["10", "50", "100"]),
            "nvidia.com/gpucores": st.sampled_from(["0", "10", "100"]),
            "nvidia.com/priority": st.sampled_from(["0", "1"]),
            "cpu": st.just("1"),
        },
    )
    resources = st.fixed_dictionaries(
        {"limits": st.one_of(gpu_limits, resource_maps) if odd else gpu_limits},
        optional={"requests": resource_maps},
    )
    envs = st.lists(env_entries, max_size=3)
    if odd:
        resources = st.one_of(resources, st.none(), st.just("garbage"))
        envs = st.one_of(envs, st.none(), st.just([1]))
    containers = st.fixed_dictionaries(
        {"name": st.sampled_from(["a", "b", "c/d", "~"])},
        optional={
            "resources": resources,
            "env": envs,
            "securityContext": st.fixed_dictionaries({"privileged": st.booleans()}),
        },
    )
    values = st.sampled_from(["", "force", "spread", "disable", "A100", "ignore", "x"])
    string_maps: st.SearchStrategy[Any] = st.dictionaries(st.sampled_from(ODD_KEYS), values, max_size=4)
    if not odd:
        string_maps = st.fixed_dictionaries(
            {},
            optional={
                "hami.io/core-policy": st.sampled_from(["", "default", "force", "disable", "none"]),
                "hami.io/node-scheduler-policy": st.sampled_from(["binpack", "spread"]),
                "hami.io/gpu-type": st.just("mine"),
                "nvidia.com/use-gputype": st.sampled_from(["", "A100", "a100,h100"]),
                "app": st.just("x"),
            },
        )
    if odd:
        string_maps = st.one_of(string_maps, st.none(), st.just({"k": 1}))
    return st.fixed_dictionaries(
        {
            "metadata": st.fixed_dictionaries(
                {}, optional={"annotations": string_maps, "labels": string_maps}
            ),
            "spec": st.fixed_dictionaries(
                {"containers": st.lists(containers, min_size=0 if odd else 1, max_size=3)},
                optional={
                    "initContainers": st.lists(containers, max_size=2),
                    "schedulerName": st.sampled_from(
                        ["", "default-scheduler", "vgpu-scheduler", "other"]
                        if odd
                        else ["", "vgpu-scheduler"]
                    ),
                    "nodeName": st.sampled_from(["", "n1"] if odd else [""]),
                    "runtimeClassName": st.sampled_from(["", "kata"]),
                },
            ),
        }
    )


garbage = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["spec", "metadata", "containers", "x"]), inner),
    ),
    max_leaves=8,
)
configs = st.builds(
    lambda overwrite, force, strip, policy, count, factor: config.load(
        {
            "webhook": {
                "overwriteEnv": overwrite,
                "forceOverwriteDefaultScheduler": force,
                "stripForgedAnnotations": strip,
                "gpuCorePolicy": policy,
                "defaultGpuCount": count,
                "memoryFactor": factor,
                "runtimeClassByType": {"NVIDIA": "nvidia"},
            }
        }
    ),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["default", "force", "disable"]),
    st.integers(0, 2),
    st.integers(1, 3),
)
facts = st.builds(
    admission.Facts,
    namespace_labels=st.sampled_from([None, {}, {"hami.io/webhook": "ignore"}, {"hami.io/webhook": "no"}]),
    quota=st.one_of(
        st.none(),
        st.builds(
            admission.Quota,
            memory_limit_mib=st.one_of(st.none(), st.integers(0, 10**6)),
            cores_limit=st.one_of(st.none(), st.integers(0, 1000)),
            used_memory_mib=st.integers(0, 10**6),
            used_cores=st.integers(0, 1000),
        ),
    ),
    largest_gpu_memory_mib=st.sampled_from([0, 24576, 81920]),
)


def check(pod: Any, conf: config.Config, snapshot: admission.Facts) -> None:
    decision = admission.decide(pod, namespace="ns", config=conf, facts=snapshot)
    json.dumps(list(decision.patch))
    assert all(len(w) < 120 for w in decision.warnings)
    if not decision.allowed:
        assert decision.code in (400, 403) and decision.message and not decision.patch
        return
    patched = jsonpatch.apply(pod, decision.patch)
    again = admission.decide(patched, namespace="ns", config=conf, facts=snapshot)
    assert again.allowed, again.message
    assert again.patch == (), f"not idempotent: {decision.patch} then {again.patch}"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pod_strategy(odd=False), conf=configs, snapshot=facts.filter(lambda f: f.namespace_labels is None))
def test_generated_pods(pod: dict[str, Any], conf: config.Config, snapshot: admission.Facts) -> None:
    check(pod, conf, snapshot)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pod_strategy(odd=True), conf=configs, snapshot=facts)
def test_odd_pods(pod: dict[str, Any], conf: config.Config, snapshot: admission.Facts) -> None:
    check(pod, conf, snapshot)


@settings(max_examples=300, deadline=None)
@given(obj=garbage)
def test_garbage_objects_are_refused_or_passed_never_crash(obj: Any) -> None:
    check(obj, config.Config(), admission.Facts())
