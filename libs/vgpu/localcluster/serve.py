"""The emulated API server and kube-scheduler, each in a process of its own.

    python -m vgpu.localcluster.serve apiserver --port 0 --ready-file F [--write-latency-ms 20]
    python -m vgpu.localcluster.serve kube-scheduler --server URL --config sched.yaml --ready-file F

``apiserver`` serves an empty ``Store`` over HTTP on 127.0.0.1 (``ApiServer``), every write delayed
by ``--write-latency-ms`` (etcd's commit, default 0) without blocking other requests; it writes its
URL to ``--ready-file`` once listening. ``kube-scheduler`` runs ``SchedulerEmulator`` for every
profile of a KubeSchedulerConfiguration (YAML) against ``--server`` with ``vgpu.kube.aioapi.AioKubeApi``, and writes
``ready`` to ``--ready-file`` once its informers have listed. Both stop on SIGTERM or SIGINT;
``--cprofile OUT`` writes a cProfile of the whole run to OUT at exit.

``LocalProcess`` starts one of them from Python (``async with LocalProcess.apiserver(...) as p``)
and stops it (SIGTERM, then SIGKILL) when the block ends, however it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import logging
import os
import pathlib
import signal
import sys
import tempfile
from collections.abc import Sequence

import yaml

from vgpu import gcfreeze
from vgpu.kube import aioapi
from vgpu.localcluster.apiserver import ApiServer
from vgpu.localcluster.scheduler import SchedulerEmulator
from vgpu.localcluster.store import Store

log = logging.getLogger(__name__)
KUBE_SCHEDULER_AGENT = "kube-scheduler/v1.30.0-localcluster"


def _write_ready(path: str, content: str) -> None:
    tmp = f"{path}.tmp"
    pathlib.Path(tmp).write_text(content)
    os.replace(tmp, path)  # readers never see a half-written file


def _read(path: str | pathlib.Path) -> str:
    try:
        return pathlib.Path(path).read_text().strip()
    except FileNotFoundError:
        return ""


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def run_apiserver(args: argparse.Namespace) -> None:
    store = Store()
    server = ApiServer(store, host=args.host, port=args.port, write_latency_s=args.write_latency_ms / 1000)
    await server.start()
    try:
        _write_ready(args.ready_file, server.url)
        log.info("API server at %s, write latency %d ms", server.url, args.write_latency_ms)
        await _until_signalled()
    finally:
        await server.stop()
        store.close_watchers()


async def run_kube_scheduler(args: argparse.Namespace) -> None:
    config = args.scheduler_config
    async with aioapi.AioKubeApi(args.server, user_agent=KUBE_SCHEDULER_AGENT) as api:
        scheduler = SchedulerEmulator(
            api,
            scheduler_config=config,
            scheduler_name=args.scheduler_name,
            initial_backoff_s=args.initial_backoff_s,
            max_backoff_s=args.max_backoff_s,
            version=args.version,
        )
        task = asyncio.create_task(scheduler.run(), name="kube-scheduler")
        try:
            await scheduler.synced.wait()
            _write_ready(args.ready_file, "ready")
            log.info("kube-scheduler emulation up: profiles %s", sorted(scheduler.profiles))
            await _until_signalled()
        finally:
            await scheduler.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m vgpu.localcluster.serve", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="what", required=True)
    api = sub.add_parser("apiserver", help="the emulated API server")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    api.add_argument("--write-latency-ms", type=float, default=0.0, help="delay of every write (etcd)")
    sched = sub.add_parser("kube-scheduler", help="the kube-scheduler emulation")
    sched.add_argument("--server", required=True, help="the API server URL")
    sched.add_argument("--config", required=True, help="KubeSchedulerConfiguration YAML")
    sched.add_argument("--scheduler-name", default="default-scheduler")
    sched.add_argument("--initial-backoff-s", type=float, default=1.0)
    sched.add_argument("--max-backoff-s", type=float, default=10.0)
    sched.add_argument(
        "--version", default="1.36", help="the kube-scheduler whose preemption is emulated: 1.N or pr135486"
    )
    for p in (api, sched):
        p.add_argument("--ready-file", required=True, help="written once serving")
        p.add_argument("--cprofile", help="write a cProfile of the run here at exit")
        p.add_argument("-v", "--verbose", action="store_true", help="log at INFO (default WARNING)")
    args = parser.parse_args(argv)
    if getattr(args, "write_latency_ms", 0) < 0:
        parser.error("--write-latency-ms must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.what == "kube-scheduler":
        args.scheduler_config = yaml.safe_load(pathlib.Path(args.config).read_text())
    run = run_apiserver if args.what == "apiserver" else run_kube_scheduler
    # the Go components stood for here do not stop the world for 60-150 ms as CPython's full
    # collections over a few thousand stored pods do (bench/gc_bench.py, docs/benchmarks.md)
    freezer = gcfreeze.SurvivorFreezer()
    freezer.install()
    profiler = cProfile.Profile() if args.cprofile else None
    if profiler is not None:
        profiler.enable()
    try:
        asyncio.run(gcfreeze.run_within(run(args), freezer))
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.cprofile)


class LocalProcess:
    """One ``serve`` subprocess; ``ready`` is what it wrote to its ready file (the API server's URL)."""

    def __init__(
        self, argv: Sequence[str], *, log_path: pathlib.Path | None = None, ready_timeout_s: float = 60.0
    ):
        self._argv = list(argv)
        self._log_path = log_path
        self._timeout_s = ready_timeout_s
        self._dir = pathlib.Path()
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = ""

    @classmethod
    def apiserver(
        cls, *, write_latency_ms: float = 0.0, log_path: pathlib.Path | None = None
    ) -> LocalProcess:
        return cls(["apiserver", "--write-latency-ms", str(write_latency_ms)], log_path=log_path)

    @classmethod
    def kube_scheduler(
        cls,
        *,
        server: str,
        config: pathlib.Path,
        extra: Sequence[str] = (),
        log_path: pathlib.Path | None = None,
    ) -> LocalProcess:
        return cls(["kube-scheduler", "--server", server, "--config", str(config), *extra], log_path=log_path)

    async def __aenter__(self) -> LocalProcess:
        self._dir = pathlib.Path(tempfile.mkdtemp(prefix="vgpu-serve-", dir="/tmp"))
        ready_file = self._dir / "ready"
        out = self._log_path.open("ab") if self._log_path else None
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vgpu.localcluster.serve", *self._argv, "--ready-file", str(ready_file),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out or asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.STDOUT if out else None,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        finally:
            if out is not None:
                out.close()
        try:
            await self._wait_ready(ready_file)
        except BaseException:
            await self.stop()
            raise
        return self

    async def _wait_ready(self, ready_file: pathlib.Path) -> None:
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        while not (content := _read(ready_file)):  # a few bytes on local disk: cheap
            if self.proc.returncode is not None:
                raise RuntimeError(
                    f"{self._argv[0]} exited with code {self.proc.returncode} before it was ready"
                )
            if loop.time() > deadline:
                raise TimeoutError(f"{self._argv[0]} not ready after {self._timeout_s:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 0.05)
        self.ready = content

    async def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._dir != pathlib.Path():
            for child in self._dir.iterdir():
                child.unlink()
            self._dir.rmdir()
            self._dir = pathlib.Path()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


if __name__ == "__main__":
    main()
