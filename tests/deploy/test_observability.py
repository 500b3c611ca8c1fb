"""The chart's observability: the usage monitor container in the device-plugin DaemonSet, the
optional ServiceMonitor/PodMonitor (only where their API exists, structure checked here since the
kinds are not in the Kubernetes schemas), and the Grafana dashboard ConfigMap, whose every query
names only metrics our two programs export."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from vgpu.core import annotations
from vgpu.core.config import Config
from vgpu.core.device import Gpu, GpuUuid
from vgpu.gpu.port import DeviceInfo, GpuMemoryUsage
from vgpu_device_plugin.monitor import exporter, mapping, region
from vgpu_scheduler.metrics import Metrics
from vgpu_scheduler.state import ClusterState

from tests.deploy import rendering
from tests.device_plugin.regionfile import RegionSpec, Slot, build

MONITORING = (
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
)
ALL_ON: dict[str, Any] = {
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        "podMonitor": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    }
}
PROMQL_WORDS = {
    "sum", "avg", "max", "min", "count", "by", "without", "rate", "irate", "increase", "histogram_quantile",
    "label_values", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "le",
}  # fmt: skip


def test_default_install_runs_the_monitor_and_creates_no_monitoring_objects() -> None:
    rendered = rendering.render()
    monitor = rendering.Rendered.container(rendered, "DaemonSet", "monitor")
    assert monitor["command"][0] == "vgpu-monitor"
    assert "--metrics-bind-address=:9394" in monitor["command"]
    assert monitor["ports"] == [{"name": "monitor", "containerPort": 9394, "protocol": "TCP"}]
    assert monitor["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "monitor"}
    core = next(m for m in monitor["volumeMounts"] if m["name"] == "hami-core")
    assert core == {"name": "hami-core", "mountPath": "/usr/local/vgpu", "readOnly": True}
    plugin = rendering.Rendered.container(rendered, "DaemonSet", "device-plugin")
    assert (
        next(m for m in plugin["volumeMounts"] if m["name"] == "hami-core")["mountPath"] == core["mountPath"]
    )
    assert not rendered.of_kind("ServiceMonitor") and not rendered.of_kind("PodMonitor")
    assert not [c for c in rendered.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]


def test_monitor_can_be_turned_off() -> None:
    spec = rendering.render({"devicePlugin": {"monitor": {"enabled": False}}}).one("DaemonSet")["spec"]
    assert [c["name"] for c in spec["template"]["spec"]["containers"]] == ["device-plugin"]


def test_monitoring_objects_need_their_api_or_skip_crd_check() -> None:
    absent = rendering.render(ALL_ON)
    assert not absent.of_kind("ServiceMonitor") and not absent.of_kind("PodMonitor")
    forced = {
        "metrics": {k: {"enabled": True, "skipCrdCheck": True} for k in ("serviceMonitor", "podMonitor")}
    }
    assert len(rendering.render(forced).of_kind("ServiceMonitor")) == 1
    assert len(rendering.render(forced).of_kind("PodMonitor")) == 1


@pytest.mark.parametrize("tls", [True, False], ids=["https", "http"])
def test_service_monitor_selects_the_scheduler_service_port(tls: bool) -> None:
    values: dict[str, Any] = json.loads(json.dumps(ALL_ON))
    if not tls:
        values |= {"webhook": {"enabled": False}, "guard": {"mode": "none"}, "tls": {"mode": "none"}}
    rendered = rendering.render(values, api_versions=MONITORING)
    sm = rendered.one("ServiceMonitor")
    service = rendered.one("Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm) == {"apiVersion", "kind", "metadata", "spec"}
    assert (
        sm["metadata"]["namespace"] == rendering.NAMESPACE and sm["metadata"]["labels"]["release"] == "prom"
    )
    assert set(sm["spec"]) == {"selector", "namespaceSelector", "endpoints"}
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert selector == service["spec"]["selector"] | {
        k: v for k, v in selector.items() if k not in service["spec"]["selector"]
    }
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [rendering.NAMESPACE]}
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["path"] == "/metrics" and re.fullmatch(r"\d+[smh]", endpoint["interval"])
    assert endpoint["scheme"] == ("https" if tls else "http")
    assert ("tlsConfig" in endpoint) == tls
    assert set(endpoint) <= {"port", "path", "scheme", "interval", "tlsConfig", "bearerTokenFile"}
    # views.auth kubernetes (the default): Prometheus sends its service-account token (issue 49)
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"


def test_the_views_cluster_role_and_its_binding() -> None:
    """issue 49: /metrics and the dashboard are read with a token RBAC allows; the chart ships the
    ClusterRole, binds it to views.subjects, lets the scheduler ask the reviews, and none of it
    (nor the ServiceMonitor's token) with views.auth none."""
    prometheus = {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    rendered = rendering.render({"views": {"subjects": [prometheus]}})
    role = rendered.one("ClusterRole", f"{rendering.FULLNAME}-views")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics", "/ui", "/ui/*"], "verbs": ["get"]}]
    binding = rendered.one("ClusterRoleBinding", f"{rendering.FULLNAME}-views")
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and binding["subjects"] == [prometheus]
    config = rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config"))
    assert config["scheduler"]["viewsAuth"] == "kubernetes"
    assert not [
        b
        for b in rendering.render().of_kind("ClusterRoleBinding")
        if b["metadata"]["name"].endswith("-views")
    ]
    values: dict[str, Any] = json.loads(json.dumps(ALL_ON)) | {"views": {"auth": "none"}}
    open_views = rendering.render(values, api_versions=MONITORING)
    assert not [r for r in open_views.of_kind("ClusterRole") if r["metadata"]["name"].endswith("-views")]
    assert "bearerTokenFile" not in open_views.one("ServiceMonitor")["spec"]["endpoints"][0]
    open_config = rendering.embedded_yaml(open_views.one("ConfigMap", f"{rendering.FULLNAME}-config"))
    assert open_config["scheduler"]["viewsAuth"] == "none"


def test_pod_monitor_selects_the_device_plugin_pods_monitor_port() -> None:
    rendered = rendering.render(ALL_ON, api_versions=MONITORING)
    pm = rendered.one("PodMonitor")
    ds = rendered.one("DaemonSet")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(pm["spec"]) == {"selector", "namespaceSelector", "podMetricsEndpoints"}
    assert (
        pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    [endpoint] = pm["spec"]["podMetricsEndpoints"]
    ports = [p["name"] for c in ds["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    assert endpoint["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    ]
    no_monitor = json.loads(json.dumps(ALL_ON)) | {"devicePlugin": {"monitor": {"enabled": False}}}
    assert not rendering.render(no_monitor, api_versions=MONITORING).of_kind("PodMonitor")


def _exported_names() -> set[str]:
    """Every sample name our scheduler and usage monitor export (histograms: _bucket, _sum, ...)."""
    keys = annotations.KEYS
    state = ClusterState(Config(), clock=lambda: 0.0)
    gpus = [Gpu(GpuUuid("GPU-0"), 0, 10, 16384, 100, "NVIDIA")]
    node = {
        "metadata": {"name": "n", "annotations": {keys.node_register: annotations.encode_node_register(gpus)}}
    }
    state.apply("nodes", "ADDED", node)
    pod = {
        "metadata": {"uid": "u", "name": "p", "namespace": "ns", "annotations": {
            keys.assigned_node: "n", keys.devices_allocated: "GPU-0,NVIDIA,1000,10:;"}},
        "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    state.apply("pods", "ADDED", pod)
    metrics = Metrics(state, clock=lambda: 0.0)
    for histogram in (metrics.filter_seconds, metrics.bind_seconds, metrics.webhook_seconds):
        histogram.labels("ok").observe(0.01)
    metrics.errors.labels("filter").inc()
    scheduler = metrics.render(metrics.snapshot()).decode()
    data = build(
        RegionSpec(["GPU-0"], [1 << 30], slots=[Slot(1, 2, {0: (1, 1, 1, 0, 3)})], last_kernel_time=5)
    )
    info = DeviceInfo(GpuUuid("GPU-0"), 0, "NVIDIA", 1 << 34, 0, "0")
    ref = mapping.PodRef("u", "ns", "p", frozenset({"c"}))
    reading = exporter.Reading(
        node="n",
        now_s=10.0,
        gpus=(exporter.HostGpu(info, GpuMemoryUsage(5), 50),),
        containers=(
            exporter.ContainerReading(
                mapping.ContainerRegion(ref, "c", pathlib.Path("x")), region.parse_bytes(data)
            ),
        ),
        unreadable=0,
        not_ours=0,
        empty=0,
    )
    monitor = exporter.render(reading).decode()
    names = set()
    for text in (scheduler, monitor):
        for family in text_string_to_metric_families(text):
            names |= {s.name for s in family.samples}
    return names


def _metric_names(expr: str) -> set[str]:
    bare = re.sub(r'"[^"]*"', "", expr)  # label values
    bare = re.sub(r"\{[^}]*\}", "", bare)  # matchers
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)  # grouping label lists
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # ranges
    bare = re.sub(r"label_values\(([^,()]+),\s*\w+\s*\)", r"\1", bare)  # Grafana's (metric, label)
    words = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)
    return {w for w in words if w not in PROMQL_WORDS}


def test_grafana_dashboard_is_valid_json_over_metrics_we_export() -> None:
    cm = rendering.render(ALL_ON).one("ConfigMap", f"{rendering.FULLNAME}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == rendering.NAMESPACE
    dashboard = json.loads(cm["data"]["kube-vgpu.json"])
    assert dashboard["uid"] == "kube-vgpu" and dashboard["panels"]
    exported = _exported_names()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [
        v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)
    ]
    used: set[str] = set()
    for expr in exprs:
        names = _metric_names(expr)
        assert names, f"no metric in {expr!r}"
        used |= names
    assert not used - exported, f"the dashboard queries metrics nobody exports: {sorted(used - exported)}"
    titles = " ".join(p["title"] for p in dashboard["panels"])
    for topic in (
        "allocated",
        "Pending GPU pods by reason",
        "Filter latency",
        "Bind latency",
        "Webhook latency",
    ):
        assert topic in titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_metric_name_extraction() -> None:
    expr = 'histogram_quantile(0.99, sum by (le) (rate(a_bucket{job=~"x{y}"}[5m]))) / on (node) b'
    assert _metric_names(expr) == {"a_bucket", "b"}
    assert _metric_names("label_values(c_total, job)") == {"c_total"}


def test_dashboard_configmap_goes_where_asked_and_validates() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    values = {
        "metrics": {
            "grafanaDashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "GPU"},
            }
        }
    }
    cm = rendering.render(values).one("ConfigMap", f"{rendering.FULLNAME}-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring" and cm["metadata"]["annotations"] == {
        "grafana_folder": "GPU"
    }
    kv.validate(cm, "1.29.0", strict=True)


def _notes(values: dict[str, Any], api_versions: tuple[str, ...] = ()) -> str:
    opts: dict[str, Any] = {
        "name": rendering.RELEASE,
        "namespace": rendering.NAMESPACE,
        "kube_version": "v1.29.3",
    }
    opts |= {"is_install": True, "api_versions": list(api_versions)} if api_versions else {"is_install": True}
    with rendering.helm.Chart.load(str(rendering.CHART_DIR)) as chart:
        out = rendering._render_raw(chart, values, opts)
    return next(text for path, text in out.items() if path.endswith("NOTES.txt"))


def test_notes_say_where_the_monitor_is_and_why_no_monitor_object_was_made() -> None:
    notes = _notes(ALL_ON)
    assert "curl -s localhost:9394/metrics" in notes
    assert "no ServiceMonitor created" in notes and "no PodMonitor created" in notes
    served = _notes(ALL_ON, MONITORING)
    assert "no ServiceMonitor created" not in served and "no PodMonitor created" not in served
