"""Namespace quota arithmetic shared by the webhook, the filter and the simulator (issue 13)."""

from __future__ import annotations

import pytest
from vgpu.core import annotations, fit, quota, usage
from vgpu.core.config import Policy
from vgpu.core.device import Gpu, GpuUsage, GpuUuid
from vgpu.core.request import ContainerRequest, PodRequest


def ask(count: int = 1, *, mem: int = 0, pct: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest("c", count, memory_mib=mem, memory_percent=pct, cores=cores)


TOTALS = [
    ("one-container", [ask(mem=1000, cores=10)], 0, (1000, 10)),
    ("count-multiplies", [ask(3, mem=1000, cores=10)], 0, (3000, 30)),
    ("app-containers-add-up", [ask(mem=1000), None, ask(2, mem=500, cores=5)], 0, (2000, 10)),
    ("percent-at-largest-gpu", [ask(pct=50)], 0, (12000, 0)),
    ("percent-rounds-up", [ask(pct=33)], 0, (7920, 0)),
    ("whole-gpu-when-no-memory-term", [ask()], 0, (24000, 0)),
    ("init-counted-alone-when-larger", [ask(mem=9000, cores=90), ask(mem=1000, cores=10)], 1, (9000, 90)),
    ("init-smaller-than-app", [ask(mem=100), ask(mem=1000), ask(mem=1000)], 1, (2000, 0)),
    ("no-gpu-containers", [None, None], 0, (0, 0)),
]


@pytest.mark.parametrize(("asks", "init", "want"), [c[1:] for c in TOTALS], ids=[c[0] for c in TOTALS])
def test_pod_totals(asks: list[ContainerRequest | None], init: int, want: tuple[int, int]) -> None:
    assert quota.pod_totals(asks, init_count=init, largest_gpu_memory_mib=24000) == want


PROBLEMS = [
    ("fits-exactly", quota.Quota(memory_limit_mib=8000, used_memory_mib=5000), 3000, 0, 1, None),
    (
        "memory-over",
        quota.Quota(memory_limit_mib=8000, used_memory_mib=6000),
        3000,
        0,
        1,
        "namespace team: GPU memory quota exceeded (used 6000 of 8000, requested 3000)",
    ),
    (
        "factor-scales-the-limit",
        quota.Quota(memory_limit_mib=300, used_memory_mib=1001),
        2000,
        0,
        10,
        "namespace team: GPU memory quota exceeded (used 1001 of 3000, requested 2000)",
    ),
    ("factor-fits", quota.Quota(memory_limit_mib=300, used_memory_mib=1000), 2000, 0, 10, None),
    (
        "cores-over",
        quota.Quota(cores_limit=100, used_cores=80),
        0,
        30,
        1,
        "namespace team: GPU cores quota exceeded (used 80 of 100, requested 30)",
    ),
    ("no-limits", quota.Quota(used_memory_mib=10**9, used_cores=10**9), 10, 10, 1, None),
    ("nothing-asked-of-a-zero-limit", quota.Quota(memory_limit_mib=0, cores_limit=0), 0, 0, 1, None),
    (
        "memory-checked-before-cores",
        quota.Quota(memory_limit_mib=1, cores_limit=1),
        2,
        2,
        1,
        "namespace team: GPU memory quota exceeded (used 0 of 1, requested 2)",
    ),
]


@pytest.mark.parametrize(
    ("facts", "memory", "cores", "factor", "want"), [c[1:] for c in PROBLEMS], ids=[c[0] for c in PROBLEMS]
)
def test_problem(facts: quota.Quota, memory: int, cores: int, factor: int, want: str | None) -> None:
    assert quota.problem("team", facts, memory_mib=memory, cores=cores, memory_factor=factor) == want


def test_pod_problem_counts_percent_requests_at_the_largest_gpu() -> None:
    pod = PodRequest(containers=(ask(pct=50),), init_count=0)
    facts = quota.Quota(memory_limit_mib=20000, used_memory_mib=10000)
    assert (
        quota.pod_problem(pod, namespace="ns", quota=facts, largest_gpu_memory_mib=16000, memory_factor=1)
        is None
    )
    assert (
        quota.pod_problem(pod, namespace="ns", quota=facts, largest_gpu_memory_mib=24000, memory_factor=1)
        == "namespace ns: GPU memory quota exceeded (used 10000 of 20000, requested 12000)"
    )


SIDECAR_TOTALS = [
    # (id, asks (init first), init count, sidecar indices, (memory, cores))
    # a sidecar holds its share beside the app containers for the pod's whole life
    ("sidecar-adds-to-app", [ask(mem=4000, cores=10), ask(mem=6000, cores=20)], 1, {0}, (10000, 30)),
    # a regular init container before the sidecar runs alone
    ("init-before-sidecar", [ask(mem=8000), ask(mem=4000), ask(mem=3000)], 2, {1}, (8000, 0)),
    # ... after it, beside it
    ("init-after-sidecar", [ask(mem=4000), ask(mem=5000), ask(mem=3000)], 2, {0}, (9000, 0)),
    ("no-sidecar-is-the-old-rule", [ask(mem=9000), ask(mem=1000)], 1, set(), (9000, 0)),
]


@pytest.mark.parametrize(
    ("asks", "init", "sidecars", "want"), [c[1:] for c in SIDECAR_TOTALS], ids=[c[0] for c in SIDECAR_TOTALS]
)
def test_pod_totals_with_sidecars(
    asks: list[ContainerRequest | None], init: int, sidecars: set[int], want: tuple[int, int]
) -> None:
    got = quota.pod_totals(asks, init_count=init, sidecars=frozenset(sidecars), largest_gpu_memory_mib=24000)
    assert got == want


def test_pod_problem_counts_a_sidecar_beside_the_app() -> None:
    """The webhook's and the filter's pre-check: a sidecar of 4000 and an app of 6000 hold 10000."""
    pod = PodRequest(containers=(ask(mem=4000), ask(mem=6000)), init_count=1, sidecars=frozenset({0}))
    facts = quota.Quota(memory_limit_mib=8000)
    assert (
        quota.pod_problem(pod, namespace="ns", quota=facts, largest_gpu_memory_mib=16000, memory_factor=1)
        == "namespace ns: GPU memory quota exceeded (used 0 of 8000, requested 10000)"
    )


NEEDS_CHECK = [
    ("app-only", PodRequest((ask(mem=1), ask(mem=1)), init_count=0), False),
    ("init-without-gpu", PodRequest((None, ask(mem=1)), init_count=1), False),
    ("gpu-init-alone", PodRequest((ask(mem=1), None), init_count=1), False),
    ("gpu-init-and-gpu-app", PodRequest((ask(mem=1), ask(mem=1)), init_count=1), True),
    ("two-gpu-inits", PodRequest((ask(mem=1), ask(mem=1), None), init_count=2), True),
    # a sidecar is summed with the app anyway: the pod-level total is what a placement holds
    ("sidecar-and-app", PodRequest((ask(mem=1), ask(mem=1)), init_count=1, sidecars=frozenset({0})), False),
    (
        "sidecar-then-init",
        PodRequest((ask(mem=1), ask(mem=1), None), init_count=2, sidecars=frozenset({0})),
        True,
    ),
]


@pytest.mark.parametrize(("pod", "want"), [c[1:] for c in NEEDS_CHECK], ids=[c[0] for c in NEEDS_CHECK])
def test_needs_placement_check(pod: PodRequest, want: bool) -> None:
    assert quota.needs_placement_check(pod) is want


def test_placement_problem_counts_an_init_container_on_another_gpu_beside_the_app() -> None:
    """Quota 10000, nothing used; init 6000 and app 6000. The pod-level total says 6000, but placed
    on two GPUs the namespace is charged 12000: that placement breaks the quota, one on a single
    GPU does not."""
    pod = PodRequest(containers=(ask(mem=6000, cores=10), ask(mem=6000, cores=10)), init_count=1)
    facts = quota.Quota(memory_limit_mib=10000)
    assert (
        quota.pod_problem(pod, namespace="ns", quota=facts, largest_gpu_memory_mib=8000, memory_factor=1)
        is None
    )
    a, b = GpuUuid("GPU-a"), GpuUuid("GPU-b")
    spread = usage.pod_usage(
        annotations.decode_pod_devices("GPU-a,NVIDIA,6000,10:;GPU-b,NVIDIA,6000,10:;"), init_count=1
    )
    assert spread == {a: GpuUsage(1, 6000, 10), b: GpuUsage(1, 6000, 10)}
    assert (
        quota.placement_problem("ns", facts, spread, memory_factor=1)
        == "namespace ns: GPU memory quota exceeded (used 0 of 10000, requested 12000)"
    )
    shared = {a: GpuUsage(1, 6000, 10)}
    assert quota.placement_problem("ns", facts, shared, memory_factor=1) is None
    cores = quota.Quota(cores_limit=15, used_cores=0)
    assert (
        quota.placement_problem("ns", cores, spread, memory_factor=1)
        == "namespace ns: GPU cores quota exceeded (used 0 of 15, requested 20)"
    )


def _two_gpus(used: dict[str, tuple[int, int]]) -> fit.NodeGpus:
    """Two 8,000 MiB GPUs, ``GPU-0`` and ``GPU-1``, with (MiB, cores) used by other pods."""
    gpus = tuple(Gpu(GpuUuid(f"GPU-{i}"), i, 10, 8000, 100, "T4") for i in range(2))
    return fit.NodeGpus.build(gpus, {GpuUuid(u): GpuUsage(1, m, c) for u, (m, c) in used.items()})


def _init_and_app(init: tuple[int, int], app: tuple[int, int]) -> PodRequest:
    return PodRequest(
        containers=(
            ContainerRequest("setup", 1, init[0], cores=init[1]),
            ContainerRequest("main", 1, app[0], cores=app[1]),
        ),
        init_count=1,
    )


# (id, GPU policy, used on GPU-0 and GPU-1, init, app): the GPU policy alone would put the init
# container on the other GPU than the app container, which fits on the app's too
APART = [
    # binpack: the init container would go on the busier GPU-1, where the app's cores do not fit
    ("binpack", Policy.BINPACK, {"GPU-0": (2000, 0), "GPU-1": (1000, 60)}, (6000, 0), (6000, 50)),
    # spread: the init container would go on the idler GPU-0, where the app's cores do not fit
    ("spread", Policy.SPREAD, {"GPU-0": (0, 60), "GPU-1": (3000, 30)}, (2000, 0), (5000, 50)),
]


@pytest.mark.parametrize(
    ("gpu_policy", "used", "init", "app"), [c[1:] for c in APART], ids=[c[0] for c in APART]
)
def test_the_init_container_shares_the_gpu_kubelet_hands_on_and_is_charged_once(
    gpu_policy: Policy, used: dict[str, tuple[int, int]], init: tuple[int, int], app: tuple[int, int]
) -> None:
    """kubelet gives the app container the init container's devices (``vgpu.core.reuse``), so the
    placement puts both on the app's GPU, and the namespace is charged the larger of the two."""
    node, pod = _two_gpus(used), _init_and_app(init, app)
    first = fit.fit_pod(pod, node, gpu_policy=gpu_policy)
    assert isinstance(first, fit.Placement)
    init_gpu, app_gpu = (devices[0].uuid for devices in first.devices)
    assert init_gpu == app_gpu
    held = max(init[0], app[0])
    assert first.usage == {app_gpu: GpuUsage(1, held, app[1])}

    def within(limit: int) -> fit.Placement | str:
        facts = quota.Quota(memory_limit_mib=limit)
        return quota.fit_within(
            pod,
            node,
            first,
            gpu_policy=gpu_policy,
            problem=lambda footprint: quota.placement_problem("ns", facts, footprint, memory_factor=1),
        )

    assert within(held) is first
    assert within(held - 1) == (
        f"namespace ns: GPU memory quota exceeded (used 0 of {held - 1}, requested {held})"
    )


def test_init_beside_app_fits_each_init_container_beside_the_sidecars_started_before_it() -> None:
    """A sidecar keeps 3,000 MiB of the only GPU: an init container after it has 5,000 left there,
    with or without ``init_beside_app``; one before it has all 8,000 (the init is charged while it
    runs, then the sidecar and main: 6,000 MiB at most, two slots)."""
    node = fit.NodeGpus.build((Gpu(GpuUuid("GPU-0"), 0, 10, 8000, 100, "T4"),), {})
    sidecar, setup, main = (
        ContainerRequest("sidecar", 1, 3000),
        ContainerRequest("setup", 1, 6000),
        ContainerRequest("main", 1, 1000),
    )
    after = PodRequest(containers=(sidecar, setup, main), init_count=2, sidecars=frozenset({0}))
    before = PodRequest(containers=(setup, sidecar, main), init_count=2, sidecars=frozenset({1}))
    for beside in (False, True):
        missed = fit.fit_pod(after, node, gpu_policy=Policy.SPREAD, init_beside_app=beside)
        assert missed == fit.Miss("container setup: no GPU with 6000 MiB free: best has 5000")
        placed = fit.fit_pod(before, node, gpu_policy=Policy.SPREAD, init_beside_app=beside)
        assert isinstance(placed, fit.Placement)
        assert placed.usage == {GpuUuid("GPU-0"): GpuUsage(2, 6000, 0)}  # the sidecar and main run on
