"""The admission decision for a pod CREATE, as one pure function (docs/protocol.md#admission; issues 8 and 9).

``decide(pod, namespace=..., config=..., facts=...)`` returns a ``Decision``: allowed or denied
(with an HTTP-style code, a Kubernetes status reason and a message), the JSON Patch that makes the
pod ours, and admission warnings. ``facts`` is a snapshot of what the cluster knows (namespace
labels, the namespace's GPU quota and live usage, the largest GPU) taken by the caller.

Rules, in order (each one documented with its message in docs/webhook.md):

 1. the object is not shaped like a Pod, or has more than ``webhook.maxContainers`` containers
    → 400 naming the field;
 2. scheduler-internal annotations (or the node label) on a new pod → denied (or stripped);
 3. the pod or its namespace is labelled ``<prefix>/webhook=ignore`` → allowed unchanged;
 4. no containers → denied;
 5. another scheduler named (``default-scheduler`` counts as ours when force-overwrite is on)
    → allowed unchanged;
 6. an invalid GPU request → 400 naming the container and field (negative, percent or cores over
    100, memory without a GPU, a count above the maximum, an unparsable quantity, bad policy);
 7. a privileged container asking for our resources → denied (a privileged container that asks
    for none is left alone); a GPU container setting one of HAMi-core's control variables
    (``controlenv``: its limits, LD_PRELOAD, ...) → denied naming it, unless its namespace is in
    ``webhook.allowControlEnvNamespaces``;
 8. ours and ``spec.nodeName`` already set → denied;
 9. mutations: default GPU count, exclusive cores for a whole-GPU request, limits copied to
    missing requests, env (``CUDA_TASK_PRIORITY``, ``GPU_CORE_UTILIZATION_POLICY`` on GPU
    containers only, ``NVIDIA_VISIBLE_DEVICES=none`` on the others when overwriteEnv),
    ``schedulerName``, ``runtimeClassName``, scheduling annotations (never over a user's value);
10. namespace quota on our memory and cores against live usage → denied with the exact numbers;
11. warnings for what is allowed but probably wrong.

In DRA mode (``mode.choose``: the pod's ``kube-vgpu.io/mode`` annotation, else its namespace's
label, else ``webhook.defaultMode``) rules 1-8 hold as they are (a pod naming ``default-scheduler``
is ours there whatever ``forceOverwriteDefaultScheduler`` says: kube-scheduler places DRA pods);
rule 9 writes claims instead of limits (``vgpu.core.dra.convert``; env, ``runtimeClassName`` as
above; no ``schedulerName``, no scheduling annotations but ``kube-vgpu.io/mode: dra``) and
``Decision.templates`` lists the ResourceClaimTemplates the claims name; rule 10 counts every GPU
container's claim for the pod's whole life (``convert.claim_charge``); what DRA cannot say is a 400
naming the field, or a warning.

Every mutation is idempotent: deciding again on the patched pod yields an empty patch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.core import admitcontainers, errors, jsonpatch, podshape, quota, request
from vgpu.core.annotations import Keys
from vgpu.core.config import AdmissionMode, Config, CorePolicy
from vgpu.core.dra import convert, mode

DEFAULT_SCHEDULER = "default-scheduler"
IGNORE_VALUE = "ignore"
DEVICE_TYPE = "NVIDIA"
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MAX_WARNING_CHARS = 119

_CORE_POLICY_VALUES = {"default": CorePolicy.DEFAULT, "force": CorePolicy.FORCE}
_CORE_POLICY_VALUES |= {"disable": CorePolicy.DISABLE, "none": CorePolicy.DISABLE}


Quota = quota.Quota  # the namespace quota facts (moved to vgpu.core.quota, shared with the filter)


@dataclass(frozen=True)
class Facts:
    """The cluster facts a decision reads; the caller snapshots them for the pod's namespace."""

    namespace_labels: Mapping[str, str] | None = None
    quota: Quota | None = None
    largest_gpu_memory_mib: int = 0
    # the distinct memory sizes of the GPUs published in our ResourceSlices (DRA mode's
    # gpumem-percentage; the largest also counts a percentage against the quota there)
    dra_memory_sizes_mib: tuple[int, ...] = ()


@dataclass(frozen=True)
class Decision:
    """The answer. ``code``/``reason`` follow metav1.Status (400 BadRequest, 403 Forbidden)."""

    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""
    patch: tuple[jsonpatch.Operation, ...] = ()
    warnings: tuple[str, ...] = ()
    ours: bool = False
    # DRA mode: the ResourceClaimTemplates (bodies) the patched pod's claims name; the caller
    # makes sure they exist before it answers
    templates: tuple[dict[str, Any], ...] = ()
    claim_templates: tuple[str, ...] = ()  # the template each of the pod's claims names, in order


def _bad_request(message: str) -> Decision:
    return Decision(allowed=False, message=message, code=400, reason="BadRequest")


def _forbidden(message: str, *, ours: bool = True) -> Decision:
    return Decision(allowed=False, message=message, code=403, reason="Forbidden", ours=ours)


def _warning(text: str) -> str:
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 3] + "..."


# --- 2. anti-forgery -----------------------------------------------------------------------------


def _forged(meta: Mapping[str, Any], keys: Keys) -> tuple[list[str], list[str]]:
    """The internal annotation keys and label keys present on a new pod."""
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    internal = (*keys.internal_pod_keys(), f"{keys.prefix}/vgpu-mig-allocations")
    return [k for k in internal if k in annotations], [k for k in (keys.assigned_node,) if k in labels]


# --- 6. validation beyond request.parse_pod -------------------------------------------------------


def _core_policy(annotations: Mapping[str, str], key: str, config: Config) -> CorePolicy:
    raw = annotations.get(key)
    if raw is None or raw.strip() == "":
        return config.webhook.gpu_core_policy
    policy = _CORE_POLICY_VALUES.get(raw.strip().lower())
    if policy is None:
        raise errors.RequestError(
            f"annotation {key}", f"unknown core policy {raw!r}: expected default, force or disable"
        )
    return policy


# --- 9. mutation ---------------------------------------------------------------------------------


def _runtime_class(config: Config, gpu_types: Sequence[str]) -> str:
    by_type = {k.lower(): v for k, v in config.webhook.runtime_class_by_type.items()}
    for t in [*gpu_types, DEVICE_TYPE]:
        if t.lower() in by_type:
            return by_type[t.lower()]
    return config.webhook.runtime_class_name


# --- 10. quota -----------------------------------------------------------------------------------


def _pod_totals(
    containers: Sequence[admitcontainers.Container], config: Config, largest_mib: int
) -> tuple[int, int]:
    """(memory MiB, cores) the pod holds at once (``quota.pod_totals``), exclusive cores counted."""
    asks = [
        dataclasses.replace(c.ask, cores=admitcontainers.EXCLUSIVE_CORES)
        if c.ask is not None and admitcontainers.exclusive(c, config)
        else c.ask
        for c in containers
    ]
    init = [c.spec for c in containers if c.init]
    return quota.pod_totals(
        asks,
        init_count=len(init),
        sidecars=request.sidecar_indices(init),
        largest_gpu_memory_mib=largest_mib,
    )


def _quota_problem(ns: str, facts: Quota, memory_mib: int, cores: int, factor: int) -> str | None:
    return quota.problem(ns, facts, memory_mib=memory_mib, cores=cores, memory_factor=factor)


# --- 11. warnings --------------------------------------------------------------------------------


def _warnings(containers: Sequence[admitcontainers.Container], config: Config, largest_mib: int) -> list[str]:
    names = config.resources
    out: list[str] = []
    for c in containers:
        if c.ask is None:
            if c.given(names.priority):
                out.append(f"container {c.name}: {names.priority} without a GPU has no effect")
            continue
        if c.given(names.memory) and c.given(names.memory_percentage) and c.ask.memory_mib > 0:
            out.append(
                f"container {c.name}: {names.memory} and {names.memory_percentage} both set; percent ignored"
            )
        if largest_mib > 0 and c.ask.memory_mib > largest_mib:
            out.append(
                f"container {c.name}: {c.ask.memory_mib} MiB per GPU is more than the largest GPU "
                f"in the cluster ({largest_mib} MiB)"
            )
    return [_warning(w) for w in out]


# --- the decision --------------------------------------------------------------------------------


def decide(pod: Any, *, namespace: str, config: Config, facts: Facts) -> Decision:
    """Admit a new pod: deny it with a reason, or allow it with a patch (see the module docstring)."""
    problem = podshape.shape_problem(pod) or podshape.size_problem(pod["spec"], config)
    if problem:
        return _bad_request(problem)
    keys = Keys(config.annotation_prefix)
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    spec: Mapping[str, Any] = pod["spec"]
    patch = jsonpatch.Builder(pod)
    notes: list[str] = []

    forged_annotations, forged_labels = _forged(meta, keys)
    if forged_annotations or forged_labels:
        forged = ", ".join([*forged_annotations, *(f"label {k}" for k in forged_labels)])
        if not config.webhook.strip_forged_annotations:
            return _forbidden(f"pod sets {forged}: only the scheduler and device plugin may", ours=False)
        for key in forged_annotations:
            patch.remove(["metadata", "annotations", key])
        for key in forged_labels:
            patch.remove(["metadata", "labels", key])
        notes.append(_warning(f"removed scheduler-internal {forged}"))

    ignore = keys.webhook_ignore_label
    namespace_labels = facts.namespace_labels or {}
    if (meta.get("labels") or {}).get(ignore) == IGNORE_VALUE or namespace_labels.get(ignore) == IGNORE_VALUE:
        return Decision(allowed=True, patch=tuple(patch.ops), warnings=tuple(notes))

    if not spec.get("containers"):
        return _bad_request("pod has no containers")
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    mode_problem = None
    try:
        dra = mode.choose(annotations, facts.namespace_labels, default=config.webhook.default_mode)
    except errors.ParseError as exc:  # only a GPU pod is refused for it, below
        dra, mode_problem = config.webhook.default_mode, str(exc)
    is_dra = dra is AdmissionMode.DRA
    scheduler = spec.get("schedulerName") or ""
    force = config.webhook.force_overwrite_default_scheduler or is_dra
    if scheduler not in ("", config.scheduler.scheduler_name) and not (
        force and scheduler == DEFAULT_SCHEDULER
    ):
        return Decision(allowed=True, patch=tuple(patch.ops), warnings=tuple(notes))

    try:
        parsed = request.parse_pod(pod, config, default_count=True)  # the count it then writes
        containers = admitcontainers.containers(spec, parsed.containers)
        admitcontainers.check_counts(containers, config)
        core_policy = _core_policy(annotations, f"{keys.prefix}/core-policy", config)
    except errors.ParseError as exc:
        return _bad_request(str(exc))
    ours = parsed.wants_gpu
    if ours and mode_problem:
        return _bad_request(mode_problem)

    for c in containers:
        if c.ask is not None and c.privileged:
            return _forbidden(
                f"container {c.name} is privileged: it would see every GPU on the node, so its GPU "
                f"share cannot be enforced; drop privileged or the GPU request"
            )
    problem = admitcontainers.control_env_problem(containers, namespace, config, core_policy)
    if problem:
        return _forbidden(problem)
    if ours and spec.get("nodeName"):
        return _forbidden(
            f"pod has node assigned (spec.nodeName={spec['nodeName']}): GPU pods must be placed by "
            f"{config.scheduler.scheduler_name or 'the GPU scheduler'}; remove spec.nodeName"
        )

    claimed = convert.claimed(spec)
    for index, c in enumerate(containers):
        if c.ask is not None:
            if is_dra:
                admitcontainers.set_control_env(patch, c, core_policy)
            else:
                admitcontainers.mutate_gpu_container(patch, c, config, core_policy)
        elif config.webhook.overwrite_env and not c.privileged and index not in claimed:
            admitcontainers.set_env(patch, c.path, ENV_VISIBLE_DEVICES, "none")

    if ours and is_dra:
        return _admit_dra(
            pod, parsed, containers, patch, notes, namespace=namespace, config=config, facts=facts
        )
    if ours:
        if config.scheduler.scheduler_name:
            patch.set(["spec", "schedulerName"], config.scheduler.scheduler_name)
        gpu_types = request.parse_selectors(annotations).use_types
        if not spec.get("runtimeClassName"):
            runtime_class = _runtime_class(config, gpu_types)
            if runtime_class:
                patch.set(["spec", "runtimeClassName"], runtime_class)
        wanted = {
            f"{keys.prefix}/gpu-type": (annotations.get(request.USE_GPUTYPE) or "").strip() or DEVICE_TYPE,
            keys.node_policy: config.scheduler.node_policy.value,
            f"{keys.prefix}/core-policy": config.webhook.gpu_core_policy.value,
        }
        current = patch.get(["metadata", "annotations"])
        current = current if isinstance(current, dict) else {}
        patch.merge(["metadata", "annotations"], {k: v for k, v in wanted.items() if k not in current})

        if facts.quota is not None:
            memory_mib, cores = _pod_totals(containers, config, facts.largest_gpu_memory_mib)
            problem = _quota_problem(namespace, facts.quota, memory_mib, cores, config.webhook.memory_factor)
            if problem:
                return _forbidden(problem)

    notes += _warnings(containers, config, facts.largest_gpu_memory_mib)
    return Decision(allowed=True, patch=tuple(patch.ops), warnings=tuple(notes), ours=ours)


# --- DRA mode (rules 9-11 for a pod admitted as claims) ------------------------------------------


def _admit_dra(
    pod: Mapping[str, Any],
    parsed: request.PodRequest,
    containers: Sequence[admitcontainers.Container],
    patch: jsonpatch.Builder,
    notes: list[str],
    *,
    namespace: str,
    config: Config,
    facts: Facts,
) -> Decision:
    keys = Keys(config.annotation_prefix)
    try:
        conversion = convert.convert(
            pod,
            parsed,
            namespace=namespace,
            resources=config.resources,
            memory_sizes_mib=facts.dra_memory_sizes_mib,
            patch=patch,
        )
    except errors.ParseError as exc:
        return _bad_request(str(exc))
    spec: Mapping[str, Any] = pod["spec"]
    if not spec.get("runtimeClassName"):
        runtime_class = _runtime_class(config, parsed.selectors.use_types)
        if runtime_class:
            patch.set(["spec", "runtimeClassName"], runtime_class)
    largest = max((facts.largest_gpu_memory_mib, *facts.dra_memory_sizes_mib))
    if facts.quota is not None:
        # every GPU container's claim is allocated for the pod's whole life (kubelet hands no DRA
        # device on from an init container), so all of them count, as the state counts them later
        charges = [convert.claim_charge(c.spec, largest_gpu_memory_mib=largest) for c in conversion.claims]
        memory_mib, cores = sum(m for m, _ in charges), sum(c for _, c in charges)
        problem = _quota_problem(namespace, facts.quota, memory_mib, cores, config.webhook.memory_factor)
        if problem:
            return _forbidden(problem)
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    for key in (keys.node_policy, f"{keys.prefix}/gpu-scheduler-policy"):
        if key in annotations:
            notes.append(_warning(f"{key} has no effect in DRA mode: kube-scheduler places the pod"))
    for c in containers:
        if c.ask is not None and c.init and c.spec.get("restartPolicy") != request.RESTART_ALWAYS:
            notes.append(
                _warning(
                    f"init container {c.name}: its GPU claim is held for the pod's whole life (DRA mode)"
                )
            )
    notes += _warnings(containers, config, largest)
    ops = tuple(patch.ops)
    return Decision(
        allowed=True,
        patch=ops,
        warnings=tuple(notes),
        ours=True,
        templates=conversion.templates,
        claim_templates=tuple(c.template for c in conversion.claims),
    )
