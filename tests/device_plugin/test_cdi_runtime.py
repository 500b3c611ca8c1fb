"""The CDI strategies end to end: the plugin writes its own spec, the answers name it next to the
GPU, and the emulated kubelet's runtime resolves both against the spec directories (as containerd
and CRI-O do: an unresolvable name fails the container)."""

import json
import pathlib
from typing import Any

import pytest
from vgpu.core import cdispec
from vgpu.demo import hamicore
from vgpu.kube.port import JsonObj
from vgpu.localcluster.kubelet import ALLOCATIONS_ANNOTATION
from vgpu_device_plugin import dirwatch

from tests.device_plugin.builders import GPU_A, GPU_B, NODE
from tests.device_plugin.test_cdispecfile import install_hami_core
from tests.device_plugin.test_kubelet_emulation import gpu_allocatable, settled, wait_for
from tests.device_plugin.test_kubelet_ids import gpu_pod
from tests.device_plugin.test_kubelet_restart import rig

OUR_SPEC = pathlib.Path("var/run/cdi") / cdispec.FILE_NAME


def toolkit_spec(root: pathlib.Path) -> None:
    """What ``nvidia-ctk cdi generate`` writes (abridged): each GPU by UUID, with its device node."""
    devices = [
        {"name": uuid, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}}
        for i, uuid in enumerate((GPU_A, GPU_B))
    ]
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}
    (root / "etc/cdi").mkdir(parents=True, exist_ok=True)
    (root / "etc/cdi/nvidia.json").write_text(json.dumps(spec))


def spec_dirs(root: pathlib.Path) -> list[pathlib.Path]:
    return [root / "etc/cdi", root / "var/run/cdi"]


def entry(pod: JsonObj, container: str = "train") -> dict[str, Any]:
    got: dict[str, Any] = json.loads(pod["metadata"]["annotations"][ALLOCATIONS_ANNOTATION])[container]
    return got


def creation_failed(pod: JsonObj) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return any(
        (s.get("state") or {}).get("waiting", {}).get("reason") == "CreateContainerError" for s in statuses
    )


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
async def test_container_gets_hami_core_from_our_spec_and_the_gpu_from_the_toolkit_s(
    tmp_path: pathlib.Path, strategy: str
) -> None:
    install_hami_core(tmp_path)
    toolkit_spec(tmp_path)
    async with rig(
        tmp_path, dirwatch.InotifyWatcher(), cdi_spec_dirs=spec_dirs(tmp_path), device_list_strategy=strategy
    ) as r:
        assert cdispec.validate(json.loads((tmp_path / OUR_SPEC).read_text())) == []
        gpu_pod(r.store, "p", init=None, main=GPU_A)
        pod = await wait_for(r.store, "pods", "p", settled, namespace="default")
        assert pod["status"]["phase"] == "Running", pod["status"]
        got = entry(pod)
        names = (
            got["cdiDevices"] if strategy == "cdi-cri" else ",".join(got["annotations"].values()).split(",")
        )
        assert names == [f"nvidia.com/gpu={GPU_A}", "kube-vgpu.io/hami-core=shared"]
        # the answer keeps what differs per container; the runtime added the rest from our spec
        assert [m["containerPath"] for m in got["mounts"]] == ["/usr/local/vgpu"]
        assert got["envs"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
        assert [m["containerPath"] for m in got["cdi"]["mounts"]] == [
            "/usr/local/vgpu/libvgpu.so",
            "/tmp/vgpulock",
            "/etc/ld.so.preload",
        ]
        lock = next(m for m in got["cdi"]["mounts"] if m["containerPath"] == "/tmp/vgpulock")
        assert lock["hostPath"] == "/usr/local/vgpu/vgpulock"  # root's lock dir, never the host's /tmp


async def test_a_name_no_spec_defines_fails_the_container(tmp_path: pathlib.Path) -> None:
    """No toolkit spec on the node: the GPU's name is unresolvable (our spec is there)."""
    install_hami_core(tmp_path)
    async with rig(
        tmp_path, dirwatch.InotifyWatcher(), cdi_spec_dirs=spec_dirs(tmp_path), device_list_strategy="cdi-cri"
    ) as r:
        gpu_pod(r.store, "p", init=None, main=GPU_A)
        pod = await wait_for(r.store, "pods", "p", creation_failed, namespace="default")
        assert pod["status"].get("phase") != "Running"
        (status,) = pod["status"]["containerStatuses"]
        assert status["state"]["waiting"]["message"] == (
            f"CDI device injection failed: unresolvable CDI devices nvidia.com/gpu={GPU_A}"
        )


async def test_our_spec_gone_fails_the_container_naming_it(tmp_path: pathlib.Path) -> None:
    """The runtime needs our spec as much as the toolkit's: removed (a wiped /var/run) while the
    plugin still names it, the container cannot be created."""
    install_hami_core(tmp_path)
    toolkit_spec(tmp_path)
    async with rig(
        tmp_path,
        dirwatch.InotifyWatcher(),
        cdi_spec_dirs=spec_dirs(tmp_path),
        device_list_strategy="cdi-annotations",
    ) as r:
        (tmp_path / OUR_SPEC).unlink()
        gpu_pod(r.store, "p", init=None, main=GPU_B)
        pod = await wait_for(r.store, "pods", "p", creation_failed, namespace="default")
        (status,) = pod["status"]["containerStatuses"]
        assert status["state"]["waiting"]["message"].endswith(
            "unresolvable CDI devices kube-vgpu.io/hami-core=shared"
        )


async def test_an_unwritable_spec_directory_keeps_every_edit_in_the_answer(tmp_path: pathlib.Path) -> None:
    """Our spec cannot be written: the answer names only the GPU and carries HAMi-core itself."""
    install_hami_core(tmp_path)
    toolkit_spec(tmp_path)
    (tmp_path / "var/run").mkdir(parents=True)
    (tmp_path / "var/run/cdi").write_text("not a directory")
    async with rig(
        tmp_path, dirwatch.InotifyWatcher(), cdi_spec_dirs=spec_dirs(tmp_path), device_list_strategy="cdi-cri"
    ) as r:
        gpu_pod(r.store, "p", init=None, main=GPU_A)
        pod = await wait_for(r.store, "pods", "p", settled, namespace="default")
        assert pod["status"]["phase"] == "Running"
        got = entry(pod)
        assert got["cdiDevices"] == [f"nvidia.com/gpu={GPU_A}"]
        assert "/etc/ld.so.preload" in [m["containerPath"] for m in got["mounts"]]


async def test_a_restarted_session_refreshes_the_spec(tmp_path: pathlib.Path) -> None:
    """HAMi-core's library gone at a session's start (a runtime would make a directory of it): the
    spec leaves it out, never naming a missing file (and Allocate is refused meanwhile). Installed
    again, SIGHUP's new session writes the spec with it, and the answers follow it."""
    toolkit_spec(tmp_path)
    async with rig(
        tmp_path, dirwatch.InotifyWatcher(), cdi_spec_dirs=spec_dirs(tmp_path), device_list_strategy="cdi-cri"
    ) as r:
        (tmp_path / "usr/local/vgpu/libvgpu.so").unlink()
        r.manager.request_restart("SIGHUP")
        await r.manager.wait_started(2)
        first = json.loads((tmp_path / OUR_SPEC).read_text())
        assert [m["hostPath"] for m in first["devices"][0]["containerEdits"]["mounts"]] == [
            "/usr/local/vgpu/vgpulock",
            "/usr/local/vgpu/ld.so.preload",
        ]
        hamicore.install_stand_in(tmp_path, hook_path="/usr/local")
        r.manager.request_restart("SIGHUP")
        await r.manager.wait_started(3)
        await wait_for(r.store, "nodes", NODE, gpu_allocatable(4))
        again = json.loads((tmp_path / OUR_SPEC).read_text())
        assert [m["hostPath"] for m in again["devices"][0]["containerEdits"]["mounts"]] == [
            "/usr/local/vgpu/libvgpu.so",
            "/usr/local/vgpu/vgpulock",
            "/usr/local/vgpu/ld.so.preload",
        ]
        gpu_pod(r.store, "p", init=None, main=GPU_A)
        pod = await wait_for(r.store, "pods", "p", settled, namespace="default")
        assert pod["status"]["phase"] == "Running"
        assert [m["containerPath"] for m in entry(pod)["mounts"]] == ["/usr/local/vgpu"]
        # the runtime, preparing the answer's mounts on the host, made no directory of the spec's files
        assert (tmp_path / entry(pod)["mounts"][0]["hostPath"].lstrip("/")).is_dir()
        assert (tmp_path / "usr/local/vgpu/libvgpu.so").is_file()
