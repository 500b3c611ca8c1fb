"""``vgpu status``: the GPUs of a real cluster as a table, read from the same annotations the scheduler reads.

    vgpu status [--kubeconfig PATH] [--watch] [--interval S] [--config vgpu.yaml]

Per node: whether its device plugin is reporting (the Lease ``vgpu-device-plugin-<node>`` in the
configured lease namespace, stale after ``scheduler.leaseTimeoutS`` = 40 s by default), and each
GPU from the register annotation (``hami.io/node-nvidia-register``): model, health, cordon, memory
and cores allocated / total, memory used outside kube-vgpu (the device plugin's
``hami.io/node-nvidia-outside-usage``; ``-`` when none), slots used / total and the pods sharing it. Usage is rebuilt from
every unfinished pod's ``hami.io/vgpu-devices-allocated`` on its ``hami.io/vgpu-node``, collapsed
as the scheduler does (``vgpu.core.usage``). A corrupt register annotation or pod annotation is
shown with the decoder's reason instead of being skipped. Only nodes that take part are listed
(a register annotation, a plugin lease or an assigned pod); the others are counted.

``collect`` (any ``KubeApi``) and ``render`` are separate so tests drive them with the local
cluster; ``run_status`` is the command (the official client from a kubeconfig).
"""

import argparse
import asyncio
import contextlib
import datetime
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from vgpu import configfile
from vgpu.core import annotations, errors, outside, usage
from vgpu.core.annotations import Keys
from vgpu.core.config import Config
from vgpu.core.device import EMPTY_USAGE, Gpu, GpuUsage, GpuUuid
from vgpu.kube.port import JsonObj, KubeApi

if TYPE_CHECKING:
    from vgpu.kube.client import OfficialKubeApi

LEASE_PREFIX = "vgpu-device-plugin-"
FINISHED_PHASES = ("Succeeded", "Failed")


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class GpuStatus:
    gpu: Gpu
    used: GpuUsage
    pods: tuple[str, ...]
    cordoned: bool = False
    outside_mib: int = 0  # used outside kube-vgpu, from the device plugin's measurement


@dataclass(frozen=True)
class NodeStatus:
    """One node. ``problem``: why its GPUs cannot be read; ``reporting`` None: no lease at all."""

    name: str
    gpus: tuple[GpuStatus, ...] = ()
    problem: str = ""
    reporting: bool | None = None
    lease_age_s: float | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterStatus:
    nodes: tuple[NodeStatus, ...]
    other_nodes: int
    taken_at: datetime.datetime
    warnings: tuple[str, ...] = field(default=())


def parse_micro_time(raw: str) -> datetime.datetime:
    """Kubernetes (Micro)Time ``2026-11-23T01:02:03.123456Z`` → an aware datetime (ValueError if not)."""
    when = datetime.datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError(f"time {raw!r} has no zone")
    return when


def _dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...`` or None when a level is missing or not an object (API data is not trusted)."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _meta(obj: Any) -> Mapping[str, Any]:
    meta = _dig(obj, "metadata")
    return meta if isinstance(meta, Mapping) else {}


def _lease_ages(leases: Sequence[JsonObj], now: datetime.datetime) -> dict[str, float | None]:
    """node → seconds since its plugin lease was renewed (None: the lease has no readable time)."""
    ages: dict[str, float | None] = {}
    for lease in leases:
        name = str(_meta(lease).get("name", ""))
        if not name.startswith(LEASE_PREFIX):
            continue
        renew = _dig(lease, "spec", "renewTime") or _dig(lease, "spec", "acquireTime")
        age: float | None = None
        if isinstance(renew, str):
            with contextlib.suppress(ValueError):
                age = (now - parse_micro_time(renew)).total_seconds()
        ages[name[len(LEASE_PREFIX) :]] = age
    return ages


def _init_done(pod: Mapping[str, Any]) -> bool:
    init = _dig(pod, "spec", "initContainers")
    if not isinstance(init, list) or not init:
        return False
    statuses = _dig(pod, "status", "initContainerStatuses")
    if not isinstance(statuses, list):
        return False
    done = sum(1 for s in statuses if _dig(s, "state", "terminated", "exitCode") == 0)
    return done == len(init)


def _pod_footprints(
    pods: Sequence[JsonObj], keys: Keys
) -> tuple[dict[str, list[tuple[str, dict[GpuUuid, GpuUsage]]]], dict[str, list[str]]]:
    """node → [(ns/name, per-GPU usage)] of unfinished assigned pods, and node → pod problems."""
    by_node: dict[str, list[tuple[str, dict[GpuUuid, GpuUsage]]]] = {}
    problems: dict[str, list[str]] = {}
    for pod in pods:
        meta = _meta(pod)
        notes = meta.get("annotations") or {}
        if not isinstance(notes, Mapping):
            continue
        node = notes.get(keys.assigned_node)
        if not isinstance(node, str) or not node:
            continue
        if _dig(pod, "status", "phase") in FINISHED_PHASES:
            continue
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        raw = notes.get(keys.devices_allocated)
        if not isinstance(raw, str):
            problems.setdefault(node, []).append(f"pod {key}: no {keys.devices_allocated} annotation")
            continue
        init = _dig(pod, "spec", "initContainers") or []
        try:
            devices = annotations.decode_pod_devices(raw, field=keys.devices_allocated)
        except errors.AnnotationError as exc:
            problems.setdefault(node, []).append(f"pod {key}: {exc}")
            continue
        footprint = usage.pod_usage(
            devices, init_count=len(init) if isinstance(init, list) else 0, init_done=_init_done(pod)
        )
        by_node.setdefault(node, []).append((key, footprint))
    return by_node, problems


def _node_status(
    node: JsonObj,
    *,
    keys: Keys,
    pods: list[tuple[str, dict[GpuUuid, GpuUsage]]],
    pod_problems: list[str],
    lease_age: tuple[bool, float | None],
    lease_timeout_s: float,
) -> NodeStatus:
    meta = _meta(node)
    name = str(meta.get("name", ""))
    notes = meta.get("annotations") or {}
    notes = notes if isinstance(notes, Mapping) else {}
    has_lease, age = lease_age
    reporting = None if not has_lease else (age is not None and age <= lease_timeout_s)
    warnings = list(pod_problems)
    raw = notes.get(keys.node_register)
    if not isinstance(raw, str):
        return NodeStatus(
            name,
            problem=f"no {keys.node_register} annotation",
            reporting=reporting,
            lease_age_s=age,
            warnings=tuple(warnings),
        )
    plugin_error = notes.get(keys.node_plugin_error)
    if isinstance(plugin_error, str) and plugin_error:
        return NodeStatus(
            name,
            problem=f"device plugin has no GPUs: {plugin_error}",
            reporting=reporting,
            lease_age_s=age,
            warnings=tuple(warnings),
        )
    try:
        gpus = annotations.decode_node_register(raw)
    except errors.AnnotationError as exc:
        return NodeStatus(
            name,
            problem=f"corrupt register annotation: {exc}",
            reporting=reporting,
            lease_age_s=age,
            warnings=tuple(warnings),
        )
    cordon_raw = notes.get(keys.device_cordon)
    cordoned = annotations.decode_cordon(cordon_raw) if isinstance(cordon_raw, str) else frozenset()
    away: Mapping[GpuUuid, int] = {}
    outside_raw = notes.get(keys.node_outside_usage)
    if outside_raw is not None:
        try:
            if not isinstance(outside_raw, str):
                raise errors.AnnotationError(keys.node_outside_usage, "expected a string")
            away = outside.decode(outside_raw, field=keys.node_outside_usage)
        except errors.AnnotationError as exc:
            warnings.append(f"memory used outside kube-vgpu unreadable (the scheduler counts 0): {exc}")
    known = {g.uuid for g in gpus}
    used = usage.node_usage(footprint for _, footprint in pods)
    sharing: dict[GpuUuid, list[str]] = {}
    for key, footprint in pods:
        for uuid in footprint:
            if uuid in known:
                sharing.setdefault(uuid, []).append(key)
            else:
                warnings.append(f"pod {key} holds {uuid}, which the node does not register")
    rows = tuple(
        GpuStatus(
            g,
            used.get(g.uuid, EMPTY_USAGE),
            tuple(sorted(sharing.get(g.uuid, ()))),
            g.uuid in cordoned,
            away.get(g.uuid, 0),
        )
        for g in sorted(gpus, key=lambda g: g.index)
    )
    return NodeStatus(name, rows, reporting=reporting, lease_age_s=age, warnings=tuple(warnings))


async def collect(
    api: KubeApi, *, config: Config, now: Callable[[], datetime.datetime] = _utcnow
) -> ClusterStatus:
    """One snapshot: nodes, pods (all namespaces) and plugin leases, read with three list calls."""
    keys = Keys(config.annotation_prefix)
    nodes, pods, leases = await asyncio.gather(
        api.list("nodes"),
        api.list("pods"),
        api.list("leases", namespace=config.scheduler.lease_namespace),
    )
    taken_at = now()
    ages = _lease_ages(leases.items, taken_at)
    by_node, pod_problems = _pod_footprints(pods.items, keys)
    rows: list[NodeStatus] = []
    other = 0
    seen: set[str] = set()
    for node in sorted(nodes.items, key=lambda n: str(_meta(n).get("name", ""))):
        name = str(_meta(node).get("name", ""))
        seen.add(name)
        notes = _meta(node).get("annotations") or {}
        registered = isinstance(notes, Mapping) and keys.node_register in notes
        if not registered and name not in ages and name not in by_node and name not in pod_problems:
            other += 1
            continue
        rows.append(
            _node_status(
                node,
                keys=keys,
                pods=by_node.get(name, []),
                pod_problems=pod_problems.get(name, []),
                lease_age=(name in ages, ages.get(name)),
                lease_timeout_s=config.scheduler.lease_timeout_s,
            )
        )
    missing = sorted(set(by_node) - seen)
    warnings = tuple(
        f"pods assigned to node {n}, which does not exist: {', '.join(k for k, _ in by_node[n])}"
        for n in missing
    )
    return ClusterStatus(tuple(rows), other, taken_at, warnings)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _plugin(node: NodeStatus) -> str:
    if node.reporting is None:
        return "no lease"
    if node.lease_age_s is None:
        return "NOT REPORTING (no renew time)"
    age = f"{max(0.0, node.lease_age_s):.0f}s ago"
    return f"reporting ({age})" if node.reporting else f"NOT REPORTING ({age})"


def _health(row: GpuStatus) -> str:
    if not row.gpu.health:
        return "UNHEALTHY"
    return "cordoned" if row.cordoned else "ok"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max([len(header[i]), *(len(r[i]) for r in rows)]) for i in range(len(header))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in [header, *rows]
    ]


def render(status: ClusterStatus) -> str:
    """The table: one line per GPU (node name and plugin state on its first), problems under it."""
    when = status.taken_at.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    out = [
        f"kube-vgpu status at {when}: {len(status.nodes)} GPU nodes"
        + (f" ({status.other_nodes} other nodes without GPUs registered)" if status.other_nodes else ""),
        "",
    ]
    header = [
        "NODE",
        "PLUGIN",
        "GPU",
        "MODEL",
        "HEALTH",
        "MEMORY MiB",
        "MEM%",
        "OUTSIDE",
        "CORES",
        "SLOTS",
        "PODS",
    ]
    rows: list[list[str]] = []
    notes: list[str] = []
    totals = [
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ]  # memory used/total, cores used/total, slots used/total, GPUs, unhealthy
    away = 0  # MiB used outside kube-vgpu, all GPUs
    for node in status.nodes:
        first = True
        if node.problem:  # the reason goes under the table: it is too long for a column
            rows.append([node.name, _plugin(node), "-", "-", "UNREADABLE", "", "", "", "", "", ""])
            notes.append(f"  ! {node.name}: {node.problem}")
            first = False
        for r in node.gpus:
            g, u = r.gpu, r.used
            rows.append(
                [
                    node.name if first else "",
                    _plugin(node) if first else "",
                    str(g.index),
                    g.type.removeprefix("NVIDIA-"),
                    _health(r),
                    f"{u.memory_mib}/{g.memory_mib}",
                    _pct(u.memory_mib, g.memory_mib),
                    str(r.outside_mib) if r.outside_mib else "-",
                    f"{u.cores}/{g.cores}",
                    f"{u.slots}/{g.count}",
                    ",".join(r.pods) or "-",
                ]
            )
            first = False
            for i, v in enumerate(
                (u.memory_mib, g.memory_mib, u.cores, g.cores, u.slots, g.count, 1, 0 if g.health else 1)
            ):
                totals[i] += v
            away += r.outside_mib
        notes.extend(f"  ! {node.name}: {w}" for w in node.warnings)
    if rows:
        out.extend(_table(header, rows, right={2, 5, 6, 7, 8, 9}))
    else:
        out.append("no node registers GPUs")
    out.extend(notes)
    out.extend(f"  ! {w}" for w in status.warnings)
    mu, mt, cu, ct, su, st, gpus, unhealthy = totals
    out.append("")
    out.append(
        f"allocated: memory {mu}/{mt} MiB ({_pct(mu, mt)}), cores {cu}/{ct} ({_pct(cu, ct)}), "
        f"slots {su}/{st}; {gpus} GPUs"
        + (f", {unhealthy} unhealthy" if unhealthy else "")
        + (f"; {away} MiB used outside kube-vgpu" if away else "")
    )
    return "\n".join(out) + "\n"


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
    on_frame: Callable[[ClusterStatus], None] | None = None,
    now: Callable[[], datetime.datetime] = _utcnow,
) -> int:
    """Print one table, or with ``watch`` one every ``interval_s`` until ``stop`` is set. A failed read
    ends a single shot with 1; while watching it is printed and the next refresh tries again."""
    stop = stop or asyncio.Event()
    clear = watch and out.isatty()
    while True:
        try:
            snapshot = await collect(api, config=config, now=now)
        except errors.KubeError as exc:
            print(f"vgpu status: cannot read the cluster: {exc}", file=err)
            if not watch:
                return 1
        else:
            out.write(
                ("\x1b[H\x1b[2J" if clear else "") + render(snapshot) + ("\n" if watch and not clear else "")
            )
            out.flush()
            if on_frame is not None:
                on_frame(snapshot)
        if not watch:
            return 0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
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
        print(f"vgpu status: kubeconfig {o['kubeconfig'] or '(default)'}: {exc}", file=err)
        return 2
    try:
        return asyncio.run(_run(api, o, cfg, out, err))
    except KeyboardInterrupt:
        return 0
