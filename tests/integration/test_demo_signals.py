"""`vgpu demo --keep` stopped by Ctrl-C, `kill <pid>` or a closed terminal: every way leaves nothing
behind (no scheduler, scheduler helper or device plugin process, no temporary directory)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import signal
import sys

import pytest
import yaml

pytestmark = pytest.mark.slow

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


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) from /proc, None once the process is gone."""
    try:
        raw = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], fields[19]


def descendants(root: int) -> dict[int, str]:
    """Every live process below ``root``: pid -> start time (so a reused pid is not mistaken for it)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents.setdefault(stat[0], []).append(int(entry.name))
            starts[int(entry.name)] = stat[2]
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def survivors(processes: dict[int, str]) -> list[int]:
    return [
        pid
        for pid, start in processes.items()
        if (stat := _stat(pid)) is not None and stat[2] == start and stat[1] != "Z"
    ]


def exists(path: str) -> bool:
    return pathlib.Path(path).exists()


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "kill", "hangup"]
)
async def test_a_stop_signal_leaves_no_process_and_no_temp_dir(
    tmp_path: pathlib.Path, signum: signal.Signals
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump([FITS]))
    # Ctrl-C as in a terminal, however pytest was started: a shell starts a background job with
    # SIGINT ignored, and an ignored signal stays ignored across exec (the demo would never stop)
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from vgpu import cli; sys.exit(cli.main(sys.argv[1:]))"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        "demo",
        "--keep",
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--workload",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    out, rest = b"", b""
    children: dict[int, str] = {}
    try:
        async with asyncio.timeout(100):
            while b"Press Ctrl-C to stop." not in out:
                line = await proc.stdout.readline()
                assert line, out.decode()
                out += line
        logs = re.search(r"Service logs: (\S+)/logs\n", out.decode())
        assert logs is not None, out.decode()
        workdir = logs.group(1)
        children = descendants(proc.pid)
        # the scheduler and its helper, and one device plugin per node
        assert len(children) >= 4 and exists(workdir), (children, out.decode())
        proc.send_signal(signum)
        async with asyncio.timeout(60):
            rest, _ = await proc.communicate()
        assert proc.returncode == 0, (out + rest).decode()
        assert survivors(children) == [], (out + rest).decode()
        assert not exists(workdir)
    finally:  # a failed run must not leave its processes behind for the rest of the suite
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for pid in survivors(children):
            os.kill(pid, signal.SIGKILL)
