"""The scheduler's informer transforms keep what it reads and drop the bulk."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core.dra import allocation
from vgpu.kube import slim

FULL_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "train",
        "namespace": "ml",
        "uid": "u-1",
        "resourceVersion": "42",
        "labels": {"app": "train"},
        "annotations": {
            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1000,10:;",
            "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 5000 + "}",
        },
        "creationTimestamp": "2026-11-23T01:00:00Z",
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}] * 20,
        "ownerReferences": [{"kind": "Job", "name": "train"}],
    },
    "spec": {
        "nodeName": "gpu-1",
        "schedulerName": "vgpu-scheduler",
        "initContainers": [{"name": "init", "image": "busybox", "command": ["sh"], "resources": {}}],
        "containers": [
            {
                "name": "main",
                "image": "cuda",
                "env": [{"name": f"E{i}", "value": "v"} for i in range(50)],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
    },
    "status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "initContainerStatuses": [
            {
                "name": "init",
                "image": "busybox",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            }
        ],
        "containerStatuses": [{"name": "main", "ready": True}],
    },
}


def test_pod_keeps_what_the_scheduler_reads() -> None:
    out = slim.pod_for_scheduling(FULL_POD)
    assert out == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "u-1",
            "resourceVersion": "42",
            "labels": {"app": "train"},
            "annotations": {"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1000,10:;"},
            "creationTimestamp": "2026-11-23T01:00:00Z",
        },
        "spec": {
            "nodeName": "gpu-1",
            "schedulerName": "vgpu-scheduler",
            "initContainers": [{"name": "init", "resources": {}}],
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {
            "phase": "Running",
            "initContainerStatuses": [
                {"name": "init", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
            ],
        },
    }
    assert len(json.dumps(out)) * 10 < len(json.dumps(FULL_POD))


def test_an_unbound_pod_keeps_only_its_podscheduled_false_condition_without_the_message() -> None:
    conditions = [
        {"type": "Ready", "status": "False"},
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1000 " * 500},
    ]
    pending = {
        "metadata": {"name": "p"},
        "spec": {"schedulerName": "s"},
        "status": {"conditions": conditions},
    }
    assert slim.pod_for_scheduling(pending)["status"] == {
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    }
    bound = {**pending, "spec": {"nodeName": "gpu-1"}}
    assert slim.pod_for_scheduling(bound)["status"] == {}  # placed: the stale condition is dropped
    scheduled = {**pending, "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert slim.pod_for_scheduling(scheduled)["status"] == {}
    for garbage in ("x", [None, 3, {"type": "PodScheduled"}], {"type": "PodScheduled", "status": "False"}):
        assert slim.pod_for_scheduling({**pending, "status": {"conditions": garbage}})["status"] == {}


def test_an_unbound_dra_pod_keeps_kube_schedulers_message_and_its_claim_statuses() -> None:
    message = (
        "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, "
        "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    )
    claims = [{"name": "vgpu-0", "resourceClaimName": "p-vgpu-0-x7k2q"}]
    pending = {
        "metadata": {"name": "p"},
        "spec": {"resourceClaims": [{"name": "vgpu-0", "resourceClaimTemplateName": "vgpu-abc"}]},
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ],
            "resourceClaimStatuses": claims,
        },
    }
    assert slim.pod_for_scheduling(pending)["status"] == {
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        ],
        "resourceClaimStatuses": claims,
    }
    long = {
        **pending,
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "message": "x" * 10_000}]},
    }
    kept = slim.pod_for_scheduling(long)["status"]["conditions"][0]["message"]
    assert kept == "x" * slim.MAX_MESSAGE_CHARS  # bounded
    bound = {**pending, "spec": {**pending["spec"], "nodeName": "n1"}}
    assert slim.pod_for_scheduling(bound)["status"] == {}  # placed: neither is read any more
    for garbage in (None, 3, ["x"]):
        odd = {
            **pending,
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "message": garbage}]},
        }
        assert slim.pod_for_scheduling(odd)["status"] == {
            "conditions": [{"type": "PodScheduled", "status": "False"}]
        }


def test_node_keeps_annotations_and_resources_not_images() -> None:
    node = {
        "metadata": {
            "name": "gpu-1",
            "annotations": {"hami.io/node-nvidia-register": "[]"},
            "managedFields": [{}],
        },
        "spec": {"unschedulable": True, "podCIDR": "10.0.0.0/24"},
        "status": {
            "allocatable": {"nvidia.com/gpu": "40"},
            "capacity": {"nvidia.com/gpu": "40"},
            "images": [{"names": [f"img{i}"], "sizeBytes": 1} for i in range(100)],
        },
    }
    assert slim.node_for_scheduling(node) == {
        "metadata": {"name": "gpu-1", "annotations": {"hami.io/node-nvidia-register": "[]"}},
        "spec": {"unschedulable": True},
        "status": {"allocatable": {"nvidia.com/gpu": "40"}, "capacity": {"nvidia.com/gpu": "40"}},
    }


def test_an_init_containers_restart_policy_is_kept_it_makes_a_sidecar() -> None:
    """A restartable init container runs beside the app containers: the scheduler's charge reads
    ``restartPolicy`` from the cached pod. An app container's (it has none in the API) is not kept."""
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [
                {"name": "setup", "image": "x", "resources": {}},
                {"name": "proxy", "image": "x", "restartPolicy": "Always", "resources": {}},
            ],
            "containers": [{"name": "main", "image": "x", "restartPolicy": "Always"}],
        },
    }
    spec = slim.pod_for_scheduling(pod)["spec"]
    assert spec["initContainers"] == [
        {"name": "setup", "resources": {}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {}},
    ]
    assert spec["containers"] == [{"name": "main"}]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=20,
)


@given(st.dictionaries(st.sampled_from(["metadata", "spec", "status", "kind"]), _json))
def test_garbage_objects_never_raise(obj: dict[str, Any]) -> None:
    slim.pod_for_scheduling(obj)
    slim.node_for_scheduling(obj)


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        ("nope", "nope"),
        ([1, None], [1, None]),
        ([{"name": "c", "resources": 5, "image": "x"}], [{"name": "c", "resources": 5}]),
    ],
)
def test_odd_container_lists_pass_through_for_the_readers_to_report(containers: Any, expected: Any) -> None:
    out = slim.pod_for_scheduling({"metadata": {"name": "p"}, "spec": {"containers": containers}})
    assert out["spec"]["containers"] == expected


def test_claims_keep_what_the_dra_views_read() -> None:
    full = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "c",
            "namespace": "team",
            "uid": "u",
            "resourceVersion": "7",
            "ownerReferences": [{"kind": "Pod", "name": "p"}],
            "managedFields": [{"manager": "kube-scheduler"}],
            "annotations": {slim.LAST_APPLIED: "{}"},
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.kube-vgpu.io",
                            "selectors": [{"cel": {}}],
                            "capacity": {"requests": {"cores": "30"}},
                        },
                    },
                    {
                        "name": "alt",
                        "firstAvailable": [
                            {
                                "name": "a",
                                "selectors": [{"cel": {}}],
                                "capacity": {"requests": {"cores": "5"}},
                            },
                            {"name": "b", "deviceClassName": "x"},
                            "garbage",
                        ],
                    },
                    "garbage",
                ],
                "constraints": [{"matchAttribute": "x"}],
            }
        },
        "status": {
            "allocation": {
                "devices": {"results": [{"device": "gpu-0"}], "config": [{"opaque": {}}]},
                "nodeSelector": {"nodeSelectorTerms": []},
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
            "devices": [{"driver": "d", "conditions": []}],
        },
    }
    assert slim.claim_for_views(full) == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "c",
            "namespace": "team",
            "uid": "u",
            "resourceVersion": "7",
            "ownerReferences": [{"kind": "Pod", "name": "p"}],
        },
        # what vgpu.core.dra.asked and .waiting read: each request's class, count and capacity asks
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.kube-vgpu.io",
                            "capacity": {"requests": {"cores": "30"}},
                        },
                    },
                    {
                        "name": "alt",
                        "firstAvailable": [
                            {"name": "a", "capacity": {"requests": {"cores": "5"}}},
                            {"name": "b", "deviceClassName": "x"},
                            "garbage",
                        ],
                    },
                    "garbage",
                ]
            }
        },
        "status": {
            "allocation": {"devices": {"results": [{"device": "gpu-0"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
        },
    }


@pytest.mark.parametrize(
    "status",
    ["x", {"allocation": "x"}, {"allocation": {"devices": 3}}],
    ids=["status", "allocation", "devices"],
)
def test_claim_garbage_stays_garbage_for_the_reader(status: object) -> None:
    slimmed = slim.claim_for_views({"metadata": "x", "status": status})
    assert slimmed["metadata"] == {}
    with pytest.raises(allocation.AllocationError):
        allocation.shares(slimmed)
