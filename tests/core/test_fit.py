"""Fit rules and both policies, table-driven: for each scenario the expected node and GPUs, or reason."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu.core import fit, policy, request
from vgpu.core.config import Config, Policy
from vgpu.core.device import Gpu, GpuUsage, GpuUuid

CONFIG = Config()


def gpu(
    uuid: str,
    index: int = 0,
    *,
    memory: int = 16000,
    cores: int = 100,
    count: int = 10,
    type: str = "NVIDIA-Tesla-T4",
    numa: int = 0,
    health: bool = True,
) -> Gpu:
    return Gpu(GpuUuid(uuid), index, count, memory, cores, type, numa=numa, health=health)


def container(name: str = "c", **res: Any) -> dict[str, Any]:
    names = {
        "gpu": "nvidia.com/gpu",
        "mem": "nvidia.com/gpumem",
        "pct": "nvidia.com/gpumem-percentage",
        "cores": "nvidia.com/gpucores",
    }
    return {"name": name, "resources": {"limits": {names[k]: str(v) for k, v in res.items()}}}


def pod(
    *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), **annotations: str
) -> request.PodRequest:
    body = {
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": list(containers), "initContainers": list(init)},
    }
    return request.parse_pod(body, CONFIG)


def node(
    gpus: list[Gpu],
    used: dict[str, tuple[int, int, int]] | None = None,
    cordoned: str = "",
    outside: dict[str, int] | None = None,
) -> fit.NodeGpus:
    usage = {GpuUuid(k): GpuUsage(*v) for k, v in (used or {}).items()}
    cordon = frozenset(GpuUuid(u) for u in cordoned.split(",") if u)
    away = {GpuUuid(k): v for k, v in (outside or {}).items()}
    return fit.NodeGpus.build(tuple(gpus), usage, cordon, outside=away)


def choose(
    req: request.PodRequest,
    nodes: dict[str, fit.NodeGpus],
    *,
    node_policy: Policy = Policy.BINPACK,
    gpu_policy: Policy = Policy.SPREAD,
) -> tuple[str, list[list[str]]] | dict[str, fit.Miss]:
    placed: dict[str, fit.Placement] = {}
    misses: dict[str, fit.Miss] = {}
    for name, n in nodes.items():
        got = fit.fit_pod(req, n, gpu_policy=req.gpu_policy or gpu_policy)
        if isinstance(got, fit.Miss):
            misses[name] = got
        else:
            placed[name] = got
    best = policy.pick_node(((name, nodes[name].score) for name in placed), req.node_policy or node_policy)
    if best is None:
        return misses
    return best, [[d.uuid for d in c] for c in placed[best].devices]


TWO_NODES = {
    "busy": node([gpu("b0"), gpu("b1", 1)], {"b0": (2, 8000, 40)}),
    "idle": node([gpu("i0"), gpu("i1", 1)]),
}
ONE_NODE_UNEVEN = {
    "n": node([gpu("g0"), gpu("g1", 1), gpu("g2", 2)], {"g0": (1, 10000, 0), "g1": (1, 4000, 0)})
}

NUMA_GPUS = [gpu("g0", 0, numa=0), gpu("g1", 1, numa=0), gpu("g2", 2, numa=1), gpu("g3", 3, numa=1)]

PLACED = [
    # (id, pod, nodes, node policy, gpu policy, expected node, expected GPUs per container)
    (
        "binpack-node-picks-busy",
        pod(container(gpu=1, mem=1000)),
        TWO_NODES,
        Policy.BINPACK,
        Policy.SPREAD,
        "busy",
        [["b1"]],
    ),
    (
        "spread-node-picks-idle",
        pod(container(gpu=1, mem=1000)),
        TWO_NODES,
        Policy.SPREAD,
        Policy.SPREAD,
        "idle",
        [["i0"]],
    ),
    (
        "binpack-gpu-fullest-after",
        pod(container(gpu=1, mem=1000)),
        ONE_NODE_UNEVEN,
        Policy.BINPACK,
        Policy.BINPACK,
        "n",
        [["g0"]],
    ),
    (
        "spread-gpu-emptiest-after",
        pod(container(gpu=1, mem=1000)),
        ONE_NODE_UNEVEN,
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g2"]],
    ),
    (
        "binpack-skips-gpu-too-full",
        pod(container(gpu=1, mem=7000)),
        ONE_NODE_UNEVEN,
        Policy.BINPACK,
        Policy.BINPACK,
        "n",
        [["g1"]],
    ),
    (
        "pod-annotation-overrides-policies",
        pod(
            container(gpu=1, mem=1000),
            **{"hami.io/node-scheduler-policy": "spread", "hami.io/gpu-scheduler-policy": "binpack"},
        ),
        TWO_NODES,
        Policy.BINPACK,
        Policy.SPREAD,
        "idle",
        [["i0"]],
    ),
    (
        "two-gpus-distinct",
        pod(container(gpu=2, mem=1000)),
        ONE_NODE_UNEVEN,
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g2", "g1"]],
    ),
    (
        "percent-memory",
        pod(container(gpu=1, pct=50)),
        ONE_NODE_UNEVEN,
        Policy.BINPACK,
        Policy.BINPACK,
        "n",
        [["g1"]],
    ),
    (
        "exclusive-takes-idle-gpu",
        pod(container(gpu=1, cores=100)),
        ONE_NODE_UNEVEN,
        Policy.BINPACK,
        Policy.BINPACK,
        "n",
        [["g2"]],
    ),
    (
        "use-gputype",
        pod(container(gpu=1), **{"nvidia.com/use-gputype": "a100"}),
        {"t4": node([gpu("t")]), "a100": node([gpu("a", type="NVIDIA-A100-SXM4-40GB", memory=40000)])},
        Policy.BINPACK,
        Policy.SPREAD,
        "a100",
        [["a"]],
    ),
    (
        "nouse-gputype",
        pod(container(gpu=1), **{"nvidia.com/nouse-gputype": "t4"}),
        {"n": node([gpu("t"), gpu("a", 1, type="NVIDIA-A100")])},
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["a"]],
    ),
    (
        "use-uuid",
        pod(container(gpu=1, mem=1000), **{"nvidia.com/use-gpuuuid": "g1"}),
        ONE_NODE_UNEVEN,
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g1"]],
    ),
    (
        "nouse-uuid-wins",
        pod(
            container(gpu=1, mem=1000),
            **{"nvidia.com/use-gpuuuid": "g1,g2", "nvidia.com/nouse-gpuuuid": "g2"},
        ),
        ONE_NODE_UNEVEN,
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g1"]],
    ),
    (
        "skips-unhealthy-and-cordoned",
        pod(container(gpu=1)),
        {"n": node([gpu("g0", health=False), gpu("g1", 1), gpu("g2", 2)], cordoned="g2")},
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g1"]],
    ),
    (
        "multi-container-accumulates",
        pod(container("a", gpu=1, mem=10000), container("b", gpu=1, mem=10000)),
        {"n": node([gpu("g0"), gpu("g1", 1)])},
        Policy.BINPACK,
        Policy.BINPACK,
        "n",
        [["g0"], ["g1"]],
    ),
    (
        "init-containers-fresh-copy",
        pod(
            container("app", gpu=1, mem=10000),
            init=(container("i1", gpu=1, mem=10000), container("i2", gpu=1, mem=10000)),
        ),
        {"n": node([gpu("g0")])},
        Policy.BINPACK,
        Policy.BINPACK,
        "n",
        [["g0"], ["g0"], ["g0"]],
    ),
    (
        "cpu-container-keeps-index",
        pod({"name": "cpu"}, container("gpu", gpu=1)),
        {"n": node([gpu("g0")])},
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [[], ["g0"]],
    ),
    (
        "numa-bind-same-node",
        pod(container(gpu=2, mem=1000), **{"nvidia.com/numa-bind": "true"}),
        {"n": node([gpu("g0", 0, numa=0), gpu("g1", 1, numa=1), gpu("g2", 2, numa=1)], {"g1": (1, 1000, 0)})},
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g2", "g1"]],
    ),
    # nvidia.com/numa-bind: HAMi's order, NUMA node first regardless of score (spread: the highest
    # NUMA node first; binpack: the lowest), then the score within the NUMA node (issue 13)
    (
        "numa-bind-spread-tries-highest-numa-first",
        pod(container(gpu=1, mem=1000), **{"nvidia.com/numa-bind": "true"}),
        {"n": node(NUMA_GPUS, {"g2": (1, 4000, 0)})},
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g3"]],
    ),
    (
        "without-numa-bind-spread-takes-the-emptiest",
        pod(container(gpu=1, mem=1000)),
        {"n": node(NUMA_GPUS, {"g2": (1, 4000, 0)})},
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g0"]],
    ),
    (
        "numa-bind-binpack-tries-lowest-numa-first",
        pod(container(gpu=1, mem=1000), **{"nvidia.com/numa-bind": "true"}),
        {"n": node(NUMA_GPUS, {"g1": (1, 1000, 0), "g2": (3, 9000, 0)})},
        Policy.BINPACK,
        Policy.BINPACK,
        "n",
        [["g1"]],
    ),
    (
        "without-numa-bind-binpack-takes-the-fullest",
        pod(container(gpu=1, mem=1000)),
        {"n": node(NUMA_GPUS, {"g1": (1, 1000, 0), "g2": (3, 9000, 0)})},
        Policy.BINPACK,
        Policy.BINPACK,
        "n",
        [["g2"]],
    ),
    (
        "numa-bind-spread-falls-back-to-a-lower-numa-with-room",
        pod(container(gpu=2, mem=8000), **{"nvidia.com/numa-bind": "true"}),
        {"n": node(NUMA_GPUS, {"g2": (1, 9000, 0)})},
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g0", "g1"]],
    ),
    # memory used outside kube-vgpu is free for no one (issue 13.4)
    (
        "outside-usage-keeps-the-pod-off-a-gpu-that-looks-free",
        pod(container(gpu=1, mem=8000)),
        {"n": node([gpu("g0", 0), gpu("g1", 1)], {"g1": (1, 2000, 0)}, outside={"g0": 10000})},
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g1"]],
    ),
    (
        "outside-usage-sends-the-pod-to-another-node",
        pod(container(gpu=1, mem=8000)),
        {"a": node([gpu("a0")], outside={"a0": 9000}), "b": node([gpu("b0")], {"b0": (1, 1000, 0)})},
        Policy.SPREAD,
        Policy.SPREAD,
        "b",
        [["b0"]],
    ),
    (
        "tie-goes-to-lower-numa-then-index",
        pod(container(gpu=1, mem=1000)),
        {"n": node([gpu("g0", 0, numa=1), gpu("g1", 1, numa=0), gpu("g2", 2, numa=0)])},
        Policy.BINPACK,
        Policy.SPREAD,
        "n",
        [["g1"]],
    ),
    (
        "tie-between-nodes-by-name",
        pod(container(gpu=1)),
        {"b": node([gpu("b0")]), "a": node([gpu("a0")])},
        Policy.BINPACK,
        Policy.SPREAD,
        "a",
        [["a0"]],
    ),
]


@pytest.mark.parametrize("case", PLACED, ids=[p[0] for p in PLACED])
def test_placement(case) -> None:
    _, req, nodes, node_policy, gpu_policy, want_node, want_gpus = case
    assert choose(req, nodes, node_policy=node_policy, gpu_policy=gpu_policy) == (want_node, want_gpus)


MISSED = [
    (
        "outside-usage-named-in-the-reason",
        pod(container(gpu=1, mem=8000)),
        node([gpu("g0")], {"g0": (1, 8000, 0)}, outside={"g0": 2000}),
        "no GPU with 8000 MiB free: best has 6000 (2000 used outside kube-vgpu)",
        False,
    ),
    (
        "outside-usage-no-eviction-can-free",
        pod(container(gpu=1, mem=8000)),
        node([gpu("g0")], outside={"g0": 10000}),
        "no GPU with 8000 MiB free: best has 6000 (10000 used outside kube-vgpu)",
        True,
    ),
    (
        "outside-usage-on-another-gpu-not-named",
        pod(container(gpu=1, mem=8000)),
        node([gpu("g0", 0), gpu("g1", 1)], {"g0": (1, 10000, 0)}, outside={"g1": 12000}),
        "no GPU with 8000 MiB free: best has 6000",
        False,
    ),
    (
        "memory",
        pod(container(gpu=1, mem=8000)),
        node([gpu("g0", memory=8000)], {"g0": (1, 3904, 0)}),
        "no GPU with 8000 MiB free: best has 4096",
        False,
    ),
    (
        "unhealthy",
        pod(container(gpu=1)),
        node(
            [gpu("a", health=False), gpu("b", 1, health=False), gpu("c", 2, health=False), gpu("d", 3)],
            {"d": (10, 0, 0)},
        ),
        "3/4 GPUs unhealthy, 1/4 GPUs have no free slot",
        False,
    ),
    (
        "too-few-gpus",
        pod(container(gpu=4)),
        node([gpu("a"), gpu("b", 1)]),
        "asks for 4 GPUs, node has 2",
        True,
    ),
    (
        "wrong-type",
        pod(container(gpu=1), **{"nvidia.com/use-gputype": "a100"}),
        node([gpu("a")]),
        "no GPU of type a100",
        True,
    ),
    (
        "bigger-than-any-gpu",
        pod(container(gpu=1, mem=20000)),
        node([gpu("a")]),
        "no GPU with 20000 MiB free: best has 16000",
        True,
    ),
    (
        "exclusive-needs-idle",
        pod(container(gpu=1, mem=10, cores=100)),
        node([gpu("a")], {"a": (1, 100, 0)}),
        "1/1 GPUs busy (exclusive use needs an idle GPU)",
        False,
    ),
    (
        "exclusive-blocks-zero-core",
        pod(container(gpu=1, mem=10)),
        node([gpu("a")], {"a": (1, 100, 100)}),
        "1/1 GPUs have all cores taken",
        False,
    ),
    (
        "exclusive-blocks-cores",
        pod(container(gpu=1, mem=10, cores=10)),
        node([gpu("a")], {"a": (1, 100, 100)}),
        "1/1 GPUs without 10% cores free: best has 0",
        False,
    ),
    (
        "two-of-three",
        pod(container(gpu=2, mem=9000)),
        node([gpu("a"), gpu("b", 1), gpu("c", 2)], {"a": (1, 8000, 0), "b": (1, 8000, 0)}),
        "needs 2 GPUs, 1 fit, 2/3 GPUs without 9000 MiB free",
        False,
    ),
    ("cordoned-all", pod(container(gpu=1)), node([gpu("a")], cordoned="a"), "1/1 GPUs cordoned", True),
    (
        "second-container-named",
        pod(container("a", gpu=1, mem=10000), container("b", gpu=1, mem=10000)),
        node([gpu("g0")]),
        "container b: no GPU with 10000 MiB free: best has 6000",
        False,
    ),
    (
        "numa-bind",
        pod(container(gpu=2), **{"nvidia.com/numa-bind": "1"}),
        node([gpu("g0", 0, numa=0), gpu("g1", 1, numa=1)]),
        "no NUMA node with 2 fitting GPUs: best has 1",
        False,
    ),
]


@pytest.mark.parametrize(
    ("req", "n", "reason", "unresolvable"), [m[1:] for m in MISSED], ids=[m[0] for m in MISSED]
)
def test_miss_reason(req, n, reason, unresolvable) -> None:
    got = fit.fit_pod(req, n, gpu_policy=Policy.SPREAD)
    assert got == fit.Miss(reason, unresolvable)
    simple = fit.simple_container(req)
    if simple is not None:
        assert not fit.can_fit_simple(n, simple)


def test_placement_footprint_is_collapsed() -> None:
    req = pod(
        container("app", gpu=1, mem=3000, cores=10), init=(container("init", gpu=1, mem=5000, cores=20),)
    )
    got = fit.fit_pod(req, node([gpu("g0")]), gpu_policy=Policy.SPREAD)
    assert isinstance(got, fit.Placement)
    assert got.usage == {GpuUuid("g0"): GpuUsage(1, 5000, 20)}


def sidecar(name: str = "sc", **res: Any) -> dict[str, Any]:
    return {**container(name, **res), "restartPolicy": "Always"}


TEN_GB = [gpu("g0", memory=10000)]
SIDECAR_FITS = [
    # (id, init containers, app MiB, placed: (slots, MiB on g0) or the reason it does not fit)
    # a sidecar runs beside the app container for the pod's whole life: 4000 + 7000 > 10000
    (
        "sidecar-and-app-overflow",
        (sidecar(gpu=1, mem=4000),),
        7000,
        "container main: no GPU with 7000 MiB free: best has 6000",
    ),
    ("sidecar-and-app-fit", (sidecar(gpu=1, mem=4000),), 6000, (2, 10000)),
    # a regular init container before the sidecar runs alone (nothing of the pod beside it)
    (
        "init-before-sidecar",
        (container("setup", gpu=1, mem=8000), sidecar(gpu=1, mem=4000)),
        6000,
        (2, 10000),
    ),
    # ... after the sidecar it runs beside it: 4000 + 7000 > 10000
    (
        "init-after-sidecar-overflows",
        (sidecar(gpu=1, mem=4000), container("setup", gpu=1, mem=7000)),
        1000,
        "container setup: no GPU with 7000 MiB free: best has 6000",
    ),
    (
        "init-after-sidecar-fits",
        (sidecar(gpu=1, mem=4000), container("setup", gpu=1, mem=6000)),
        1000,
        (2, 10000),
    ),
    # a plain init container is not charged beside the app: the HAMi collapse
    ("regular-init-collapses", (container("setup", gpu=1, mem=4000),), 7000, (1, 7000)),
]


@pytest.mark.parametrize(
    ("init", "app_mib", "want"), [c[1:] for c in SIDECAR_FITS], ids=[c[0] for c in SIDECAR_FITS]
)
def test_a_sidecar_shares_the_gpu_with_what_starts_after_it(
    init: tuple[dict[str, Any], ...], app_mib: int, want: tuple[int, int] | str
) -> None:
    req = pod(container("main", gpu=1, mem=app_mib), init=init)
    got = fit.fit_pod(req, node(TEN_GB), gpu_policy=Policy.SPREAD)
    if isinstance(want, str):
        assert got == fit.Miss(want, unresolvable=False)
        return
    assert isinstance(got, fit.Placement)
    slots, memory = want
    assert got.usage == {GpuUuid("g0"): GpuUsage(slots, memory, 0)}


def test_a_sidecar_beside_other_pods_is_fitted_on_what_is_left() -> None:
    """The node already holds 3000 MiB: the sidecar's 4000 and the app's 4000 do not both fit."""
    req = pod(container("main", gpu=1, mem=4000), init=(sidecar(gpu=1, mem=4000),))
    got = fit.fit_pod(req, node(TEN_GB, {"g0": (1, 3000, 0)}), gpu_policy=Policy.SPREAD)
    assert got == fit.Miss("container main: no GPU with 4000 MiB free: best has 3000")


# --- properties -------------------------------------------------------------------------------

_gpus = st.lists(
    st.builds(
        lambda mem, cores, count, health, numa: (mem, cores, count, health, numa),
        st.sampled_from([4000, 8000, 16000]),
        st.sampled_from([100, 100, 200]),
        st.integers(1, 4),
        st.booleans() | st.just(True),
        st.integers(0, 1),
    ),
    min_size=1,
    max_size=4,
)
_containers = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 9000), st.integers(0, 100), st.sampled_from([0, 0, 25, 100])),
    min_size=1,
    max_size=3,
)


def _req(
    specs: list[tuple[int, int, int, int]], init: int, numa: bool, sidecars: frozenset[int] = frozenset()
) -> request.PodRequest:
    containers = tuple(
        request.ContainerRequest(
            f"c{i}", count, memory_mib=mem, memory_percent=None if mem else (pct or 100), cores=cores
        )
        for i, (count, mem, cores, pct) in enumerate(specs)
    )
    init_count = min(init, len(containers))
    return request.PodRequest(
        containers,
        init_count,
        request.Selectors(numa_bind=numa),
        sidecars=frozenset(i for i in sidecars if i < init_count),
    )


def _phases(req: request.PodRequest) -> list[list[int]]:
    """The containers of a pod that run at once: each regular init container with the sidecars
    started before it, then the sidecars with the app containers."""
    out = []
    for i in range(req.init_count):
        if i not in req.sidecars:
            out.append([*sorted(j for j in req.sidecars if j < i), i])
    out.append([*sorted(req.sidecars), *range(req.init_count, len(req.containers))])
    return out


def _assert_footprint_covers_every_phase(req: request.PodRequest, got: fit.Placement) -> None:
    for phase in _phases(req):
        at_once: dict[GpuUuid, GpuUsage] = {}
        for index in phase:
            for d in got.devices[index]:
                at_once[d.uuid] = at_once.get(d.uuid, GpuUsage()).plus(memory_mib=d.memory_mib, cores=d.cores)
        for uuid, u in at_once.items():
            charged = got.usage[uuid]
            assert u.slots <= charged.slots, (phase, uuid, u, charged)
            assert u.memory_mib <= charged.memory_mib, (phase, uuid, u, charged)
            assert u.cores <= charged.cores, (phase, uuid, u, charged)


@settings(max_examples=150, deadline=None)
@given(
    _gpus,
    st.lists(
        st.tuples(
            _containers,
            st.integers(0, 2),
            st.booleans(),
            st.sampled_from(list(Policy)),
            st.frozensets(st.integers(0, 1)),
        ),
        max_size=12,
    ),
)
def test_no_overcommit_after_any_sequence(gpu_specs, pods) -> None:
    """Whatever pods come (init containers and sidecars included), each pod's charge covers what
    its containers hold at any one moment, and the charges never overcommit a GPU."""
    gpus = tuple(
        Gpu(GpuUuid(f"g{i}"), i, count, mem, cores, "NVIDIA-X", numa=numa, health=health)
        for i, (mem, cores, count, health, numa) in enumerate(gpu_specs)
    )
    used: dict[GpuUuid, GpuUsage] = {}
    for specs, init, numa, gpu_policy, sidecars in pods:
        n = fit.NodeGpus.build(gpus, used)
        req = _req(specs, init, numa, sidecars)
        got = fit.fit_pod(req, n, gpu_policy=gpu_policy)
        simple = fit.simple_container(req)
        if simple is not None:
            assert fit.can_fit_simple(n, simple) == isinstance(got, fit.Placement)
        if isinstance(got, fit.Miss):
            continue
        for c in got.devices:
            assert len({d.uuid for d in c}) == len(c)  # never two slots of one GPU in one container
        _assert_footprint_covers_every_phase(req, got)
        for uuid, u in got.usage.items():
            have = used.get(uuid, GpuUsage())
            used[uuid] = GpuUsage(have.slots + u.slots, have.memory_mib + u.memory_mib, have.cores + u.cores)
        for g in gpus:
            u = used.get(g.uuid, GpuUsage())
            assert u.slots <= g.count and u.memory_mib <= g.memory_mib and u.cores <= g.cores
            if u.slots and not g.health:
                raise AssertionError("allocated on an unhealthy GPU")


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.integers(0, 3), st.integers(0, 16000), st.integers(0, 100), st.sampled_from([0, 0, 3000])
            ),
            min_size=1,
            max_size=3,
        ),
        min_size=0,
        max_size=6,
    ),
    st.tuples(st.integers(1, 2), st.integers(0, 9000), st.sampled_from([0, 10, 100])),
    st.sampled_from(list(Policy)),
)
def test_scan_simple_agrees_with_fit_and_pick_node(nodes_used, spec, node_policy) -> None:
    count, mem, cores = spec
    views = []
    for n, used in enumerate(nodes_used):
        gpus = tuple(Gpu(GpuUuid(f"n{n}g{i}"), i, 3, 16000, 100, "NVIDIA-X") for i in range(len(used)))
        views.append(
            fit.NodeGpus.build(
                gpus,
                {g.uuid: GpuUsage(*u[:3]) for g, u in zip(gpus, used, strict=True)},
                outside={g.uuid: u[3] for g, u in zip(gpus, used, strict=True)},
            )
        )
    names = [f"node-{(n * 7) % 10}-{n}" for n in range(len(views))]
    req = _req([(count, mem, cores, 0)], 0, False)
    simple = fit.simple_container(req)
    assert simple is not None
    scan = fit.scan_simple(views, names, simple, binpack=node_policy is Policy.BINPACK)
    fits = [
        (names[i], v.score)
        for i, v in enumerate(views)
        if isinstance(fit.fit_pod(req, v, gpu_policy=Policy.SPREAD), fit.Placement)
    ]
    assert scan.fitting == len(fits)
    assert sorted(scan.misses) == [i for i, v in enumerate(views) if names[i] not in dict(fits)]
    expected = policy.pick_node(fits, node_policy)
    assert (names[scan.best] if scan.best >= 0 else None) == expected
