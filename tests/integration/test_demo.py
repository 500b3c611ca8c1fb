"""`vgpu demo` end to end, as a user runs it: real processes, real HTTP(S), real gRPC over unix sockets."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest
import yaml
from vgpu.demo import workload

pytestmark = pytest.mark.slow


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )


@pytest.mark.timeout(180)
def test_demo_places_every_sample_pod_and_explains_the_one_that_cannot_fit() -> None:
    result = run_demo()
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for pod in workload.sample_workload():
        if pod.expect_pending:
            assert re.search(rf"{pod.name}\s+Pending: .*no GPU with 200000 MiB free", out), out
        else:
            assert re.search(rf"{pod.name}\s+Running\s+→ gpu-node-\d", out), out
    # the container env came from the device plugin's Allocate through the kubelet emulation
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=10000m" in out
    assert "CUDA_DEVICE_MEMORY_LIMIT_1=8000m" in out  # the 2-GPU pod got two limits
    assert "OK: 8/8 pods as expected" in out


@pytest.mark.timeout(120)
def test_demo_fails_when_a_pod_expected_to_run_does_not(tmp_path: pathlib.Path) -> None:
    pods = [
        {
            "metadata": {"name": "fits"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}},
                    }
                ]
            },
        },
        {
            "metadata": {"name": "cannot"},
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]
            },
        },
    ]
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(pods))
    result = run_demo("--nodes", "1", "--gpus", "2", "--workload", str(path), "--timeout", "15")
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"fits\s+Running", result.stdout)
    assert re.search(r"cannot\s+Pending: ", result.stdout)
    assert "FAILED: 1/2 pods as expected (not as expected: cannot)" in result.stdout


def test_demo_rejects_a_bad_workload_file_with_a_clear_message(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("- kind: Service\n")
    result = run_demo("--workload", str(path))
    assert result.returncode == 2
    assert "expected a Pod manifest" in result.stderr
