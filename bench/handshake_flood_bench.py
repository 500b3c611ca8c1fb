"""Memory and ``/filter`` latency under a flood of TLS handshakes that never start (issue 49, item 1).

Starts the emulated API server (``--nodes`` GPU nodes, their Leases kept fresh) and the
``vgpu-scheduler`` binary (HTTPS with a throwaway CA) on 127.0.0.1. A caller sends ``/filter`` for
a one-GPU pod over one keep-alive connection to the extender port every ``--filter-every-ms``, as
kube-scheduler does, the whole time. After ``--baseline-s`` seconds of that alone, each round
opens ``--connections`` plain TCP connections to the Service port that send nothing and waits
until the scheduler has closed them all (its TLS handshake timeout, 5 s). Per round it prints the
scheduler's resident memory (``/proc/<pid>/status``, helper processes apart) and the p50/p99 of
the ``/filter`` calls made during it; at the end, the baseline's p99 and how the memory moved.

    .venv/bin/python -m bench.handshake_flood_bench [--rounds 12] [--connections 256] [--nodes 200]
        [--pythonpath OTHER_TREE/services:OTHER_TREE/libs]

``--pythonpath`` runs the scheduler from another source tree (an older release, to compare).
Before the listener broke the handshake's reference cycle, each round kept its 256 ``SSLProtocol``
objects (256 KiB each) until an idle compaction, which a scheduler called every few ms never got.
"""

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from vgpu.core import annotations, lease
from vgpu.kube.kubeconfig import write_kubeconfig
from vgpu.localcluster import certs
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.store import Store

from bench import fleet
from bench.percentile import pct
from bench.procstat import rss_mib

LEASE_NAMESPACE = "kube-system"  # the scheduler's default scheduler.leaseNamespace


def _populate(store: Store, nodes: int) -> list[str]:
    names = []
    for n in range(nodes):
        name = fleet.node_name(n)
        register = annotations.encode_node_register(fleet.gpus(n))
        store.create(
            "nodes", {"metadata": {"name": name, "annotations": {annotations.KEYS.node_register: register}}}
        )
        names.append(name)
    _renew(store, names, create=True)
    return names


def _renew(store: Store, names: list[str], *, create: bool = False) -> None:
    stamp = lease.format_micro_time(datetime.datetime.now(datetime.UTC))
    for name in names:
        if create:
            body = {"metadata": {"name": lease.name(name)}, "spec": {"renewTime": stamp}}
            store.create("leases", body, namespace=LEASE_NAMESPACE)
        else:
            spec = {"spec": {"renewTime": stamp}}
            store.patch("leases", lease.name(name), spec, patch_type="merge", namespace=LEASE_NAMESPACE)


def _filter_request(names: list[str]) -> bytes:
    pod = {
        "metadata": {"name": "flood-probe", "namespace": "default", "uid": "flood-probe-uid"},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}
            ],
        },
    }
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}, separators=(",", ":")).encode()
    head = f"POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class FilterCaller:
    """kube-scheduler's calls: one keep-alive connection, a /filter every ``every_s``."""

    def __init__(self, address: str, request: bytes, *, every_s: float) -> None:
        self._address = address
        self._request = request
        self._every_s = every_s
        self.latencies_s: list[float] = []
        self.failures = 0
        self.last_failure = b""
        self.placing = asyncio.Event()  # set at the first answer that places the pod

    async def run(self) -> None:
        host, port = self._address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while True:
                started = time.perf_counter()
                writer.write(self._request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = await reader.readexactly(length)
                self.latencies_s.append(time.perf_counter() - started)
                if not head.startswith(b"HTTP/1.1 200") or b'"NodeNames":["' not in body:
                    self.failures += 1
                    self.last_failure = body[:300]
                else:
                    self.placing.set()
                await asyncio.sleep(max(0.0, self._every_s - (time.perf_counter() - started)))
        finally:
            writer.close()

    def take(self) -> list[float]:
        taken, self.latencies_s = self.latencies_s, []
        return taken


async def _flood_round(address: str, connections: int) -> float:
    """Open ``connections`` TCP connections that send nothing; return once the server closed them."""
    host, port = address.rsplit(":", 1)
    started = time.perf_counter()
    opened = await asyncio.gather(
        *(asyncio.open_connection(host, int(port)) for _ in range(connections)), return_exceptions=True
    )

    async def closed(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()

    streams = [o for o in opened if isinstance(o, tuple)]
    await asyncio.gather(*(closed(reader) for reader, _ in streams))
    for _, writer in streams:
        writer.close()
    return time.perf_counter() - started


def _ms(values: list[float], q: float) -> str:
    return f"{pct(values, q / 100) * 1000:6.2f}" if values else "     -"


async def run(opts: argparse.Namespace) -> None:
    store = Store()
    names = _populate(store, opts.nodes)
    server = ApiServer(store)
    await server.start()
    tmp = Path(tempfile.mkdtemp(prefix="vgpu-flood-", dir="/tmp"))
    tls = certs.make_serving_certs(tmp / "certs", now=datetime.datetime.now(datetime.UTC))
    ready, log = tmp / "ready", tmp / "scheduler.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if opts.pythonpath:
        env["PYTHONPATH"] = opts.pythonpath
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vgpu_scheduler.main",
            "--kubeconfig", str(write_kubeconfig(tmp / "kubeconfig", server=server.url)),
            "--host", "127.0.0.1", "--port", "0", "--extender-port", "0",
            "--tls-cert-file", str(tls.cert_file), "--tls-key-file", str(tls.key_file),
            "--ready-file", str(ready),
            stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
    caller_task: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(60):
            while not ready.exists() or len(ready.read_text().split()) < 2:
                if proc.returncode is not None:
                    raise SystemExit(log.read_text())
                await asyncio.sleep(0.05)
        service, extender = ready.read_text().split()
        caller = FilterCaller(extender, _filter_request(names), every_s=opts.filter_every_ms / 1000)
        caller_task = asyncio.create_task(caller.run())
        await asyncio.wait_for(caller.placing.wait(), 60)  # the scheduler has synced
        caller.take()
        caller.failures = 0
        await asyncio.sleep(opts.baseline_s)
        baseline = caller.take()
        start_rss = rss_mib(proc.pid)
        print(
            f"{opts.nodes} nodes, a /filter every {opts.filter_every_ms:g} ms; baseline {opts.baseline_s:g} s: "
            f"{len(baseline)} calls, p50 {_ms(baseline, 50)} ms, p99 {_ms(baseline, 99)} ms; RSS {start_rss:.0f} MiB"
        )
        print("round  seconds  RSS MiB  /filter calls  p50 ms  p99 ms")
        began = time.perf_counter()
        rss: list[float] = []
        flooded: list[float] = []
        for n in range(1, opts.rounds + 1):
            _renew(store, names)
            seconds = await _flood_round(service, opts.connections)
            rss.append(rss_mib(proc.pid))
            taken = caller.take()
            flooded += taken
            print(
                f"{n:5d}  {seconds:7.1f}  {rss[-1]:7.0f}  {len(taken):13d}  {_ms(taken, 50)}  {_ms(taken, 99)}"
            )
        print(
            f"{opts.rounds} rounds of {opts.connections} silent connections in {time.perf_counter() - began:.0f} s: "
            f"RSS {start_rss:.0f} -> {rss[-1]:.0f} MiB (max {max(rss):.0f}); /filter p99 {_ms(flooded, 99)} ms "
            f"(baseline {_ms(baseline, 99)}), {caller.failures} answers without a node"
        )
        if caller.failures:
            print(f"  the last: {caller.last_failure!r}")
        compactions = [
            line for line in log.read_text().splitlines() if "compacted the frozen objects" in line
        ]
        print(f"compactions in the scheduler's log: {len(compactions)}")
        for line in compactions[-3:]:
            print("  " + line[-160:])
    finally:
        if caller_task is not None:
            caller_task.cancel()
            await asyncio.gather(caller_task, return_exceptions=True)
        proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 15)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=12, help="flood rounds (each about 5 s)")
    p.add_argument("--connections", type=int, default=256, help="silent connections a round")
    p.add_argument("--nodes", type=int, default=200, help="GPU nodes in the cluster and in each /filter")
    p.add_argument("--filter-every-ms", type=float, default=10.0, help="pace of the /filter calls")
    p.add_argument("--baseline-s", type=float, default=5.0, help="seconds of /filter alone first")
    p.add_argument("--pythonpath", default="", help="PYTHONPATH for the scheduler (another source tree)")
    return p.parse_args(argv)


def main() -> None:
    asyncio.run(run(parse_args()))


if __name__ == "__main__":
    main()
