"""Memory under idle TLS connections: the vgpu-scheduler binary's RSS as N clients connect and sit.

Starts the emulated API server and ``vgpu-scheduler`` (HTTPS, a throwaway CA) as a subprocess on
127.0.0.1, opens ``--connections`` TLS connections to its Service port that complete the handshake
and send nothing, and prints the process's RSS (``/proc/<pid>/status``) before, with them open,
and after the server has closed them. ``--extra-flags`` are passed to the binary (e.g. an older
version without the listener flags: ``--extra-flags ''``).

    .venv/bin/python -m bench.idle_connections_bench [--connections 2000] [--extra-flags '--max-connections 256']
"""

import argparse
import asyncio
import contextlib
import datetime
import os
import shlex
import ssl
import sys
import tempfile
import time
from pathlib import Path

from vgpu.kube.kubeconfig import write_kubeconfig
from vgpu.localcluster import certs
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

from bench.procstat import rss_mib


async def run(connections: int, extra_flags: list[str], hold_s: float) -> None:
    server = ApiServer(Store())
    await server.start()
    tmp = Path(tempfile.mkdtemp(prefix="vgpu-idle-", dir="/tmp"))
    tls = certs.make_serving_certs(tmp / "certs", now=datetime.datetime.now(datetime.UTC))
    ctx = ssl.create_default_context(cafile=str(tls.ca_file))
    ready = tmp / "ready"
    with (tmp / "scheduler.log").open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vgpu_scheduler.main",
            "--kubeconfig", str(write_kubeconfig(tmp / "kubeconfig", server=server.url)),
            "--host", "127.0.0.1", "--port", "0",
            "--tls-cert-file", str(tls.cert_file), "--tls-key-file", str(tls.key_file),
            "--ready-file", str(ready), *extra_flags,
            stdout=out, stderr=asyncio.subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    writers: list[asyncio.StreamWriter] = []
    try:
        while not ready.exists():
            if proc.returncode is not None:
                raise SystemExit((tmp / "scheduler.log").read_text())
            await asyncio.sleep(0.05)
        host, port = ready.read_text().split()[0].rsplit(":", 1)
        await asyncio.sleep(1.0)  # let the first sync settle before the baseline
        before = rss_mib(proc.pid)
        refused = 0
        started = time.perf_counter()
        for _ in range(connections):
            try:
                _, writer = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=host)
                writers.append(writer)
            except (OSError, ssl.SSLError):
                refused += 1
        opened_s = time.perf_counter() - started
        held = rss_mib(proc.pid)
        await asyncio.sleep(hold_s)
        after = rss_mib(proc.pid)
        print(
            f"connections {connections}: {len(writers)} completed the TLS handshake, {refused} refused "
            f"({opened_s:.1f} s to open)\n"
            f"RSS MB: {before:.0f} before, {held:.0f} with them open (+{held - before:.0f}), "
            f"{after:.0f} after {hold_s:.0f} s"
        )
    finally:
        for writer in writers:
            writer.transport.abort()
        proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 15)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--extra-flags", default="--extender-port 0", help="more vgpu-scheduler flags")
    p.add_argument("--hold-s", type=float, default=8.0, help="seconds to wait before the last RSS reading")
    args = p.parse_args()
    asyncio.run(run(args.connections, shlex.split(args.extra_flags), args.hold_s))


if __name__ == "__main__":
    main()
