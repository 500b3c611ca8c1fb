"""The ``vgpu simulate`` command: options, reading the files, running, writing the reports.

    vgpu simulate --cluster C.yaml --workload W.yaml [--node-policy binpack|spread]
                  [--gpu-policy binpack|spread] [--compare] [--json] [--html report.html]
                  [--config vgpu.yaml] [--dra objects.yaml]

Exit status: 0 when the simulation ran (pending pods are a result, not a failure); 2 when an
input file cannot be read or is invalid (the message names the file and the bad key).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import yaml

from vgpu.core import config as config_mod
from vgpu.core import errors
from vgpu.core.config import Config, Policy
from vgpu.simulate import analysis, dra, engine, html_report, model, report

_POLICIES = [p.value for p in Policy]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vgpu simulate``'s options to ``parser`` (a subparser)."""
    parser.add_argument("--cluster", required=True, metavar="C.yaml", help="nodes and their GPUs")
    parser.add_argument(
        "--workload",
        required=True,
        metavar="W.yaml",
        help="Pod manifests to place, in order: a list or multi-document YAML, as vgpu demo reads",
    )
    parser.add_argument(
        "--node-policy", choices=_POLICIES, default=None, help="default: the config's (binpack)"
    )
    parser.add_argument(
        "--gpu-policy", choices=_POLICIES, default=None, help="default: the config's (spread)"
    )
    parser.add_argument(
        "--compare", action="store_true", help="run every node/GPU policy pair and compare them in one table"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--html", metavar="report.html", default=None, help="also write an HTML report")
    parser.add_argument(
        "--config", metavar="vgpu.yaml", default=None, help="kube-vgpu config (resource names, defaults)"
    )
    parser.add_argument(
        "--dra",
        metavar="objects.yaml",
        default=None,
        help="ResourceSlices and ResourceClaims (kubectl get resourceslices,resourceclaims -A -o yaml; "
        "DeviceClasses, ResourceClaimTemplates and Namespaces too): the DRA nodes take part in the run "
        "and DRA pods are placed on them by kube-scheduler's allocation; what the claims held is reported",
    )


class InputError(Exception):
    """An input file that cannot be used; the message says which and why."""


def _read_yaml(path: str, what: str, *, documents: bool = False) -> Any:
    """The file's YAML; with ``documents`` the list of every document of a multi-document file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{what} file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} file {path}: not UTF-8 text ({exc.reason})") from None
    try:
        # libyaml's loader where PyYAML was built with it: the same safe subset, several times
        # faster on a ``kubectl get -o yaml`` of a large cluster
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return list(yaml.load_all(text, Loader=loader)) if documents else yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise InputError(f"{what} file {path}: invalid YAML: {exc}") from None


def _options(opts: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    raw = vars(opts) if isinstance(opts, argparse.Namespace) else dict(opts)
    defaults = {
        "node_policy": None,
        "gpu_policy": None,
        "compare": False,
        "json": False,
        "html": None,
        "config": None,
        "dra": None,
    }
    return {**defaults, **raw}


def run(
    opts: argparse.Namespace | Mapping[str, Any], *, held: dra.DraHeld | None = None
) -> list[analysis.Analysis]:
    """Read the inputs and simulate; one analysis, or one per policy pair with ``compare``.
    ``held``: the ``--dra`` file read (``load_dra``), read here when not given."""
    o = _options(opts)
    if held is None:
        held = load_dra(o["dra"])
    try:
        cfg = config_mod.load(_read_yaml(o["config"], "config")) if o["config"] else Config()
    except errors.ConfigError as exc:
        raise InputError(f"config file {o['config']}: {exc}") from None
    try:
        cluster = model.load_cluster(_read_yaml(o["cluster"], "cluster"), config=cfg)
    except errors.ConfigError as exc:
        raise InputError(f"cluster file {o['cluster']}: {exc}") from None
    try:
        workload = model.load_workload(_read_yaml(o["workload"], "workload", documents=True), config=cfg)
    except errors.ConfigError as exc:
        raise InputError(f"workload file {o['workload']}: {exc}") from None
    if o["compare"]:
        pairs = [(n, g) for n in Policy for g in Policy]
    else:
        node = Policy(o["node_policy"]) if o["node_policy"] else cfg.scheduler.node_policy
        gpu = Policy(o["gpu_policy"]) if o["gpu_policy"] else cfg.scheduler.gpu_policy
        pairs = [(node, gpu)]
    return [
        analysis.analyse(
            engine.simulate(
                cluster,
                workload,
                config=cfg,
                node_policy=n,
                gpu_policy=g,
                dra=held.objects if held is not None else None,
            )
        )
        for n, g in pairs
    ]


def load_dra(path: str | None) -> dra.DraHeld | None:
    """The DRA objects file's usage (None without one); ``InputError`` when it is unusable."""
    if path is None:
        return None
    try:
        return dra.load(_read_yaml(path, "DRA objects", documents=True))
    except errors.ConfigError as exc:
        raise InputError(f"DRA objects file {path}: {exc}") from None


def main_simulate(
    opts: argparse.Namespace | Mapping[str, Any], *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``vgpu simulate`` with parsed options (a Namespace from ``add_arguments`` or a dict)."""
    out = out or sys.stdout
    err = err or sys.stderr
    o = _options(opts)
    try:
        held = load_dra(o["dra"])
        results = run(o, held=held)
    except InputError as exc:
        print(f"vgpu simulate: {exc}", file=err)
        return 2
    if o["html"]:
        try:
            Path(o["html"]).write_text(html_report.render_html(results), encoding="utf-8")
        except OSError as exc:
            print(f"vgpu simulate: cannot write {o['html']}: {exc.strerror or exc}", file=err)
            return 2
    if o["json"]:
        doc = report.to_json(results)
        if held is not None:
            doc["dra"] = dra.to_json(held)
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        out.write(report.render_compare(results) if o["compare"] else report.render_text(results[0]))
        if held is not None:
            out.write(dra.render_text(held))
    if o["html"]:
        out.flush()
        print(f"wrote {o['html']}", file=err)
    return 0
