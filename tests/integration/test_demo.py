"""`vgpu demo` end to end, as a user runs it: real processes, real HTTP(S), real gRPC over unix sockets."""

from __future__ import annotations

import asyncio
import pathlib
import re
import signal
import ssl
import subprocess
import sys

import aiohttp
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
    # the models as NVML names them, as `vgpu status` and `vgpu simulate` show them
    assert re.search(r"\d Tesla T4 +mem ", out) and "NVIDIA-" not in out, out
    # the preemption act: a GPU-only shortfall, which kube-scheduler (emulated v1.36) does not
    # call /preempt for: the scheduler's own path evicts both slices and the training pod runs
    assert re.search(r"evicted low-infer-1 .*evicted by vgpu-scheduler", out, re.S), out
    assert re.search(r"high-train\s+evicting 2 pod\(s\) on node gpu-node-\d to make room", out), out
    assert re.search(r"high-train\s+Running\s+→ gpu-node-\d", out), out


# a 1-GPU, 1,000 MiB pod that fits any demo node
FITS = {
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
}


@pytest.mark.timeout(120)
def test_demo_fails_when_a_pod_expected_to_run_does_not(tmp_path: pathlib.Path) -> None:
    pods = [
        FITS,
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


@pytest.mark.timeout(180)
def test_demo_runs_the_example_workload_that_simulate_reads_too() -> None:
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "workload.yaml"
    result = run_demo("--workload", str(example))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"inference-2\s+Running\s+→ gpu-node-\d", result.stdout)  # replicas, namespace
    assert re.search(r"huge\s+Pending: ", result.stdout)  # expect: pending
    assert "OK: 13/13 pods as expected" in result.stdout


def test_demo_rejects_a_bad_workload_file_with_a_clear_message(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("- kind: Service\n")
    result = run_demo("--workload", str(path))
    assert result.returncode == 2
    assert "expected a Pod manifest" in result.stderr


@pytest.mark.timeout(120)
async def test_demo_keep_prints_the_dashboard_url_and_it_serves_the_live_state(
    tmp_path: pathlib.Path,
) -> None:
    pods = [FITS]
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(pods))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "vgpu.cli",
        "demo",
        "--keep",
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--workload",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    out = b""
    try:
        async with asyncio.timeout(90):
            while b"Press Ctrl-C to stop." not in out:
                line = await proc.stdout.readline()
                assert line, out.decode()
                out += line
        text = out.decode()
        url = re.search(r"dashboard \(live\): (https://127\.0\.0\.1:\d+/ui)\n", text)
        ca = re.search(r"throwaway CA, (\S+):", text)
        assert url is not None and ca is not None, text
        trust = ssl.create_default_context(cafile=ca.group(1))
        async with aiohttp.ClientSession() as session:
            async with session.get(url.group(1), ssl=trust) as resp:
                assert resp.status == 200 and "<!DOCTYPE html>" in await resp.text()
            async with session.get(f"{url.group(1)}/state", ssl=trust) as resp:
                snap = await resp.json()
        held = [p["name"] for n in snap["nodes"] for g in n["gpus"] for p in g["pods"]]
        # the workload's pod (the demo's preemption act may have placed its own pod beside it)
        assert [n["name"] for n in snap["nodes"]] == ["gpu-node-0"] and "fits" in held
    finally:
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            await proc.communicate()
