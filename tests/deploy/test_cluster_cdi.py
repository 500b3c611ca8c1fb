"""scripts/cluster/cluster.sh's containerd options, offline (``cluster.sh containerd-config`` prints
the config ``up`` writes): CDI turned on for a containerd 1.7 or newer from CONTAINERD_BIN, as the
DRA mode's kubelet path needs, and left out for 1.6, which has none; asking for it on 1.6, or a
value it does not know, is refused with the remedy."""

from __future__ import annotations

import pathlib
import subprocess
import tomllib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "cluster" / "cluster.sh"
CRI = "io.containerd.grpc.v1.cri"


def fake_containerd(tmp_path: pathlib.Path, version_line: str) -> pathlib.Path:
    """A directory whose ``containerd --version`` prints ``version_line``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "containerd"
    exe.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    exe.chmod(0o755)
    return bin_dir


def config(
    tmp_path: pathlib.Path, version_line: str, *, cdi: str = "auto"
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "CONTAINERD_BIN": str(fake_containerd(tmp_path, version_line)),
        "CDI": cdi,
        "CLUSTER_DIR": str(tmp_path / "cluster"),
    }
    return subprocess.run(
        ["bash", str(SCRIPT), "containerd-config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("version_line", "cdi"),
    [
        ("containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1", True),
        ("containerd github.com/containerd/containerd/v2 v2.1.0 abc", True),  # upstream's build
        ("containerd github.com/containerd/containerd 1.10.0 abc", True),
        ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", False),
        ("garbage", False),
        ("", False),
    ],
    ids=["1.7", "2.1", "1.10", "1.6", "garbage", "empty"],
)
def test_cdi_is_on_for_a_containerd_that_has_it(tmp_path: pathlib.Path, version_line: str, cdi: bool) -> None:
    done = config(tmp_path, version_line)
    assert done.returncode == 0, done.stderr
    cri = tomllib.loads(done.stdout)["plugins"][CRI]
    assert cri["restrict_oom_score_adj"] is True  # every pod sandbox fails here without it
    assert cri.get("enable_cdi", False) is cdi
    if cdi:
        assert cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    # containerd's own state stays under the cluster's directory, /opt/containerd included
    assert tomllib.loads(done.stdout)["plugins"]["io.containerd.internal.v1.opt"]["path"].startswith(
        str(tmp_path / "cluster")
    )


def test_cdi_on_with_a_containerd_without_it_is_refused_naming_the_remedy(tmp_path: pathlib.Path) -> None:
    done = config(tmp_path, "containerd github.com/containerd/containerd 1.6.20~ds1 x", cdi="on")
    assert done.returncode != 0
    assert "CDI=on needs containerd 1.7" in done.stderr and "containerd-cdi.sh" in done.stderr


def test_cdi_off_leaves_it_out_of_a_containerd_that_has_it(tmp_path: pathlib.Path) -> None:
    done = config(tmp_path, "containerd github.com/containerd/containerd 1.7.24 x", cdi="off")
    assert "enable_cdi" not in tomllib.loads(done.stdout)["plugins"][CRI]


def test_an_unknown_cdi_value_is_refused(tmp_path: pathlib.Path) -> None:
    done = config(tmp_path, "containerd github.com/containerd/containerd 1.7.24 x", cdi="yes")
    assert done.returncode != 0 and "expected auto, on or off" in done.stderr
