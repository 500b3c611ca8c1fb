"""The local cluster's DRA against the real Kubernetes 1.36 (marked ``realk8s``): the same
DeviceClass, ResourceSlices, claim templates and pods go to the real kube-apiserver,
kube-controller-manager's resourceclaim controller and kube-scheduler (fake nodes, no kubelet) and
to the emulation (``LocalCluster``); both must agree on

* which pods schedule, one at a time, and which one an overcommit refuses ("cannot allocate all
  claims"), including after a pod's deletion frees its share;
* each claim's allocation: device, request (subrequest of a ``firstAvailable``), consumed capacity
  after the request policy's rounding and defaults, a tainted GPU left alone;
* what the API server stores for a slice (canonical quantities, defaults) and which fields it
  refuses in invalid objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.core.dra import names
from vgpu.kube import aioapi
from vgpu.kube.port import JsonObj, KubeApi
from vgpu.localcluster import cluster, description
from vgpu.localcluster.cluster import LocalCluster

from bench.throughput_procs import register_node
from tests.localcluster import draobjects as dra
from tests.realk8s import drastack

pytestmark = [pytest.mark.realk8s, pytest.mark.dra, pytest.mark.slow, pytest.mark.timeout(300)]

NODE = "dra-a"
SETTLE_S = 30.0
TAINT = {"key": names.UNHEALTHY_TAINT_KEY, "value": "true", "effect": "NoSchedule"}


@contextlib.asynccontextmanager
async def _real(workdir: pathlib.Path) -> AsyncIterator[aioapi.AioKubeApi]:
    """The real DRA control plane (``drastack``) with the node ``NODE`` registered."""
    async with drastack.dra_control_plane(workdir, user_agent="dra-diff/1") as api:
        await register_node(
            api,
            cluster.node_object(
                description.NodeSpec(name=NODE, allocatable={"cpu": "64", "memory": "256Gi", "pods": "110"})
            ),
        )
        yield api


@contextlib.asynccontextmanager
async def _emulated() -> AsyncIterator[KubeApi]:
    async with LocalCluster(
        {"nodes": [{"name": NODE}]}, scheduler_name="default-scheduler", scheduler_initial_backoff_s=0.1
    ) as local:
        yield local.api


def _outcome(pod: JsonObj) -> str | None:
    if pod["spec"].get("nodeName"):
        return "scheduled"
    for c in (pod.get("status") or {}).get("conditions") or ():
        if (
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ) and "cannot allocate all claims" in (c.get("message") or ""):
            return "refused: cannot allocate all claims"
    return None


async def _settle(api: KubeApi, name: str) -> str:
    async def probe() -> str | None:
        return _outcome(await api.get("pods", name, namespace="default"))

    return str(await drastack.until(f"pod {name} neither scheduled nor refused", probe))


async def _allocation(api: KubeApi, pod_name: str) -> list[tuple[str, str, str, dict[str, str]]]:
    """(request, pool, device, consumedCapacity) of each result of the pod's claim."""

    async def claim() -> JsonObj | None:
        pod = await api.get("pods", pod_name, namespace="default")
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if not statuses:
            return None
        got = await api.get("resourceclaims", statuses[0]["resourceClaimName"], namespace="default")
        return got if (got.get("status") or {}).get("allocation") else None

    found = await drastack.until(f"claim of {pod_name} allocated", claim)
    return [
        (r["request"], r["pool"], r["device"], dict(r.get("consumedCapacity") or {}))
        for r in found["status"]["allocation"]["devices"]["results"]
    ]


def _first_available() -> JsonObj:
    attr = f'device.attributes["{names.DRIVER}"].{names.ATTR_MEMORY_MIB}'
    return {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": f"m{size}",
                "deviceClassName": names.DEVICE_CLASS,
                "selectors": [{"cel": {"expression": f"{attr} == {size}"}}],
                "capacity": {"requests": {"memory": f"{size // 4}Mi"}},
            }
            for size in (32768, 16384)
        ],
    }


TEMPLATES = {
    "round": dra.gpu_request(memory_mib=None),  # memory set below in raw form
    "half": dra.gpu_request(memory_mib=8192, cores=30),
    "cores": dra.gpu_request(cores=80),  # no memory: the whole GPU's memory by default
    "quarter": _first_available(),
}
TEMPLATES["round"]["exactly"]["capacity"] = {"requests": {"memory": "1536Ki", "cores": "5"}}
# (pod, template): created one at a time, each settled before the next
SEQUENCE = [
    ("r1", "round"),
    ("a1", "half"),
    ("a2", "half"),
    ("a3", "half"),
    ("a4", "half"),  # gpu-0 keeps 8190 MiB, gpu-1 none: refused (gpu-2 is tainted)
    ("c1", "cores"),  # no GPU has all its memory free
    ("q1", "quarter"),  # 32768 MiB GPUs: none; 16384: 4096 MiB on gpu-0
]


async def _scenario(api: KubeApi) -> dict[str, Any]:
    await api.create("deviceclasses", dra.device_class())
    await api.create(
        "resourceslices",
        dra.resource_slice(NODE, [dra.gpu(0), dra.gpu(1), dra.gpu(2, taints=[TAINT])]),
    )
    for name, request in TEMPLATES.items():
        await api.create("resourceclaimtemplates", dra.template(name, request), namespace="default")
    outcomes: dict[str, Any] = {}
    for pod, template in SEQUENCE:
        await api.create("pods", dra.dra_pod(pod, template), namespace="default")
        outcomes[pod] = await _settle(api, pod)
    allocations = {pod: await _allocation(api, pod) for pod, out in outcomes.items() if out == "scheduled"}
    # a1's deletion frees 8192 MiB and 30 cores of its GPU: a4 fits there now
    await api.delete("pods", "a1", namespace="default", grace_period_s=0)

    async def a4_bound() -> bool:
        return bool((await api.get("pods", "a4", namespace="default"))["spec"].get("nodeName"))

    await drastack.until("a4 scheduled after a1 was deleted", a4_bound)
    allocations["a4 after a1 deleted"] = await _allocation(api, "a4")
    stored = await api.get("resourceslices", f"{NODE}-{names.DRIVER}")
    for device in stored["spec"]["devices"]:
        for taint in device.get("taints") or ():
            assert taint.pop("timeAdded")  # defaulted by both, at their own time
    return {"outcomes": outcomes, "allocations": allocations, "stored slice": stored["spec"]}


async def test_scheduling_and_allocation_match_the_real_1_36(tmp_path: pathlib.Path) -> None:
    async with _real(tmp_path) as api:
        real = await _scenario(api)
    async with _emulated() as api:
        emulated = await _scenario(api)
    print("real:", real)
    assert emulated == real
    # and what they agreed on is what kube-vgpu needs
    assert real["outcomes"]["a4"] == "refused: cannot allocate all claims"
    assert real["allocations"]["r1"] == [("gpu", NODE, "gpu-0", {"memory": "2Mi", "cores": "5"})]
    assert real["allocations"]["q1"] == [("gpu/m16384", NODE, "gpu-0", {"memory": "4Gi", "cores": "0"})]


async def _burst(api: KubeApi) -> dict[str, Any]:
    """Ten 8 GiB pods at once on two 16 GiB GPUs: how many bind, what each GPU holds."""
    await api.create("deviceclasses", dra.device_class())
    await api.create("resourceslices", dra.resource_slice(NODE, [dra.gpu(0), dra.gpu(1)]))
    await api.create("resourceclaimtemplates", dra.template("half", TEMPLATES["half"]), namespace="default")
    pods = [f"b{i}" for i in range(10)]
    await asyncio.gather(*(api.create("pods", dra.dra_pod(p, "half"), namespace="default") for p in pods))
    outcomes = [await _settle(api, p) for p in pods]
    held: dict[str, int] = {}
    for pod, outcome in zip(pods, outcomes, strict=True):
        if outcome == "scheduled":
            for _, _, device, consumed in await _allocation(api, pod):
                held[device] = held.get(device, 0) + int(consumed["memory"].removesuffix("Gi"))
    return {
        "scheduled": outcomes.count("scheduled"),
        "refused": outcomes.count("refused: cannot allocate all claims"),
        "GiB per GPU": held,
    }


async def test_a_burst_never_overcommits_on_either(tmp_path: pathlib.Path) -> None:
    async with _real(tmp_path) as api:
        real = await _burst(api)
    async with _emulated() as api:
        emulated = await _burst(api)
    assert emulated == real == {"scheduled": 4, "refused": 6, "GiB per GPU": {"gpu-0": 16, "gpu-1": 16}}


ATTRS = f'device.attributes["{names.DRIVER}"]'
# (pod, request): the selector and constraint forms the DRA webhook writes (use-gputype,
# nouse-gputype, use-gpuuuid, nouse-gpuuuid, numa-bind), each on a fresh node
SELECTOR_PODS: list[tuple[str, JsonObj, list[JsonObj]]] = [
    (
        "use-t4",
        dra.gpu_request(memory_mib=100),
        [{"cel": {"expression": f'{ATTRS}.model.lowerAscii().contains("t4")'}}],
    ),
    (
        "use-a10-or-t4",
        dra.gpu_request(memory_mib=100),
        [
            {
                "cel": {
                    "expression": f'{ATTRS}.model.lowerAscii().contains("a10") || {ATTRS}.model.lowerAscii().contains("t4")'
                }
            }
        ],
    ),
    (
        "nouse-a100",
        dra.gpu_request(memory_mib=100),
        [{"cel": {"expression": f'!{ATTRS}.model.lowerAscii().contains("a100")'}}],
    ),
    (
        "uuid-in",
        dra.gpu_request(memory_mib=100),
        [{"cel": {"expression": f'{ATTRS}.uuid in ["GPU-00000003", "GPU-00000002"]'}}],
    ),
    (
        "uuid-not-in",
        dra.gpu_request(memory_mib=100),
        [{"cel": {"expression": f'!({ATTRS}.uuid in ["GPU-00000000"])'}}],
    ),
    ("numa-pair", dra.gpu_request(count=2, memory_mib=100), []),
    ("numa-three", dra.gpu_request(count=3, memory_mib=100), []),
]


async def _selectors(api: KubeApi) -> dict[str, Any]:
    """Each pod alone on a node of A100 (NUMA 0), T4 (NUMA 1), A10 (NUMA 1), A100 (NUMA 0)."""
    await api.create("deviceclasses", dra.device_class())
    gpus = [
        dra.gpu(i, model=m) for i, m in enumerate(("NVIDIA A100", "Tesla T4", "NVIDIA A10", "NVIDIA A100"))
    ]
    for gpu, numa in zip(gpus, (0, 1, 1, 0), strict=True):
        gpu["attributes"][names.ATTR_NUMA] = {"int": numa}
    await api.create("resourceslices", dra.resource_slice(NODE, gpus))
    out: dict[str, Any] = {}
    for name, request, selectors in SELECTOR_PODS:
        body = dict(
            request,
            exactly={**request["exactly"], "selectors": selectors} if selectors else request["exactly"],
        )
        template = dra.template(name, body)
        if name.startswith("numa"):
            template["spec"]["spec"]["devices"]["constraints"] = [
                {"requests": ["gpu"], "matchAttribute": f"{names.DRIVER}/{names.ATTR_NUMA}"}
            ]
        await api.create("resourceclaimtemplates", template, namespace="default")
        await api.create("pods", dra.dra_pod(name, name), namespace="default")
        outcome = await _settle(api, name)
        out[name] = [r[2] for r in await _allocation(api, name)] if outcome == "scheduled" else outcome
        await api.delete("pods", name, namespace="default", grace_period_s=0)  # the next pod sees free GPUs

        async def released(pod: str = name) -> bool:
            claims = (await api.list("resourceclaims", namespace="default")).items
            return not any(
                (c.get("status") or {}).get("allocation")
                for c in claims
                if c["metadata"]["name"].startswith(pod)
            )

        await drastack.until(f"{name}'s claim released", released)
    return out


async def test_the_webhooks_selectors_and_numa_constraint_choose_as_the_real_1_36(
    tmp_path: pathlib.Path,
) -> None:
    async with _real(tmp_path) as api:
        real = await _selectors(api)
    async with _emulated() as api:
        emulated = await _selectors(api)
    assert emulated == real
    assert real == {
        "use-t4": ["gpu-1"],
        "use-a10-or-t4": ["gpu-0"],  # a substring: "nvidia a100" contains "a10", as HAMi matches types
        "nouse-a100": ["gpu-1"],
        "uuid-in": ["gpu-2"],
        "uuid-not-in": ["gpu-1"],
        "numa-pair": ["gpu-0", "gpu-3"],
        "numa-three": "refused: cannot allocate all claims",
    }


def _slice_with(mutate: Callable[[JsonObj], None]) -> JsonObj:
    body = dra.resource_slice("bad", [dra.gpu(0)])
    body["metadata"]["name"] = "bad-slice"
    mutate(body["spec"])
    return body


def _claim_with(mutate: Callable[[JsonObj], None]) -> JsonObj:
    body = dra.claim("bad-claim", dra.gpu_request(memory_mib=10))
    mutate(body["spec"]["devices"]["requests"][0])
    return body


def _bad_pod() -> JsonObj:
    pod = dra.dra_pod("bad-pod", "t")
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "vgpu-9"}]
    return pod


INVALID: list[tuple[str, str, Callable[[], JsonObj]]] = [
    ("device-name", "resourceslices", lambda: _slice_with(lambda s: s["devices"][0].update(name="GPU_0"))),
    (
        "policy-needs-multi",
        "resourceslices",
        lambda: _slice_with(lambda s: s["devices"][0].pop("allowMultipleAllocations")),
    ),
    (
        "default-off-step",
        "resourceslices",
        lambda: _slice_with(
            lambda s: s["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"].update(step="5Mi")
        ),
    ),
    (
        "max-over-value",
        "resourceslices",
        lambda: _slice_with(
            lambda s: s["devices"][0]["capacity"]["cores"]["requestPolicy"]["validRange"].update(max="200")
        ),
    ),
    ("no-node", "resourceslices", lambda: _slice_with(lambda s: s.pop("nodeName"))),
    ("pool-count", "resourceslices", lambda: _slice_with(lambda s: s["pool"].update(resourceSliceCount=0))),
    (
        "taint-effect",
        "resourceslices",
        lambda: _slice_with(lambda s: s["devices"][0].update(taints=[{"key": "k", "effect": "Sometimes"}])),
    ),
    ("count-zero", "resourceclaims", lambda: _claim_with(lambda r: r["exactly"].update(count=-1))),
    ("no-class", "resourceclaims", lambda: _claim_with(lambda r: r["exactly"].pop("deviceClassName"))),
    ("request-name", "resourceclaims", lambda: _claim_with(lambda r: r.update(name="Gpu"))),
    ("neither", "resourceclaims", lambda: _claim_with(lambda r: r.pop("exactly"))),
    ("pod-claim-ref", "pods", _bad_pod),
]


_FIELD = re.compile(r"((?:spec|metadata|status)(?:\.[A-Za-z]+|\[[^\]]*\])+)")


async def _refusal(api: KubeApi, kind: str, body: JsonObj) -> tuple[int, list[str]]:
    namespace = "default" if kind != "resourceslices" else None
    try:
        await api.create(kind, body, namespace=namespace)  # type: ignore[arg-type]
    except errors.KubeError as err:
        return err.status, sorted(set(_FIELD.findall(str(err))))
    return 201, []


async def test_validation_refuses_the_same_fields_as_the_real_1_36(tmp_path: pathlib.Path) -> None:
    results: dict[str, dict[str, tuple[int, list[str]]]] = {}
    async with _real(tmp_path) as api:
        results["real"] = {case: await _refusal(api, kind, make()) for case, kind, make in INVALID}
    async with _emulated() as api:
        results["emulated"] = {case: await _refusal(api, kind, make()) for case, kind, make in INVALID}
    print("refusals:", results["real"])
    assert results["emulated"] == results["real"]
    assert all(status == 422 for status, _ in results["real"].values())
