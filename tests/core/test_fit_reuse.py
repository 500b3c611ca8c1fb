"""kubelet's reuse of init containers' devices (``vgpu.core.reuse``) and the placements ``fit_pod``
makes so that the GPUs kubelet hands on are the GPUs the scheduler assigned, table-driven."""

from __future__ import annotations

import pytest
from vgpu.core import fit, reuse
from vgpu.core.config import Policy
from vgpu.core.device import Gpu, GpuUsage, GpuUuid
from vgpu.core.request import ContainerRequest, PodRequest

INIT, SIDE, APP = "init", "sidecar", "app"


def _pod(*parts: tuple[str, int, int, int] | None) -> PodRequest:
    """Containers in kubelet's order as (kind, GPUs, MiB, cores), None for one without a GPU;
    init containers and sidecars first."""
    containers: list[ContainerRequest | None] = []
    init_count, sidecars = 0, set()
    for index, part in enumerate(parts):
        if part is None:
            containers.append(None)
            init_count += 1 if index == init_count else 0
            continue
        kind, count, memory, cores = part
        if kind in (INIT, SIDE):
            init_count += 1
            if kind == SIDE:
                sidecars.add(index)
        containers.append(ContainerRequest(f"c{index}", count, memory, cores=cores))
    return PodRequest(containers=tuple(containers), init_count=init_count, sidecars=frozenset(sidecars))


# (id, containers, expected heir per regular init container, or the start of the reason)
LINKS = [
    ("init-then-app", [(INIT, 1, 1, 0), (APP, 1, 1, 0)], {0: 1}),
    ("app-asks-more", [(INIT, 1, 1, 0), (APP, 2, 1, 0)], {0: 1}),
    ("app-asks-fewer", [(INIT, 2, 1, 0), (APP, 1, 1, 0)], "container c1 asks for 1 GPU(s), fewer than the 2"),
    ("init-after-init", [(INIT, 1, 1, 0), (INIT, 2, 1, 0), (APP, 2, 1, 0)], {0: 1, 1: 2}),
    ("second-init-asks-fewer", [(INIT, 2, 1, 0), (INIT, 1, 1, 0), (APP, 2, 1, 0)], "container c1 asks"),
    ("sidecar-keeps-its-devices", [(SIDE, 1, 1, 0), (APP, 1, 1, 0)], {}),
    ("sidecar-takes-the-pool", [(INIT, 1, 1, 0), (SIDE, 1, 1, 0), (APP, 1, 1, 0)], {0: 1}),
    ("sidecar-takes-more", [(INIT, 1, 1, 0), (SIDE, 3, 1, 0), (APP, 1, 1, 0)], {0: 1}),
    ("init-after-sidecar", [(SIDE, 1, 1, 0), (INIT, 1, 1, 0), (APP, 1, 1, 0)], {1: 2}),
    ("gpu-less-app-between", [(INIT, 1, 1, 0), (APP, 0, 0, 0), (APP, 1, 1, 0)], {0: 2}),
    ("first-app-empties-the-pool", [(INIT, 1, 1, 0), (APP, 1, 1, 0), (APP, 1, 1, 0)], {0: 1}),
    ("no-gpu-init", [None, (APP, 1, 1, 0)], {}),
    ("init-without-heir", [(INIT, 1, 1, 0), None], {}),
]


@pytest.mark.parametrize(("parts", "expected"), [c[1:] for c in LINKS], ids=[c[0] for c in LINKS])
def test_links_follow_kubelets_reuse(parts: list[tuple[str, int, int, int] | None], expected: object) -> None:
    ask = _pod(*[p if p is None or p[1] else None for p in parts])
    got = reuse.links(ask)
    if isinstance(expected, str):
        assert isinstance(got, str)
        assert got.startswith(expected), got
        missed = fit.fit_pod(ask, _node(4, {}), gpu_policy=Policy.SPREAD)
        assert missed == fit.Miss(got, unresolvable=True)
    else:
        assert got == reuse.Links(expected)  # type: ignore[arg-type]


def _node(count: int, used: dict[int, tuple[int, int]]) -> fit.NodeGpus:
    """``count`` GPUs of 8,000 MiB, ``GPU-<i>``, with (MiB, cores) used by other pods."""
    gpus = tuple(Gpu(GpuUuid(f"GPU-{i}"), i, 10, 8000, 100, "T4") for i in range(count))
    return fit.NodeGpus.build(gpus, {GpuUuid(f"GPU-{i}"): GpuUsage(1, m, c) for i, (m, c) in used.items()})


# (id, GPUs, used per GPU, GPU policy, containers, expected GPU indices per container)
PLACED = [
    # binpack would put the init container on the busier GPU 1, where the app's cores do not fit:
    # the app goes first (GPU 0) and the init container within its GPUs
    (
        "app-first",
        2,
        {0: (2000, 0), 1: (1000, 60)},
        Policy.BINPACK,
        [(INIT, 1, 6000, 0), (APP, 1, 6000, 50)],
        [[0], [0]],
    ),
    # binpack would put the app on the busier GPU 0, where the init container does not fit: the init
    # container goes first (GPU 1) and the app on its GPU
    ("init-first", 2, {0: (5000, 0)}, Policy.BINPACK, [(INIT, 1, 7000, 0), (APP, 1, 2000, 0)], [[1], [1]]),
    # spread: the idler GPU 0 for the init container, the app's cores fit only on GPU 1
    (
        "spread",
        2,
        {0: (1, 60), 1: (3000, 30)},
        Policy.SPREAD,
        [(INIT, 1, 2000, 0), (APP, 1, 5000, 50)],
        [[1], [1]],
    ),
    # the app asks for more GPUs: the init container's GPU is among them
    (
        "app-asks-more",
        3,
        {0: (7000, 0)},
        Policy.BINPACK,
        [(INIT, 1, 1000, 0), (APP, 2, 2000, 0)],
        [[1], [1, 2]],
    ),
    # init containers in turn: each next one is given the GPUs of the one before
    (
        "chain",
        3,
        {0: (1000, 0)},
        Policy.BINPACK,
        [(INIT, 1, 7000, 0), (INIT, 2, 1000, 0), (APP, 2, 1000, 0)],
        [[0], [0, 1], [0, 1]],
    ),
    # a sidecar hands nothing on: the app goes where the policy says
    ("sidecar", 2, {0: (2000, 0)}, Policy.SPREAD, [(SIDE, 1, 5000, 0), (APP, 1, 5000, 0)], [[1], [0]]),
    # the sidecar takes the init container's devices; the app after it is free
    (
        "sidecar-heir",
        2,
        {},
        Policy.BINPACK,
        [(INIT, 1, 6000, 0), (SIDE, 1, 1000, 0), (APP, 1, 7500, 0)],
        [[0], [0], [1]],
    ),
]


@pytest.mark.parametrize(
    ("count", "used", "gpu_policy", "parts", "expected"), [c[1:] for c in PLACED], ids=[c[0] for c in PLACED]
)
def test_each_heir_is_given_the_gpus_of_the_init_container_it_reuses(
    count: int,
    used: dict[int, tuple[int, int]],
    gpu_policy: Policy,
    parts: list[tuple[str, int, int, int]],
    expected: list[list[int]],
) -> None:
    ask = _pod(*parts)
    placed = fit.fit_pod(ask, _node(count, used), gpu_policy=gpu_policy)
    assert isinstance(placed, fit.Placement), placed
    assert [sorted(int(d.uuid.split("-")[1]) for d in c) for c in placed.devices] == expected
    links = reuse.links(ask)
    assert isinstance(links, reuse.Links)
    for init, heir in links.heir.items():
        assert {d.uuid for d in placed.devices[init]} <= {d.uuid for d in placed.devices[heir]}


def test_a_node_where_no_gpu_takes_both_is_a_miss_saying_why() -> None:
    """An init container of 7,000 MiB fits only on GPU 1, the app of 6,000 MiB and 50 % cores only
    on GPU 0: either order fails. An empty node would take both on one GPU: resolvable (evicting may help)."""
    ask = _pod((INIT, 1, 7000, 0), (APP, 1, 6000, 50))
    missed = fit.fit_pod(ask, _node(2, {0: (2000, 0), 1: (1000, 60)}), gpu_policy=Policy.BINPACK)
    assert missed == fit.Miss(
        "container c1 (kubelet gives it the devices of init container c0 first): GPU-1 cannot take it; "
        "nor container c0 (kubelet hands its devices on to container c1): no GPU with 7000 MiB free: "
        "best has 6000"
    )
