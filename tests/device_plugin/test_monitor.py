"""The usage monitor end to end: region directories mapped to this node's pods, HAMi's metric names
and labels with the driver's figures, series of gone pods removed, bad files skipped and logged once,
and ``vgpu-monitor`` serving /metrics over HTTP."""

from __future__ import annotations

import asyncio
import logging
import pathlib
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from vgpu.gpu import fake
from vgpu_device_plugin import config, hostfs
from vgpu_device_plugin.monitor import exporter, main, mapping

from tests.device_plugin.builders import GPU_A, GPU_B, NODE, StoreView, add_pod, cluster, fake_backend
from tests.device_plugin.regionfile import RegionSpec, Slot, build

MIB = 1 << 20
NOW = 1_800_000_000.0


def _region(uuid: str = GPU_A, *, used_mib: int = 100, limit_mib: int = 3000, host_pid: int = 5000) -> bytes:
    return build(
        RegionSpec(
            uuids=[uuid],
            limits=[limit_mib * MIB],
            slots=[
                Slot(7, host_pid, {0: (2 * MIB, 3 * MIB, (used_mib - 5) * MIB, 0, used_mib * MIB)}, {0: 42})
            ],
            last_kernel_time=int(NOW) - 30,
        )
    )


def _container_dir(root: pathlib.Path, pod: dict[str, Any], container: str) -> pathlib.Path:
    path = root / f"{pod['metadata']['uid']}_{container}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _families(body: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def _samples(families: dict[str, Any], name: str) -> list[tuple[dict[str, str], float]]:
    family = families.get(name)
    return [] if family is None else [(s.labels, s.value) for s in family.samples]


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("0b3c5a5e-1d2f-4c1a-9e2b-0123456789ab_main", ("0b3c5a5e-1d2f-4c1a-9e2b-0123456789ab", "main")),
        ("abc-123_side-car", ("abc-123", "side-car")),
        ("abc_", None),
        ("_main", None),
        ("abc", None),
        ("abc_Main", None),
        ("abc_a_b", None),
        ("../x_main", None),
        (".hidden_main", None),
    ],
    ids=[
        "uid",
        "dashes",
        "no-container",
        "no-uid",
        "no-separator",
        "upper",
        "two-separators",
        "dots",
        "not-hex",
    ],
)
def test_split_dir_name(name: str, want: tuple[str, str] | None) -> None:
    assert mapping.split_dir_name(name) == want


def test_pods_on_node_skips_garbage() -> None:
    pods = [
        {"metadata": {"uid": "u1", "namespace": "ns", "name": "a"}, "spec": {"containers": [{"name": "c"}]}},
        {"metadata": "garbage", "spec": {}},
        {"metadata": {"uid": 5, "namespace": "ns", "name": "b"}, "spec": {}},
        {"metadata": {"uid": "u3", "namespace": "ns", "name": "c"}, "spec": {"containers": "nope"}},
    ]
    got = mapping.pods_on_node(pods)
    assert set(got) == {"u1", "u3"}
    assert got["u1"].containers == frozenset({"c"}) and got["u3"].containers == frozenset()


class Scene:
    """A node with two GPUs, pods in a local store, the containers directory in tmp_path."""

    def __init__(self, tmp_path: pathlib.Path) -> None:
        self.store, self.api = cluster()
        self.view = StoreView(self.store)
        self.dir = tmp_path / "usr/local/vgpu/containers"
        self.dir.mkdir(parents=True)
        self.backend: fake.FakeGpuBackend = fake_backend()
        self.backend.open()
        self.monitor = exporter.Monitor(
            backend=self.backend, view=self.view, containers_dir=self.dir, node=NODE, clock=lambda: NOW
        )

    def pod(self, name: str, containers: tuple[str, ...] = ("main",)) -> dict[str, Any]:
        return add_pod(self.store, name, to_allocate=None, phase="success", containers=containers)

    def region(
        self, pod: dict[str, Any], container: str, data: bytes, file: str = "a1b2.cache"
    ) -> pathlib.Path:
        path = _container_dir(self.dir, pod, container) / file
        path.write_bytes(data)
        return path

    async def scrape(self) -> dict[str, Any]:
        return _families(await self.monitor.scrape())


async def test_container_series_carry_hamis_names_labels_and_the_drivers_figures(
    tmp_path: pathlib.Path,
) -> None:
    s = Scene(tmp_path)
    web = s.pod("web")
    s.region(web, "main", _region(GPU_A, used_mib=100, limit_mib=3000, host_pid=5000))
    s.backend.set_memory_usage(GPU_A, reserved_mib=50, processes={5000: 180, 6000: 999})
    s.backend.set_utilization(GPU_A, 64)
    got = await s.scrape()
    labels = {
        "podnamespace": "default",
        "podname": "web",
        "ctrname": "main",
        "vdeviceid": "0",
        "deviceuuid": GPU_A,
        "zone": "vGPU",
    }
    assert _samples(got, "vGPU_device_memory_usage_in_bytes") == [(labels, 100 * MIB)]
    assert _samples(got, "vGPU_device_memory_limit_in_bytes") == [(labels, 3000 * MIB)]
    assert _samples(got, "Device_utilization_desc_of_container") == [(labels, 42)]
    assert _samples(got, "Device_last_kernel_of_container") == [(labels, 30)]
    assert _samples(got, "vGPU_device_memory_context_size_bytes") == [(labels, 2 * MIB)]
    assert _samples(got, "vGPU_device_memory_buffer_size_bytes") == [(labels, 95 * MIB)]
    [(desc, value)] = _samples(got, "Device_memory_desc_of_container")
    assert value == 100 * MIB and desc["module"] == str(3 * MIB) and desc["data"] == str(95 * MIB)
    # the driver's own count of the container's processes (host pid 5000 only)
    nvml = _samples(got, "vgpu_monitor_container_nvml_memory_used_bytes")
    assert nvml == [
        (
            {
                "podnamespace": "default",
                "podname": "web",
                "ctrname": "main",
                "deviceuuid": GPU_A,
                "zone": "vGPU",
            },
            180 * MIB,
        )
    ]
    host = {
        (lab["deviceuuid"], lab["deviceidx"], lab["nodeid"]): v
        for lab, v in _samples(got, "HostGPUMemoryUsage")
    }
    assert host == {(GPU_A, "0", NODE): (50 + 180 + 999) * MIB, (GPU_B, "1", NODE): 0}
    cores = {lab["deviceuuid"]: v for lab, v in _samples(got, "HostCoreUtilization")}
    assert cores == {GPU_A: 64, GPU_B: 0}


async def test_only_dirs_of_pods_on_this_node_count_and_gone_pods_leave_no_series(
    tmp_path: pathlib.Path,
) -> None:
    s = Scene(tmp_path)
    web, db = s.pod("web"), s.pod("db", containers=("main", "sidecar"))
    s.region(web, "main", _region(GPU_A))
    s.region(db, "sidecar", _region(GPU_B, used_mib=700))
    _container_dir(s.dir, db, "main")  # CUDA not used yet: no region file
    (s.dir / "0000-dead_main").mkdir()  # a pod that is gone
    s.region(web, "ghost", _region(GPU_A))  # no such container in the pod
    (s.dir / "not-a-dir_main").write_bytes(_region(GPU_A))
    got = await s.scrape()
    assert {
        (lab["podname"], lab["ctrname"]) for lab, _ in _samples(got, "vGPU_device_memory_usage_in_bytes")
    } == {
        ("web", "main"),
        ("db", "sidecar"),
    }
    dirs = {lab["state"]: v for lab, v in _samples(got, "vgpu_monitor_container_dirs")}
    assert dirs == {"read": 2, "unreadable": 0, "no_region_yet": 1, "not_of_a_pod_here": 2}
    s.store.delete("pods", "db", namespace="default")
    got = await s.scrape()
    assert {lab["podname"] for lab, _ in _samples(got, "vGPU_device_memory_usage_in_bytes")} == {"web"}
    assert not [
        lab for lab, _ in _samples(got, "Device_utilization_desc_of_container") if lab["podname"] == "db"
    ]


async def test_bad_files_are_skipped_and_logged_once_per_problem(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Scene(tmp_path)
    good, bad = s.pod("good"), s.pod("bad")
    s.region(good, "main", _region(GPU_A))
    path = s.region(bad, "main", _region(GPU_B)[:5000])
    caplog.set_level(logging.WARNING, logger=exporter.__name__)
    for _ in range(3):
        got = await s.scrape()
        assert {lab["podname"] for lab, _ in _samples(got, "vGPU_device_memory_usage_in_bytes")} == {"good"}
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: skipped: truncated: 5000 bytes, a version 1.0 region needs 2008952"
    ]
    path.write_bytes(b"\x7fELF" + bytes(100))  # a different problem: logged again
    await s.scrape()
    assert len(caplog.records) == 2 and "not a HAMi-core shared region" in caplog.records[1].getMessage()
    path.write_bytes(_region(GPU_B))  # repaired: read again
    got = await s.scrape()
    assert {lab["podname"] for lab, _ in _samples(got, "vGPU_device_memory_usage_in_bytes")} == {
        "good",
        "bad",
    }
    assert len(caplog.records) == 2


async def test_a_failing_driver_drops_host_series_not_the_containers(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Scene(tmp_path)
    s.region(s.pod("web"), "main", _region(GPU_A))
    s.backend.fail_memory_usage("Unknown Error")
    caplog.set_level(logging.WARNING, logger=exporter.__name__)
    got = await s.scrape()
    await s.scrape()
    assert _samples(got, "HostGPUMemoryUsage") == [] and _samples(got, "HostCoreUtilization") == []
    assert len(_samples(got, "vGPU_device_memory_usage_in_bytes")) == 1
    assert _samples(got, "vgpu_monitor_container_nvml_memory_used_bytes") == []
    assert len(caplog.records) == 2  # one per GPU, not one per scrape


async def test_vgpu_monitor_serves_metrics_over_http(tmp_path: pathlib.Path) -> None:
    store, api = cluster()
    pod = add_pod(store, "web", to_allocate=None, phase="success")
    containers = tmp_path / "usr/local/vgpu/containers"
    (_container_dir(containers, pod, "main") / "x.cache").write_bytes(_region(GPU_A))
    args = main.parser().parse_args(
        ["--node-name", NODE, "--host-root", str(tmp_path), "--metrics-bind-address", "127.0.0.1:0"]
    )
    settings = config.settings(args, {})
    assert main.containers_dir(settings) == containers
    backend = fake_backend()
    backend.open()
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        main.run(
            settings, api=api, backend=backend, address=args.metrics_bind_address, stop=stop, ready=ready
        )
    )
    address = await ready
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{address}/metrics") as resp:  # ready: the pod cache has synced
            assert resp.status == 200
            text = await resp.text()
        assert 'vGPU_device_memory_usage_in_bytes{ctrname="main",deviceuuid="' in text
        assert 'podname="web"' in text
        async with session.get(f"http://{address}/healthz") as resp:
            assert resp.status == 200
    stop.set()
    assert await task == 0


@pytest.mark.parametrize("address", ["9394", "host:port", "h:99999"])
def test_bad_bind_address_is_a_config_error(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["--node-name", NODE, "--metrics-bind-address", address]) == 2
    assert "--metrics-bind-address" in capsys.readouterr().err


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=80))
def test_any_directory_name_is_split_or_refused(name: str) -> None:
    got = mapping.split_dir_name(name)
    if got is not None:
        uid, container = got
        assert f"{uid}_{container}" == name and "/" not in name and "_" not in container


@settings(max_examples=200, deadline=None)
@given(
    pods=st.lists(st.dictionaries(st.sampled_from(["metadata", "spec", "status"]), json_values), max_size=4)
)
def test_any_cached_pod_shape_is_read_or_left_out(pods: list[dict[str, Any]]) -> None:
    for ref in mapping.pods_on_node(pods).values():
        assert ref.uid and isinstance(ref.name, str) and all(isinstance(c, str) for c in ref.containers)


def test_the_monitor_reads_the_directories_allocate_creates(tmp_path: pathlib.Path) -> None:
    """Allocate's host directory (HostFs) and the monitor's containers dir are the same place."""
    args = main.parser().parse_args(["--node-name", NODE, "--host-root", str(tmp_path)])
    settings = config.settings(args, {})
    host = hostfs.HostFs(tmp_path, hook_path=settings.device_plugin.hook_path)
    store, _ = cluster()
    pod = add_pod(store, "web", to_allocate=None, phase="success")
    host_dir = host.container_dir(pod["metadata"]["uid"], "main")
    (tmp_path / host_dir.lstrip("/") / "f00d.cache").write_bytes(_region(GPU_A))
    found = mapping.scan(main.containers_dir(settings), mapping.pods_on_node([pod]))
    assert [(r.pod.name, r.container) for r in found.regions] == [("web", "main")]
