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
