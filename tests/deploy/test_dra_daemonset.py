"""The DRA driver's DaemonSet (dra.enabled) matches the program: its command parses with the
plugin's own flags into --mode dra and the paths the pod mounts from the same host paths (kubelet
dials the endpoint GetInfo names; the runtime mounts what the CDI specs name), the liveness probe
watches the registration socket the driver serves, and DRA nodes and extender nodes each get one
device plugin: the extender's keeps off the DRA label, the user's own affinity kept."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from vgpu.core.dra import names

from tests.deploy import rendering

dp_config = pytest.importorskip("vgpu_device_plugin.config")
kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (dev dependency) is not installed"
)

DRA_DS = f"{rendering.FULLNAME}-dra-kubelet-plugin"
EXT_DS = f"{rendering.FULLNAME}-device-plugin"
ON = {"dra": {"enabled": True}}


def _pod(rendered: rendering.Rendered, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = rendered.one("DaemonSet", name)["spec"]["template"]["spec"]
    return pod


def _host_path(pod: dict[str, Any], container: dict[str, Any], path: pathlib.Path | str) -> str:
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(path)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return str(volume["hostPath"]["path"])


def _matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    for expr in term.get("matchExpressions", []):
        value = labels.get(expr["key"])
        if expr["operator"] == "In" and value not in expr["values"]:
            return False
        if expr["operator"] == "NotIn" and value in expr["values"]:
            return False
    return True


def _runs_on(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether kube-scheduler may place ``pod`` on a node with ``labels`` (selector and required
    node affinity with In/NotIn, all the chart writes)."""
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = (
        (pod.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    return required is None or any(_matches(t, labels) for t in required["nodeSelectorTerms"])


def test_off_by_default_and_the_extender_daemonset_is_unchanged() -> None:
    rendered = rendering.render()
    assert [d["metadata"]["name"] for d in rendered.of_kind("DaemonSet")] == [EXT_DS]
    assert "affinity" not in _pod(rendered, EXT_DS)
    roles = [r["metadata"]["name"] for r in rendered.of_kind("ClusterRole")]
    assert f"{EXT_DS}-resourceclaims" not in roles


def test_command_parses_into_dra_mode_with_the_mounted_paths(tmp_path: pathlib.Path) -> None:
    rendered = rendering.render(ON)
    pod = _pod(rendered, DRA_DS)
    (container,) = [c for c in pod["containers"] if c["name"] == "device-plugin"]
    assert container["command"][0] == "vgpu-device-plugin"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")["data"]["config.yaml"])
    args = [f"--config={cfg}" if a.startswith("--config=") else a for a in container["command"][1:]]
    settings = dp_config.resolve(args, {"NODE_NAME": "gpu-node-1"})
    assert settings.mode == "dra"
    assert settings.registry_dir == pathlib.Path(names.REGISTRATION_DIR)
    assert settings.dra_plugin_dir == pathlib.Path(names.PLUGIN_DIR)
    for path in (settings.registry_dir, settings.dra_plugin_dir):
        assert _host_path(pod, container, path) == str(path)  # same path inside and out
    cdi_dir = settings.device_plugin.cdi_spec_dir
    assert _host_path(pod, container, cdi_dir) == cdi_dir == "/var/run/cdi"
    hami = f"{settings.device_plugin.hook_path}/vgpu"
    assert _host_path(pod, container, hami) == hami
    probe = container["livenessProbe"]["exec"]["command"]
    assert probe == ["test", "-S", str(settings.registry_dir / names.REGISTRATION_SOCKET)]
    assert "hostPID" not in pod  # no outside-usage measuring in this mode
    assert [c["name"] for c in pod.get("initContainers", [])] == ["hami-core-installer"]


def test_paths_and_extra_args_follow_the_values(tmp_path: pathlib.Path) -> None:
    rendered = rendering.render(
        {
            "dra": {
                "enabled": True,
                "kubeletPlugin": {
                    "registryPath": "/data/kubelet/plugins_registry/",
                    "pluginPath": "/data/kubelet/plugins/gpu.kube-vgpu.io",
                    "extraArgs": ["-v"],
                },
            },
            "config": {"devicePlugin": {"cdiSpecDir": "/etc/cdi"}},
        }
    )
    pod = _pod(rendered, DRA_DS)
    (container,) = pod["containers"]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")["data"]["config.yaml"])
    args = [f"--config={cfg}" if a.startswith("--config=") else a for a in container["command"][1:]]
    settings = dp_config.resolve(args, {"NODE_NAME": "n"})
    assert settings.registry_dir == pathlib.Path("/data/kubelet/plugins_registry")
    assert _host_path(pod, container, "/data/kubelet/plugins_registry") == "/data/kubelet/plugins_registry"
    assert _host_path(pod, container, "/etc/cdi") == "/etc/cdi" == settings.device_plugin.cdi_spec_dir
    assert settings.verbose == 1


@pytest.mark.parametrize(
    ("labels", "extender", "dra"),
    [
        ({"gpu": "on"}, True, False),
        ({"gpu": "on", "kube-vgpu.io/mode": "dra"}, False, True),
        ({"gpu": "on", "kube-vgpu.io/mode": "extender"}, True, False),
        ({"kube-vgpu.io/mode": "dra"}, False, False),
    ],
    ids=["gpu-node", "dra-node", "extender-labelled", "not-a-gpu-node"],
)
def test_each_gpu_node_gets_one_device_plugin(labels: dict[str, str], extender: bool, dra: bool) -> None:
    rendered = rendering.render(ON)
    assert _runs_on(_pod(rendered, EXT_DS), labels) is extender
    assert _runs_on(_pod(rendered, DRA_DS), labels) is dra


def test_the_users_affinity_is_kept_and_every_dra_label_avoided() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    rendered = rendering.render(
        {
            "dra": {
                "enabled": True,
                "kubeletPlugin": {"nodeSelector": {"kube-vgpu.io/mode": "dra", "pool": "x"}},
            },
            "devicePlugin": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [zone]}]
                        }
                    },
                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
                }
            },
        }
    )
    ext = _pod(rendered, EXT_DS)
    assert "podAntiAffinity" in ext["affinity"]
    assert _runs_on(ext, {"gpu": "on", "zone": "a"})
    assert not _runs_on(ext, {"gpu": "on", "zone": "b"})  # the user's term still holds
    assert not _runs_on(ext, {"gpu": "on", "zone": "a", "kube-vgpu.io/mode": "dra", "pool": "x"})
    assert _runs_on(ext, {"gpu": "on", "zone": "a", "kube-vgpu.io/mode": "dra"})  # not every label
    dra = _pod(rendered, DRA_DS)
    assert dra["nodeSelector"] == {"gpu": "on", "kube-vgpu.io/mode": "dra", "pool": "x"}


def test_the_plugin_may_read_resource_claims_in_dra_mode() -> None:
    rendered = rendering.render(ON)
    role = rendered.one("ClusterRole", f"{EXT_DS}-resourceclaims")
    assert role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}
    ]
    binding = rendered.one("ClusterRoleBinding", f"{EXT_DS}-resourceclaims")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": EXT_DS, "namespace": rendering.NAMESPACE}
    ]


def test_the_dra_objects_validate_against_the_kubernetes_schema() -> None:
    version = kv.latest_version()
    rendered = rendering.render(ON, kube_version=f"v{version}")
    ours = [
        rendered.one("DaemonSet", DRA_DS),
        rendered.one("DaemonSet", EXT_DS),
        rendered.one("ClusterRole", f"{EXT_DS}-resourceclaims"),
        rendered.one("ClusterRoleBinding", f"{EXT_DS}-resourceclaims"),
    ]
    for obj in ours:
        kv.validate(obj, version, strict=True)
