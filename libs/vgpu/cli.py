"""The ``vgpu`` command: demo (local cluster), simulate (capacity planning), status (a real cluster)."""

import argparse
import sys
from collections.abc import Sequence

from vgpu.core import annotations
from vgpu.core.device import Gpu, GpuUuid


def _sample_inventory() -> list[Gpu]:
    return [
        Gpu(GpuUuid("GPU-fake-0000-a100"), 0, 10, 40960, 100, "NVIDIA-A100-SXM4-40GB"),
        Gpu(GpuUuid("GPU-fake-0001-a100"), 1, 10, 40960, 100, "NVIDIA-A100-SXM4-40GB", numa=1),
    ]


def _cmd_demo(_: argparse.Namespace) -> int:
    gpus = _sample_inventory()
    print("fake node gpu-node-0: register annotation hami.io/node-nvidia-register =")
    print(annotations.encode_node_register(gpus))
    for gpu in gpus:
        print(
            f"  {gpu.index}: {gpu.uuid} {gpu.type} {gpu.memory_mib} MiB, {gpu.count} slots, NUMA {gpu.numa}"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vgpu", description="kube-vgpu: GPU sharing for Kubernetes")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the whole system on an emulated local cluster")
    demo.set_defaults(func=_cmd_demo)
    opts = parser.parse_args(argv)
    result: int = opts.func(opts)
    return result


if __name__ == "__main__":
    sys.exit(main())
