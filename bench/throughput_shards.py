"""``Shards``: the throughput bench's node side from processes of their own (``--node-procs N``).

One process for 1,000 nodes becomes the limit where cores are spare (one Python core), so each
shard process (``python -m bench.throughput_nodes``, its arguments from ``shard_args``) stands in
for every N-th node from its index, with a pods watch of its own as each kubelet has. ``Shards``
starts them and waits for each one's ``ready``; on exit it closes their stdin and collects the
Allocate failures each prints as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys

SHARD_EXIT_S = 30.0  # for a node shard to finish its pods' writes and exit once told to


def shard_args(
    opts: argparse.Namespace,
    *,
    url: str,
    ca_file: str | None,
    config_file: pathlib.Path,
    host_root: pathlib.Path,
) -> list[str]:
    """The command-line arguments (after ``-m bench.throughput_nodes``) of every shard but the index."""
    return [
        *("--url", url, "--config", str(config_file), "--host-root", str(host_root)),
        *("--nodes", str(opts.nodes), "--shards", str(opts.node_procs)),
        *("--gpus-per-node", str(opts.gpus_per_node), "--gpu-memory-mib", str(opts.gpu_memory_mib)),
        *("--slots", str(opts.slots), "--admission-delay-s", str(opts.admission_delay_s)),
        *("--start-delay-s", str(opts.start_delay_s), "--plugin-search", opts.plugin_search),
        *(("--ca-file", ca_file) if ca_file else ()),
    ]


class Shards:
    """``count`` shard processes of the nodes (``python -m bench.throughput_nodes``), each started
    and ready (registered, synced) on entry; on exit their stdin is closed and their Allocate
    failures are added to ``failures``."""

    def __init__(self, count: int, args: list[str], *, token: str | None, log_dir: pathlib.Path) -> None:
        self._count = count
        self._args = args
        self._env = {**os.environ, "VGPU_BENCH_TOKEN": token or ""}
        self._log_dir = log_dir
        self.procs: list[asyncio.subprocess.Process] = []
        self.failures: list[str] = []

    async def __aenter__(self) -> Shards:
        for index in range(self._count):
            with (self._log_dir / f"nodes-{index}.log").open("wb") as log_file:
                self.procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        *("-m", "bench.throughput_nodes", *self._args, "--shard", str(index)),
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=log_file,
                        env=self._env,
                    )
                )
        for index, proc in enumerate(self.procs):
            assert proc.stdout is not None
            line = await proc.stdout.readline()
            if line.strip() != b"ready":
                await self.__aexit__(None, None, None)  # the others end too
                raise RuntimeError(f"node shard {index} did not start (see nodes-{index}.log): {line!r}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for index, proc in enumerate(self.procs):
            try:
                async with asyncio.timeout(SHARD_EXIT_S):
                    out, _ = await proc.communicate()
            except TimeoutError:
                proc.kill()
                out, _ = await proc.communicate()
            try:
                self.failures += json.loads(out.decode().strip().splitlines()[-1])["failures"]
            except (ValueError, IndexError, KeyError):
                self.failures.append(f"node shard {index} exited {proc.returncode} without its report")
