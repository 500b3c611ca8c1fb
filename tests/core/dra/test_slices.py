"""vgpu.core.dra.slices: the node's ResourceSlice from its inventory, garbage left out with a
reason, names within the API's limits, and the update rules (generation, taint times, ownership).
The real kube-apiserver's verdict on the same bodies is tests/realk8s/test_dra_schema.py."""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core import quantity
from vgpu.core.device import Gpu, GpuUuid, Mode, NodeInventory, NodeName
from vgpu.core.dra import names, slices

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def gpu(index: int = 0, **kw: Any) -> Gpu:
    base: dict[str, Any] = {
        "uuid": GpuUuid(f"GPU-{index:04d}"),
        "index": index,
        "count": 10,
        "memory_mib": 40960,
        "cores": 100,
        "type": "NVIDIA A100-SXM4-40GB",
        "numa": 1,
    }
    base.update(kw)
    return Gpu(**base)


def build(*gpus: Gpu, node: str = "n1", **kw: Any) -> slices.SliceBuild:
    kw.setdefault("driver_version", "550.54.15")
    return slices.build(NodeInventory(NodeName(node), gpus), **kw)


def devices(built: slices.SliceBuild) -> list[dict[str, Any]]:
    return list(built.body["spec"].get("devices") or [])


def valid_dns_subdomain(name: str) -> bool:
    """apimachinery's IsDNS1123Subdomain: 253 at most, dot-separated labels (no per-label limit)."""
    return len(name) <= 253 and all(DNS_LABEL.match(p) for p in name.split("."))


def test_a_healthy_gpu_is_one_shared_device_with_capacities_and_attributes() -> None:
    built = build(gpu(3), node_uid="uid-1")
    assert built.skipped == ()
    assert built.body["apiVersion"] == "resource.k8s.io/v1"
    assert built.body["metadata"] == {
        "name": "n1-gpu.kube-vgpu.io",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1", "controller": True}
        ],
    }
    assert built.body["spec"] == {
        "driver": names.DRIVER,
        "nodeName": "n1",
        "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {
                "name": "gpu-3",
                "attributes": {
                    "uuid": {"string": "GPU-0003"},
                    "index": {"int": 3},
                    "migEnabled": {"bool": False},
                    "memoryMiB": {"int": 40960},
                    "model": {"string": "NVIDIA A100-SXM4-40GB"},
                    "numaNode": {"int": 1},
                    "driverVersion": {"version": "550.54.15"},
                },
                "allowMultipleAllocations": True,
                "capacity": {
                    "memory": {
                        "value": "40Gi",
                        "requestPolicy": {"default": "40Gi", "validRange": {"min": "1Mi", "step": "1Mi"}},
                    },
                    "cores": {
                        "value": "100",
                        "requestPolicy": {
                            "default": "0",
                            "validRange": {"min": "0", "max": "100", "step": "1"},
                        },
                    },
                },
            }
        ],
    }


@pytest.mark.parametrize(
    ("memory_mib", "cores", "memory", "cores_q", "max_q"),
    [
        (81559, 100, "81559Mi", "100", "100"),
        (15360, 100, "15Gi", "100", "100"),
        (2, 1, "2Mi", "1", "1"),
        (4096, 50, "4Gi", "50", "50"),  # core scaling 0.5
        (1048576, 1000, "1Ti", "1k", "100"),  # core scaling 10: decimal SI as the server writes it
    ],
)
def test_quantities_are_written_as_kube_apiserver_stores_them(
    memory_mib: int, cores: int, memory: str, cores_q: str, max_q: str
) -> None:
    (dev,) = devices(build(gpu(memory_mib=memory_mib, cores=cores)))
    assert dev["capacity"]["memory"]["value"] == memory == quantity.canonical(f"{memory_mib}Mi")
    assert dev["capacity"]["cores"]["value"] == cores_q
    # one claim asks at most the whole GPU's SMs, as a container in the extender mode
    assert dev["capacity"]["cores"]["requestPolicy"]["validRange"]["max"] == max_q


def test_an_unhealthy_gpu_is_tainted_or_left_out_where_taints_are_dropped() -> None:
    sick = gpu(1, health=False)
    tainted = devices(build(gpu(0), sick))
    assert [d.get("taints") for d in tainted] == [
        None,
        [{"key": "gpu.kube-vgpu.io/unhealthy", "effect": "NoSchedule"}],
    ]
    without = build(gpu(0), sick, taints=False)
    assert [d["name"] for d in devices(without)] == ["gpu-0"]
    assert [(s.index, s.reason) for s in without.skipped] == [
        (1, "unhealthy, and the API server keeps no device taints")
    ]


def test_a_mig_gpu_is_shown_but_not_shared() -> None:
    (dev,) = devices(build(gpu(0, mode=Mode.MIG)))
    assert dev["attributes"]["migEnabled"] == {"bool": True}
    assert "capacity" not in dev and "allowMultipleAllocations" not in dev


def test_unknown_numa_unparseable_driver_and_long_model_are_left_out_or_cut() -> None:
    long_model = "NVIDIA " + "Ü" * 40  # 7 + 80 bytes
    (dev,) = devices(build(gpu(0, numa=-1, type=long_model), driver_version="R550 beta"))
    attrs = dev["attributes"]
    assert "numaNode" not in attrs and "driverVersion" not in attrs
    model = attrs["model"]["string"]
    assert len(model.encode()) <= 64 and long_model.startswith(model) and len(model) == 35


@pytest.mark.parametrize(
    ("raw", "semver"),
    [
        ("550.54.15", "550.54.15"),
        ("535.104.05", "535.104.5"),  # semver forbids the leading zero NVIDIA writes
        ("470.82", "470.82.0"),
        ("570", "570.0.0"),
        (" 560.35.03\n", "560.35.3"),
        ("1.2.3.4", None),
        ("550.54.15-beta", None),
        ("", None),
        ("v550", None),
        (None, None),
        ("9" * 70, None),
    ],
)
def test_driver_semver(raw: str | None, semver: str | None) -> None:
    assert slices.driver_semver(raw) == semver


GARBAGE: list[tuple[str, Gpu, str]] = [
    ("empty-uuid", gpu(0, uuid=GpuUuid("")), "UUID is not printable ASCII"),
    ("non-ascii-uuid", gpu(0, uuid=GpuUuid("GPU-é")), "UUID is not printable ASCII"),
    ("newline-uuid", gpu(0, uuid=GpuUuid("GPU-1\n")), "UUID is not printable ASCII"),
    ("long-uuid", gpu(0, uuid=GpuUuid("G" * 65)), "UUID is longer than 64 characters"),
    ("negative-index", gpu(-1), "index is not a non-negative integer"),
    ("zero-memory", gpu(0, memory_mib=0), "memory 0 MiB is outside 2.."),
    ("one-mib", gpu(0, memory_mib=1), "memory 1 MiB is outside 2.."),
    ("absurd-memory", gpu(0, memory_mib=2**50), "memory 1125899906842624 MiB is outside"),
    ("zero-cores", gpu(0, cores=0), "cores 0 % is outside 1..1000000"),
    ("absurd-cores", gpu(0, cores=10**9), "cores 1000000000 % is outside"),
    ("bool-cores", gpu(0, cores=True), "cores True % is outside"),
    ("float-memory", gpu(0, memory_mib=4096.5), "memory 4096.5 MiB is outside"),
    ("string-index", dataclasses.replace(gpu(0), index="1"), "index is not a non-negative integer"),
]


@pytest.mark.parametrize(("case", "bad", "reason"), GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_gpus_are_left_out_with_a_reason(case: str, bad: Gpu, reason: str) -> None:
    built = build(gpu(7), bad)
    assert [d["name"] for d in devices(built)] == ["gpu-7"]
    (skipped,) = built.skipped
    assert skipped.reason.startswith(reason), case


def test_repeated_index_or_uuid_keeps_the_first() -> None:
    built = build(gpu(0), gpu(0, uuid=GpuUuid("GPU-other")), gpu(1, uuid=GpuUuid("GPU-0000")))
    assert [d["attributes"]["uuid"]["string"] for d in devices(built)] == ["GPU-0000"]
    assert [s.reason for s in built.skipped] == ["index 0 is given twice", "UUID is given twice"]


def test_absurd_counts_stop_at_the_device_limit_of_a_slice_with_taints() -> None:
    built = build(*(gpu(i) for i in range(200)))
    assert len(devices(built)) == 64 == slices.MAX_DEVICES
    assert len(built.skipped) == 136 and {s.reason for s in built.skipped} == {
        "a slice holds at most 64 devices"
    }


def test_no_gpus_is_a_slice_without_devices() -> None:
    built = build()
    assert "devices" not in built.body["spec"] and built.skipped == ()


@pytest.mark.parametrize("length", [1, 200, 234, 235, 253])
def test_slice_names_are_dns_subdomains_within_253(length: int) -> None:
    node = ("a" * 62 + ".") * 4
    node = node[: length - 1] + "z"
    name = slices.slice_name(node)
    assert valid_dns_subdomain(name), name
    if length + 1 + len(names.DRIVER) <= 253:
        assert name == f"{node}-{names.DRIVER}"
    else:
        other = slices.slice_name(node[:-1] + "y")
        assert name != other and name.endswith(f"-{names.DRIVER}")


def test_slice_names_with_a_cut_before_a_dot_stay_valid() -> None:
    node = "a" * 225 + "." + "b" * 27  # the cut falls on the dot
    assert valid_dns_subdomain(slices.slice_name(node))


# ----- reconcile: what to write over what is stored -----


def stored_from(body: dict[str, Any], *, rv: str = "7", time: str = "2026-12-07T10:00:00Z") -> dict[str, Any]:
    """``body`` as kube-apiserver answers it: resourceVersion, uid, and taints stamped."""
    out = copy.deepcopy(body)
    out["metadata"].update({"resourceVersion": rv, "uid": "slice-uid", "generation": 3})
    for dev in out["spec"].get("devices") or []:
        for taint in dev.get("taints") or []:
            taint.setdefault("timeAdded", time)
    return out


def test_reconcile_creates_when_nothing_is_stored_and_skips_when_nothing_changed() -> None:
    desired = build(gpu(0), gpu(1, health=False)).body
    assert slices.reconcile(None, desired) == desired
    stored = stored_from(desired)
    stored["spec"]["pool"]["generation"] = 9  # another generation alone is no change
    assert slices.reconcile(stored, desired) is None


def test_reconcile_bumps_the_generation_on_each_change_and_keeps_what_is_not_ours() -> None:
    stored = stored_from(build(gpu(0), gpu(1)).body)
    stored["spec"]["pool"]["generation"] = 4
    stored["metadata"]["labels"] = {"team": "a"}
    body = slices.reconcile(stored, build(gpu(0), gpu(1, health=False)).body)
    assert body is not None
    assert body["spec"]["pool"]["generation"] == 5
    assert body["metadata"]["resourceVersion"] == "7"  # compare-and-swap on what was read
    assert body["metadata"]["labels"] == {"team": "a"}
    assert "timeAdded" not in body["spec"]["devices"][1]["taints"][0]  # new taint: the server stamps it
    again = slices.reconcile(stored_from(body, rv="8"), build(gpu(0), gpu(1)).body)
    assert again is not None and again["spec"]["pool"]["generation"] == 6


def test_reconcile_carries_a_stored_taint_time_over() -> None:
    desired = build(gpu(0, health=False), gpu(1, health=False)).body
    stored = stored_from(desired, time="2026-01-01T00:00:00Z")
    del stored["spec"]["devices"][1]["taints"]  # gpu-1's taint is new in desired
    body = slices.reconcile(stored, desired)
    assert body is not None
    assert body["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2026-01-01T00:00:00Z"
    assert "timeAdded" not in body["spec"]["devices"][1]["taints"][0]


def test_reconcile_writes_when_the_owner_changes() -> None:
    stored = stored_from(build(gpu(0), node_uid="old").body)
    assert slices.reconcile(stored, build(gpu(0), node_uid="old").body) is None
    body = slices.reconcile(stored, build(gpu(0), node_uid="new").body)
    assert body is not None and body["metadata"]["ownerReferences"][0]["uid"] == "new"
    kept = slices.reconcile(stored, build(gpu(1)).body)  # no owner known now: the stored one stays
    assert kept is not None and kept["metadata"]["ownerReferences"][0]["uid"] == "old"


@pytest.mark.parametrize(
    ("spec", "whose"),
    [
        ({"driver": names.DRIVER, "nodeName": "n1", "pool": {"name": "n1"}}, "ours"),
        ({"driver": names.DRIVER, "nodeName": "n2", "pool": {"name": "n1"}}, "stale"),
        ({"driver": names.DRIVER, "nodeName": "n1", "pool": {"name": "other"}}, "stale"),
        ({"driver": names.DRIVER, "nodeName": "n1", "pool": "garbage"}, "stale"),
        ({"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": {"name": "n1"}}, "foreign"),
        ("garbage", "foreign"),
        (None, "foreign"),
    ],
)
def test_ownership(spec: Any, whose: str) -> None:
    assert slices.ownership({"spec": spec}, node="n1") == whose


def test_taints_dropped_is_seen_only_when_taints_were_sent() -> None:
    sent = build(gpu(0, health=False)).body
    assert slices.taints_dropped(sent, stored_from(sent)) is False
    dropped = copy.deepcopy(sent)
    del dropped["spec"]["devices"][0]["taints"]
    assert slices.taints_dropped(sent, dropped) is True
    assert slices.taints_dropped(build(gpu(0)).body, build(gpu(0)).body) is False


# ----- every published device keeps kube-apiserver 1.36's rules (validation.go) -----


def _value(q: str) -> int:
    return int(quantity.parse(q, field="q"))


def check_request_policy(capacity: dict[str, Any]) -> None:
    """validateRequestPolicyRange, restated: default, min <= default <= max <= value,
    min + step <= value, default - min and max - min multiples of step."""
    value = _value(capacity["value"])
    policy = capacity["requestPolicy"]
    rng = policy["validRange"]
    default, low, step = _value(policy["default"]), _value(rng["min"]), _value(rng["step"])
    high = _value(rng["max"]) if "max" in rng else None
    assert 0 <= low <= default <= value and low + step <= value
    assert (default - low) % step == 0
    if high is not None:
        assert low <= high <= value and default <= high and (high - low) % step == 0


gpus_strategy = st.builds(
    Gpu,
    uuid=st.text(max_size=70).map(GpuUuid),
    index=st.integers(-3, 300),
    count=st.integers(0, 100),
    memory_mib=st.one_of(st.integers(-5, 200000), st.just(2**44)),
    cores=st.integers(-5, 2000),
    type=st.text(max_size=90),
    numa=st.integers(-2, 2**32),
    mode=st.sampled_from(list(Mode)),
    health=st.booleans(),
)


@given(st.lists(gpus_strategy, max_size=80), st.booleans())
def test_whatever_the_inventory_the_slice_keeps_the_api_rules(gpus: list[Gpu], taints: bool) -> None:
    built = build(*gpus, taints=taints)
    devs = devices(built)
    assert len(devs) + len(built.skipped) == len(gpus)
    assert len(devs) <= 64
    assert len({d["name"] for d in devs}) == len(devs)
    for dev in devs:
        assert DNS_LABEL.match(dev["name"]) and len(dev["name"]) <= 63
        assert len(dev["attributes"]) + len(dev.get("capacity") or {}) <= 32
        for attr in dev["attributes"].values():
            (kind, value), *more = attr.items()
            assert not more
            if kind in ("string", "version"):
                assert len(value.encode()) <= 64
            if kind == "int":
                assert -(2**63) <= value < 2**63
        for capacity in (dev.get("capacity") or {}).values():
            check_request_policy(capacity)
        if not taints:
            assert "taints" not in dev


def test_the_bodies_validate_against_the_1_36_openapi_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for body in (
        build(gpu(0), gpu(1, health=False), gpu(2, mode=Mode.MIG), node_uid="u").body,
        build().body,
    ):
        kv.validate(body, "1.36.0", strict=True)
