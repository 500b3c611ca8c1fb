"""``/metrics``: the cached GPU exposition says what prometheus_client would, follows every change,
drops what is gone, and leaves the per-pod series out on request; pending pods by reason."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from vgpu.core import annotations, fit
from vgpu.core import config as core_config
from vgpu.core.config import Config
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid
from vgpu_scheduler import exposition, metrics, routes
from vgpu_scheduler.state import ClusterState

from tests.scheduler.scenario import Cluster, FakeClock, gpu_container

KEYS = annotations.KEYS
MIB = 1 << 20


def _node(name: str, gpus: int = 2, *, kind: str = "NVIDIA-A100", memory_mib: int = 16384) -> dict[str, Any]:
    devices = [Gpu(GpuUuid(f"GPU-{name}-{i}"), i, 10, memory_mib, 100, kind) for i in range(gpus)]
    return {
        "metadata": {
            "name": name,
            "annotations": {KEYS.node_register: annotations.encode_node_register(devices)},
        }
    }


def _pod(
    uid: str, node: str, gpu: str, *, mem: int = 1000, cores: int = 10, name: str | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": uid,
            "name": name or f"pod-{uid}",
            "namespace": "ns",
            "annotations": {
                KEYS.assigned_node: node,
                KEYS.devices_allocated: f"{gpu},NVIDIA,{mem},{cores}:;",
                KEYS.bind_phase: "success",
            },
        },
        "spec": {"nodeName": node, "containers": [{"name": "c"}], "schedulerName": "vgpu-scheduler"},
        "status": {"phase": "Running"},
    }


class _Reference(Collector):
    """The series as prometheus_client objects (how metrics.py rendered them before the cache)."""

    def __init__(self, state: ClusterState, *, pod_series: bool = True) -> None:
        self._state = state
        self._pod_series = pod_series

    def collect(self) -> Iterator[Metric]:
        gpu_labels = ["node", "device_uuid", "device_index", "device_type", "zone"]
        fams = [GaugeMetricFamily(f.name, f.help, labels=gpu_labels) for f in exposition.GPU_FAMILIES]
        fams[2] = GaugeMetricFamily(
            fams[2].name, fams[2].documentation, labels=[*gpu_labels[:3], "device_cores", *gpu_labels[3:]]
        )
        for name, entry in self._state.nodes.items():
            used = self._state.used(name)
            for gpu in entry.gpus:
                u = used.get(gpu.uuid, EMPTY_USAGE)
                labels = [name, gpu.uuid, str(gpu.index), gpu.type, "vGPU"]
                fams[0].add_metric(labels, gpu.memory_mib * MIB)
                fams[1].add_metric(labels, gpu.cores)
                fams[2].add_metric([*labels[:3], str(gpu.cores), *labels[3:]], u.memory_mib * MIB)
                fams[3].add_metric(labels, u.slots)
                fams[4].add_metric(labels, u.cores)
                if gpu.memory_mib:
                    fams[5].add_metric(labels, u.memory_mib / gpu.memory_mib)
        yield from fams
        if not self._pod_series:
            return
        pod_labels = ["namespace", "node", "pod", "container_index", "device_uuid", "zone"]
        pods = [GaugeMetricFamily(f.name, f.help, labels=pod_labels) for f in exposition.POD_FAMILIES]
        for uid, charge in self._state.charges.items():
            pod = str(((self._state.pods.get(uid) or {}).get("metadata") or {}).get("name", uid))
            for uuid, u in charge.usage.items():
                values = [charge.namespace, charge.node, pod, "0", uuid, "vGPU"]
                pods[0].add_metric(values, u.memory_mib * MIB)
                pods[1].add_metric(values, u.cores)
        yield from pods


def _reference(state: ClusterState, *, pod_series: bool = True) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Reference(state, pod_series=pod_series))
    return generate_latest(registry)


def _by_family(text: bytes) -> dict[str, list[str]]:
    """Each family's lines (HELP, TYPE, samples), samples sorted: the order of nodes may differ."""
    out: dict[str, list[str]] = {}
    # lines end at "\n" only: a label value may hold other characters str.splitlines() breaks at
    for line in text.decode().split("\n"):
        if not line:
            continue
        name = line.split(" ")[2] if line.startswith("#") else line.split("{")[0]
        out.setdefault(name, []).append(line)
    return {name: sorted(lines) for name, lines in out.items()}


def _gpu_text(gpus: exposition.GpuExposition, state: ClusterState) -> bytes:
    return gpus.render(gpus.snapshot(state))


def _state(config: Config | None = None) -> ClusterState:
    state = ClusterState(config or Config(), clock=FakeClock())
    state.apply("nodes", "ADDED", _node("n1"))
    state.apply("nodes", "ADDED", _node("n2", 3, kind='odd "type"\\x'))
    state.apply("pods", "ADDED", _pod("a", "n1", "GPU-n1-0", mem=1000, cores=10))
    state.apply("pods", "ADDED", _pod("b", "n1", "GPU-n1-0", mem=2000, cores=30))
    state.apply("pods", "ADDED", _pod("c", "n2", "GPU-n2-2", mem=4096, cores=100))
    return state


def test_cached_text_is_what_prometheus_client_writes() -> None:
    state = _state()
    text = _gpu_text(exposition.GpuExposition(pod_series=True), state)
    assert _by_family(text) == _by_family(_reference(state))
    parsed = {f.name: f for f in text_string_to_metric_families(text.decode())}
    allocated = [
        s for s in parsed["hami_gpu_memory_allocated_bytes"].samples if s.labels["device_uuid"] == "GPU-n1-0"
    ]
    assert [s.value for s in allocated] == [3000 * MIB]
    assert {s.labels["device_type"] for s in parsed["hami_gpu_shared_count"].samples} == {
        "NVIDIA-A100",
        'odd "type"\\x',
    }


def test_each_change_shows_at_the_next_scrape_and_gone_series_leave() -> None:
    state = _state()
    gpus = exposition.GpuExposition(pod_series=True)
    _gpu_text(gpus, state)
    changes = [
        ("pods", "ADDED", _pod("d", "n2", "GPU-n2-0", mem=512, cores=5)),
        ("pods", "DELETED", _pod("a", "n1", "GPU-n1-0")),
        ("nodes", "ADDED", _node("n3", 1)),
        ("nodes", "DELETED", _node("n2")),
        (
            "pods",
            "MODIFIED",
            {**_pod("b", "n1", "GPU-n1-0", mem=2000, cores=30), "status": {"phase": "Succeeded"}},
        ),
    ]
    for kind, event, obj in changes:
        state.apply(kind, event, obj)
        assert _by_family(_gpu_text(gpus, state)) == _by_family(_reference(state)), (kind, event)
    text = _gpu_text(gpus, state).decode()
    assert 'node="n2",zone' not in text.split("# HELP hami_vgpu")[0]  # node n2 is gone: no GPU series
    assert 'pod="pod-c"' in text  # its pods' charges stay until the pods go
    assert 'pod="pod-c"' in text
    assert 'pod="pod-a"' not in text and 'pod="pod-b"' not in text
    assert 'device_uuid="GPU-n3-0"' in text


def test_nothing_changed_reuses_the_text_and_a_change_renders_only_its_node() -> None:
    state = _state()
    gpus = exposition.GpuExposition(pod_series=True)
    first = _gpu_text(gpus, state)
    again = gpus.snapshot(state)
    assert again.generation is None
    assert gpus.render(again) is first
    state.apply("pods", "ADDED", _pod("d", "n2", "GPU-n2-0"))
    snap = gpus.snapshot(state)
    assert [n.name for n in snap.changed] == ["n2"]
    # a pod update that changes nothing shown (its status) does not invalidate the text
    state.apply("pods", "MODIFIED", {**_pod("a", "n1", "GPU-n1-0"), "status": {"phase": "Running", "x": 1}})
    gpus.render(snap)
    assert gpus.snapshot(state).generation is None


def test_a_pod_seen_after_its_reservation_gets_its_name() -> None:
    state = ClusterState(Config(), clock=FakeClock())
    state.apply("nodes", "ADDED", _node("n1"))
    gpus = exposition.GpuExposition(pod_series=True)
    placement = fit.Placement(devices=(), usage={GpuUuid("GPU-n1-1"): GpuUsage(1, 1000, 10)})
    state.reserve("late", namespace="ns", node="n1", placement=placement, devices_raw="x")
    assert 'pod="late"' in _gpu_text(gpus, state).decode()  # the filter's decision, pod not seen yet
    state.apply("pods", "ADDED", {**_pod("late", "n1", "GPU-n1-1", name="web-0"), "spec": {"containers": []}})
    assert 'pod="web-0"' in _gpu_text(gpus, state).decode()


def test_pod_series_can_be_left_out() -> None:
    config = core_config.load({"scheduler": {"metricsPodSeries": False}})
    state = _state(config)
    m = metrics.Metrics(state, clock=FakeClock())
    body = m.render(m.snapshot())
    names = set(metrics.families(body))
    assert "hami_gpu_memory_allocated_bytes" in names
    assert not {f.name for f in exposition.POD_FAMILIES} & names
    assert _by_family(body[: body.index(b"# HELP vgpu_scheduler_nodes")]) == _by_family(
        _reference(state, pod_series=False)
    )


def _pending(
    uid: str, *, node: str = "", phase_ann: str | None = None, scheduler: str = "vgpu-scheduler"
) -> dict:
    ann = {} if phase_ann is None else {KEYS.bind_phase: phase_ann}
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "ns", "annotations": ann},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize(
    ("pod", "reserved", "want"),
    [
        (_pending("u"), False, "unplaced"),
        (_pending("r"), True, "reserved"),
        (_pending("b", node="n1", phase_ann="allocating"), False, "allocating"),
        (_pending("f", node="n1", phase_ann="failed"), False, "allocation_failed"),
        (_pending("s", node="n1", phase_ann="success"), False, None),
        (_pending("o", scheduler="default-scheduler"), False, None),
        ({**_pending("run"), "status": {"phase": "Running"}}, False, None),
        ({"metadata": "garbage", "spec": {"schedulerName": "vgpu-scheduler"}}, False, None),
    ],
    ids=[
        "unplaced",
        "reserved",
        "allocating",
        "failed",
        "allocated",
        "other-scheduler",
        "running",
        "garbage",
    ],
)
def test_pending_reason(pod: dict, reserved: bool, want: str | None) -> None:
    if not isinstance(pod.get("metadata"), dict):
        with pytest.raises(AttributeError):
            metrics.pending_reason(pod, scheduler_name="vgpu-scheduler", keys=KEYS, reserved=reserved)
        return
    assert metrics.pending_reason(pod, scheduler_name="vgpu-scheduler", keys=KEYS, reserved=reserved) == want


def test_pending_pods_are_counted_by_reason() -> None:
    state = _state()
    for pod in (_pending("u1"), _pending("u2"), _pending("b", node="n1", phase_ann="allocating")):
        state.apply("pods", "ADDED", pod)
    m = metrics.Metrics(state, clock=FakeClock())
    parsed = {f.name: f for f in text_string_to_metric_families(m.render(m.snapshot()).decode())}
    counts = {s.labels["reason"]: s.value for s in parsed["vgpu_scheduler_pending_pods"].samples}
    assert counts == {"unplaced": 2, "reserved": 0, "allocating": 1, "allocation_failed": 0}


names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(kind=names, pod_name=names)
@example(kind="0", pod_name="\x1e#")  # a line break to str.splitlines(), not to the exposition format
def test_any_label_text_parses_back(kind: str, pod_name: str) -> None:
    state = ClusterState(Config(), clock=FakeClock())
    state.apply(
        "nodes", "ADDED", _node("n1", 1, kind=kind.replace(":", "").replace(",", "").replace(";", "") or "k")
    )
    state.apply("pods", "ADDED", _pod("a", "n1", "GPU-n1-0", name=pod_name))
    text = _gpu_text(exposition.GpuExposition(pod_series=True), state)
    assert _by_family(text) == _by_family(_reference(state))
    parsed = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert [s.labels["pod"] for s in parsed["hami_vgpu_memory_allocated_bytes"].samples] == [pod_name]


async def test_webhook_latency_is_observed_and_scrapes_follow_the_state(cluster: Cluster) -> None:
    assert cluster.session is not None
    async with cluster.session.post(f"{cluster.url}/webhook", data=b"not a review") as resp:
        assert resp.status == 400
    async with cluster.session.get(f"{cluster.url}/metrics") as resp:
        first = await resp.text()
    assert 'vgpu_scheduler_webhook_duration_seconds_count{outcome="bad_request"} 1.0' in first
    assert 'pod="p"' not in first
    cluster.add_pod("p", gpu_container(mem=3000, cores=25))
    await cluster.synced()
    await cluster.filter("p")
    await cluster.synced()
    async with cluster.session.get(f"{cluster.url}/metrics") as resp:
        second = await resp.text()
    assert 'pod="p"' in second
    # the extender listener's counts: one connection, and the filter was the first call on it
    assert "vgpu_scheduler_extender_connections_total 1.0" in second
    assert 'vgpu_scheduler_extender_requests_total{connection="new",path="/filter"} 1.0' in second
    assert 'connection="kept"' not in second
    await cluster.filter("p")
    async with cluster.session.get(f"{cluster.url}/metrics") as resp:
        third = await resp.text()
    assert 'vgpu_scheduler_extender_requests_total{connection="kept",path="/filter"} 1.0' in third


async def test_a_scrape_is_gzipped_for_a_caller_that_takes_it_and_the_same_text_otherwise(
    cluster: Cluster,
) -> None:
    """Prometheus sends ``Accept-Encoding: gzip``; the body is then about a tenth of the text (its
    TLS encryption is the loop's work), and it says the same."""
    assert cluster.session is not None
    for i in range(40):  # enough series that the body spans several 64 KiB pieces
        cluster.add_node(f"more-{i}")
    await cluster.synced()
    url = f"{cluster.url}/metrics"
    async with cluster.session.get(
        url, headers={"Accept-Encoding": "identity"}, auto_decompress=False
    ) as resp:
        assert "Content-Encoding" not in resp.headers
        plain = await resp.read()
    async with cluster.session.get(url, headers={"Accept-Encoding": "gzip"}, auto_decompress=False) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert int(resp.headers["Content-Length"]) == resp.content_length
        packed = await resp.read()
    assert len(plain) > routes.METRICS_CHUNK_BYTES  # sent in more than one piece
    assert len(packed) * 5 < len(plain)
    unpacked = gzip.decompress(packed)
    drop = ("vgpu_scheduler_event_loop_lag", "vgpu_scheduler_filter_duration", "vgpu_scheduler_gc")
    same = [line for line in unpacked.splitlines() if not line.decode().startswith(drop)]
    assert same == [line for line in plain.splitlines() if not line.decode().startswith(drop)]


@pytest.mark.parametrize(
    ("header", "takes"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("deflate, GZIP;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0, identity", False),
        ("identity", False),
        ("", False),
        ("gzip;q=nonsense", False),
        (";;,,", False),
    ],
)
def test_accept_encoding_is_read_as_http_says(header: str, takes: bool) -> None:
    assert routes.accepts_gzip(header) is takes
