"""Admission webhook benchmark: reviews/s and latency at 64 concurrent clients, server on one core.

The server is the real aiohttp handler (``vgpu_scheduler.webhook.Webhook`` at ``POST /webhook``)
reading the scheduler's real ``ClusterState`` (fed with a namespace, a GPU ResourceQuota and a
node), in its own process bound to 127.0.0.1 port 0 and pinned to one core. The client runs in
this process on another core: raw keep-alive HTTP/1.1 over 64 connections (lighter than an HTTP
client library, so the client is not the bottleneck). Every review is a GPU pod that gets the full
path: validation, mutation, quota check and a base64 JSON Patch.

Two phases after a warm-up:
  * closed loop: each client sends its next review as soon as the last answer arrives, so the
    server runs flat out: the throughput figure (latency here is mostly queueing: 64 in flight);
  * open loop: the clients together offer ``--rate`` reviews/s on a fixed schedule; latency is
    measured from each request's scheduled send time (no coordinated omission): the p99 figure.

With ``--review pod-update`` or ``--review node-update`` every review is instead an UPDATE the
update guard decides on (vgpu.core.guard): a user relabelling a placed GPU pod, or a kubelet-like
write of a Node carrying the 8-GPU register annotation. Neither changes an owned key, so they take
the guard's common path (what every pod and node UPDATE costs on clusters without matchConditions).

    .venv/bin/python -m bench.webhook_bench [--seconds 5] [--clients 64] [--rate 1500]
        [--review create|pod-update|node-update] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

GPU_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"generateName": "train-", "namespace": "team", "labels": {"app": "train"}},
    "spec": {
        "schedulerName": "default-scheduler",
        "containers": [
            {
                "name": "trainer",
                "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                "env": [{"name": "EPOCHS", "value": "3"}],
                "resources": {
                    "limits": {
                        "cpu": "4",
                        "memory": "16Gi",
                        "nvidia.com/gpu": "1",
                        "nvidia.com/gpumem": "8000",
                    },
                    "requests": {"cpu": "4", "memory": "16Gi"},
                },
            },
            {"name": "sidecar", "image": "busybox"},
        ],
    },
}


PLACED_REGISTER = "hami.io/node-nvidia-register"
PLACED = {
    "hami.io/vgpu-node": "gpu-1",
    "hami.io/vgpu-time": "1700000000",
    "hami.io/vgpu-devices-to-allocate": ";",
    "hami.io/vgpu-devices-allocated": "GPU-3,NVIDIA,8000,0:;",
    "hami.io/bind-phase": "success",
    "hami.io/bind-time": "1700000000",
    "hami.io/gpu-type": "NVIDIA",
}


def _update(i: int, kind: str, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    request = {
        "uid": f"bench-{i:08d}",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "name": new["metadata"]["name"],
        "operation": "UPDATE",
        "userInfo": {"username": "system:node:gpu-1" if kind == "Node" else "alice", "groups": []},
        "object": new,
        "oldObject": old,
        "dryRun": False,
    }
    if kind == "Pod":
        request["namespace"] = "team"
    return request


def review_body(i: int, review: str = "create") -> bytes:
    if review == "pod-update":
        old = json.loads(json.dumps(GPU_POD))
        old["metadata"] |= {"name": f"train-{i}", "annotations": dict(PLACED), "labels": {"app": "train"}}
        new = json.loads(json.dumps(old))
        new["metadata"]["labels"]["stage"] = f"epoch-{i}"
        request = _update(i, "Pod", old, new)
    elif review == "node-update":
        from vgpu.core import annotations

        register = annotations.encode_node_register(_gpus())
        old = {
            "metadata": {
                "name": "gpu-1",
                "labels": {"gpu": "on"},
                "annotations": {PLACED_REGISTER: register},
            },
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "t0"}]},
        }
        new = json.loads(json.dumps(old))
        new["status"]["conditions"][0]["lastHeartbeatTime"] = f"t{i}"
        request = _update(i, "Node", old, new)
    else:
        request = {
            "uid": f"bench-{i:08d}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team",
            "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": GPU_POD,
            "dryRun": False,
        }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def _gpus() -> list[Any]:
    from vgpu.core.device import Gpu, GpuUuid

    return [
        Gpu(
            uuid=GpuUuid(f"GPU-{i}"), index=i, count=10, memory_mib=81920, cores=100, type="H100", health=True
        )
        for i in range(8)
    ]


def http_request(body: bytes) -> bytes:
    head = (
        "POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# --- server process ------------------------------------------------------------------------------


def _pin(core: int | None) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})


def _serve(conn: Connection, core: int | None) -> None:
    _pin(core)
    asyncio.run(_serve_async(conn))


async def _serve_async(conn: Connection) -> None:
    from aiohttp import web
    from vgpu.core import annotations, config
    from vgpu_scheduler import state, webhook

    conf = config.load(
        {"webhook": {"overwriteEnv": True, "trustedUsers": ["system:serviceaccount:kube-vgpu:scheduler"]}}
    )
    cluster = state.ClusterState(conf, clock=time.time)
    cluster.apply("namespaces", "ADDED", {"metadata": {"name": "team", "labels": {"tier": "ml"}}})
    quota = {"limits.nvidia.com/gpumem": "1000000", "limits.nvidia.com/gpucores": "100000"}
    cluster.apply(
        "resourcequotas", "ADDED", {"metadata": {"namespace": "team", "name": "gpu"}, "spec": {"hard": quota}}
    )
    gpus = _gpus()
    register = annotations.Keys(conf.annotation_prefix).node_register
    cluster.apply(
        "nodes",
        "ADDED",
        {"metadata": {"name": "gpu-1", "annotations": {register: annotations.encode_node_register(gpus)}}},
    )
    hook = webhook.Webhook(conf, cluster.quota)
    handler_wall_s: list[float] = []
    handler_cpu_s: list[float] = []

    @web.middleware
    async def timed(request: web.Request, handler: Any) -> web.StreamResponse:
        wall, cpu = time.perf_counter(), time.thread_time()
        response: web.StreamResponse = await handler(request)
        handler_cpu_s.append(time.thread_time() - cpu)
        handler_wall_s.append(time.perf_counter() - wall)
        return response

    app = web.Application(middlewares=[timed])
    app.router.add_post("/webhook", hook.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(conn.fileno(), stop.set)
    cpu_before = time.process_time()
    conn.send(sock.getsockname()[1])
    await stop.wait()
    loop.remove_reader(conn.fileno())
    conn.recv()
    conn.send(
        {
            "cpu_s": time.process_time() - cpu_before,
            "handler_wall": _percentiles_ms(handler_wall_s),
            "handler_cpu": _percentiles_ms(handler_cpu_s),
        }
    )
    await runner.cleanup()


# --- client --------------------------------------------------------------------------------------


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bool:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length)
    return head.startswith(b"HTTP/1.1 200") and b'"allowed":true' in body.replace(b" ", b"")


@dataclass
class Phase:
    name: str
    reviews: int
    errors: int
    seconds: float
    reviews_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float


def _percentiles_ms(samples: list[float]) -> dict[str, float]:
    if len(samples) < 2:
        return {}
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50_ms": round(q[49] * 1000, 3), "p99_ms": round(q[98] * 1000, 3)}


def _phase(name: str, latencies: list[float], errors: int, seconds: float) -> Phase:
    ordered = sorted(latencies)
    q = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
    return Phase(
        name=name,
        reviews=len(ordered),
        errors=errors,
        seconds=round(seconds, 3),
        reviews_per_s=round(len(ordered) / seconds, 1),
        p50_ms=round(q[49] * 1000, 3),
        p99_ms=round(q[98] * 1000, 3),
        max_ms=round(ordered[-1] * 1000, 3),
    )


async def _closed(port: int, clients: int, seconds: float, requests: list[bytes]) -> Phase:
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(clients)]
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def client(k: int) -> None:
        nonlocal errors
        reader, writer = conns[k]
        i = k
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            ok = await _roundtrip(reader, writer, requests[i % len(requests)])
            latencies.append(time.perf_counter() - start)
            errors += not ok
            i += clients

    began = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    elapsed = time.perf_counter() - began
    for _, writer in conns:
        writer.close()
    return _phase("closed loop (flat out)", latencies, errors, elapsed)


async def _open(port: int, clients: int, seconds: float, rate: float, requests: list[bytes]) -> Phase:
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(clients)]
    latencies: list[float] = []
    errors = 0
    interval = clients / rate  # each client's period
    began = time.perf_counter() + 0.05

    async def client(k: int) -> None:
        nonlocal errors
        reader, writer = conns[k]
        n = 0
        while True:
            scheduled = began + (k / clients) * interval + n * interval
            if scheduled - began >= seconds:
                return
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the offered load, not synchronisation
            ok = await _roundtrip(reader, writer, requests[(k + n * clients) % len(requests)])
            latencies.append(time.perf_counter() - scheduled)
            errors += not ok
            n += 1

    await asyncio.gather(*(client(k) for k in range(clients)))
    elapsed = time.perf_counter() - began
    for _, writer in conns:
        writer.close()
    return _phase(f"open loop at {rate:g}/s offered", latencies, errors, elapsed)


def run(
    *,
    seconds: float,
    clients: int,
    rate: float,
    server_core: int | None,
    client_core: int | None,
    review: str = "create",
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_serve, args=(child, server_core), daemon=True)
    process.start()
    try:
        if not parent.poll(30):
            raise RuntimeError("webhook server did not start within 30 s")
        port = parent.recv()
        _pin(client_core)
        requests = [http_request(review_body(i, review)) for i in range(1024)]

        async def phases() -> list[Phase]:
            warm_up = await _closed(port, clients, min(1.0, seconds), requests)
            return [
                warm_up,
                await _closed(port, clients, seconds, requests),
                await _open(port, clients, seconds, rate, requests),
            ]

        warm_up, *results = asyncio.run(phases())
        parent.send("stop")
        server = parent.recv() if parent.poll(30) else {}
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()
    total = warm_up.reviews + sum(p.reviews for p in results)  # the server's CPU covers all three
    return {
        "machine": _cpu_model(),
        "cores": os.cpu_count(),
        "server_core": server_core,
        "client_core": client_core,
        "clients": clients,
        "review": review,
        "phases": [asdict(p) for p in results],
        "server_cpu_us_per_review": round(server.get("cpu_s", 0.0) / total * 1e6, 1) if total else None,
        "handler_wall": server.get("handler_wall", {}),
        "handler_cpu": server.get("handler_cpu", {}),
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rate", type=float, default=1500.0, help="offered reviews/s in the open-loop phase")
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1 if (os.cpu_count() or 1) > 1 else None)
    parser.add_argument("--review", choices=("create", "pod-update", "node-update"), default="create")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = run(
        seconds=args.seconds,
        clients=args.clients,
        rate=args.rate,
        server_core=args.server_core,
        client_core=args.client_core,
        review=args.review,
    )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"machine: {result['machine']} ({result['cores']} cores); server pinned to core {args.server_core}")
    print(
        f"{'phase':32} {'reviews':>8} {'errors':>6} {'reviews/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
    )
    for p in result["phases"]:
        print(
            f"{p['name']:32} {p['reviews']:>8} {p['errors']:>6} {p['reviews_per_s']:>10} "
            f"{p['p50_ms']:>8} {p['p99_ms']:>8} {p['max_ms']:>8}"
        )
    print(f"server CPU per review (whole process): {result['server_cpu_us_per_review']} us")
    wall, cpu = result["handler_wall"], result["handler_cpu"]
    print(f"in the handler: wall p50 {wall.get('p50_ms')} / p99 {wall.get('p99_ms')} ms, ", end="")
    print(f"CPU p50 {cpu.get('p50_ms')} / p99 {cpu.get('p99_ms')} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
