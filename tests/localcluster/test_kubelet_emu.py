"""The kubelet emulation against a small device plugin over real unix sockets and real gRPC."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
from typing import Any

import grpc
import pytest
from vgpu.kubeletapi.v1beta1 import api_pb2
from vgpu.localcluster.kubelet import ALLOCATIONS_ANNOTATION, KubeletEmulator
from vgpu.localcluster.store import Store

RES = "example.com/gpu"  # the test plugin's resource (conftest.Plugin)


@pytest.fixture
async def kubelet(env, sock_dir, status_writer):
    await env.add_node("n1")
    emu = KubeletEmulator(
        env.api, node="n1", socket_dir=sock_dir, status_writer=status_writer, dial_timeout_s=0.5
    )
    await emu.start()
    yield emu
    await emu.stop()


def healthy(*ids: str) -> list[tuple[str, str]]:
    return [(i, "Healthy") for i in ids]


def node_has(resource: str, *, capacity: str, allocatable: str):
    def check(node: dict[str, Any]) -> bool:
        status = node.get("status", {})
        return (status.get("capacity", {}).get(resource), status.get("allocatable", {}).get(resource)) == (
            capacity,
            allocatable,
        )

    return check


def phase(expected: str):
    return lambda pod: pod.get("status", {}).get("phase") == expected


async def start_plugin(env, kubelet, plugins, devices, **options) -> Any:
    plugin = plugins(devices, **options)
    await plugin.serve(kubelet.socket_dir)
    await plugin.register(kubelet.socket_dir)
    await env.wait_for(
        "nodes",
        "n1",
        node_has(
            RES, capacity=str(len(devices)), allocatable=str(sum(1 for _, h in devices if h == "Healthy"))
        ),
        namespace=None,
    )
    return plugin


# ----- registration -----


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"version": "v1alpha"},
            'requested API version "v1alpha" is not supported by kubelet. Supported versions are ["v1beta1"]',
        ),
        ({"version": ""}, 'requested API version "" is not supported by kubelet'),
        ({"resource": "gpu"}, 'the ResourceName "gpu" is invalid'),
        ({"resource": "kubernetes.io/gpu"}, 'the ResourceName "kubernetes.io/gpu" is invalid'),
        ({"resource": "requests.example.com/gpu"}, 'the ResourceName "requests.example.com/gpu" is invalid'),
        ({"resource": "Example.com/gpu"}, 'the ResourceName "Example.com/gpu" is invalid'),
        ({"resource": "example.com/a/b"}, 'the ResourceName "example.com/a/b" is invalid'),
        ({"endpoint": "nobody-listens.sock"}, "failed to dial device plugin: dial unix"),
    ],
    ids=[
        "old-version",
        "no-version",
        "no-domain",
        "native",
        "requests-prefix",
        "upper-case",
        "two-slashes",
        "no-endpoint",
    ],
)
async def test_register_is_validated_like_kubelet(kubelet, plugins, kwargs, message):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plugins([]).register(kubelet.socket_dir, **kwargs)
    assert info.value.code() == grpc.StatusCode.UNKNOWN
    assert (info.value.details() or "").startswith(message)
    assert kubelet.options == {}


async def test_register_reads_options_from_get_device_plugin_options(env, kubelet, plugins):
    plugin = plugins(healthy("d0"), get_preferred_allocation_available=True)
    await plugin.serve(kubelet.socket_dir)
    # the RegisterRequest's own options disagree: a newer kubelet believes GetDevicePluginOptions
    await plugin.register(kubelet.socket_dir, options=api_pb2.DevicePluginOptions(pre_start_required=True))
    assert kubelet.options[RES] == api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)


# ----- ListAndWatch → node status -----


async def test_list_and_watch_sets_capacity_and_allocatable_and_follows_health(env, kubelet, plugins):
    plugin = await start_plugin(
        env, kubelet, plugins, [("d0", "Healthy"), ("d1", "Healthy"), ("d2", "Unhealthy")]
    )
    plugin.updates.put_nowait([("d0", "Healthy"), ("d1", "Unhealthy"), ("d2", "Unhealthy")])
    await env.wait_for("nodes", "n1", node_has(RES, capacity="3", allocatable="1"), namespace=None)
    plugin.updates.put_nowait([("d0", "Healthy"), ("d1", "Healthy"), ("d2", "Healthy"), ("d3", "Healthy")])
    node = await env.wait_for("nodes", "n1", node_has(RES, capacity="4", allocatable="4"), namespace=None)
    assert node["status"]["allocatable"]["cpu"] == "8"  # other resources untouched

    plugin.updates.put_nowait(None)  # the stream ends: every device unhealthy, capacity kept
    await env.wait_for("nodes", "n1", node_has(RES, capacity="4", allocatable="0"), namespace=None)


async def test_re_registration_replaces_the_old_endpoint(env, kubelet, plugins):
    old = await start_plugin(env, kubelet, plugins, healthy("a0", "a1"))
    new = plugins(healthy("b0"))
    await new.serve(kubelet.socket_dir, "new.sock")
    await new.register(kubelet.socket_dir, endpoint="new.sock")
    await env.wait_for("nodes", "n1", node_has(RES, capacity="1", allocatable="1"), namespace=None)
    async with asyncio.timeout(5):
        await old.stream_ended.wait()  # kubelet hung up on the old plugin's stream
    await env.add_pod("p1", limits={RES: 1}, node_name="n1")
    await env.wait_for("pods", "p1", phase("Running"))
    assert old.allocate_calls == [] and new.allocate_calls == [[["b0"]]]


# ----- admission -----


def allocations(pod: dict[str, Any]) -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads(pod["metadata"]["annotations"][ALLOCATIONS_ANNOTATION])
    return recorded


async def test_allocate_per_container_records_the_answers_and_runs_the_pod(env, kubelet, plugins):
    plugin = await start_plugin(
        env, kubelet, plugins, healthy("d0", "d1", "d2", "d3"), pre_start_required=True
    )
    await env.add_pod("p1", limits={RES: 1, "cpu": "1"}, containers=2, init_limits={RES: 2}, node_name="n1")
    pod = await env.wait_for("pods", "p1", phase("Running"))

    # one Allocate per container, each with exactly one ContainerAllocateRequest, init first;
    # the init container's devices are reused by the app containers
    assert plugin.allocate_calls == [[["d0", "d1"]], [["d0"]], [["d1"]]]
    recorded = allocations(pod)
    assert set(recorded) == {"init", "c0", "c1"}
    assert recorded["c1"] == {
        "devices": ["d1"],
        "resources": {RES: ["d1"]},
        "envs": {"VISIBLE": "d1"},
        "mounts": [{"containerPath": "/usr/lib/x.so", "hostPath": "/opt/x.so", "readOnly": True}],
        "devices_specs": [{"containerPath": "/dev/x0", "hostPath": "/dev/x0", "permissions": "rw"}],
        "annotations": {"a": "b"},
        "cdiDevices": ["example.com/gpu=0"],
    }
    assert sorted(plugin.prestart_calls) == [["d0"], ["d0", "d1"], ["d1"]]
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert [c["name"] for c in pod["status"]["containerStatuses"]] == ["c0", "c1"]


async def test_preferred_allocation_is_asked_and_honoured(env, kubelet, plugins):
    plugin = await start_plugin(
        env, kubelet, plugins, healthy("d0", "d1", "d2", "d3"), get_preferred_allocation_available=True
    )
    plugin.preferred = ["d3", "nonexistent", "d2"]
    await env.add_pod("p1", limits={RES: 2}, node_name="n1")
    pod = await env.wait_for("pods", "p1", phase("Running"))
    assert plugin.preferred_calls == [(["d0", "d1", "d2", "d3"], [], 2)]
    assert allocations(pod)["c0"]["devices"] == ["d3", "d2"]
    plugin.preferred = ["d3"]  # taken already: ignored, kubelet fills up from what is free
    await env.add_pod("p2", limits={RES: 2}, node_name="n1")
    pod = await env.wait_for("pods", "p2", phase("Running"))
    assert plugin.preferred_calls[1] == (["d0", "d1"], [], 2)
    assert allocations(pod)["c0"]["devices"] == ["d0", "d1"]


async def test_allocate_error_fails_the_pod_as_unexpected_admission_error(env, kubelet, plugins):
    plugin = await start_plugin(env, kubelet, plugins, healthy("d0"))
    plugin.allocate_error = "no pending pod matches"
    await env.add_pod("p1", limits={RES: 1}, node_name="n1")
    pod = await env.wait_for("pods", "p1", phase("Failed"))
    expected = (
        "Allocate failed due to rpc error: code = Unknown desc = no pending pod matches, which is unexpected"
    )
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert pod["status"]["message"] == f"Pod was rejected: {expected}"
    event = await env.wait_event("p1", reason="UnexpectedAdmissionError")
    assert (event["type"], event["message"]) == ("Warning", expected)
    assert kubelet.devices.in_use(RES) == set()  # nothing stays held by a rejected pod


async def test_devices_in_use_are_not_given_twice_and_are_freed_on_delete(env, kubelet, plugins):
    await start_plugin(env, kubelet, plugins, healthy("d0"))
    await env.add_pod("p1", limits={RES: 1}, node_name="n1")
    await env.wait_for("pods", "p1", phase("Running"))
    await env.add_pod("p2", limits={RES: 1}, node_name="n1")
    pod = await env.wait_for("pods", "p2", phase("Failed"))
    assert pod["status"]["message"] == (
        "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
        f"{RES}. Requested: 1, Available: 0, which is unexpected"
    )
    await env.api.delete("pods", "p1", namespace="default")
    await env.add_pod("p3", limits={RES: 1}, node_name="n1")
    pod = await env.wait_for("pods", "p3", phase("Running"))
    assert allocations(pod)["c0"]["devices"] == ["d0"]


async def test_pods_without_device_limits_just_run(env, kubelet):
    await env.add_pod("p1", limits={"cpu": "1"}, node_name="n1")
    pod = await env.wait_for("pods", "p1", phase("Running"))
    assert ALLOCATIONS_ANNOTATION not in (pod["metadata"].get("annotations") or {})


async def test_pods_are_admitted_one_at_a_time_in_creation_order(sock_dir, env_for, plugins):
    ticks = itertools.count()
    base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    env = env_for(Store(clock=lambda: base + datetime.timedelta(seconds=next(ticks))))
    api = env.api
    await env.add_node("n1")
    kubelet = KubeletEmulator(api, node="n1", socket_dir=sock_dir, status_writer=env.status_writer)
    await kubelet.start()
    plugin = plugins(healthy("d0", "d1", "d2"))
    try:
        await plugin.serve(sock_dir)
        await plugin.register(sock_dir)
        await env.wait_for("nodes", "n1", node_has(RES, capacity="3", allocatable="3"), namespace=None)
        plugin.gate = asyncio.Event()
        for name in ("old", "middle", "young"):
            await env.add_pod(name, limits={RES: 1})  # created in this order, not yet bound
        await api.bind_pod("default", "old", node="n1")
        async with asyncio.timeout(5):
            await plugin.allocate_started.wait()  # the first Allocate is in flight, held at the gate
        await api.bind_pod("default", "young", node="n1")
        await api.bind_pod("default", "middle", node="n1")
        plugin.gate.set()
        for name in ("old", "middle", "young"):
            await env.wait_for("pods", name, phase("Running"))
        order = [allocations(await env.get_pod(n))["c0"]["devices"][0] for n in ("old", "middle", "young")]
        assert order == ["d0", "d1", "d2"]  # admitted oldest first although "young" was bound first
        assert plugin.max_in_allocate == 1
    finally:
        await kubelet.stop()


async def test_restart_wipes_the_dir_and_plugins_must_register_again(env, kubelet, plugins):
    plugin = await start_plugin(env, kubelet, plugins, healthy("d0", "d1"))
    await env.add_pod("p1", limits={RES: 1}, node_name="n1")
    await env.wait_for("pods", "p1", phase("Running"))
    (kubelet.socket_dir / "stale-file").write_text("x")
    (kubelet.socket_dir / "subdir").mkdir()

    await kubelet.restart()
    assert sorted(p.name for p in kubelet.socket_dir.iterdir()) == ["kubelet.sock", "subdir"]
    await env.wait_for("nodes", "n1", node_has(RES, capacity="0", allocatable="0"), namespace=None)

    await plugin.stop()  # the plugin notices and comes back: serve again, register again
    await plugin.serve(kubelet.socket_dir)
    await plugin.register(kubelet.socket_dir)
    await env.wait_for("nodes", "n1", node_has(RES, capacity="2", allocatable="2"), namespace=None)
    await env.add_pod("p2", limits={RES: 1}, node_name="n1")
    pod = await env.wait_for("pods", "p2", phase("Running"))
    assert allocations(pod)["c0"]["devices"] == ["d1"]  # d0 stays with p1 across the restart


async def test_pre_start_failure_keeps_the_pod_from_running(env, kubelet, plugins):
    plugin = await start_plugin(env, kubelet, plugins, healthy("d0"), pre_start_required=True)
    plugin.prestart_error = "device not ready"
    await env.add_pod("p1", limits={RES: 1}, node_name="n1")
    event = await env.wait_event("p1", reason="Failed")
    assert event["message"] == (
        "device plugin PreStartContainer rpc failed with err: "
        "rpc error: code = FailedPrecondition desc = device not ready"
    )
    pod = await env.get_pod("p1")
    assert pod["status"]["phase"] == "Pending" and ALLOCATIONS_ANNOTATION in pod["metadata"]["annotations"]
    assert plugin.prestart_calls == [["d0"]]


async def test_admission_delay_spaces_out_admissions(env, sock_dir):
    await env.add_node("n1")
    kubelet = KubeletEmulator(
        env.api, node="n1", socket_dir=sock_dir, status_writer=env.status_writer, admission_delay_s=0.2
    )
    await kubelet.start()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await env.add_pod("p1", node_name="n1")
        await env.add_pod("p2", node_name="n1")
        await env.wait_for("pods", "p2", phase("Running"))
        assert loop.time() - started >= 0.4  # two admissions, each after its 0.2 s delay
        assert (await env.get_pod("p1"))["status"]["phase"] == "Running"
    finally:
        await kubelet.stop()


@pytest.mark.parametrize(
    "garbage",
    ["not json", "[]", '{"c0": 1}', '{"c0": {}}', '{"c0": {"resources": {"example.com/gpu": "d1"}}}'],
    ids=["not-json", "list", "entry-int", "no-resources", "ids-string"],
)
async def test_a_new_kubelet_holds_the_devices_running_pods_record(env, sock_dir, plugins, garbage):
    await env.add_node("n1")
    for name, annotation in (("valid", json.dumps({"c0": {"resources": {RES: ["d0"]}}})), ("bad", garbage)):
        await env.add_pod(name, limits={RES: 1}, node_name="n1")
        await env.api.merge_patch(
            "pods",
            name,
            {"metadata": {"annotations": {ALLOCATIONS_ANNOTATION: annotation}}},
            namespace="default",
        )
        await env.status_writer.merge_patch_status(
            "pods", name, {"status": {"phase": "Running"}}, namespace="default"
        )
    kubelet = KubeletEmulator(env.api, node="n1", socket_dir=sock_dir, status_writer=env.status_writer)
    await kubelet.start()
    try:
        plugin = plugins(healthy("d0", "d1"))
        await plugin.serve(sock_dir)
        await plugin.register(sock_dir)
        await env.wait_for("nodes", "n1", node_has(RES, capacity="2", allocatable="2"), namespace=None)
        await env.add_pod("new", limits={RES: 1}, node_name="n1")
        pod = await env.wait_for("pods", "new", phase("Running"))
        assert allocations(pod)["c0"]["devices"] == ["d1"]  # d0 belongs to "valid"; "bad" holds nothing
        assert plugin.allocate_calls == [[["d1"]]]
    finally:
        await kubelet.stop()


async def test_a_pod_changed_while_it_waits_for_admission_is_admitted_once(env, sock_dir, plugins):
    """Writes that land during the admission delay (the scheduler's label patch after the Binding)
    must not queue the pod a second time: kubelet admits each pod uid once."""
    await env.add_node("n1")
    kubelet = KubeletEmulator(
        env.api, node="n1", socket_dir=sock_dir, status_writer=env.status_writer, admission_delay_s=0.3
    )
    await kubelet.start()
    try:
        plugin = await start_plugin(env, kubelet, plugins, healthy("d0", "d1"))
        await env.add_pod("p1", limits={RES: 1}, node_name="n1")
        for i in range(20):  # changes spread over the 0.3 s the pod waits (pacing, not synchronisation)
            await env.api.merge_patch(
                "pods", "p1", {"metadata": {"labels": {"n": str(i)}}}, namespace="default"
            )
            await asyncio.sleep(0.02)
        await env.wait_for("pods", "p1", phase("Running"))
        # a later pod is admitted after anything still queued for p1 (creation order)
        await env.add_pod("p2", limits={RES: 1}, node_name="n1")
        await env.wait_for("pods", "p2", phase("Running"))
        assert len(plugin.allocate_calls) == 2, plugin.allocate_calls
    finally:
        await kubelet.stop()
