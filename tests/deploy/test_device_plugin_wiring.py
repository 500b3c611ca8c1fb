"""The device plugin DaemonSet matches the program: its command parses with the plugin's own flag
parser into the paths the pod mounts, the config it mounts loads for a node, the liveness probe
watches the socket the plugin serves, and HAMi-core's host directory is where Allocate mounts from."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

import pytest
import yaml
from vgpu.core import config

from tests.deploy import rendering

dp_config = pytest.importorskip("vgpu_device_plugin.config")
inventory = pytest.importorskip("vgpu_device_plugin.inventory")


def _pod(rendered: rendering.Rendered) -> dict[str, Any]:
    pod: dict[str, Any] = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    return pod


def _mount_source(pod: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path.rstrip("/")]
    volumes: list[dict[str, Any]] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert len(volumes) == 1
    return volumes[0]


def test_command_parses_with_the_plugins_own_flags(tmp_path):
    rendered = rendering.render()
    container = rendered.container("DaemonSet", "device-plugin")
    assert container["command"][0] == "vgpu-device-plugin"
    args = container["command"][1:]
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")["data"]["config.yaml"])
    args = [f"--config={cfg_file}" if a.startswith("--config=") else a for a in args]
    (env,) = [e for e in container["env"] if e["name"] == "NODE_NAME"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    settings = dp_config.resolve(args, {"NODE_NAME": "gpu-node-1"})
    assert settings.node == "gpu-node-1"
    assert settings.backend == "nvml"
    assert settings.fail_on_init_error is True
    assert settings.plugin_dir == pathlib.Path("/var/lib/kubelet/device-plugins")
    assert settings.config.scheduler.lease_namespace == rendering.LEASE_NAMESPACE
    assert settings.device_plugin.resource_name == "nvidia.com/gpu"


def test_fail_on_init_error_false_reaches_the_program():
    container = rendering.render({"devicePlugin": {"failOnInitError": False}}).container(
        "DaemonSet", "device-plugin"
    )
    args = dp_config.parser().parse_args(container["command"][1:])
    assert args.fail_on_init_error is False


def test_host_paths_are_mounted_where_the_plugin_uses_them():
    rendered = rendering.render({"config": {"devicePlugin": {"hookPath": "/opt/hami"}}})
    pod = _pod(rendered)
    container = rendered.container("DaemonSet", "device-plugin")
    args = dp_config.parser().parse_args(container["command"][1:])
    plugin_dir = _mount_source(pod, container, args.device_plugin_path)
    assert plugin_dir["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    # host root is "/" in the pod, so <hookPath>/vgpu must be the host's, at the same path
    assert args.host_root == pathlib.Path("/")
    core = _mount_source(pod, container, "/opt/hami/vgpu")
    assert core["hostPath"] == {"path": "/opt/hami/vgpu", "type": "DirectoryOrCreate"}
    # the lock dir lives in root's <hookPath>/vgpu (mounted above), never the host's /tmp
    assert not [v for v in pod["volumes"] if v.get("hostPath", {}).get("path", "").startswith("/tmp")]
    (installer,) = pod["initContainers"]
    assert installer["command"][-1] == "/opt/hami/vgpu"
    assert [m["mountPath"] for m in installer["volumeMounts"]] == ["/opt/hami/vgpu", "/tmp"]
    assert _mount_source(pod, installer, "/tmp") == {"name": "tmp", "emptyDir": {}}


def test_plugin_pod_has_a_seccomp_profile_and_the_installer_no_privileges():
    pod = _pod(rendering.render())
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (installer,) = pod["initContainers"]
    assert installer["securityContext"] == {
        "runAsUser": 0,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


@pytest.mark.parametrize("count", ["nvidia.com/gpu", "example.com/vgpu"])
def test_liveness_probe_watches_the_socket_the_plugin_serves(count):
    rendered = rendering.render({"resourceNames": {"count": count}})
    container = rendered.container("DaemonSet", "device-plugin")
    probe = container["livenessProbe"]["exec"]["command"]
    socket = inventory.Resource(name=count, devices=(), shared=True).socket_name
    assert probe == ["test", "-S", f"/var/lib/kubelet/device-plugins/{socket}"]


def test_daemonset_runs_on_gpu_nodes_as_a_critical_pod():
    pod = _pod(rendering.render())
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"gpu": "on"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {
        e["name"]: e.get("value") for e in rendering.render().container("DaemonSet", "device-plugin")["env"]
    }
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"  # the NVIDIA runtime injects NVML


def test_installer_can_be_turned_off_and_runtime_class_set():
    values = {"devicePlugin": {"hamiCoreInstaller": {"enabled": False}, "runtimeClassName": "nvidia"}}
    pod = _pod(rendering.render(values))
    assert "initContainers" not in pod
    assert pod["runtimeClassName"] == "nvidia"


def test_fake_backend_gets_its_gpus_file(tmp_path):
    gpus = {"gpus": [{"name": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960}]}
    rendered = rendering.render({"devicePlugin": {"backend": "fake", "fakeGpus": gpus}})
    container = rendered.container("DaemonSet", "device-plugin")
    args = dp_config.parser().parse_args(container["command"][1:])
    assert args.backend == "fake"
    cm = rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")
    assert rendering.embedded_yaml(cm, "fake-gpus.yaml") == gpus
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(args.fake_gpus)]
    assert mount["subPath"] == "fake-gpus.yaml"
    assert "backend fake needs devicePlugin.fakeGpus" in rendering.render_error(
        {"devicePlugin": {"backend": "fake"}}
    )


def test_per_node_overrides_reach_the_node():
    rendered = rendering.render({"config": {"nodes": {"gpu-7": {"deviceSplitCount": 3}}}})
    cfg = config.load(rendering.embedded_yaml(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")))
    assert cfg.for_node("gpu-7").device_split_count == 3
    assert cfg.for_node("gpu-8").device_split_count == 10


def _run_installer(
    tmp_path: pathlib.Path, image: pathlib.Path
) -> tuple[subprocess.CompletedProcess[str], pathlib.Path]:
    """The init container's command as rendered, HAMi's image at ``image`` (HAMI_CORE_SOURCE)."""
    container = _pod(rendering.render())["initContainers"][0]
    assert container["command"][:2] == ["sh", "-c"]
    host_dir = tmp_path / "host" / "usr/local/vgpu"
    command = [*container["command"][:-1], str(host_dir), "/usr/local/vgpu"]
    done = subprocess.run(
        command,
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "HAMI_CORE_SOURCE": str(image / "k8s-vgpu")},
    )
    return done, host_dir


def test_the_installer_script_is_the_charts_file():
    """One installer: the chart renders files/hami-core-installer.sh (the demo runs that file)."""
    container = _pod(rendering.render())["initContainers"][0]
    script = (rendering.CHART_DIR / "files" / "hami-core-installer.sh").read_text()
    assert container["command"][2].strip() == script.strip()
    assert container["command"][3:] == ["hami-core-installer", "/usr/local/vgpu"]


def _image(tmp_path: pathlib.Path) -> pathlib.Path:
    image = tmp_path / "image"
    lib = image / "k8s-vgpu/lib/nvidia"
    lib.mkdir(parents=True)
    (image / "k8s-vgpu/bin").mkdir(parents=True)
    (lib / "libvgpu.so.v2.10.0").write_text("fresh build")
    init = image / "k8s-vgpu/bin/vgpu-init.sh"
    init.write_text(f'#!/bin/sh\nmkdir -p "$1" && cp "{lib}"/* "$1"\n')
    init.chmod(0o755)
    return image


@pytest.mark.parametrize("planted", ["empty-dir", "symlink"])
def test_installer_repairs_what_a_runtime_made_of_missing_files(tmp_path, planted):
    """containerd made a missing mount source a directory; a symlink is replaced by a file."""
    image = _image(tmp_path)
    host_dir = tmp_path / "host" / "usr/local/vgpu"
    host_dir.mkdir(parents=True)
    if planted == "empty-dir":
        (host_dir / "libvgpu.so").mkdir()
        (host_dir / "ld.so.preload").mkdir()
    else:
        (tmp_path / "target").write_text("someone else's")
        (host_dir / "ld.so.preload").symlink_to(tmp_path / "target")
    done, host_dir = _run_installer(tmp_path, image)
    assert done.returncode == 0, done.stderr
    for name in ("libvgpu.so", "ld.so.preload"):
        assert (host_dir / name).is_file() and not (host_dir / name).is_symlink()
    assert (host_dir / "ld.so.preload").read_text().strip() == "/usr/local/vgpu/libvgpu.so"
    assert planted != "symlink" or (tmp_path / "target").read_text() == "someone else's"


def test_installer_fails_on_a_non_empty_directory_in_the_way(tmp_path):
    image = _image(tmp_path)
    host_dir = tmp_path / "host" / "usr/local/vgpu"
    (host_dir / "libvgpu.so").mkdir(parents=True)
    (host_dir / "libvgpu.so" / "data").write_text("x")
    done, _ = _run_installer(tmp_path, image)
    assert done.returncode != 0 and "libvgpu.so" in done.stderr


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned-build", "plain-build"])
def test_installer_script_leaves_libvgpu_and_ld_so_preload_in_the_host_dir(tmp_path, versioned):
    """Run the init container's script with HAMi's image layout faked under tmp_path."""
    image = tmp_path / "image"
    (image / "k8s-vgpu/lib/nvidia").mkdir(parents=True)
    (image / "k8s-vgpu/bin").mkdir(parents=True)
    lib = image / "k8s-vgpu/lib/nvidia"
    (lib / "libvgpu.so").write_text("stale build")
    if versioned:
        (lib / "libvgpu.so.v2.9.0").write_text("old build")
        (lib / "libvgpu.so.v2.10.0").write_text("fresh build")
    init = image / "k8s-vgpu/bin/vgpu-init.sh"  # HAMi's script: copy every file of lib/nvidia
    init.write_text(f'#!/bin/sh\nmkdir -p "$1" && cp "{lib}"/* "$1"\n')
    init.chmod(0o755)
    done, host_dir = _run_installer(tmp_path, image)
    assert done.returncode == 0, done.stderr
    assert (host_dir / "libvgpu.so").read_text() == ("fresh build" if versioned else "stale build")
    # the plugin mounts <hookPath>/vgpu/libvgpu.so and ld.so.preload at the same paths in containers
    assert (host_dir / "ld.so.preload").read_text().strip() == "/usr/local/vgpu/libvgpu.so"


@pytest.mark.parametrize(("value", "want"), [(None, True), (False, False)], ids=["default", "off"])
def test_host_pid_namespace_for_outside_usage_attribution(value, want):
    values = {} if value is None else {"devicePlugin": {"hostPID": value}}
    assert _pod(rendering.render(values))["hostPID"] is want


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ({}, {}),
        ({"deviceListStrategy": "cdi-cri"}, {"/var/run/cdi": False, "/etc/cdi": True}),
        (
            {"deviceListStrategy": "cdi-annotations", "cdiSpecDir": "/run/cdi/"},
            {"/run/cdi": False, "/etc/cdi": True, "/var/run/cdi": True},
        ),
        (
            {"cdiSpecDir": "/etc/cdi", "deviceListStrategy": "cdi-cri"},
            {"/etc/cdi": False, "/var/run/cdi": True},
        ),
    ],
    ids=["envvar", "cdi-cri", "own-dir", "etc-cdi"],
)
def test_cdi_spec_directories_are_mounted_with_a_cdi_strategy(values, want):
    """The plugin writes its own spec below --host-root (/ in the pod) and reads the toolkit's."""
    rendered = rendering.render({"config": {"devicePlugin": values}})
    pod = _pod(rendered)
    container = rendered.container("DaemonSet", "device-plugin")
    mounts = {
        m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"] if "cdi" in m["name"]
    }
    assert mounts == want
    for path in want:
        assert _mount_source(pod, container, path)["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}
    cfg = config.load(
        yaml.safe_load(rendered.one("ConfigMap", f"{rendering.FULLNAME}-config")["data"]["config.yaml"])
    )
    if want:
        assert cfg.device_plugin.cdi_spec_dir.rstrip("/") in want


def test_a_node_override_with_a_cdi_strategy_mounts_the_spec_directories():
    rendered = rendering.render({"config": {"nodes": {"gpu-7": {"deviceListStrategy": "cdi-annotations"}}}})
    container = rendered.container("DaemonSet", "device-plugin")
    assert "/var/run/cdi" in [m["mountPath"] for m in container["volumeMounts"]]
