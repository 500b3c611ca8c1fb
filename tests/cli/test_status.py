"""``vgpu status`` against the local cluster's store (``LocalKubeApi``): the table's numbers, plugin
liveness from leases, corrupt annotations shown with their reason, and ``--watch`` refreshing."""

from __future__ import annotations

import asyncio
import datetime
import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu.core import annotations, config, errors
from vgpu.core.device import Gpu, GpuUsage, GpuUuid
from vgpu.kube.port import ObjectList
from vgpu.localcluster.client import LocalKubeApi
from vgpu.localcluster.store import Store
from vgpu.status import command, snapshot, table

CFG = config.load(None)
KEYS = annotations.KEYS
NOW = datetime.datetime(2026, 11, 23, 2, 0, 0, tzinfo=datetime.UTC)


def micro(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node(name: str, notes: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": notes or {}}}


def lease(node_name: str, renewed: datetime.datetime) -> dict[str, Any]:
    return {
        "metadata": {"name": f"vgpu-device-plugin-{node_name}", "namespace": "kube-system"},
        "spec": {"holderIdentity": node_name, "leaseDurationSeconds": 40, "renewTime": micro(renewed)},
    }


def pod(name: str, node_name: str | None, devices: str | None, *, init: int = 0) -> dict[str, Any]:
    notes = {}
    if node_name is not None:
        notes[KEYS.assigned_node] = node_name
    if devices is not None:
        notes[KEYS.devices_allocated] = devices
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if init:
        spec["initContainers"] = [{"name": f"init{i}"} for i in range(init)]
    return {"metadata": {"name": name, "namespace": "default", "annotations": notes}, "spec": spec}


A0, A1, B0 = GpuUuid("GPU-a0"), GpuUuid("GPU-a1"), GpuUuid("GPU-b0")


def populate(store: Store) -> None:
    a = [Gpu(A0, 0, 10, 40960, 100, "NVIDIA-A100"), Gpu(A1, 1, 10, 40960, 100, "NVIDIA-A100", health=False)]
    b = [Gpu(B0, 0, 4, 15360, 100, "NVIDIA-Tesla T4", numa=1)]
    store.create("nodes", node("gpu-a", {KEYS.node_register: annotations.encode_node_register(a)}))
    store.create(
        "nodes",
        node(
            "gpu-b", {KEYS.node_register: annotations.encode_node_register(b), KEYS.device_cordon: "GPU-b0"}
        ),
    )
    store.create("nodes", node("gpu-c", {KEYS.node_register: '[{"id": "GPU-c0", "count": "ten"}]'}))
    store.create("nodes", node("cpu-1"))
    store.create("leases", lease("gpu-a", NOW - datetime.timedelta(seconds=5)), namespace="kube-system")
    store.create("leases", lease("gpu-b", NOW - datetime.timedelta(seconds=75)), namespace="kube-system")
    store.create("pods", pod("p1", "gpu-a", "GPU-a0,NVIDIA,4000,30:;"), namespace="default")
    store.create(
        "pods", pod("p2", "gpu-a", "GPU-a0,NVIDIA,1000,10:;GPU-a0,NVIDIA,2000,20:;"), namespace="default"
    )
    done = store.create("pods", pod("p3", "gpu-a", "GPU-a0,NVIDIA,9999,99:;"), namespace="default")
    done["status"] = {"phase": "Succeeded"}
    store.update("pods", done, namespace="default", subresource="status")
    store.create(
        "pods",
        pod("p4", "gpu-b", "GPU-b0,NVIDIA,8000,50:;GPU-b0,NVIDIA,3000,20:;", init=1),
        namespace="default",
    )
    store.create("pods", pod("p5", "gpu-b", "GPU-b0,NVIDIA,lots,0:;"), namespace="default")
    store.create("pods", pod("p6", "gpu-a", "GPU-zz,NVIDIA,100,0:;"), namespace="default")
    store.create("pods", pod("p7", None, None), namespace="default")
    store.create("pods", pod("p8", "gone-node", "GPU-x,NVIDIA,1,0:;"), namespace="default")


@pytest.fixture
def api() -> LocalKubeApi:
    store = Store()
    populate(store)
    return LocalKubeApi(store)


async def test_collect_rebuilds_usage_liveness_and_problems(api: LocalKubeApi) -> None:
    """gpu-a GPU 0: p1 (4000 MiB, 30 %) + p2's two containers (1000 + 2000 MiB, 10 + 20 %, 2 slots)
    = 7000 MiB, 60 %, 3 slots; p3 has Succeeded and does not count. gpu-b GPU 0: p4's init container
    (8000, 50) runs before its app container (3000, 20): the collapse takes the larger, 8000 / 50 /
    1 slot. Lease ages: gpu-a 5 s (reporting), gpu-b 75 s > 40 s (not reporting), gpu-c none."""
    snap = await snapshot.collect(api, config=CFG, now=lambda: NOW)
    assert [n.name for n in snap.nodes] == ["gpu-a", "gpu-b", "gpu-c"]
    assert snap.other_nodes == 1
    a, b, c = snap.nodes
    assert (a.reporting, a.lease_age_s) == (True, 5.0)
    assert [(r.gpu.uuid, r.used, r.pods, r.gpu.health) for r in a.gpus] == [
        (A0, GpuUsage(slots=3, memory_mib=7000, cores=60), ("default/p1", "default/p2"), True),
        (A1, GpuUsage(), (), False),
    ]
    assert a.warnings == ("pod default/p6 holds GPU-zz, which the node does not register",)
    assert (b.reporting, b.lease_age_s) == (False, 75.0)
    [row] = b.gpus
    assert (row.used, row.pods, row.cordoned) == (
        GpuUsage(slots=1, memory_mib=8000, cores=50),
        ("default/p4",),
        True,
    )
    assert len(b.warnings) == 1 and b.warnings[0].startswith("pod default/p5: ") and "memory" in b.warnings[0]
    assert c.reporting is None and c.gpus == ()
    assert c.problem.startswith("corrupt register annotation: ") and "count" in c.problem
    assert snap.warnings == ("pods assigned to node gone-node, which does not exist: default/p8",)


async def test_render_shows_the_table(api: LocalKubeApi) -> None:
    text = table.render(await snapshot.collect(api, config=CFG, now=lambda: NOW))
    lines = text.splitlines()
    assert (
        lines[0]
        == "kube-vgpu status at 2026-11-23 02:00:00 UTC: 3 GPU nodes (1 other nodes without GPUs registered)"
    )
    row_a0 = next(line for line in lines if line.startswith("gpu-a"))
    assert row_a0.split() == [
        "gpu-a",
        "reporting",
        "(5s",
        "ago)",
        "0",
        "A100",
        "ok",
        "7000/40960",
        "17.1%",
        "-",
        "60/100",
        "3/10",
        "default/p1,default/p2",
    ]
    row_b0 = next(line for line in lines if line.startswith("gpu-b"))
    assert "NOT REPORTING (75s ago)" in row_b0 and "cordoned" in row_b0 and "8000/15360" in row_b0
    row_c = next(line for line in lines if line.startswith("gpu-c"))
    assert row_c.split() == ["gpu-c", "no", "lease", "-", "-", "UNREADABLE"]
    assert (
        "  ! gpu-c: corrupt register annotation: hami.io/node-nvidia-register[0].count: expected an integer, got 'ten'"
        in lines
    )
    assert any("UNHEALTHY" in line for line in lines)
    assert "  ! gpu-a: pod default/p6 holds GPU-zz, which the node does not register" in lines
    assert (
        lines[-1]
        == "allocated: memory 15000/97280 MiB (15.4%), cores 110/300 (36.7%), slots 4/24; 3 GPUs, 1 unhealthy"
    )


async def test_watch_refreshes_until_stopped(api: LocalKubeApi) -> None:
    out, err = io.StringIO(), io.StringIO()
    stop = asyncio.Event()
    frames: list[snapshot.ClusterStatus] = []

    def on_frame(snap: snapshot.ClusterStatus) -> None:
        frames.append(snap)
        if len(frames) == 1:  # the cluster changes between two refreshes
            api.store.create("pods", pod("late", "gpu-a", "GPU-a0,NVIDIA,500,0:;"), namespace="default")
        else:
            stop.set()

    code = await asyncio.wait_for(
        command.status_loop(
            api,
            config=CFG,
            out=out,
            err=err,
            watch=True,
            interval_s=0.01,
            stop=stop,
            on_frame=on_frame,
            now=lambda: NOW,
        ),
        timeout=10,
    )
    assert code == 0 and err.getvalue() == ""
    assert len(frames) == 2
    assert frames[0].nodes[0].gpus[0].used.memory_mib == 7000
    assert frames[1].nodes[0].gpus[0].used.memory_mib == 7500
    assert out.getvalue().count("kube-vgpu status at") == 2
    assert "default/late" in out.getvalue().split("kube-vgpu status at")[2]


class _Unreachable:
    async def list(self, kind: str, **_: Any) -> ObjectList:
        raise errors.KubeError("connection refused", status=0)


async def test_unreachable_cluster_exits_1() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = await command.status_loop(_Unreachable(), config=CFG, out=out, err=err)  # type: ignore[arg-type]
    assert code == 1 and out.getvalue() == ""
    assert "cannot read the cluster: connection refused" in err.getvalue()


async def test_empty_cluster() -> None:
    text = table.render(await snapshot.collect(LocalKubeApi(Store()), config=CFG, now=lambda: NOW))
    assert "no node registers GPUs" in text


@pytest.mark.parametrize(
    ("opts", "needle"),
    [
        pytest.param({"interval": 0}, "--interval must be a positive", id="zero-interval"),
        pytest.param({"interval": "soon"}, "--interval must be a positive", id="text-interval"),
        pytest.param(
            {"config": "/nonexistent/vgpu.yaml"}, "config file /nonexistent/vgpu.yaml", id="missing-config"
        ),
    ],
)
def test_bad_options_exit_2(opts: dict[str, Any], needle: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert command.run_status(opts, out=out, err=err) == 2
    assert needle in err.getvalue() and out.getvalue() == ""


def test_bad_config_content_exit_2(tmp_path: Any) -> None:
    cfg = tmp_path / "vgpu.yaml"
    cfg.write_text("scheduler: {leaseTimeoutS: -1}\n")
    err = io.StringIO()
    assert command.run_status({"config": str(cfg)}, out=io.StringIO(), err=err) == 2
    assert "leaseTimeoutS" in err.getvalue()


async def test_unreadable_lease_time_is_not_reporting() -> None:
    # a real API server refuses such a Lease (as the emulated one does), but status reads whatever
    # it is given: served here without validation
    gpus = [Gpu(A0, 0, 10, 40960, 100, "NVIDIA-A100")]
    bad = lease("gpu-a", NOW)
    bad["spec"]["renewTime"] = "last tuesday"
    api = _Served(
        {
            "nodes": [node("gpu-a", {KEYS.node_register: annotations.encode_node_register(gpus)})],
            "leases": [bad],
        }
    )
    snap = await snapshot.collect(api, config=CFG, now=lambda: NOW)  # type: ignore[arg-type]
    [n] = snap.nodes
    assert (n.reporting, n.lease_age_s) == (False, None)
    assert "NOT REPORTING (no renew time)" in table.render(snap)


class _Served:
    """A KubeApi fake that lists whatever objects it was given (no validation, unlike the store)."""

    def __init__(self, objects: dict[str, list[Any]]) -> None:
        self.objects = objects

    async def list(self, kind: str, **_: Any) -> ObjectList:
        return ObjectList(self.objects.get(kind, []), "1")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
annotation_values = st.one_of(
    json_values,
    st.sampled_from(
        ["GPU-a0,NVIDIA,1,1:;", "x,y:;", ";;", "[]", "[{}]", '[{"id":"g"}]', "GPU-a0,NVIDIA,-1,0:;"]
    ),
)
k8s_like = st.fixed_dictionaries(
    {
        "metadata": st.one_of(
            json_values,
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["gpu-a", "vgpu-device-plugin-gpu-a", "x"]),
                    "annotations": st.one_of(
                        json_values,
                        st.dictionaries(
                            st.sampled_from(
                                [
                                    KEYS.node_register,
                                    KEYS.assigned_node,
                                    KEYS.devices_allocated,
                                    KEYS.device_cordon,
                                ]
                            ),
                            annotation_values,
                        ),
                    ),
                }
            ),
        ),
        "spec": st.one_of(json_values, st.fixed_dictionaries({"initContainers": json_values})),
        "status": st.one_of(
            json_values,
            st.fixed_dictionaries(
                {
                    "phase": st.sampled_from(["Running", "Succeeded", 3]),
                    "initContainerStatuses": st.one_of(
                        json_values,
                        st.lists(
                            st.one_of(
                                json_values,
                                st.fixed_dictionaries(
                                    {
                                        "state": st.one_of(
                                            json_values, st.fixed_dictionaries({"terminated": json_values})
                                        )
                                    }
                                ),
                            ),
                            max_size=2,
                        ),
                    ),
                }
            ),
        ),
    }
)


@settings(max_examples=200, deadline=None)
@given(st.lists(k8s_like, max_size=3), st.lists(k8s_like, max_size=3), st.lists(k8s_like, max_size=2))
async def test_garbage_objects_never_crash_status(
    nodes: list[Any], pods: list[Any], leases: list[Any]
) -> None:
    api = _Served({"nodes": nodes, "pods": pods, "leases": leases})
    snap = await snapshot.collect(api, config=CFG, now=lambda: NOW)  # type: ignore[arg-type]
    assert table.render(snap).startswith("kube-vgpu status at")


@pytest.mark.parametrize(
    "status_value",
    [
        pytest.param("Running", id="status-a-string"),
        pytest.param([1], id="status-a-list"),
        pytest.param({"initContainerStatuses": "done"}, id="statuses-a-string"),
        pytest.param(
            {"initContainerStatuses": ["x", {"state": "ok"}, {"state": {"terminated": 7}}]}, id="odd-items"
        ),
        pytest.param(
            {"initContainerStatuses": [{"state": {"terminated": {"exitCode": 0}}}]}, id="init-done-unnamed"
        ),
        pytest.param(
            {"initContainerStatuses": [{"name": "init0", "state": {"terminated": {"exitCode": 0}}}]},
            id="init-done",
        ),
    ],
)
async def test_garbage_pod_status_is_read_safely(status_value: Any) -> None:
    """A pod with an init container and a status of any shape still counts (the init peak unless
    the status proves every init container exited 0)."""
    p = pod("p", "gpu-a", "GPU-a0,NVIDIA,8000,0:;GPU-a0,NVIDIA,1000,0:;", init=1)
    p["status"] = status_value
    gpus = [Gpu(A0, 0, 10, 40960, 100, "NVIDIA-A100")]
    api = _Served(
        {"nodes": [node("gpu-a", {KEYS.node_register: annotations.encode_node_register(gpus)})], "pods": [p]}
    )
    [n] = (await snapshot.collect(api, config=CFG, now=lambda: NOW)).nodes  # type: ignore[arg-type]
    done = {"initContainerStatuses": [{"name": "init0", "state": {"terminated": {"exitCode": 0}}}]}
    expected = 1000 if status_value == done else 8000  # (a status names its container)
    assert n.gpus[0].used.memory_mib == expected


async def test_a_plugin_without_gpus_shows_its_reason() -> None:
    store = Store()
    store.create(
        "nodes",
        node("gpu-d", {KEYS.node_register: "[]", KEYS.node_plugin_error: "NVML not available: no driver"}),
    )
    snap = await snapshot.collect(LocalKubeApi(store), config=CFG, now=lambda: NOW)
    [d] = snap.nodes
    assert d.problem == "device plugin has no GPUs: NVML not available: no driver"
    assert "device plugin has no GPUs: NVML not available: no driver" in table.render(snap)


@pytest.mark.parametrize(
    ("raw", "outside", "warning"),
    [
        pytest.param('{"GPU-a0":2000}', 2000, "", id="measured"),
        pytest.param("{}", 0, "", id="nothing-outside"),
        pytest.param("2000", 0, "expected a JSON object", id="garbage"),
        pytest.param('{"GPU-a0":-1}', 0, "expected MiB", id="negative"),
    ],
)
async def test_memory_used_outside_kube_vgpu_is_shown(raw: str, outside: int, warning: str) -> None:
    store = Store()
    gpus = [Gpu(A0, 0, 10, 40960, 100, "NVIDIA-A100")]
    notes = {KEYS.node_register: annotations.encode_node_register(gpus), KEYS.node_outside_usage: raw}
    store.create("nodes", node("gpu-a", notes))
    snap = await snapshot.collect(LocalKubeApi(store), config=CFG, now=lambda: NOW)
    [row] = snap.nodes[0].gpus
    assert row.outside_mib == outside
    text = table.render(snap)
    line = next(line for line in text.splitlines() if line.startswith("gpu-a"))
    assert line.split()[8] == (str(outside) if outside else "-")
    if outside:
        assert text.splitlines()[-1].endswith(f"; {outside} MiB used outside kube-vgpu")
    if warning:
        [note] = snap.nodes[0].warnings
        assert note.startswith("memory used outside kube-vgpu unreadable (the scheduler counts 0): ")
        assert warning in note
    else:
        assert snap.nodes[0].warnings == ()


async def test_the_schedulers_preemptions_are_listed_newest_first() -> None:
    store = Store()
    populate(store)
    api = LocalKubeApi(store)
    involved = {"kind": "Pod", "namespace": "default", "name": "train", "uid": "u1"}
    for i, (reason, message) in enumerate(
        [
            ("Preempting", "evicting 2 pod(s) on node gpu-a to make room: default/a, default/b"),
            ("Preempted", "not listed: the victim's side"),
            ("Preempting", "evicting 1 pod(s) on node gpu-b to make room: default/c"),
        ]
    ):
        store.create(
            "events",
            {
                "metadata": {"name": f"e{i}"},
                "involvedObject": {**involved, "name": f"train-{i}"},
                "reason": reason,
                "message": message,
                "lastTimestamp": f"2026-11-23T01:0{i}:00Z",
            },
            namespace="default",
        )
    store.create(  # garbage: an event without involvedObject
        "events",
        {"metadata": {"name": "bad"}, "reason": "Preempting", "involvedObject": None},
        namespace="default",
    )
    status = await snapshot.collect(api, config=CFG, now=lambda: NOW)
    assert [p[1] for p in status.preemptions] == ["default/train-2", "default/train-0"]
    text = table.render(status)
    assert "preemptions by the scheduler (newest first):" in text
    assert "2026-11-23T01:02:00Z  default/train-2: evicting 1 pod(s) on node gpu-b to make room" in text
