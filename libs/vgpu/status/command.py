"""The ``vgpu status`` command: its options, the refresh loop (one table, or one every ``--interval``
seconds with ``--watch``) and the official ``kubernetes`` client built from a kubeconfig."""

import argparse
import asyncio
import datetime
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from vgpu import configfile
from vgpu.core import errors
from vgpu.core.config import Config
from vgpu.kube.port import KubeApi
from vgpu.status import snapshot, table
from vgpu.waits import wait_at_most

if TYPE_CHECKING:
    from vgpu.kube.client import OfficialKubeApi


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vgpu status``'s options to ``parser`` (a subparser)."""
    parser.add_argument(
        "--kubeconfig", default=None, metavar="PATH", help="default: $KUBECONFIG or ~/.kube/config"
    )
    parser.add_argument("--watch", action="store_true", help="refresh every --interval seconds until Ctrl-C")
    parser.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes (2)"
    )
    parser.add_argument(
        "--config", default=None, metavar="vgpu.yaml", help="kube-vgpu config (annotation prefix, lease)"
    )


async def status_loop(
    api: KubeApi,
    *,
    config: Config,
    out: TextIO,
    err: TextIO,
    watch: bool = False,
    interval_s: float = 2.0,
    stop: asyncio.Event | None = None,
    on_frame: Callable[[snapshot.ClusterStatus], None] | None = None,
    now: Callable[[], datetime.datetime] = snapshot.utcnow,
) -> int:
    """Print one table, or with ``watch`` one every ``interval_s`` until ``stop`` is set. A failed read
    ends a single shot with 1; while watching it is printed and the next refresh tries again."""
    stop = stop or asyncio.Event()
    clear = watch and out.isatty()
    while True:
        try:
            frame = await snapshot.collect(api, config=config, now=now)
        except errors.KubeError as exc:
            print(f"vgpu status: cannot read the cluster: {exc}", file=err)
            if not watch:
                return 1
        else:
            out.write(
                ("\x1b[H\x1b[2J" if clear else "")
                + table.render(frame)
                + ("\n" if watch and not clear else "")
            )
            out.flush()
            if on_frame is not None:
                on_frame(frame)
        if not watch:
            return 0
        await wait_at_most(stop.wait(), interval_s)
        if stop.is_set():
            return 0


def _options(opts: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    raw = vars(opts) if isinstance(opts, argparse.Namespace) else dict(opts)
    return {"kubeconfig": None, "watch": False, "interval": 2.0, "config": None, **raw}


def load_config(path: str | None) -> Config:
    """The kube-vgpu config at ``path`` (defaults when None). Raises ConfigError or OSError."""
    return configfile.load(path)


def _official_api(kubeconfig: str | None) -> "OfficialKubeApi":
    """The official client from a kubeconfig (in-cluster config or the default kubeconfig with None).
    Imported here: ``kubernetes`` takes ~0.4 s to import and only this command needs it."""
    from vgpu.kube import client

    return client.OfficialKubeApi.from_kubeconfig(kubeconfig)


async def _run(api: "OfficialKubeApi", o: Mapping[str, Any], cfg: Config, out: TextIO, err: TextIO) -> int:
    try:
        return await status_loop(
            api, config=cfg, out=out, err=err, watch=bool(o["watch"]), interval_s=float(o["interval"])
        )
    finally:
        await api.close()


def run_status(
    opts: argparse.Namespace | Mapping[str, Any], *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``vgpu status`` with parsed options (a Namespace from ``add_arguments`` or a dict).

    Exit status: 0 (watch ended by Ctrl-C included), 1 when the cluster cannot be read, 2 for a bad
    option, kubeconfig or config file.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    o = _options(opts)
    interval = o["interval"]
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        print(f"vgpu status: --interval must be a positive number of seconds, got {interval!r}", file=err)
        return 2
    try:
        cfg = load_config(o["config"])
    except errors.ConfigError as exc:
        print(f"vgpu status: config file {o['config']}: {exc}", file=err)
        return 2
    try:
        api = _official_api(o["kubeconfig"])
    except errors.ConfigError as exc:  # a missing or unusable kubeconfig: report, exit 2
        where = f"kubeconfig {o['kubeconfig']}" if o["kubeconfig"] else "kubeconfig"
        print(f"vgpu status: {where}: {exc.message}", file=err)
        return 2
    try:
        return asyncio.run(_run(api, o, cfg, out, err))
    except KeyboardInterrupt:
        return 0
