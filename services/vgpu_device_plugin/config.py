"""Command-line flags and environment, resolved once into ``Settings`` (no env reads elsewhere)."""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vgpu import configfile
from vgpu.core import config as core_config
from vgpu.core import errors
from vgpu.core.dra import names as dra_names

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins/"
MODES = ("extender", "dra")


@dataclass(frozen=True)
class Settings:
    node: str
    kubeconfig: str | None
    config: core_config.Config
    plugin_dir: pathlib.Path
    backend: str  # nvml | fake
    fake_gpus: pathlib.Path | None
    host_root: pathlib.Path
    sysfs_root: pathlib.Path
    fail_on_init_error: bool
    verbose: int
    mode: str = "extender"  # extender | dra (docs/protocol.md#dra-kubelet-plugin)
    registry_dir: pathlib.Path = pathlib.Path(dra_names.REGISTRATION_DIR)
    dra_plugin_dir: pathlib.Path = pathlib.Path(dra_names.PLUGIN_DIR)

    @property
    def device_plugin(self) -> core_config.DevicePluginConfig:
        return self.config.for_node(self.node)


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "t", "true", "yes"):
        return True
    if lowered in ("0", "f", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parser(
    *,
    prog: str = "vgpu-device-plugin",
    description: str = "kube-vgpu device plugin: shared NVIDIA GPUs for kubelet",
    modes: bool = True,
) -> argparse.ArgumentParser:
    """The device plugin's flags (the usage monitor, ``vgpu-monitor``, adds its own to them; it
    takes them without ``modes``: ``--mode`` and the DRA paths are the plugin's alone)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--node-name", help="this node's name (default: env NODE_NAME)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    p.add_argument("--config", type=pathlib.Path, help="the shared kube-vgpu YAML config file")
    p.add_argument(
        "--device-plugin-path", default=DEFAULT_PLUGIN_DIR, help="kubelet's device-plugin directory"
    )
    p.add_argument("--backend", choices=("nvml", "fake"), default="nvml", help="GPU backend")
    p.add_argument("--fake-gpus", type=pathlib.Path, help="YAML file describing fake GPUs (--backend fake)")
    p.add_argument(
        "--host-root", type=pathlib.Path, default=pathlib.Path("/"), help="where host paths are reachable"
    )
    p.add_argument(
        "--sysfs-root", type=pathlib.Path, default=pathlib.Path("/sys"), help="sysfs mount (NUMA nodes)"
    )
    p.add_argument(
        "--fail-on-init-error",
        type=_bool,
        default=True,
        metavar="BOOL",
        help="exit when the GPU driver is missing (false: stay up with zero devices)",
    )
    if modes:
        p.add_argument(
            "--mode",
            choices=MODES,
            default="extender",
            help="extender: kubelet device plugin + kube-vgpu's scheduler extender; dra: a DRA driver "
            "(ResourceSlice + kubelet DRA plugin, scheduled by kube-scheduler itself)",
        )
        p.add_argument(
            "--plugins-registry",
            type=pathlib.Path,
            default=pathlib.Path(dra_names.REGISTRATION_DIR),
            help="kubelet's plugin registration directory (--mode dra)",
        )
        p.add_argument(
            "--dra-plugin-path",
            type=pathlib.Path,
            default=pathlib.Path(dra_names.PLUGIN_DIR),
            help="the DRA plugin's own directory: its socket and checkpoint (--mode dra)",
        )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    return p


def resolve(argv: Sequence[str] | None, env: Mapping[str, str]) -> Settings:
    """Parse flags (argparse exits on bad flags) and load the config file; ConfigError on bad input."""
    return settings(parser().parse_args(argv), env)


def settings(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """Settings from parsed flags (``parser()``'s, or a parser built on it) and the environment."""
    node = args.node_name or env.get("NODE_NAME", "")
    if not node:
        raise errors.ConfigError("--node-name", "required (or set env NODE_NAME)")
    loaded = configfile.load(args.config)
    loaded.for_node(node)  # validate this node's overrides now
    if args.backend == "fake" and args.fake_gpus is None:
        raise errors.ConfigError("--fake-gpus", "required with --backend fake")
    return Settings(
        node=node,
        kubeconfig=args.kubeconfig,
        config=loaded,
        plugin_dir=pathlib.Path(args.device_plugin_path),
        backend=args.backend,
        fake_gpus=args.fake_gpus,
        host_root=args.host_root,
        sysfs_root=args.sysfs_root,
        fail_on_init_error=args.fail_on_init_error,
        verbose=args.verbose,
        mode=getattr(args, "mode", "extender"),
        registry_dir=getattr(args, "plugins_registry", pathlib.Path(dra_names.REGISTRATION_DIR)),
        dra_plugin_dir=getattr(args, "dra_plugin_path", pathlib.Path(dra_names.PLUGIN_DIR)),
    )
