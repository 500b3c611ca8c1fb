"""The ``vgpu`` command as a shell user meets it: a closed pipe, a missing kubeconfig."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_reader_that_goes_away_is_no_traceback() -> None:
    """`vgpu simulate --json | head`: the pipe closes before the report is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE, as after `head` has exited
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "vgpu.cli",
                "simulate",
                "--cluster",
                str(EXAMPLES / "cluster.yaml"),
                "--workload",
                str(EXAMPLES / "workload.yaml"),
                "--json",
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 128 + signal.SIGPIPE


def _status(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "status"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_status_without_a_kubeconfig_names_the_files_tried_and_how_to_give_one(tmp_path: Path) -> None:
    result = _status({"HOME": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"vgpu status: kubeconfig: none found (tried {tmp_path}/.kube/config, and this is not a pod: "
        "KUBERNETES_SERVICE_HOST is unset); point at one with --kubeconfig PATH or KUBECONFIG=PATH\n"
    )


def test_status_names_every_file_of_kubeconfig_it_tried(tmp_path: Path) -> None:
    listed = f"{tmp_path}/a:{tmp_path}/b"
    result = _status({"HOME": str(tmp_path), "KUBECONFIG": listed})
    assert result.returncode == 2
    assert f"tried {tmp_path}/a, {tmp_path}/b," in result.stderr and "Traceback" not in result.stderr
