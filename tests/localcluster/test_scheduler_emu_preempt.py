"""The emulated PostFilter: DefaultPreemption with a preemption-capable extender over real HTTP,
as each emulated kube-scheduler version does it (v1.20: no extender; v1.22-v1.36: only nodes with
in-tree victims reach the extender; pr135486: GPU-only shortfalls reach it with an empty list)."""

from __future__ import annotations

from typing import Any

import pytest
from vgpu.core import errors
from vgpu.localcluster import preemption

from tests.localcluster.extenders import config, unschedulable

GPU = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "1000"}


def fail_all(args: dict[str, Any]) -> Any:
    return {"NodeNames": [], "FailedNodes": dict.fromkeys(args["NodeNames"], "no GPU with 1000 MiB free")}


async def _setup(env: Any, *, preemption_policy: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    await env.add_node("n1")
    low = env.make_pod("low", limits=GPU, node_name="n1")
    low["spec"]["priority"] = 10
    low["spec"]["terminationGracePeriodSeconds"] = 7
    low = await env.api.create("pods", low, namespace="default")
    high = env.make_pod("high", limits=GPU)
    high["spec"]["priority"] = 1000
    if preemption_policy:
        high["spec"]["preemptionPolicy"] = preemption_policy
    return low, high


def _nominated(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("nominatedNodeName") == "n1"


async def test_extender_victims_are_deleted_with_grace_and_the_preemptor_nominated(env, ext, start_scheduler):
    low, high = await _setup(env)
    ext.filter_reply = fail_all
    ext.preempt_reply = lambda args: {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": low["metadata"]["uid"]}], "NumPDBViolations": 0}}
    }
    start_scheduler(config(ext.url, preemptVerb="preempt"), version="pr135486")
    await env.api.create("pods", high, namespace="default")

    await env.wait_for("pods", "high", _nominated)
    (args,) = ext.preempt_calls[:1]
    # GPU-only shortfall: the in-tree dry run needs no victim, the node is offered with an empty list
    assert args["NodeNameToMetaVictims"] == {"n1": {"Pods": [], "NumPDBViolations": 0}}
    assert args["Pod"]["metadata"]["name"] == "high"
    victim = await env.get_pod("low")
    assert victim["metadata"]["deletionTimestamp"] and victim["metadata"]["deletionGracePeriodSeconds"] == 7
    event = await env.wait_event("high", reason="FailedScheduling")
    assert "preemption under way: nominated node n1, evicting 1 pod(s): low" in event["message"]
    preempted = await env.wait_event("low", reason="Preempted")
    assert preempted["message"] == f"Preempted by pod {args['Pod']['metadata']['uid']} on node n1"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ({"n1": {"Pods": [{"UID": "not-there"}]}}, "but the pod is not found on that node"),
        ({"n1": {"Pods": []}}, 'expected at least one victim pod on node "n1"'),
        ({"n9": {"Pods": [{"UID": "x"}]}}, 'nodeinfo not found for node name "n9"'),
    ],
    ids=["victim-not-on-node", "empty-victims", "unknown-node"],
)
async def test_bad_extender_answers_preempt_nothing(env, ext, start_scheduler, answer, error):
    _, high = await _setup(env)
    ext.filter_reply = fail_all
    ext.preempt_reply = lambda args: {"NodeNameToMetaVictims": answer}
    start_scheduler(config(ext.url, preemptVerb="preempt"), version="pr135486")
    await env.api.create("pods", high, namespace="default")

    event = await env.wait_event("high", reason="FailedScheduling")
    assert error in event["message"]
    assert not (await env.get_pod("low"))["metadata"].get("deletionTimestamp")
    assert not _nominated(await env.get_pod("high"))


async def test_preemption_policy_never_does_not_call_the_extender(env, ext, start_scheduler):
    _, high = await _setup(env, preemption_policy="Never")
    ext.filter_reply = fail_all
    start_scheduler(config(ext.url, preemptVerb="preempt"))
    await env.api.create("pods", high, namespace="default")

    await env.wait_for("pods", "high", unschedulable)
    assert ext.preempt_calls == []
    assert not (await env.get_pod("low"))["metadata"].get("deletionTimestamp")


async def test_equal_priority_pods_are_no_candidates(env, ext, start_scheduler):
    low, high = await _setup(env)
    high["spec"]["priority"] = 10
    ext.filter_reply = fail_all
    start_scheduler(config(ext.url, preemptVerb="preempt"), version="pr135486")
    await env.api.create("pods", high, namespace="default")

    await env.wait_for("pods", "high", unschedulable)
    # the node is still offered (it fits in-tree with no victim) but with nothing to evict
    assert all(a["NodeNameToMetaVictims"]["n1"]["Pods"] == [] for a in ext.preempt_calls)
    del low


CPU_FULL = {"cpu": "1"}


async def _cpu_full(env: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """n1 has one CPU, taken by ``low`` (a GPU pod of priority 10); ``high`` needs that CPU too."""
    await env.add_node("n1", allocatable=CPU_FULL)
    low = env.make_pod("low", limits=GPU, requests=CPU_FULL, node_name="n1")
    low["spec"]["priority"] = 10
    low = await env.api.create("pods", low, namespace="default")
    high = env.make_pod("high", limits=GPU, requests=CPU_FULL)
    high["spec"]["priority"] = 1000
    return low, high


async def test_v1_36_never_offers_a_gpu_only_shortfall_to_the_extender(env, ext, start_scheduler):
    _, high = await _setup(env)  # n1 has CPU to spare: only the GPU is short
    ext.filter_reply = fail_all
    start_scheduler(config(ext.url, preemptVerb="preempt"), version="1.36")
    await env.api.create("pods", high, namespace="default")

    event = await env.wait_event("high", reason="FailedScheduling")
    assert 'preemption: expected at least one victim pod on node "n1"' in event["message"]
    assert ext.preempt_calls == []
    assert not (await env.get_pod("low"))["metadata"].get("deletionTimestamp")
    assert not _nominated(await env.get_pod("high"))


async def test_v1_36_offers_nodes_with_in_tree_victims_and_takes_the_extenders_answer(
    env, ext, start_scheduler
):
    low, high = await _cpu_full(env)
    ext.filter_reply = fail_all
    ext.preempt_reply = lambda args: {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": low["metadata"]["uid"]}], "NumPDBViolations": 0}}
    }
    start_scheduler(config(ext.url, preemptVerb="preempt"), version="1.36")
    await env.api.create("pods", high, namespace="default")

    await env.wait_for("pods", "high", _nominated)
    (args,) = ext.preempt_calls[:1]
    assert args["NodeNameToMetaVictims"] == {
        "n1": {"Pods": [{"UID": low["metadata"]["uid"]}], "NumPDBViolations": 0}
    }
    assert (await env.get_pod("low"))["metadata"]["deletionTimestamp"]


@pytest.mark.parametrize("version", ["1.20", "v1.21.3"])
async def test_before_v1_22_the_extender_is_never_called(env, ext, start_scheduler, version):
    _, high = await _cpu_full(env)
    ext.filter_reply = fail_all
    start_scheduler(config(ext.url, preemptVerb="preempt"), version=version)
    await env.api.create("pods", high, namespace="default")

    await env.wait_for("pods", "high", _nominated)  # its own in-tree victim: low's CPU
    assert (await env.get_pod("low"))["metadata"]["deletionTimestamp"]
    assert ext.preempt_calls == []


@pytest.mark.parametrize("version", ["2.0", "1.x", "", "1", "latest"])
def test_an_unknown_version_is_refused(version):
    with pytest.raises(errors.ConfigError, match=r"expected 1\.N or pr135486"):
        preemption.Behaviour.of(version)
