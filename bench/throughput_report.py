"""What the throughput bench prints: each phase's figures as it ends (with its CPU ceiling, ``cpu_ceilings``), and a summary over repeated runs.

``print_phase`` writes one phase's result (``throughput_phase.run_phase``) as a few aligned lines;
``Outcome`` is one whole run (every phase's figures, the overcommit violations and Allocate
failures found); ``summary`` gives the median and range over the runs of each GPU phase's rate
(% of the plain phase's) and p99 (÷ plain's, ``vs_plain``).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any

# the processes of the control plane itself (kube-scheduler apart): what a pod's writes cost there
CONTROL_PLANE_WRITERS: tuple[str, ...] = ("etcd", "apiserver", "kube-controller-manager")


def cpu_ceilings(cpu_ms: Mapping[str, float], cores: int) -> dict[str, float]:
    """The most pods/s a phase could bind if ``cores`` did nothing but its work, from its CPU ms per
    pod (``cpu_ms``, by process): over every process, over the control plane (etcd, kube-apiserver,
    kube-controller-manager, kube-scheduler) and over the control plane without kube-scheduler (the
    writes alone: a floor no scheduling can go under). Processes the phase did not measure count 0;
    a group with no CPU at all has no ceiling and is left out."""
    groups = {
        "every process": tuple(cpu_ms),
        "control plane": (*CONTROL_PLANE_WRITERS, "kube-scheduler"),
        "its writes alone": CONTROL_PLANE_WRITERS,
    }
    out: dict[str, float] = {}
    for name, members in groups.items():
        ms = sum(cpu_ms.get(who, 0.0) for who in members)
        if ms > 0 and cores > 0:
            out[name] = cores * 1000 / ms
    return out


def print_phase(result: dict[str, Any]) -> None:
    """One phase's figures, as it ends."""
    writes = ", ".join(f"{c} {n:.2f}" for c, n in result["writes"].items())
    print(
        f"{result['label']:<22} {result['bound']}/{result['pods']} bound  {result['rate']:7.1f} pods/s  "
        f"(created at {result['offered']:.1f}/s)  "
        f"p50 {result['p50']:6.2f} s  p99 {result['p99']:6.2f} s  {result['nodes']:4d} nodes"
        + (f"  writes/pod: {writes}" if writes else ""),
        flush=True,
    )
    detail = ", ".join(
        f"{w} {n:.2f}" for w, n in result["detail"].items() if not w.startswith(("bench", "kubelet"))
    )
    print(f"{'':<22} by verb and resource: {detail}", flush=True)
    cpu = ", ".join(f"{who} {ms:.1f}" for who, ms in result["cpu_ms"].items())
    print(f"{'':<22} CPU ms/pod: {cpu}", flush=True)
    if ceilings := cpu_ceilings(result["cpu_ms"], result["cores"]):
        shown = ", ".join(f"{name} {rate:.0f}" for name, rate in ceilings.items())
        print(f"{'':<22} CPU ceiling on {result['cores']} cores, pods/s: {shown}", flush=True)
    if result.get("cores_used"):
        used = ", ".join(f"{who} {n:.2f}" for who, n in result["cores_used"].items())
        print(f"{'':<22} cores in use over the phase: {used}", flush=True)
    if any(result.get("waited_ms", {}).values()):
        waited = ", ".join(f"{who} {ms:.1f}" for who, ms in result["waited_ms"].items())
        print(
            f"{'':<22} waiting for a core, ms/pod: {waited}; "
            f"{result['cores']} core{'' if result['cores'] == 1 else 's'} {result['busy'] * 100:.0f} % busy",
            flush=True,
        )
    if result.get("split_ms"):
        split = ", ".join(f"{part} {p50:.1f}/{p99:.1f}" for part, (p50, p99, _) in result["split_ms"].items())
        covered = min(n for _, _, n in result["split_ms"].values())
        print(
            f"{'':<22} in kube-scheduler, ms p50/p99: {split}"
            + (f" ({covered} of {result['pods']} pods logged)" if covered < result["pods"] else ""),
            flush=True,
        )
    if result.get("dra_split"):
        split = ", ".join(
            f"{part} {p50 * 1000:.0f}/{p99 * 1000:.0f}" for part, (p50, p99, _) in result["dra_split"].items()
        )
        print(f"{'':<22} DRA pod's way, ms p50/p99: {split}", flush=True)
    if result.get("cycle_ms"):
        cycle = ", ".join(f"{name} {ms:.2f} ({n})" for name, (ms, n) in result["cycle_ms"].items())
        print(f"{'':<22} kube-scheduler's own mean (ms, observations): {cycle}", flush=True)
    if result["served_ms"]:
        dialled = result.get("dialled", {})
        served = ", ".join(
            f"/{v} {ms:.2f}" + (f" ({dialled[v] * 100:.0f} % on a new connection)" if v in dialled else "")
            for v, ms in result["served_ms"].items()
        )
        print(f"{'':<22} vgpu-scheduler's mean answer time (ms): {served}", flush=True)
    if result.get("loop_steps"):
        steps = "; ".join(
            f"{r['kind']} {r['count']}, {r['total_ms']:.0f} ms, p99 <= {r['p99_ms']:g}, max <= {r['max_ms']:g}"
            for r in result["loop_steps"][:5]
        )
        print(
            f"{'':<22} vgpu-scheduler's loop steps >= 0.2 ms (count, total, bounds in ms): {steps}",
            flush=True,
        )
    if result.get("events"):
        events = ", ".join(f"{what} {n:.2f}" for what, n in result["events"].items())
        print(f"{'':<22} events per pod: {events}", flush=True)
    timeline = result["timeline"]  # (created at, latency), in creation order
    size = max(1, len(timeline) // 10)
    by_tenth = " ".join(
        f"{max(lat for _, lat in timeline[i : i + size]):.2f}" for i in range(0, len(timeline), size)
    )
    print(f"{'':<22} worst latency per tenth of the pods, in creation order (s): {by_tenth}", flush=True)


@dataclasses.dataclass
class Outcome:
    """Every phase's figures, and what the watcher and the node side found wrong."""

    results: list[dict[str, Any]]
    violations: list[str]
    failures: list[str]
    checks: int
    # the niceness the vgpu-scheduler and its writes helper ran at, read from the processes
    niceness: dict[str, int] = dataclasses.field(default_factory=dict)
    # where the vgpu-scheduler said it reads its watch streams: "by the helper" or "here"
    watches: str = ""

    @property
    def ok(self) -> bool:
        return (
            not self.violations and not self.failures and all(r["bound"] == r["pods"] for r in self.results)
        )


def vs_plain(plain: Mapping[str, Any], phase: Mapping[str, Any]) -> tuple[float, float]:
    """A phase's rate as % of the plain phase's, and its p99 as a multiple of plain's (0 without plain)."""
    percent = phase["rate"] / plain["rate"] * 100 if plain["rate"] else 0.0
    return percent, phase["p99"] / plain["p99"] if plain["p99"] else 0.0


def summary(outcomes: list[Outcome]) -> list[str]:
    """Median and range over the runs of each GPU phase's rate (% of plain) and p99 (÷ plain's),
    with how busy the cores were (where they are full, the p99 is the queue in front of
    kube-scheduler's serial cycle): one run's ratio moves by about ±1x with the machine's noise
    (docs/benchmarks.md). First, the
    plain phase's CPU per pod over all processes: how fast the machine was (on a shared VM it moves
    by half within an hour, and the GPU phases, which fill the cores, move more)."""
    lines = [f"over {len(outcomes)} runs (median, range):"]
    cpu = [sum(o.results[0].get("cpu_ms", {}).values()) for o in outcomes]
    if all(cpu):
        lines.append(
            f"plain phase's CPU per pod, all processes (the machine's speed): {statistics.median(cpu):.1f} ms"
            f" ({min(cpu):.1f}-{max(cpu):.1f}); compare summaries only at similar figures"
        )
    labels = [r["label"] for r in outcomes[0].results[1:]]
    for index, label in enumerate(labels, start=1):
        percent, p99 = [], []
        for o in outcomes:
            got_percent, got_p99 = vs_plain(o.results[0], o.results[index])
            percent.append(got_percent)
            p99.append(got_p99)
        busy = [o.results[index].get("busy", 0.0) * 100 for o in outcomes]
        lines.append(
            f"{label}: {statistics.median(percent):.0f} % of the plain rate ({min(percent):.0f}-{max(percent):.0f}),"
            f" p99 {statistics.median(p99):.1f}x plain ({min(p99):.1f}-{max(p99):.1f})"
            + (
                f", cores {statistics.median(busy):.0f} % busy ({min(busy):.0f}-{max(busy):.0f})"
                if all(busy)
                else ""
            )
        )
    return lines
