"""Generate the config-file reference in docs/configuration.md from ``vgpu.core.config``.

The reference (one table per section: YAML key, type, default, meaning) and a complete file with
every default are written between the GENERATED config-reference markers of docs/configuration.md,
and the two programs' flag tables, read from their own argparse parsers, between the flags
markers; the rest of that page is prose. Keys, types and defaults come from the dataclasses themselves; the meaning of a
key comes from this script's DESCRIPTIONS or, for keys it does not know, from the comments next to
the field in config.py (a trailing comment is appended either way, e.g. the allowed values).

    python scripts/gen_config_doc.py           # rewrite the generated part
    python scripts/gen_config_doc.py --check   # exit 1 if the page is stale (tests run this)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import inspect
import io
import pathlib
import re
import sys
import tokenize
import types
import typing
from typing import Any

import yaml
from vgpu.core import config, configload

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: config reference (scripts/gen_config_doc.py; do not edit by hand) -->"
END = "<!-- END GENERATED: config reference -->"
FLAGS_BEGIN = "<!-- BEGIN GENERATED: flags (scripts/gen_config_doc.py; do not edit by hand) -->"
FLAGS_END = "<!-- END GENERATED: flags -->"
# (program, module, function returning its argparse parser)
PARSERS = (
    ("vgpu-scheduler", "vgpu_scheduler.main", "build_parser"),
    ("vgpu-device-plugin", "vgpu_device_plugin.config", "parser"),
    ("vgpu-monitor", "vgpu_device_plugin.monitor.main", "parser"),
)

SECTION_INTRO = {
    "resources": "Extended resource names. The defaults are HAMi's; renaming them renames them everywhere "
    "(webhook, extender, device plugin, kube-scheduler's managedResources in the chart).",
    "scheduler": "The scheduler extender (`vgpu-scheduler`): policies, node locks, reservations, liveness.",
    "webhook": "The admission webhook (`POST /webhook` of `vgpu-scheduler`): defaults it fills in and what it refuses.",
    "devicePlugin": "The device plugin (`vgpu-device-plugin`). Every key here can be overridden per node under `nodes`.",
}

# What each key means, by dotted YAML path. Keys missing here fall back to config.py's comments.
DESCRIPTIONS = {
    "annotationPrefix": "Prefix of every scheduling annotation (`<prefix>/vgpu-node`, `<prefix>/mutex.lock`, ...). "
    "A DNS subdomain; keep `hami.io` to stay compatible with HAMi-core, HAMi's WebUI and monitor.",
    "nodes": "Per-node overrides of `devicePlugin` keys, keyed by node name, e.g. "
    "`{gpu-7: {deviceSplitCount: 4}}`. Unknown keys are rejected at load.",
    "resources.count": "Number of distinct GPUs a container gets; the resource the device plugin registers.",
    "resources.memory": "Device memory per GPU in MiB.",
    "resources.memoryPercentage": "Device memory per GPU as a percentage of the card; used when `memory` is not given.",
    "resources.cores": "Share of each GPU's SMs in percent; 100 means the whole card.",
    "resources.priority": "Task priority handed to HAMi-core as `CUDA_TASK_PRIORITY`.",
    "scheduler.schedulerName": "The `schedulerName` the webhook sets on GPU pods and kube-scheduler's profile answers to.",
    "scheduler.nodePolicy": "Node ranking: `binpack` fills the fullest node first, `spread` the emptiest. "
    "A pod may override it with `hami.io/node-scheduler-policy`.",
    "scheduler.gpuPolicy": "GPU ranking within a node: `binpack` or `spread`. "
    "A pod may override it with `hami.io/gpu-scheduler-policy`.",
    "scheduler.nodeLockTimeoutS": "A node lock (`hami.io/mutex.lock`) older than this is taken over by the next bind "
    "(HAMi: 5 minutes), unless its pod is bound to the node and still waits for its Allocate (the device plugin "
    "will read the lock to find it). Locks whose pod is gone, finished or already running are taken over at once.",
    "scheduler.leaseTimeoutS": "A node whose device plugin Lease has not been renewed for this long is treated as "
    "dead: its GPUs get no new pods. At least 1 (it is also the Lease's whole-second `leaseDurationSeconds`).",
    "scheduler.leaseNamespace": "Namespace of the device plugins' Leases (`vgpu-device-plugin-<node>`); "
    "the chart sets it to a namespace of their own, `<release namespace>-leases` (the device plugin may write "
    "every Lease there: keep it dedicated).",
    "scheduler.reservationTtlS": "How long the GPUs chosen at `/filter` stay reserved for a pod that is not bound.",
    "scheduler.bindLockWaitS": "How long `/bind` waits for another pod's node lock before failing; keep it below "
    "the extender's `httpTimeout` (chart: 30s).",
    "scheduler.avoidBusyNodes": "The filter picks a node where a bind is under way (its node lock held, a "
    "decision not yet bound, or a GPU pod between its Binding and its Allocate) only when no other node fits, "
    "so binds of a burst do not queue behind one node's hand-over. `false`: strict node policy order (binpack "
    "fills one node at a time, one bind at a time).",
    "scheduler.apiClient": "`asyncio`: API requests and watches run on the event loop over aiohttp, "
    "configured and authenticated as the official client would be (kubeconfig or in-cluster, CA, client "
    "certificate, bearer token refreshed through its hooks every 10 s and after a 401), so no threads compete "
    "with `/filter` for the GIL. `threads`: the official client's own transport (urllib3), calls on "
    "`apiWorkers` threads, a thread per watch. See docs/benchmarks.md for what the choice costs.",
    "scheduler.apiWorkers": "The scheduler's API requests at once (watches apart): with `apiClient: threads` "
    "the threads making them, with `asyncio` the requests in flight (the rest wait, counted in "
    "`vgpu_scheduler_api_calls_queued`; connections to the API server stay bounded). kube-scheduler binds "
    "concurrently and each `/bind` holds one for its writes (node lock, Binding); with fewer than binds in "
    "flight, binds queue here and GPU pods bind slower than plain pods.",
    "scheduler.apiWatches": "Where the scheduler reads its watch streams. `auto` (the default): `process` "
    "where the writes' helper runs (`apiWriter`), else `inline`. `process`: the helper reads them too, "
    "decodes each watched object and keeps what the scheduler caches, and sends it over as one frame: "
    "against a real API server on 16 cores that took 15-20 % of the scheduler's CPU per GPU pod off its "
    "core (0.66-0.72 of a core against 0.81-0.83 in the twenty-third pass); over three passes of "
    "alternating runs GPU pods bound faster with `always` in all phase pairs but one (-1 to +28 %; p99 2.6-2.7 times plain "
    "pods' against 3.0-3.1 in the last), and with `contended` from 7 % slower to 10 % faster, 2-3 % faster "
    'on average (docs/benchmarks.md, "Twenty-third pass"); on 2 cores the rate is the same. '
    "Its events reach the scheduler a hop later, which widens a race in which kube-scheduler "
    "retries a pending pod on a pod's deletion before the scheduler has seen it (the filter retries close "
    'it: docs/scheduler.md, "Filter retries"). `process` needs the helper (`apiWriter: auto` or '
    "`process`, `apiClient: asyncio`); where `auto` writes inline, the watches are read inline too. "
    "`inline`: on the scheduler's own event loop.",
    "scheduler.apiWriter": "Where the scheduler's API writes are made (the Binding, Events, node-lock and "
    "clean-up writes). `process`: by a helper process it starts (`python -m vgpu.kube.offload`, loading the "
    "same kubeconfig or in-cluster credentials), reached over a socket pair; reads stay in the scheduler "
    "(the watch streams are read by the helper too, unless `apiWatches: inline`). A write then costs the scheduler's one Python core about a third of what an HTTPS request "
    "does, and the HTTP and TLS run on another core: on 16 cores GPU pods bound 20-30 % faster with p99 "
    'three to five times lower, on 2 cores as fast (docs/benchmarks.md, "Nineteenth pass"). A helper that '
    "dies fails only the writes it had in flight (as a broken connection: `/bind` checks whether its Binding "
    "landed) and the next write starts another, at most one a second. Needs `apiClient: asyncio`; the helper "
    "takes about 75 MiB of memory. `inline`: on the scheduler's own event loop, with its reads (no second "
    "process). `auto`: `process` with `apiClient: asyncio` where the scheduler may use 2 CPUs or more, "
    "else `inline`. The CPUs it may use are its affinity capped by its cgroup's CPU quota (the container's "
    "`limits.cpu`, or the pod's), read at start and logged (`API writes: in this process (scheduler.apiWriter: "
    "auto; 0.5 CPUs usable (the cgroup's quota, /sys/fs/cgroup/cpu.max))`). Under a quota below 2 the helper "
    "has no core of its own, and the frames to it are CPU the quota must pay: held to 0.4 CPU, GPU pods bound "
    "178-190 a second with p99 14-18 times plain pods' with the helper, against 175-228 and 2.9-7.4 times "
    'inline (docs/benchmarks.md, "Twentieth pass").',
    "scheduler.preemption": "How a pending GPU pod of higher priority gets room: `verb`, victims named in "
    "kube-scheduler's `/preempt` call; `self`, the scheduler's own path (when `/filter` finds the pod fails "
    "everywhere only for GPUs, it evicts the fewest lower-priority GPU pods through the Eviction API and holds "
    "the freed slice for the pod); `auto`, the verb when kube-scheduler calls it and the own path for the "
    "GPU-only shortfalls it does not call for (every release before kubernetes PR #135486); `off`, neither. "
    "docs/scheduler.md has the matrix.",
    "scheduler.preemptionsPerMinute": "The own path's preemptions (one pod's victim set each) started per "
    "minute, cluster-wide; 0 turns the own path off.",
    "scheduler.preemptionExcludedNamespaces": "Namespaces whose pods the own path never evicts (nor does it "
    "evict system-critical pods, priority 2000000000 and above, or pods of equal or higher priority).",
    "scheduler.preemptionGraceS": "How long after a pod's failed `/filter` the own path waits for "
    "kube-scheduler's own `/preempt` call for it before acting (`auto`).",
    "scheduler.preemptionVictimTimeoutS": "Victims of the own path not gone after this long: the node is no "
    "longer held for the pod, and the pod backs off (doubling) before another preemption.",
    "scheduler.filterRetries": "When GPUs come free or come back on a node (a pod deleted or finished, a GPU "
    "healthy again or uncordoned, a device plugin reporting again), write the annotation "
    "`kube-vgpu.io/filter-retry` on the pending pods whose last `/filter` failed and that fit there now (after "
    "a pod went, only those that failed in the 2 s before: kube-scheduler retries the others itself), so that "
    "kube-scheduler retries them; it would otherwise leave them among its unschedulable pods for up to 60-90 s "
    "(v1.20) or 5 minutes (later versions), as it sees no reason to retry (annotations and Leases are not what "
    "it schedules by) or retried before the scheduler's watch had shown the change. At most 20 pods per "
    "release and 20 a second, once per pod per 5 s. And once after each start (the reasons live in memory): "
    "the same annotation on every pending GPU pod of ours that kube-scheduler has marked `PodScheduled=False`, "
    "10 a second, so that the pods it tried while the scheduler was down or restarting (their `/filter` "
    "refused) are retried now. And after each failed `/bind` (a node lock not released in `bindLockWaitS`, "
    "a GPU lost since the filter), once its back-off has passed (1 s doubled per failure in a row, at most "
    "10 s), unless kube-scheduler has tried the pod again meanwhile: v1.20 parks a pod whose bind failed twice "
    'alike for 60-90 s (docs/scheduler.md, "Filter retries"). `false`: no writes '
    "to pending pods; they wait for kube-scheduler's own retries.",
    "scheduler.labelAssignedPods": "Also write the `hami.io/vgpu-node` label after each bind (one more API write "
    "per GPU pod). Our device plugin sets the label in its bind-phase `success` write; turn this on when a "
    "tool needs the label from the moment the pod is bound (HAMi's scheduler sets it then).",
    "scheduler.nodeLock": "`always` (HAMi's protocol): `/bind` writes the node lock annotation before every "
    "GPU pod's Binding and the device plugin deletes it after Allocate, so the plugin knows which pod an "
    "Allocate is for. `contended`: the scheduler keeps the same one-pod-at-a-time rule per node in memory and "
    "writes the lock only when one is already on the node (two node writes fewer per GPU pod otherwise); for "
    "kube-vgpu's device plugin, which takes the one pod `allocating` on its node (HAMi's plugins cannot follow "
    "it: its v2.x search can take a pod that has not started, its newest needs the lock); needs one active "
    "scheduler (kube-scheduler's leader election); see docs/scheduler.md.",
    "scheduler.nodeLabelSelector": "Only nodes matching this label selector (e.g. `gpu=on`) are registered; "
    "empty means every node with a register annotation.",
    "scheduler.subtractOutsideUsage": "Take each GPU's memory used outside kube-vgpu (the device plugin's "
    "`<prefix>/node-nvidia-outside-usage` annotation) off its free memory at `/filter`; an unreadable value "
    "counts as 0 (logged, Warning event on the node).",
    "scheduler.metricsPodSeries": "Export the per-pod series of `/metrics` (`hami_vgpu_memory_allocated_bytes`, "
    "`hami_vgpu_core_allocated_ratio`: one per pod and GPU). `false` leaves them out, for very large clusters "
    "where they dominate the scrape; the per-GPU series stay (docs/benchmarks.md has the sizes).",
    "webhook.defaultMemoryMib": "Device memory (MiB) given to a GPU container that asks for none; 0 means the "
    "whole card's memory.",
    "webhook.defaultCores": "SM share (percent) given to a GPU container that asks for none; 0 means no limit.",
    "webhook.defaultGpuCount": (
        "GPU count the webhook adds to a container that asks for memory or cores but no GPU count. Only the "
        "webhook adds it: the scheduler refuses a pod with such a container (one created without the webhook), "
        "since kubelet calls Allocate only for containers with the count in their limits. At most `maxGpuCount`."
    ),
    "webhook.maxGpuCount": "Largest GPU count one container may request; larger requests are denied.",
    "webhook.maxContainers": (
        "Most containers (init and app together) a pod may have; a pod with more is denied with a "
        "400 naming the count. Bounds the webhook's work per review; real pods have a handful."
    ),
    "webhook.memoryFactor": "Multiplier applied to `memory` requests (e.g. 1024 when users request GiB).",
    "webhook.overwriteEnv": "Set `NVIDIA_VISIBLE_DEVICES=none` on containers that request no GPU, so they see none.",
    "webhook.forceOverwriteDefaultScheduler": "Take over pods whose schedulerName is `default-scheduler` "
    "(API defaulting sets it on every pod, so this is what makes plain GPU pods ours).",
    "webhook.runtimeClassName": "RuntimeClass set on GPU pods that name none (e.g. `nvidia`).",
    "webhook.gpuCorePolicy": "HAMi-core's `GPU_CORE_UTILIZATION_POLICY` for GPU containers: `default` sets "
    "nothing, `force` always enforces the SM limit, `disable` never does.",
    "webhook.trustedUsers": "Usernames that may change scheduling annotations after creation (pod "
    "`vgpu-node`, `vgpu-time`, `vgpu-devices-*`, `bind-*`, the `vgpu-node` label; node register, plugin-error "
    'and `mutex.lock`); anyone else\'s UPDATE changing one is refused (docs/webhook.md, "The update guard"). '
    "The chart sets the scheduler's `system:serviceaccount:<ns>:<sa>` plus `guard.extraUsers`.",
    "webhook.trustedGroups": "Groups whose members may change them too (the chart sets `guard.extraGroups`, "
    "e.g. `system:masters` for break-glass).",
    "webhook.nodeBoundUsers": "Usernames trusted like `trustedUsers`, but where the API server names the node "
    "of their pod-bound service-account token (`userInfo.extra` `authentication.kubernetes.io/node-name`, "
    "Kubernetes 1.30+) only on pods bound to that node and on that Node; without it (older clusters) "
    "everywhere. The chart sets the device plugin's service account.",
    "webhook.allowControlEnvNamespaces": "Namespaces whose GPU containers may set HAMi-core's control "
    "variables (`CUDA_DEVICE_MEMORY_LIMIT*`, `CUDA_DEVICE_SM_LIMIT*`, `CUDA_DISABLE_CONTROL`, `LD_PRELOAD`, "
    "...; docs/webhook.md, rule 7'); anywhere else such a pod is refused, naming the variable.",
    "scheduler.viewsAuth": "Who may read `/metrics`, `/ui`, `/ui/state` and `/ui/events` on the Service port. "
    "`kubernetes` (the default, and the chart's `views.auth`): a bearer token the API server authenticates "
    "(TokenReview) and whose user RBAC allows to `get` the path (SubjectAccessReview, nonResourceURLs); "
    "the default because these views list every GPU pod of every namespace. `none`: open to whoever reaches "
    "the port, for the local demo (`vgpu demo` sets it: a browser cannot send a token, and it serves on "
    "loopback). `/healthz`, `/readyz` and `/webhook` are never behind it.",
    "devicePlugin.resourceName": "Resource the plugin registers with kubelet; the chart sets it to `resources.count`.",
    "devicePlugin.deviceSplitCount": "Slots per physical GPU: how many containers may share one card.",
    "devicePlugin.deviceMemoryScaling": "Memory over-subscription factor: a card reports `memory * scaling` MiB "
    "(above 1, HAMi-core swaps to host memory).",
    "devicePlugin.deviceCoreScaling": "Core scaling: a card reports `100 * scaling` cores.",
    "devicePlugin.preconfiguredDeviceMemoryMib": "Memory to report for GPUs whose memory NVML cannot tell "
    "(unified-memory parts); 0 skips such GPUs.",
    "devicePlugin.hookPath": "Host prefix of HAMi-core: `libvgpu.so` and `ld.so.preload` are in `<hookPath>/vgpu`.",
    "devicePlugin.libCudaLogLevel": "HAMi-core log level (`LIBCUDA_LOG_LEVEL`): 0 errors, 1 warnings, "
    "3 infos, 4 debug; empty sets nothing.",
    "devicePlugin.disableCoreLimit": "Tell HAMi-core not to enforce SM limits (`GPU_CORE_UTILIZATION_POLICY=disable`).",
    "devicePlugin.enableNumaTopology": "Report each device's NUMA node to kubelet (topology manager).",
    "devicePlugin.leaseRenewS": "How often the plugin renews its liveness Lease; keep it well below "
    "`scheduler.leaseTimeoutS` (at or above it is refused at load).",
    "devicePlugin.registerIntervalS": "Longest time between two checks of the node's register annotation "
    "(it is re-patched only when it changes, and at once on a health change).",
    "devicePlugin.healthChecksEnabled": "Watch NVML XID and ECC events; a critical one marks the GPU unhealthy "
    "(kubelet and the scheduler stop using it).",
    "devicePlugin.ignoredXids": "XIDs that are application errors, not GPU faults, and never mark a GPU unhealthy.",
    "devicePlugin.healthRecoveryS": "An unhealthy GPU becomes healthy again after this long without new critical "
    "events and with passing probes (HAMi never recovers).",
    "devicePlugin.healthProbeIntervalS": "How often an unhealthy GPU is probed through NVML.",
    "devicePlugin.getPreferredAllocation": "Offer kubelet preferred device IDs matching the scheduler's choice "
    "(GetPreferredAllocation).",
    "devicePlugin.deviceListStrategy": "How containers are told their GPUs, as NVIDIA's device plugin does.",
    "devicePlugin.deviceIdStrategy": "Name GPUs to the container runtime by UUID or by index.",
    "devicePlugin.cdiSpecDir": "With a CDI `deviceListStrategy`: the directory (below `--host-root`; "
    "one the runtime reads CDI specs from) where the plugin writes its own CDI spec, "
    "`kube-vgpu.io-hami-core.json` (docs/device-plugin.md). Absolute path.",
    "devicePlugin.passDeviceSpecs": "Also pass the `/dev/nvidia*` device nodes in the Allocate answer.",
    "devicePlugin.gdsEnabled": "Set `NVIDIA_GDS=enabled` (GPUDirect Storage) on GPU containers.",
    "devicePlugin.mofedEnabled": "Set `NVIDIA_MOFED=enabled` on GPU containers.",
    "devicePlugin.gdrcopyEnabled": "Set `NVIDIA_GDRCOPY=enabled` on GPU containers.",
    "devicePlugin.migStrategy": "MIG devices: `none` shares whole GPUs only, `single`/`mixed` as in NVIDIA's plugin.",
    "devicePlugin.filterDeviceUuids": "GPUs (by UUID) this node keeps for itself: hidden from kubelet and the scheduler.",
    "devicePlugin.filterDeviceIndexes": "GPUs (by NVML index) hidden from kubelet and the scheduler.",
    "devicePlugin.startRetryS": "After a failed start (NVML, socket, registration), retry after this long.",
    "devicePlugin.outsideUsageEnabled": "Measure GPU memory used outside kube-vgpu (driver reserve, other "
    "schedulers' pods, hand-started processes, our pods beyond their share) and publish it per GPU in "
    "`<prefix>/node-nvidia-outside-usage`. Needs the host PID namespace (the chart sets `hostPID`).",
    "devicePlugin.outsideUsageIntervalS": "How often GPU memory is measured: the annotation changes at most "
    "this often.",
    "devicePlugin.outsideUsageStepMib": "The annotation is rewritten only when a GPU's figure moved by more than "
    "this many MiB (or the GPUs changed).",
    "devicePlugin.kubeletPollS": "How often the plugin checks that kubelet.sock is unchanged (a kubelet restart "
    "means serve and register again); inotify sees a restart at once, this poll is the fallback where it is "
    "unavailable.",
    "devicePlugin.allocateTimeoutS": "The most an Allocate may take (kubelet waits for it in its pod loop, with no "
    "deadline of its own); past it the call fails naming what it waited for. Writes land after the answer.",
}


def _comments(source: str) -> dict[int, str]:
    """Line number → the comment on that line (without ``#``)."""
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def _field_comments(cls: type) -> dict[str, tuple[str, str]]:
    """field name → (comment block right above it, comment on its line), from config.py's source."""
    source = inspect.getsource(config)
    comments = _comments(source)
    lines = source.splitlines()
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    out: dict[str, tuple[str, str]] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            above: list[str] = []
            line = stmt.lineno - 1
            while line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments.get(line, ""))
                line -= 1
            out[stmt.target.id] = (" ".join(above), comments.get(stmt.lineno, ""))
    return out


def _type_name(kind: Any) -> str:
    origin = typing.get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in kind)
    if kind is bool:
        return "boolean"
    if kind is int:
        return "integer"
    if kind is float:
        return "number"
    if kind is str:
        return "string"
    if origin is dict:
        return "mapping"
    if origin in (list, tuple):
        (item, *_) = typing.get_args(kind)
        return f"list of {_type_name(item)}s"
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(kind) if a is not types.NoneType)
    return getattr(kind, "__name__", str(kind))


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, pathlib.PurePath):
        value = str(value)
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{value:g}`"
    if isinstance(value, int | float):
        return f"`{value}`"
    return f"`{yaml.safe_dump(value, default_flow_style=True, width=1000).strip()}`"


def _describe(path: str, comments: tuple[str, str]) -> str:
    above, trailing = comments
    # a comment block above a field often heads a group of fields: only a last resort
    text = DESCRIPTIONS.get(path) or ("" if trailing else above)
    if trailing and trailing not in text:
        text = f"{text} Values: {trailing}." if text else f"Values: {trailing}."
    if not text:
        print(f"gen_config_doc: no description for {path} (add one to DESCRIPTIONS)", file=sys.stderr)
        return "(not described yet)"
    return re.sub(r"(?<!\\)\|", r"\\|", text)  # a bare | would end the table cell


def _table(cls: type, prefix: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    notes = _field_comments(cls)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        key = configload.camel(f.name)
        path = f"{prefix}.{key}" if prefix else key
        rows.append(
            f"| `{key}` | {_type_name(hints[f.name])} | {_show(_default(f))} | "
            f"{_describe(path, notes.get(f.name, ('', '')))} |"
        )
    return rows


def generate() -> str:
    """The generated part of docs/configuration.md, markers included."""
    out = [BEGIN, "", "### Top level", ""]
    hints = typing.get_type_hints(config.Config)
    notes = _field_comments(config.Config)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    sections: list[tuple[str, type]] = []
    for f in dataclasses.fields(config.Config):
        kind = hints[f.name]
        key = configload.camel(f.name)
        if dataclasses.is_dataclass(kind) and isinstance(kind, type):
            sections.append((key, kind))
            rows.append(f"| `{key}` | section | | see [`{key}`](#{key.lower()}) |")
        else:
            rows.append(
                f"| `{key}` | {_type_name(kind)} | {_show(_default(f))} | "
                f"{_describe(key, notes.get(f.name, ('', '')))} |"
            )
    out += rows
    for key, cls in sections:
        out += ["", f"### `{key}`", ""]
        if key in SECTION_INTRO:
            out += [SECTION_INTRO[key], ""]
        out += _table(cls, key)
    defaults = yaml.safe_dump(config.to_dict(config.Config()), sort_keys=False, default_flow_style=False)
    out += [
        "",
        "### Every default, as one file",
        "",
        "```yaml",
        defaults.rstrip(),
        "```",
        "",
        END,
    ]
    return "\n".join(out)


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| flag | argument | default | meaning |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flags = ", ".join(f"`{f}`" for f in action.option_strings)
        if action.choices:
            argument = " \\| ".join(f"`{c}`" for c in action.choices)
        elif action.nargs == 0:
            argument = "(repeatable)" if isinstance(action, argparse._CountAction) else ""
        else:
            metavar = action.metavar
            argument = " ".join(metavar) if isinstance(metavar, tuple) else metavar or action.dest.upper()
        default = "" if action.default in (None, argparse.SUPPRESS) else _show(action.default)
        text = re.sub(r"(?<!\\)\|", r"\\|", (action.help or "").replace("%%", "%"))
        rows.append(f"| {flags} | {argument} | {default} | {text} |")
    return rows


def generate_flags() -> str:
    """The flag tables of both programs, markers included."""
    out = [FLAGS_BEGIN]
    for program, module_name, function in PARSERS:
        parser = getattr(importlib.import_module(module_name), function)()
        out += ["", f"### `{program}`", ""]
        out += _flag_rows(parser)
    out += ["", FLAGS_END]
    return "\n".join(out)


def _replace(page: str, begin: str, end: str, fresh: str) -> str:
    if begin not in page or end not in page:
        raise SystemExit(f"{DOC}: the GENERATED markers are missing ({begin})")
    head, _, rest = page.partition(begin)
    _, _, tail = rest.partition(end)
    return head + fresh + tail


def apply(page: str) -> str:
    """``page`` with its generated parts replaced by fresh ones."""
    page = _replace(page, BEGIN, END, generate())
    return _replace(page, FLAGS_BEGIN, FLAGS_END, generate_flags())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/configuration.md is stale")
    args = parser.parse_args(argv)
    page = DOC.read_text()
    fresh = apply(page)
    if args.check:
        if fresh != page:
            print(
                f"{DOC.relative_to(REPO)} is stale: run `python scripts/gen_config_doc.py`", file=sys.stderr
            )
            return 1
        return 0
    if fresh != page:
        DOC.write_text(fresh)
        print(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
