"""kube-scheduler's structured allocation with consumable capacity, as the local cluster runs it."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core.dra import allocation, allocator, names, selector

from tests.localcluster import draobjects as dra

CLASSES = {names.DEVICE_CLASS: dra.device_class()}


def _ids() -> Any:
    counter = itertools.count()
    return lambda: f"00000000-0000-0000-0000-{next(counter):012d}"


def _alloc(
    claims: list[dict[str, Any]],
    *,
    slices: list[dict[str, Any]],
    allocated: list[dict[str, Any]] = (),  # type: ignore[assignment]
    node: str = "n1",
    classes: dict[str, Any] = CLASSES,
) -> list[dict[str, Any]] | None:
    return allocator.allocate(
        claims, node=node, slices=slices, classes=classes, allocated=list(allocated), new_share_id=_ids()
    )


def _allocated(claim: dict[str, Any], allocation_body: dict[str, Any]) -> dict[str, Any]:
    return {**claim, "status": {"allocation": allocation_body}}


ONE_GPU = [dra.resource_slice("n1", [dra.gpu(0, memory_mib=16384)])]
TWO_GPUS = [dra.resource_slice("n1", [dra.gpu(0, memory_mib=16384), dra.gpu(1, memory_mib=16384)])]


def test_a_share_consumes_its_request_and_defaults_for_the_rest() -> None:
    got = _alloc([dra.claim("c", dra.gpu_request(memory_mib=4000))], slices=ONE_GPU)
    assert got is not None
    (result,) = got[0]["devices"]["results"]
    assert result == {
        "request": "gpu",
        "driver": names.DRIVER,
        "pool": "n1",
        "device": "gpu-0",
        "shareID": "00000000-0000-0000-0000-000000000000",
        "consumedCapacity": {"memory": "4000Mi", "cores": "0"},
    }
    assert got[0]["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    }
    shares = allocation.shares(_allocated(dra.claim("c"), got[0]))
    assert (shares[0].memory_mib, shares[0].cores_percent) == (4000, 0)


def test_no_memory_request_takes_the_whole_gpu_by_default() -> None:
    got = _alloc([dra.claim("c", dra.gpu_request(cores=30))], slices=ONE_GPU)
    assert got is not None
    assert got[0]["devices"]["results"][0]["consumedCapacity"] == {"memory": "16Gi", "cores": "30"}
    again = _alloc(
        [dra.claim("d", dra.gpu_request(memory_mib=1))],
        slices=ONE_GPU,
        allocated=[_allocated(dra.claim("c"), got[0])],
    )
    assert again is None  # the whole memory is taken


@pytest.mark.parametrize(
    ("requested", "consumed"),
    [("1536Ki", "2Mi"), ("1Gi", "1Gi"), ("1000Mi", "1000Mi"), ("1", "1Mi"), ("0", "1Mi")],
    ids=["rounded-up-to-step", "binary-kept", "mi-kept", "below-min", "zero-to-min"],
)
def test_request_policy_rounds_up_to_the_step(requested: str, consumed: str) -> None:
    claim = dra.claim(
        "c",
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": names.DEVICE_CLASS,
                "capacity": {"requests": {"memory": requested}},
            },
        },
    )
    got = _alloc([claim], slices=ONE_GPU)
    assert got is not None
    assert got[0]["devices"]["results"][0]["consumedCapacity"]["memory"] == consumed


def test_a_request_above_the_policy_max_never_fits() -> None:
    assert _alloc([dra.claim("c", dra.gpu_request(cores=101))], slices=ONE_GPU) is None


def test_valid_values_round_up_and_refuse_above() -> None:
    device = dra.gpu(0)
    device["capacity"]["memory"] = {
        "value": "16Gi",
        "requestPolicy": {"default": "8Gi", "validValues": ["4Gi", "8Gi", "16Gi"]},
    }
    slices = [dra.resource_slice("n1", [device])]
    got = _alloc([dra.claim("c", dra.gpu_request(memory_mib=5000))], slices=slices)
    assert got is not None
    assert got[0]["devices"]["results"][0]["consumedCapacity"]["memory"] == "8Gi"
    assert _alloc([dra.claim("c", dra.gpu_request(memory_mib=17000))], slices=slices) is None


def test_shares_fill_a_gpu_then_the_next_and_never_overcommit() -> None:
    allocated: list[dict[str, Any]] = []
    placed = []
    for i in range(5):
        c = dra.claim(f"c{i}", dra.gpu_request(memory_mib=6000, cores=40))
        got = _alloc([c], slices=TWO_GPUS, allocated=allocated)
        if got is None:
            placed.append(None)
            continue
        allocated.append(_allocated(c, got[0]))
        placed.append(got[0]["devices"]["results"][0]["device"])
    # 16384 MiB and 100 cores per GPU: two 6000 MiB / 40 % shares each, the fifth fits nowhere
    assert placed == ["gpu-0", "gpu-0", "gpu-1", "gpu-1", None]


def test_count_two_takes_two_distinct_gpus_and_a_claim_may_reuse_one_in_another_request() -> None:
    got = _alloc([dra.claim("c", dra.gpu_request(count=2, memory_mib=1000))], slices=TWO_GPUS)
    assert got is not None
    assert [r["device"] for r in got[0]["devices"]["results"]] == ["gpu-0", "gpu-1"]
    assert _alloc([dra.claim("c", dra.gpu_request(count=3, memory_mib=1000))], slices=TWO_GPUS) is None
    two_requests = dra.claim(
        "c", dra.gpu_request(name="a", memory_mib=1000), dra.gpu_request(name="b", memory_mib=1000)
    )
    got = _alloc([two_requests], slices=ONE_GPU)
    assert got is not None
    assert [r["device"] for r in got[0]["devices"]["results"]] == ["gpu-0", "gpu-0"]


def test_all_claims_of_a_pod_fit_together_or_none() -> None:
    claims = [dra.claim(f"c{i}", dra.gpu_request(memory_mib=10000)) for i in range(3)]
    assert _alloc(claims, slices=TWO_GPUS) is None
    got = _alloc(claims[:2], slices=TWO_GPUS)
    assert got is not None
    assert [a["devices"]["results"][0]["device"] for a in got] == ["gpu-0", "gpu-1"]


def test_backtracking_finds_the_placement_first_fit_misses() -> None:
    # gpu-0 has 8000 MiB, gpu-1 16384: claim a (6000) first fits gpu-0, then b (10000) only on gpu-1
    slices = [dra.resource_slice("n1", [dra.gpu(0, memory_mib=8000), dra.gpu(1, memory_mib=16384)])]
    claims = [
        dra.claim("a", dra.gpu_request(memory_mib=12000)),
        dra.claim("b", dra.gpu_request(memory_mib=8000)),
    ]
    got = _alloc(claims, slices=slices)
    assert got is not None
    assert [a["devices"]["results"][0]["device"] for a in got] == ["gpu-1", "gpu-0"]


def test_first_available_takes_the_first_subrequest_that_fits() -> None:
    slices = [dra.resource_slice("n1", [dra.gpu(0, memory_mib=8000), dra.gpu(1, memory_mib=16384)])]
    attr = f'device.attributes["{names.DRIVER}"].{names.ATTR_MEMORY_MIB}'
    request = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": f"m{size}",
                "deviceClassName": names.DEVICE_CLASS,
                "selectors": [{"cel": {"expression": f"{attr} == {size}"}}],
                "capacity": {"requests": {"memory": f"{size // 2}Mi"}},
            }
            for size in (32768, 16384, 8000)
        ],
    }
    got = _alloc([dra.claim("c", request)], slices=slices)
    assert got is not None
    (result,) = got[0]["devices"]["results"]
    assert (result["request"], result["device"], result["consumedCapacity"]["memory"]) == (
        "gpu/m16384",
        "gpu-1",
        "8Gi",
    )


def test_a_no_schedule_taint_excludes_the_device_unless_tolerated() -> None:
    taint = {"key": names.UNHEALTHY_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    slices = [dra.resource_slice("n1", [dra.gpu(0, taints=[taint])])]
    assert _alloc([dra.claim("c", dra.gpu_request(memory_mib=10))], slices=slices) is None
    tolerating = dra.gpu_request(memory_mib=10)
    tolerating["exactly"]["tolerations"] = [{"key": names.UNHEALTHY_TAINT_KEY, "operator": "Exists"}]
    got = _alloc([dra.claim("c", tolerating)], slices=slices)
    assert got is not None
    assert got[0]["devices"]["results"][0]["tolerations"] == tolerating["exactly"]["tolerations"]
    none_effect = [dra.resource_slice("n1", [dra.gpu(0, taints=[{**taint, "effect": "None"}])])]
    assert _alloc([dra.claim("c", dra.gpu_request(memory_mib=10))], slices=none_effect) is not None


def test_only_the_nodes_complete_newest_pool_counts() -> None:
    other_node = [dra.resource_slice("n2", [dra.gpu(0)])]
    assert _alloc([dra.claim("c", dra.gpu_request())], slices=other_node) is None
    stale = dra.resource_slice("n1", [dra.gpu(0, memory_mib=100000)], generation=1)
    newest = dra.resource_slice("n1", [dra.gpu(0, memory_mib=1000)], generation=2)
    newest["metadata"]["name"] = "newer"
    assert _alloc([dra.claim("c", dra.gpu_request(memory_mib=2000))], slices=[stale, newest]) is None
    incomplete = dra.resource_slice("n1", [dra.gpu(0)])
    incomplete["spec"]["pool"]["resourceSliceCount"] = 2
    assert _alloc([dra.claim("c", dra.gpu_request())], slices=[incomplete]) is None


def test_an_exclusive_device_serves_one_claim() -> None:
    device = dra.gpu(0)
    device.pop("allowMultipleAllocations")
    for cap in device["capacity"].values():
        cap.pop("requestPolicy")
    slices = [dra.resource_slice("n1", [device])]
    got = _alloc([dra.claim("c", dra.gpu_request())], slices=slices)
    assert got is not None
    assert "shareID" not in got[0]["devices"]["results"][0]
    assert (
        _alloc(
            [dra.claim("d", dra.gpu_request())], slices=slices, allocated=[_allocated(dra.claim("c"), got[0])]
        )
        is None
    )


def test_class_selectors_apply_and_unknown_class_is_an_error() -> None:
    classes = {
        names.DEVICE_CLASS: dra.device_class(
            expression=f'device.attributes["{names.DRIVER}"].model == "H100"'
        )
    }
    assert _alloc([dra.claim("c", dra.gpu_request())], slices=ONE_GPU, classes=classes) is None
    with pytest.raises(allocator.AllocatorError, match="could not retrieve device class"):
        _alloc([dra.claim("c", dra.gpu_request())], slices=ONE_GPU, classes={})


@pytest.mark.parametrize(
    "expression",
    [
        "device.capacity['x'].memory > 1",
        '(device.driver == "a")',
        "true",
        "",
        "device.attributes",
    ],
    ids=["capacity", "parentheses", "literal", "empty", "bare"],
)
def test_cel_outside_the_subset_is_refused_clearly(expression: str) -> None:
    with pytest.raises(selector.UnsupportedSelector, match=r"subset|non-empty"):
        selector.parse(expression)


def test_cel_runtime_errors_are_errors() -> None:
    view = selector.DeviceView(driver="d", attributes={"model": {"string": "A"}}, allow_multiple=True)
    assert selector.matches(
        selector.parse('device.attributes["d"].model == "A" && device.driver == \'d\''), view
    )
    assert not selector.matches(selector.parse('device.attributes["d"]["model"] != "A"'), view)
    with pytest.raises(selector.SelectorError, match="no such key"):
        selector.matches(selector.parse('device.attributes["d"].uuid == "x"'), view)
    with pytest.raises(selector.SelectorError, match="no such overload"):
        selector.matches(selector.parse('device.attributes["d"].model == 3'), view)


@pytest.mark.parametrize(
    "claim_spec",
    [
        {"devices": {"requests": [{"name": "gpu"}]}},
        {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": names.DEVICE_CLASS, "count": 0}}]
            }
        },
        {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": names.DEVICE_CLASS,
                            "capacity": {"requests": {"memory": "lots"}},
                        },
                    }
                ]
            }
        },
        {"devices": {"requests": [dra.gpu_request()], "constraints": [{"distinctAttribute": "x/y"}]}},
    ],
    ids=["no-request-kind", "count-zero", "bad-quantity", "constraints"],
)
def test_garbage_claims_are_allocator_errors(claim_spec: dict[str, Any]) -> None:
    with pytest.raises(allocator.AllocatorError):
        _alloc([{"metadata": {"name": "c"}, "spec": claim_spec}], slices=ONE_GPU)


def test_a_request_for_a_capacity_the_device_lacks_does_not_fit() -> None:
    claim = dra.claim(
        "c",
        {
            "name": "gpu",
            "exactly": {"deviceClassName": names.DEVICE_CLASS, "capacity": {"requests": {"bandwidth": "1"}}},
        },
    )
    assert _alloc([claim], slices=ONE_GPU) is None


@given(st.lists(st.tuples(st.integers(1, 20000), st.integers(0, 100)), min_size=1, max_size=12))
def test_property_no_capacity_is_ever_exceeded(asks: list[tuple[int, int]]) -> None:
    allocated: list[dict[str, Any]] = []
    for i, (mem, cores) in enumerate(asks):
        c = dra.claim(f"c{i}", dra.gpu_request(memory_mib=mem, cores=cores))
        got = _alloc([c], slices=TWO_GPUS, allocated=allocated)
        if got is not None:
            allocated.append(_allocated(c, got[0]))
    for device in ("gpu-0", "gpu-1"):
        shares = [s for c in allocated for s in allocation.shares(c) if s.device == device]
        assert sum(s.memory_mib or 0 for s in shares) <= 16384
        assert sum(s.cores_percent or 0 for s in shares) <= 100


@pytest.mark.parametrize(
    ("value", "text"),
    [(50, "50"), (1000, "1k"), (1024, "1Ki"), (2**30, "1Gi"), (1536 * 2**20, "1536Mi"), (1000000, "1000000")],
)
def test_format_quantity_as_binary_si(value: int, text: str) -> None:
    import decimal

    assert allocator.format_quantity(decimal.Decimal(value)) == text


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.attributes["d"].model.lowerAscii().contains("t4")', True),
        ('device.attributes["d"].model.contains("t4")', False),
        ('!device.attributes["d"].model.lowerAscii().contains("a100") && device.driver == "d"', True),
        ('device.attributes["d"].uuid in ["GPU-1", "GPU-2"]', True),
        ('!(device.attributes["d"].uuid in ["GPU-1"])', False),
        (
            'device.attributes["d"].model.contains("H100") || device.attributes["d"].model.contains("T4")',
            True,
        ),
        ('device.attributes["d"].missing == 1 || device.driver == "d"', True),  # CEL: true || error
        ('device.attributes["d"].missing == 1 && device.driver == "x"', False),  # false && error
    ],
    ids=["lower-contains", "case-sensitive", "negated-and", "in", "not-in", "or", "or-error", "and-error"],
)
def test_the_webhooks_selector_forms(expression: str, expected: bool) -> None:
    view = selector.DeviceView(
        driver="d",
        attributes={"model": {"string": "Tesla T4"}, "uuid": {"string": "GPU-1"}},
        allow_multiple=True,
    )
    assert selector.matches(selector.parse(expression), view) is expected


def test_match_attribute_keeps_a_claims_gpus_on_one_numa_node() -> None:
    devices = [dra.gpu(i) for i in range(4)]
    for i, d in enumerate(devices):
        d["attributes"][names.ATTR_NUMA] = {"int": [0, 1, 1, 0][i]}
    slices = [dra.resource_slice("n1", devices)]
    claim = dra.claim("c", dra.gpu_request(count=2, memory_mib=10))
    claim["spec"]["devices"]["constraints"] = [
        {"requests": ["gpu"], "matchAttribute": f"{names.DRIVER}/{names.ATTR_NUMA}"}
    ]
    got = _alloc([claim], slices=slices)
    assert got is not None
    assert [r["device"] for r in got[0]["devices"]["results"]] == ["gpu-0", "gpu-3"]  # backtracked past gpu-1
    three = dra.claim("c", dra.gpu_request(count=3, memory_mib=10))
    three["spec"]["devices"]["constraints"] = claim["spec"]["devices"]["constraints"]
    assert _alloc([three], slices=slices) is None
