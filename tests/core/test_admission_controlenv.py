"""HAMi-core's control variables on GPU containers are refused, naming them (issue 49).

A kubelet applies a container's own env after the device plugin's, so a pod that sets
``CUDA_DEVICE_MEMORY_LIMIT_0`` would take more than it is accounted for. The webhook refuses such
pods unless their namespace is listed in ``webhook.allowControlEnvNamespaces``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core import admission, config, controlenv, jsonpatch

GPU = "nvidia.com/gpu"
CORES = "nvidia.com/gpucores"
PRIO = "nvidia.com/priority"
GPU_LIMITS = {GPU: "1", CORES: "10"}


def ctr(name: str, env: Any, *, limits: dict[str, str] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "cuda", "resources": {"limits": limits or dict(GPU_LIMITS)}}
    if env is not None:
        c["env"] = env
    return c


def pod(
    *containers: dict[str, Any], init: list[dict[str, Any]] | None = None, **notes: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    meta: dict[str, Any] = {"name": "p", "annotations": dict(notes)} if notes else {"name": "p"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def decide(p: Any, *, namespace: str = "team", **webhook: Any) -> admission.Decision:
    return admission.decide(
        p, namespace=namespace, config=config.load({"webhook": webhook}), facts=admission.Facts()
    )


def env(**values: str) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


REFUSED = [
    ("disable-control", env(CUDA_DISABLE_CONTROL="true"), "CUDA_DISABLE_CONTROL"),
    ("memory-limit-per-gpu", env(CUDA_DEVICE_MEMORY_LIMIT_0="16000m"), "CUDA_DEVICE_MEMORY_LIMIT_0"),
    ("memory-limit-fallback", env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "CUDA_DEVICE_MEMORY_LIMIT"),
    ("sm-limit", env(CUDA_DEVICE_SM_LIMIT="100"), "CUDA_DEVICE_SM_LIMIT"),
    ("sm-limit-per-gpu", env(CUDA_DEVICE_SM_LIMIT_3="100"), "CUDA_DEVICE_SM_LIMIT_3"),
    ("shared-cache", env(CUDA_DEVICE_MEMORY_SHARED_CACHE="/tmp/x"), "CUDA_DEVICE_MEMORY_SHARED_CACHE"),
    ("priority-without-the-resource", env(CUDA_TASK_PRIORITY="0"), "CUDA_TASK_PRIORITY"),
    ("core-policy", env(GPU_CORE_UTILIZATION_POLICY="disable"), "GPU_CORE_UTILIZATION_POLICY"),
    ("oom-killer", env(ACTIVE_OOM_KILLER="false"), "ACTIVE_OOM_KILLER"),
    ("kernel-interval", env(RECORD_KERNEL_INTERVAL="1000000"), "RECORD_KERNEL_INTERVAL"),
    ("redirect", env(CUDA_REDIRECT="/tmp/mine.so"), "CUDA_REDIRECT"),
    ("ld-preload", env(LD_PRELOAD="/tmp/mine.so"), "LD_PRELOAD"),
    ("device-list", env(NVIDIA_VISIBLE_DEVICES="all"), "NVIDIA_VISIBLE_DEVICES"),
    ("empty-value", env(CUDA_DISABLE_CONTROL=""), "CUDA_DISABLE_CONTROL"),
    (
        "value-from-a-secret",
        [{"name": "CUDA_DEVICE_SM_LIMIT", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        "CUDA_DEVICE_SM_LIMIT",
    ),
    (
        "two-named-once-each",
        [*env(A="1", LD_PRELOAD="x", CUDA_DISABLE_CONTROL="1"), *env(LD_PRELOAD="y")],
        "LD_PRELOAD, CUDA_DISABLE_CONTROL",
    ),
]


@pytest.mark.parametrize(("entries", "named"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_gpu_container_setting_a_control_variable_is_refused_naming_it(entries: Any, named: str) -> None:
    decision = decide(pod(ctr("train", entries)))
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, "Forbidden")
    assert decision.message.startswith(f"container train sets {named}: the device plugin sets ")
    assert "webhook.allowControlEnvNamespaces" in decision.message


@pytest.mark.parametrize(
    "p",
    [
        pod(ctr("app", None, limits={"cpu": "1"}), init=[ctr("init", env(CUDA_DEVICE_SM_LIMIT="100"))]),
        pod(ctr("cpu", env(LD_PRELOAD="x"), limits={"cpu": "1"}), ctr("train", env(LD_PRELOAD="y"))),
    ],
    ids=["init-container", "second-container"],
)
def test_every_gpu_container_is_checked_and_only_those(p: dict[str, Any]) -> None:
    decision = decide(p)
    assert not decision.allowed
    assert decision.message.startswith(("container init sets", "container train sets"))


ALLOWED = [
    ("no-env", None),
    ("ordinary-env", env(A="1", CUDA_VISIBLE_DEVICES="0", LIBCUDA_LOG_LEVEL="4", PATH="/bin")),
    ("near-names", env(CUDA_DEVICE_MEMORY="1", MY_LD_PRELOAD="x", cuda_disable_control="true")),
]


@pytest.mark.parametrize("entries", [c[1] for c in ALLOWED], ids=[c[0] for c in ALLOWED])
def test_other_variables_are_allowed(entries: Any) -> None:
    assert decide(pod(ctr("train", entries))).allowed


def test_a_container_without_a_gpu_may_set_them() -> None:
    p = pod(ctr("cpu", env(LD_PRELOAD="x", CUDA_DISABLE_CONTROL="1"), limits={"cpu": "1"}))
    assert decide(p).allowed


def test_a_listed_namespace_may_set_them() -> None:
    p = pod(ctr("train", env(CUDA_DEVICE_MEMORY_LIMIT_0="16000m")))
    assert not decide(p, namespace="team", allowControlEnvNamespaces=["lab"]).allowed
    assert decide(p, namespace="lab", allowControlEnvNamespaces=["lab"]).allowed


def test_the_webhooks_own_variables_pass_on_reinvocation() -> None:
    """What the webhook wrote itself (priority, core policy) is allowed when it sees the pod again."""
    p = pod(ctr("train", None, limits={**GPU_LIMITS, PRIO: "1"}))
    first = decide(p, gpuCorePolicy="force")
    assert first.allowed
    patched = jsonpatch.apply(p, list(first.patch))
    assert {e["name"]: e["value"] for e in patched["spec"]["containers"][0]["env"]} == {
        "CUDA_TASK_PRIORITY": "1",
        "GPU_CORE_UTILIZATION_POLICY": "force",
    }
    again = decide(patched, gpuCorePolicy="force")
    assert (again.allowed, again.patch) == (True, ())


@pytest.mark.parametrize(
    "entries",
    [env(CUDA_TASK_PRIORITY="0"), [{"name": "CUDA_TASK_PRIORITY", "value": "1", "valueFrom": {"x": {}}}]],
    ids=["another-value", "value-from"],
)
def test_a_priority_other_than_the_webhooks_is_refused(entries: Any) -> None:
    decision = decide(pod(ctr("train", entries, limits={**GPU_LIMITS, PRIO: "1"})))
    assert not decision.allowed and "CUDA_TASK_PRIORITY" in decision.message


# --- garbage: env entries the shape check lets through and what it refuses ----------------------


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("LD_PRELOAD=x", "pod.spec.containers[0].env: expected a list"),
        ([{"name": 1}], "pod.spec.containers[0].env[0]: expected an object with a string name"),
        (["LD_PRELOAD"], "pod.spec.containers[0].env[0]: expected an object with a string name"),
    ],
    ids=["string", "number-name", "string-entry"],
)
def test_garbage_env_is_a_400_naming_the_field(entries: Any, message: str) -> None:
    decision = decide(pod(ctr("train", entries)))
    assert (decision.allowed, decision.code, decision.message) == (False, 400, message)


@given(
    st.one_of(
        st.none(),
        st.integers(),
        st.text(),
        st.lists(
            st.one_of(
                st.none(),
                st.text(),
                st.dictionaries(st.text(max_size=30), st.one_of(st.text(), st.none(), st.integers())),
            )
        ),
    )
)
def test_set_by_pod_never_raises_and_names_only_control_variables(entries: Any) -> None:
    names = controlenv.set_by_pod(entries, own={})
    assert all(controlenv.is_control(n) for n in names)
    assert len(names) == len(set(names))
