"""``vgpu simulate --dra`` against the real Kubernetes 1.36 (marked ``realk8s``): a real
kube-apiserver, kube-controller-manager's resourceclaim controller and kube-scheduler (fake nodes, no
kubelet) place HAMi pods the webhook's own code converted, one at a time; the simulation, given what
that API server listed before (its ResourceSlices, DeviceClass and the claim a first pod holds) and the
same pods, must predict the same node, device, (sub)request and consumed capacity for each pod, and
the same refusals. Two nodes of equal size, so the node choice is kube-scheduler's scoring: the DRA
prioritized-list score (a percentage prefers the smaller GPU), then the fewest pods."""

from __future__ import annotations

import contextlib
import pathlib
from typing import Any

import pytest
from vgpu.core.config import Policy
from vgpu.core.dra import deviceclass
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster import cluster, description
from vgpu.simulate import engine, model
from vgpu.simulate.dra import DraObjects

from bench.throughput_procs import register_node
from tests.cli.simdra import DRA_CFG, admitted, gpu_pod, node_slice
from tests.realk8s import drastack

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]

SETTLE_S = 30.0
SIZES = (16384, 32768)
# small nodes: kube-scheduler's LeastAllocated, with its 100m / 200Mi defaults for a pod that asks
# nothing, then tells the node with fewer pods from the other (on big nodes it rounds them equal)
ALLOCATABLE = {"cpu": "1", "memory": "2Gi", "pods": "110"}
FIRST = gpu_pod("old", memory=6144, cores=30, namespace="default")  # on dra-a, before dra-b exists
WORKLOAD = [
    gpu_pod("pct", percent=25, namespace="default"),  # firstAvailable: the 16384 MiB GPUs score higher
    gpu_pod("m1", memory=8192, cores=30, namespace="default"),  # equal DRA score: the node with fewer pods
    gpu_pod("m2", memory=8192, cores=30, namespace="default"),
    gpu_pod("m3", memory=8192, cores=50, namespace="default"),  # only dra-a's second GPU has 50 % left
    gpu_pod("big", memory=20000, namespace="default"),  # no GPU has it free
    gpu_pod("whole", cores=100, namespace="default"),  # a whole idle GPU: none is left
]


async def _node(api: KubeApi, name: str) -> None:
    await register_node(api, cluster.node_object(description.NodeSpec(name=name, allocatable=ALLOCATABLE)))


async def _outcome(api: KubeApi, pod_name: str) -> Any:
    """(node, [(request, pool, device, consumedCapacity)]) once bound, or the refusal."""

    async def probe() -> Any:
        pod = await api.get("pods", pod_name, namespace="default")
        if pod["spec"].get("nodeName"):
            [status] = pod["status"]["resourceClaimStatuses"]
            claim = await api.get("resourceclaims", status["resourceClaimName"], namespace="default")
            return (pod["spec"]["nodeName"], _results(claim))
        for c in (pod.get("status") or {}).get("conditions") or ():
            if c.get("type") == "PodScheduled" and "cannot allocate all claims" in (c.get("message") or ""):
                return "refused: cannot allocate all claims"
        return None

    return await drastack.until(f"pod {pod_name} neither bound nor refused", probe)


def _results(claim: JsonObj) -> list[tuple[str, str, str, dict[str, str]]]:
    return [
        (r["request"], r["pool"], r["device"], dict(r.get("consumedCapacity") or {}))
        for r in claim["status"]["allocation"]["devices"]["results"]
    ]


async def _submit(api: KubeApi, pod: JsonObj) -> None:
    for container in pod["spec"]["containers"]:
        container["image"] = "busybox"
    patched, templates = admitted(pod, sizes=SIZES)
    for template in templates:
        with contextlib.suppress(Exception):  # the same size asked again: made already
            await api.create("resourceclaimtemplates", template, namespace="default")
    await api.create("pods", patched, namespace="default")


async def _real_run(workdir: pathlib.Path) -> tuple[list[JsonObj], dict[str, Any]]:
    """The objects listed after the first pod held its share, and each workload pod's outcome."""
    async with drastack.dra_control_plane(workdir, user_agent="simulate-dra/1") as api:
        await api.create("deviceclasses", deviceclass.device_class())
        await api.create("resourceslices", node_slice("dra-a", 16384, 16384))
        await api.create("resourceslices", node_slice("dra-b", 32768))
        await _node(api, "dra-a")
        await _submit(api, FIRST)
        assert (await _outcome(api, "old"))[0] == "dra-a"
        listed = [
            {"kind": kind, **obj}
            for plural, kind in (("resourceslices", "ResourceSlice"), ("resourceclaims", "ResourceClaim"))
            for obj in (await api.list(plural)).items
        ]
        await _node(api, "dra-b")
        outcomes = {}
        for pod in WORKLOAD:
            await _submit(api, dict(pod, spec={"containers": [dict(c) for c in pod["spec"]["containers"]]}))
            outcomes[pod["metadata"]["name"]] = await _outcome(api, pod["metadata"]["name"])
        return listed, outcomes


def _simulated(listed: list[JsonObj]) -> dict[str, Any]:
    nodes = {"nodes": [{"name": "extender-only", "gpus": [{"model": "T4", "memoryMib": 1}]}]}
    objects = DraObjects(
        slices=tuple(o for o in listed if o["kind"] == "ResourceSlice"),
        claims=tuple(o for o in listed if o["kind"] == "ResourceClaim"),
    )
    run = engine.simulate(
        model.load_cluster(nodes, config=DRA_CFG),
        model.load_workload(WORKLOAD, config=DRA_CFG),
        config=DRA_CFG,
        node_policy=Policy.BINPACK,
        gpu_policy=Policy.SPREAD,
        dra=objects,
    )
    assert run.dra is not None
    claims = {c["metadata"]["name"]: c for c in run.dra.claims}
    out: dict[str, Any] = {
        p.pod.key.split("/")[1]: (p.node, _results(claims[p.claims[0]])) for p in run.placed
    }
    for pending in run.pending:
        reasons = [m.reason for n, m in pending.reasons.items() if n.startswith("dra-")]
        assert len(reasons) == 2 and all(
            r.startswith("cannot allocate all claims (best GPU free: ") for r in reasons
        )
        out[pending.pod.key.split("/")[1]] = "refused: cannot allocate all claims"
    return out


async def test_the_simulation_places_dra_pods_as_the_real_kube_scheduler(tmp_path: pathlib.Path) -> None:
    listed, real = await _real_run(tmp_path)
    print("real:", real)
    assert _simulated(listed) == real
    # and the scenario tells the scoring apart: the percentage on the smaller GPUs' node, the equal
    # asks on the node with fewer pods, the rest refused
    assert [real[p][0] for p in ("pct", "m1", "m2", "m3")] == ["dra-a", "dra-b", "dra-b", "dra-a"]
    assert real["pct"][1][0][0] == f"gpu/mem-{SIZES[0]}"
    assert real["big"] == real["whole"] == "refused: cannot allocate all claims"
