"""The plugin's own CDI spec on the host (cdispecfile): written, atomically, only what exists."""

import json
import logging
import os
import pathlib

import pytest
from vgpu.core import cdispec
from vgpu_device_plugin import cdispecfile
from vgpu_device_plugin.hostfs import HostFs

from tests.device_plugin.builders import config

SPEC = pathlib.Path("var/run/cdi") / "kube-vgpu.io-hami-core.json"


def host(root: pathlib.Path, hook: str = "/usr/local") -> HostFs:
    return HostFs(root, hook_path=hook)


def install_hami_core(root: pathlib.Path, hook: str = "usr/local") -> None:
    (root / hook / "vgpu").mkdir(parents=True)
    (root / hook / "vgpu" / "libvgpu.so").write_bytes(b"\x7fELF")
    (root / hook / "vgpu" / "ld.so.preload").write_text(f"/{hook}/vgpu/libvgpu.so\n")


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
def test_spec_is_written_valid_with_every_mount(tmp_path: pathlib.Path, strategy: str) -> None:
    install_hami_core(tmp_path)
    edits = cdispecfile.publish(host(tmp_path), config=config(device_list_strategy=strategy), node="n1")
    assert edits is not None and edits.device == "kube-vgpu.io/hami-core=shared"
    doc = json.loads((tmp_path / SPEC).read_text())
    assert cdispec.validate(doc) == []
    assert [m["containerPath"] for m in doc["devices"][0]["containerEdits"]["mounts"]] == [
        "/usr/local/vgpu/libvgpu.so",
        "/tmp/vgpulock",
        "/etc/ld.so.preload",
    ]
    # the lock dir's host side is root's <hook>/vgpu/vgpulock (made as Allocate makes it), never /tmp
    mounts = {m["containerPath"]: m["hostPath"] for m in doc["devices"][0]["containerEdits"]["mounts"]}
    assert mounts["/tmp/vgpulock"] == "/usr/local/vgpu/vgpulock"
    assert (tmp_path / "usr/local/vgpu/vgpulock").is_dir()
    assert not (tmp_path / "tmp").exists()
    assert (tmp_path / SPEC).stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path / SPEC.parent) == [SPEC.name]  # no temp file left behind


@pytest.mark.parametrize("strategy", ["envvar", "volume-mounts"])
def test_no_spec_without_a_cdi_strategy(tmp_path: pathlib.Path, strategy: str) -> None:
    install_hami_core(tmp_path)
    assert (
        cdispecfile.publish(host(tmp_path), config=config(device_list_strategy=strategy), node="n1") is None
    )
    assert not (tmp_path / "var").exists()


def test_rewrite_replaces_the_file_by_rename_and_follows_the_hook_path(tmp_path: pathlib.Path) -> None:
    install_hami_core(tmp_path)
    install_hami_core(tmp_path, "opt/hami")
    cdispecfile.publish(host(tmp_path), config=config(device_list_strategy="cdi-cri"), node="n1")
    reader = tmp_path / "reader-holds-the-old-file"
    os.link(tmp_path / SPEC, reader)  # a runtime reading while we write keeps a whole old file
    old_text = reader.read_text()
    cdispecfile.publish(
        host(tmp_path, "/opt/hami"),
        config=config(device_list_strategy="cdi-cri", hook_path="/opt/hami"),
        node="n1",
    )
    new_text = (tmp_path / SPEC).read_text()
    assert reader.read_text() == old_text and "/usr/local/vgpu/libvgpu.so" in old_text
    assert "/opt/hami/vgpu/libvgpu.so" in new_text and "/usr/local/" not in new_text
    assert os.stat(reader).st_ino != os.stat(tmp_path / SPEC).st_ino
    assert sorted(os.listdir(tmp_path / SPEC.parent)) == [SPEC.name]


def test_identical_spec_is_left_alone(tmp_path: pathlib.Path) -> None:
    install_hami_core(tmp_path)
    cfg = config(device_list_strategy="cdi-cri")
    cdispecfile.publish(host(tmp_path), config=cfg, node="n1")
    before = os.stat(tmp_path / SPEC)
    assert cdispecfile.publish(host(tmp_path), config=cfg, node="n1") is not None
    after = os.stat(tmp_path / SPEC)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize(
    "garbage", [b"{not json", b"\xff\xfe binary", b""], ids=["broken-json", "not-utf8", "empty"]
)
def test_existing_garbage_spec_is_replaced(tmp_path: pathlib.Path, garbage: bytes) -> None:
    install_hami_core(tmp_path)
    (tmp_path / SPEC).parent.mkdir(parents=True)
    (tmp_path / SPEC).write_bytes(garbage)
    assert cdispecfile.publish(host(tmp_path), config=config(device_list_strategy="cdi-cri"), node="n1")
    assert cdispec.validate(json.loads((tmp_path / SPEC).read_text())) == []


def test_missing_hami_core_files_are_left_out_and_logged(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "usr/local/vgpu").mkdir(parents=True)  # the chart's hostPath: made, but empty
    with caplog.at_level(logging.ERROR):
        edits = cdispecfile.publish(host(tmp_path), config=config(device_list_strategy="cdi-cri"), node="n1")
    assert edits is not None and [m.container_path for m in edits.mounts] == ["/tmp/vgpulock"]
    doc = json.loads((tmp_path / SPEC).read_text())
    assert [m["hostPath"] for m in doc["devices"][0]["containerEdits"]["mounts"]] == [
        "/usr/local/vgpu/vgpulock"
    ]
    assert "HAMi-core's /usr/local/vgpu/libvgpu.so is missing on the host" in caplog.text
    assert "HAMi-core's /usr/local/vgpu/ld.so.preload is missing on the host" in caplog.text


@pytest.mark.parametrize("bad", ["directory", "symlink"])
def test_hami_core_files_that_are_not_regular_files_are_left_out(tmp_path: pathlib.Path, bad: str) -> None:
    """The rule Allocate applies: a directory (what a runtime made of a missing file) or a symlink
    is not HAMi-core's file, so the spec never mounts it."""
    core = tmp_path / "usr/local/vgpu"
    core.mkdir(parents=True)
    (core / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    if bad == "directory":
        (core / "libvgpu.so").mkdir()
    else:
        (tmp_path / "elsewhere.so").write_bytes(b"\x7fELF")
        (core / "libvgpu.so").symlink_to(tmp_path / "elsewhere.so")
    edits = cdispecfile.publish(host(tmp_path), config=config(device_list_strategy="cdi-cri"), node="n1")
    assert edits is not None
    assert [m.container_path for m in edits.mounts] == ["/tmp/vgpulock", "/etc/ld.so.preload"]


def test_a_lock_dir_planted_as_a_symlink_is_left_out(tmp_path: pathlib.Path) -> None:
    install_hami_core(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "usr/local/vgpu/vgpulock").symlink_to(tmp_path / "elsewhere")
    edits = cdispecfile.publish(host(tmp_path), config=config(device_list_strategy="cdi-cri"), node="n1")
    assert edits is not None
    assert [m.container_path for m in edits.mounts] == ["/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"]


def test_nothing_usable_writes_no_spec(tmp_path: pathlib.Path) -> None:
    """No <hook>/vgpu at all: not even the lock dir can be made; nothing of HAMi-core to carry."""
    assert (
        cdispecfile.publish(host(tmp_path), config=config(device_list_strategy="cdi-cri"), node="n1") is None
    )
    assert not (tmp_path / SPEC).exists()


@pytest.mark.parametrize("blocker", ["file-as-directory", "directory-as-spec"])
def test_unwritable_spec_directory_is_logged_and_no_spec_is_named(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, blocker: str
) -> None:
    install_hami_core(tmp_path)
    if blocker == "file-as-directory":
        (tmp_path / "var/run").mkdir(parents=True)
        (tmp_path / "var/run/cdi").write_text("a file where the directory should be")
    else:
        (tmp_path / SPEC).mkdir(parents=True)
    with caplog.at_level(logging.ERROR):
        edits = cdispecfile.publish(host(tmp_path), config=config(device_list_strategy="cdi-cri"), node="n1")
    assert edits is None
    assert "cannot write the CDI spec" in caplog.text and "stay in the Allocate answers" in caplog.text
    if blocker == "directory-as-spec":
        assert os.listdir(tmp_path / SPEC.parent) == [SPEC.name]  # the temp file was removed


def test_spec_directory_comes_from_the_config(tmp_path: pathlib.Path) -> None:
    install_hami_core(tmp_path)
    cfg = config(device_list_strategy="cdi-annotations", cdi_spec_dir="/etc/cdi")
    assert cdispecfile.publish(host(tmp_path), config=cfg, node="n1") is not None
    assert (tmp_path / "etc/cdi/kube-vgpu.io-hami-core.json").is_file()
