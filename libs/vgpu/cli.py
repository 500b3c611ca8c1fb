"""The ``vgpu`` command: ``demo`` (the whole system on a local cluster), ``simulate`` (capacity
planning through the scheduling code) and ``status`` (a real cluster's GPUs)."""

import argparse
import asyncio
import logging
import math
import os
import pathlib
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from vgpu import configfile, status
from vgpu.core import config as core_config
from vgpu.core import errors
from vgpu.demo import run as demo_run
from vgpu.demo import workload
from vgpu.simulate import command as simulate


def _add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="emulated GPU nodes (3)")
    parser.add_argument("--gpus", type=int, default=4, help="fake GPUs per node, mixed models (4)")
    parser.add_argument("--node-policy", choices=["binpack", "spread"], help="default: binpack")
    parser.add_argument("--gpu-policy", choices=["binpack", "spread"], help="default: spread")
    parser.add_argument(
        "--workload",
        type=pathlib.Path,
        help="Pod manifests, a list or multi-document YAML, as vgpu simulate reads (default: a sample)",
    )
    parser.add_argument("--config", type=pathlib.Path, help="kube-vgpu config YAML for the services")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for pods to settle (90)")
    parser.add_argument(
        "--mode",
        choices=["extender", "dra"],
        default="extender",
        help="extender: the scheduler extender places GPU pods; dra: the pods ask through "
        "ResourceClaims, kube-scheduler's DRA allocation places them (default: extender)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the cluster running and print its kubeconfig"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the local cluster does")


def _cmd_demo(opts: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO if opts.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if opts.nodes < 1 or opts.gpus < 1:
        print("vgpu demo: --nodes and --gpus must be at least 1", file=sys.stderr)
        return 2
    if not (math.isfinite(opts.timeout) and opts.timeout > 0):
        print(
            f"vgpu demo: --timeout must be a number of seconds above 0, got {opts.timeout}", file=sys.stderr
        )
        return 2
    try:
        config = configfile.read_yaml(opts.config) if opts.config else {}
        core_config.load(config)  # every error now, before the local cluster starts
        config = dict(config or {})
        scheduler = dict(config.get("scheduler") or {})
        if opts.node_policy:
            scheduler["nodePolicy"] = opts.node_policy
        if opts.gpu_policy:
            scheduler["gpuPolicy"] = opts.gpu_policy
        config["scheduler"] = scheduler
        pods = workload.load_workload(opts.workload) if opts.workload else workload.sample_workload()
    except errors.VgpuError as exc:
        print(f"vgpu demo: {exc}", file=sys.stderr)
        return 2
    description = workload.cluster_description(nodes=opts.nodes, gpus_per_node=opts.gpus)
    try:
        return asyncio.run(
            _stopped_by_signals(
                demo_run.run_demo(
                    description, pods, config=config, keep=opts.keep, timeout_s=opts.timeout, mode=opts.mode
                )
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 0
    except errors.VgpuError as exc:
        print(f"vgpu demo: {exc}", file=sys.stderr)
        return 1


# `kill <pid>` and a closed terminal stop the demo as Ctrl-C does: the main task is cancelled, so the
# stack's exit stops every child process and removes the temporary directory.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


async def _stopped_by_signals(work: Coroutine[Any, Any, int]) -> int:
    """Run ``work``, cancelling it once on SIGTERM or SIGHUP (asyncio.run does the same for SIGINT);
    a second signal does not interrupt the clean-up the first one started."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)

    def stop() -> None:
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, lambda: None)
        task.cancel()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop)
    try:
        return await task
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vgpu", description="kube-vgpu: GPU sharing for Kubernetes")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the whole system on an emulated local cluster")
    _add_demo_arguments(demo)
    demo.set_defaults(func=_cmd_demo)
    sim = sub.add_parser("simulate", help="capacity planning: place a workload on a described cluster")
    simulate.add_arguments(sim)
    sim.set_defaults(func=simulate.main_simulate)
    st = sub.add_parser("status", help="nodes, GPUs and what is allocated on a real cluster")
    status.add_arguments(st)
    st.set_defaults(func=status.run_status)
    opts = parser.parse_args(argv)
    try:
        result: int = opts.func(opts)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`vgpu simulate --json | head`): stop quietly, as a SIGPIPE'd tool does;
        # stdout goes to /dev/null so the interpreter's own flush at exit cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return result


if __name__ == "__main__":
    sys.exit(main())
