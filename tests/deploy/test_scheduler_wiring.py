"""The scheduler pod is wired to itself: kube-scheduler's extender entry reaches our container's
port on loopback with the right scheme, names our resources and scheduler, and the shared config
file the chart writes loads through ``vgpu.core.config`` with the same names (docs/protocol.md#the-extender-entry)."""

from __future__ import annotations

import ast
import re
import urllib.parse
from typing import Any

import pytest
from vgpu.core import config

from tests.deploy import rendering


def _kube_scheduler_config(rendered: rendering.Rendered) -> dict[str, Any]:
    cm = rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-kube-scheduler"))
    return cm


def _shared_config(rendered: rendering.Rendered) -> config.Config:
    raw = rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config"))
    return config.load(raw)


def _flags(container: dict[str, Any]) -> dict[str, str]:
    """``--name=value`` arguments of a container's command as a dict (bare flags map to "")."""
    out: dict[str, str] = {}
    for arg in container["command"][1:] + container.get("args", []):
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            out[name] = value
    return out


def _our_container(rendered: rendering.Rendered) -> dict[str, Any]:
    return rendered.container("Deployment", "vgpu-scheduler")


@pytest.mark.parametrize(
    ("kube_version", "api_version"),
    [
        ("v1.23.17", "kubescheduler.config.k8s.io/v1beta3"),
        ("v1.24.17-eks-5e0fdde", "kubescheduler.config.k8s.io/v1beta3"),
        ("v1.25.0", "kubescheduler.config.k8s.io/v1"),
        ("v1.29.3", "kubescheduler.config.k8s.io/v1"),
        ("v1.37.0", "kubescheduler.config.k8s.io/v1"),
    ],
)
def test_kube_scheduler_config_version_follows_the_cluster(kube_version, api_version):
    ksc = _kube_scheduler_config(rendering.render(kube_version=kube_version))
    assert ksc["apiVersion"] == api_version
    assert ksc["kind"] == "KubeSchedulerConfiguration"


def test_config_api_version_can_be_pinned():
    values = {"scheduler": {"kubeScheduler": {"configApiVersion": "kubescheduler.config.k8s.io/v1beta3"}}}
    ksc = _kube_scheduler_config(rendering.render(values, kube_version="v1.26.0"))
    assert ksc["apiVersion"] == "kubescheduler.config.k8s.io/v1beta3"


@pytest.mark.parametrize(
    ("kube_version", "tag"),
    [
        ("v1.29.3", "v1.29.3"),
        ("v1.29.3-gke.1200", "v1.29.3"),
        ("v1.28.2+k3s1", "v1.28.2"),
        ("v1.30.1-eks-49c6de4", "v1.30.1"),
    ],
)
def test_kube_scheduler_image_matches_the_cluster_without_build_suffix(kube_version, tag):
    container = rendering.render(kube_version=kube_version).container("Deployment", "kube-scheduler")
    assert container["image"] == f"registry.k8s.io/kube-scheduler:{tag}"


def test_kube_scheduler_image_tag_can_be_set():
    values = {"scheduler": {"kubeScheduler": {"image": {"repository": "mirror/ks", "tag": "v1.29.0"}}}}
    assert rendering.render(values).container("Deployment", "kube-scheduler")["image"] == "mirror/ks:v1.29.0"


@pytest.mark.parametrize(
    ("values", "scheme", "port", "extender_port"),
    [
        (None, "https", 8443, 8888),
        (
            {"webhook": {"enabled": False}, "guard": {"mode": "none"}, "tls": {"mode": "none"}},
            "http",
            8080,
            8888,
        ),
        ({"scheduler": {"httpsPort": 9443, "extender": {"port": 9999}}}, "https", 9443, 9999),
    ],
    ids=["tls", "plain-http", "custom-ports"],
)
def test_extender_url_is_our_loopback_listener_and_the_service_port_is_separate(
    values, scheme, port, extender_port
):
    rendered = rendering.render(values)
    (extender,) = _kube_scheduler_config(rendered)["extenders"]
    url = urllib.parse.urlsplit(extender["urlPrefix"])
    ours = _our_container(rendered)
    flags = _flags(ours)
    # issue 16: kube-scheduler reaches /filter and /bind on loopback only, plain HTTP in the pod
    assert (url.scheme, url.hostname, url.port, url.path) == ("http", "127.0.0.1", extender_port, "")
    assert extender["enableHTTPS"] is False and "tlsConfig" not in extender
    assert int(flags["--extender-port"]) == extender_port
    # the Service port (webhook, metrics, probes) is the only one a container port or Service names
    assert int(flags["--port"]) == port
    assert [p["containerPort"] for p in ours["ports"]] == [port]
    (service_port,) = rendered.one("Service", f"{rendering.FULLNAME}-scheduler")["spec"]["ports"]
    assert service_port["targetPort"] == ours["ports"][0]["name"]
    assert ("--tls-cert-file" in flags) is (scheme == "https")
    for probe in ("livenessProbe", "readinessProbe"):
        get = ours[probe]["httpGet"]
        assert (get["scheme"].lower(), get["port"]) == (scheme, port)
    assert ours["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert ours["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_listener_limits_reach_our_container():
    flags = _flags(
        _our_container(
            rendering.render({"scheduler": {"maxConnections": 64, "extender": {"maxNodes": 20000}}})
        )
    )
    assert (flags["--max-connections"], flags["--extender-max-nodes"]) == ("64", "20000")


def test_extender_entry_has_the_hami_verbs_and_flags():
    (extender,) = _kube_scheduler_config(rendering.render())["extenders"]
    assert extender["filterVerb"] == "filter"
    assert extender["bindVerb"] == "bind"
    assert extender["preemptVerb"] == "preempt"
    assert extender["nodeCacheCapable"] is True
    assert extender["httpTimeout"] == "30s"
    assert extender["ignorable"] is False
    assert "prioritizeVerb" not in extender  # no weight needed without it


@pytest.mark.parametrize(
    "names",
    [
        None,
        {"count": "example.com/vgpu", "memory": "example.com/vgpu-mem", "cores": "example.com/vgpu-cores"},
    ],
    ids=["hami-defaults", "renamed"],
)
def test_managed_resources_are_exactly_our_resources_all_ignored_by_scheduler(names):
    rendered = rendering.render({"resourceNames": names} if names else None)
    (extender,) = _kube_scheduler_config(rendered)["extenders"]
    cfg = _shared_config(rendered)
    managed = [r["name"] for r in extender["managedResources"]]
    assert managed == list(cfg.resources.all())
    assert all(r["ignoredByScheduler"] is True for r in extender["managedResources"])
    if names is None:
        assert cfg.resources == config.ResourceNames()  # HAMi's names by default
    else:
        assert cfg.resources.count == "example.com/vgpu"
        assert cfg.device_plugin.resource_name == "example.com/vgpu"


def test_scheduler_name_is_one_value_everywhere():
    rendered = rendering.render({"schedulerName": "gpu-sched"})
    ksc = _kube_scheduler_config(rendered)
    assert [p["schedulerName"] for p in ksc["profiles"]] == ["gpu-sched"]
    assert _flags(_our_container(rendered))["--scheduler-name"] == "gpu-sched"
    assert _shared_config(rendered).scheduler.scheduler_name == "gpu-sched"


def test_shared_config_loads_and_keeps_user_settings():
    values = {
        "config": {
            "scheduler": {"nodePolicy": "spread", "nodeLockTimeoutS": 90},
            "devicePlugin": {"deviceSplitCount": 4},
            "nodes": {"gpu-7": {"deviceSplitCount": 2}},
        }
    }
    cfg = _shared_config(rendering.render(values))
    assert cfg.scheduler.node_policy == config.Policy.SPREAD
    assert cfg.scheduler.node_lock_timeout_s == 90
    assert cfg.scheduler.lease_namespace == rendering.LEASE_NAMESPACE
    assert cfg.device_plugin.device_split_count == 4
    assert cfg.for_node("gpu-7").device_split_count == 2


def test_lease_namespace_can_be_moved_and_rbac_follows():
    rendered = rendering.render({"config": {"scheduler": {"leaseNamespace": "gpu-leases"}}})
    assert _shared_config(rendered).scheduler.lease_namespace == "gpu-leases"
    lease_roles = [
        r for r in rendered.of_kind("Role") if any("leases" in rule["resources"] for rule in r["rules"])
    ]
    by_name = {r["metadata"]["name"]: r["metadata"]["namespace"] for r in lease_roles}
    assert by_name == {
        f"{rendering.FULLNAME}-scheduler-leases": "gpu-leases",
        f"{rendering.FULLNAME}-device-plugin-leases": "gpu-leases",
        f"{rendering.FULLNAME}-scheduler-leader-election": rendering.NAMESPACE,
    }


def test_both_services_read_the_mounted_shared_config():
    rendered = rendering.render()
    cm_name = f"{rendering.FULLNAME}-config"
    for kind, container in (("Deployment", "vgpu-scheduler"), ("DaemonSet", "device-plugin")):
        pod = rendered.one(kind)["spec"]["template"]["spec"]
        ours = rendered.container(kind, container)
        path = _flags(ours)["--config"]
        (mount,) = [m for m in ours["volumeMounts"] if m["mountPath"] == path]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["configMap"]["name"] == cm_name
        assert mount["subPath"] == "config.yaml"


def test_tls_files_come_from_the_tls_secret():
    rendered = rendering.render()
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    flags = _flags(_our_container(rendered))
    (mount,) = [m for m in _our_container(rendered)["volumeMounts"] if m["name"] == "tls"]
    assert flags["--tls-cert-file"] == f"{mount['mountPath']}/tls.crt"
    assert flags["--tls-key-file"] == f"{mount['mountPath']}/tls.key"
    assert "subPath" not in mount  # renewed certificates must reach the running pod
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == f"{rendering.FULLNAME}-scheduler-tls"


def test_ha_values_elect_one_active_replica_and_keep_one_up():
    rendered = rendering.render(rendering.HA_CERT_MANAGER)
    deploy = rendered.one("Deployment")
    assert deploy["spec"]["replicas"] == 3
    le = _kube_scheduler_config(rendered)["leaderElection"]
    assert le["leaderElect"] is True
    assert le["resourceLock"] == "leases"
    assert le["resourceNamespace"] == rendering.NAMESPACE
    role = rendered.one("Role", f"{rendering.FULLNAME}-scheduler-leader-election")
    assert [r.get("resourceNames") for r in role["rules"]] == [None, [le["resourceName"]]]
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    anti = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()


def test_scheduler_pods_run_as_non_root_with_a_read_only_root():
    pod = rendering.render().one("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    for container in pod["containers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_verbosity_becomes_repeated_v_flags():
    ours = _our_container(rendering.render({"scheduler": {"verbosity": 2}}))
    assert ours["command"].count("-v") == 2


def _routes() -> set[tuple[str, str]]:
    """(METHOD, path) of every ``router.add_<method>("<path>", ...)`` in the scheduler's code."""
    found: set[tuple[str, str]] = set()
    for path in sorted((rendering.REPO / "services" / "vgpu_scheduler").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr.startswith("add_")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("/")
            ):
                found.add((node.func.attr.removeprefix("add_").upper(), str(node.args[0].value)))
    return found


def test_every_path_the_chart_calls_is_served_on_the_listener_it_calls():
    routes = pytest.importorskip("vgpu_scheduler.routes")
    rendered = rendering.render()
    extender_routes = {(method, path) for method, path, _ in routes.EXTENDER_ROUTES}
    service_routes = {(method, path) for method, path, _ in routes.SERVICE_ROUTES} | _routes()
    (extender,) = _kube_scheduler_config(rendered)["extenders"]
    ours = _our_container(rendered)
    (hook,) = rendered.one("MutatingWebhookConfiguration")["webhooks"]
    verbs = {("POST", "/" + extender[k]) for k in ("filterVerb", "bindVerb", "preemptVerb")}
    assert verbs <= extender_routes, f"not served on the extender listener: {verbs - extender_routes}"
    assert not verbs & service_routes, "extender verbs must not be served on the Service port"
    called = {
        ("POST", hook["clientConfig"]["service"]["path"]),
        ("GET", ours["livenessProbe"]["httpGet"]["path"]),
        ("GET", ours["readinessProbe"]["httpGet"]["path"]),
        ("GET", "/metrics"),
    }
    assert called <= service_routes, f"not served on the Service port: {called - service_routes}"


def test_command_parses_with_the_schedulers_own_flags(tmp_path):
    main = pytest.importorskip("vgpu_scheduler.main")
    rendered = rendering.render({"scheduler": {"verbosity": 1}})
    ours = _our_container(rendered)
    assert ours["command"][0] == "vgpu-scheduler"
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")["data"]["config.yaml"])
    argv = [f"--config={cfg_file}" if a.startswith("--config=") else a for a in ours["command"][1:]]
    args = main.build_parser().parse_args(argv)
    assert (args.host, args.port, args.verbose) == ("0.0.0.0", 8443, 1)
    assert str(args.tls_cert_file).endswith("/tls.crt") and str(args.tls_key_file).endswith("/tls.key")
    loaded = main.load_config(args)
    assert loaded == _shared_config(rendered)
    assert loaded.scheduler.scheduler_name == "vgpu-scheduler"


KSC_KEYS = {"apiVersion", "kind", "leaderElection", "percentageOfNodesToScore", "profiles", "extenders"}
EXTENDER_KEYS = {  # docs/protocol.md#the-extender-entry: the same in v1beta3 and v1
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
LEADER_ELECTION_KEYS = {
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
}
GO_DURATION = re.compile(r"(\d+(\.\d+)?(ns|us|ms|s|m|h))+")


@pytest.mark.parametrize(
    "values",
    [None, rendering.HA_CERT_MANAGER, {"scheduler": {"kubeScheduler": {"percentageOfNodesToScore": 100}}}],
)
def test_kube_scheduler_configuration_uses_only_known_fields(values):
    """kube-scheduler decodes its config strictly: an unknown or misspelt key stops it from starting."""
    ksc = _kube_scheduler_config(rendering.render(values))
    assert set(ksc) <= KSC_KEYS
    assert set(ksc["leaderElection"]) <= LEADER_ELECTION_KEYS
    for key in ("leaseDuration", "renewDeadline", "retryPeriod"):
        assert GO_DURATION.fullmatch(ksc["leaderElection"][key])
    (extender,) = ksc["extenders"]
    assert set(extender) <= EXTENDER_KEYS
    assert set(extender.get("tlsConfig", {})) <= {"insecure", "serverName", "certFile", "keyFile", "caFile"}
    assert GO_DURATION.fullmatch(extender["httpTimeout"])
    for managed in extender["managedResources"]:
        assert set(managed) == {"name", "ignoredByScheduler"}
    assert [set(p) for p in ksc["profiles"]] == [{"schedulerName"}]
    if "percentageOfNodesToScore" in ksc:
        assert 1 <= ksc["percentageOfNodesToScore"] <= 100


def test_local_kube_scheduler_accepts_the_configuration():
    """The local cluster's kube-scheduler emulation validates extenders as kube-scheduler does."""
    extender_mod = pytest.importorskip("vgpu.localcluster.extender")
    (parsed,) = extender_mod.parse_config(_kube_scheduler_config(rendering.render()))
    assert parsed.http_timeout_s == 30
    assert parsed.node_cache_capable and not parsed.enable_https
    assert all(m.ignored_by_scheduler for m in parsed.managed_resources)


def test_single_replica_without_leader_election_has_no_election_lease_rights():
    rendered = rendering.render({"scheduler": {"leaderElection": {"enabled": False}}})
    ksc = _kube_scheduler_config(rendered)
    assert ksc["leaderElection"] == {"leaderElect": False}
    names = {o["metadata"]["name"] for o in rendered.of_kind("Role") + rendered.of_kind("RoleBinding")}
    assert f"{rendering.FULLNAME}-scheduler-leader-election" not in names


def test_device_plugin_leases_live_in_a_namespace_of_their_own():
    # RBAC cannot name a Lease before it exists, so the plugin may write every Lease of its
    # namespace: that namespace must hold no other Lease (kube-scheduler's leader election above all)
    rendered = rendering.render(rendering.HA_CERT_MANAGER)
    (namespace,) = rendered.of_kind("Namespace")
    assert namespace["metadata"]["name"] == rendering.LEASE_NAMESPACE != rendering.NAMESPACE
    assert _shared_config(rendered).scheduler.lease_namespace == rendering.LEASE_NAMESPACE
    plugin_role = rendered.one("Role", f"{rendering.FULLNAME}-device-plugin-leases")
    assert plugin_role["metadata"]["namespace"] == rendering.LEASE_NAMESPACE
    assert _kube_scheduler_config(rendered)["leaderElection"]["resourceNamespace"] == rendering.NAMESPACE
    roles_writing_leases = {
        (r["metadata"]["name"], r["metadata"]["namespace"])
        for r in rendered.of_kind("Role")
        for rule in r["rules"]
        if "leases" in rule["resources"] and {"create", "patch", "delete"} & set(rule["verbs"])
    }
    # the plugin writes Leases only in its own namespace; the leader election Role is kube-scheduler's
    assert roles_writing_leases == {
        (plugin_role["metadata"]["name"], rendering.LEASE_NAMESPACE),
        (f"{rendering.FULLNAME}-scheduler-leader-election", rendering.NAMESPACE),
    }


def test_a_configured_lease_namespace_is_used_not_created():
    rendered = rendering.render({"config": {"scheduler": {"leaseNamespace": "gpu-leases"}}})
    assert not rendered.of_kind("Namespace")
    assert not rendering.render({"leases": {"createNamespace": False}}).of_kind("Namespace")
