"""The mutating admission webhook: AdmissionReview in, AdmissionReview out (docs/protocol.md#admission).

This module is the HTTP adapter only. It decodes the review envelope (``admission.k8s.io/v1`` or
``v1beta1``), gathers the namespace facts the decision needs from an ``AdmissionView`` (in-memory
state kept by the scheduler's caches), calls the pure ``vgpu.core.admission.decide`` and encodes
its answer in the same review version, with ``response.uid`` echoed and the JSON Patch base64'd
(``patchType: JSONPatch`` only when there is a patch).

The same handler is the update guard (issue 13; the chart's ValidatingWebhookConfiguration
sends pod and node UPDATEs here): an UPDATE of a core/v1 Pod or Node goes to the pure
``vgpu.core.guard.decide`` with ``object``, ``oldObject`` and ``userInfo``; it never patches.

In DRA mode (``vgpu.core.dra.mode``) the decision names ResourceClaimTemplates; the handler awaits
``TemplateKeeper.ensure`` (``dratemplates.py``: memory when they are known, a bounded create when
not) before it answers, and refuses the pod with code 503 when one cannot be made in time; a
dry run makes none.

A body that is not an AdmissionReview gets HTTP 400 with the reason (there is no uid to answer).
Everything else gets HTTP 200 with a review response: other operations, subresources and kinds
are allowed unchanged; a request object that is not a Pod is refused in the response with code
400 (the apiserver reports it to the user). An unexpected fault in the decision is logged and
answered with code 500 in the response, never an HTTP 500.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from aiohttp import web
from vgpu.core import admission, guard
from vgpu.core.annotations import Keys
from vgpu.core.config import Config

from vgpu_scheduler import bodies

log = logging.getLogger(__name__)

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
REVIEW_KIND = "AdmissionReview"
_GUARDED: dict[str, guard.Resource] = {"Pod": "pods", "Node": "nodes"}


class AdmissionView(Protocol):
    """What the webhook reads from the scheduler's live state (all in memory, never blocking)."""

    def namespace_labels(self, ns: str) -> Mapping[str, str] | None:
        """The namespace's labels, or None when the namespace is not known (yet)."""
        ...

    def namespace_gpu_usage(self, ns: str) -> tuple[int, int]:
        """(memory MiB, cores percent) held by the namespace's unfinished pods, memory factor applied."""
        ...

    def quota_limits(self, ns: str) -> tuple[int | None, int | None]:
        """The namespace's ResourceQuota ``spec.hard`` ``limits.<memory>`` (MiB, before the memory
        factor) and ``limits.<cores>`` (percent); None where no quota sets that key."""
        ...

    def largest_gpu_memory_mib(self) -> int:
        """Memory of the largest GPU registered in the cluster; 0 when none is known."""
        ...


class TemplateKeeper(Protocol):
    """What the DRA mode needs: the GPU sizes our ResourceSlices publish and the templates made."""

    def memory_sizes_mib(self) -> tuple[int, ...]:
        """The distinct memory sizes of our published GPUs, ascending (memory, never blocking)."""
        ...

    async def ensure(self, bodies: Sequence[Mapping[str, Any]]) -> None:
        """Make sure the ResourceClaimTemplates exist; raises an exception whose message says why not."""
        ...


class DraReservations(Protocol):
    """The namespace quota's view of DRA pods (``draquota.DraUsage``): a pod admitted with claims is
    charged from the moment it is admitted, not only once the watch shows it."""

    def admitted(
        self, namespace: str, templates: Sequence[str], bodies: Sequence[Mapping[str, Any]]
    ) -> tuple[int, int]: ...

    def withdraw(self, namespace: str, templates: Sequence[str]) -> None: ...


class BadReview(Exception):
    """The body is not an AdmissionReview request; the message says why (sent with HTTP 400)."""


def parse_review(body: bytes) -> tuple[str, Mapping[str, Any]]:
    """(apiVersion, request) of an AdmissionReview body, or BadReview."""
    try:
        review = bodies.loads(body)  # (NaN and Infinity are not JSON)
    except (ValueError, RecursionError) as exc:
        raise BadReview(f"body is not JSON: {exc}") from None
    if not isinstance(review, dict):
        raise BadReview("body is not a JSON object")
    api_version = review.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise BadReview(f"apiVersion {api_version!r}: expected one of {', '.join(API_VERSIONS)}")
    if review.get("kind") != REVIEW_KIND:
        raise BadReview(f"kind {review.get('kind')!r}: expected {REVIEW_KIND}")
    req = review.get("request")
    if not isinstance(req, dict):
        raise BadReview("request: expected an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid: expected a non-empty string")
    for key in ("operation", "namespace", "subResource", "name"):
        if req.get(key) is not None and not isinstance(req[key], str):
            raise BadReview(f"request.{key}: expected a string")
    return str(api_version), req


def _is_pod(req: Mapping[str, Any]) -> bool:
    kind = req.get("kind")
    if isinstance(kind, Mapping):
        return kind.get("group", "") == "" and kind.get("kind") == "Pod"
    obj = req.get("object")
    return not (isinstance(obj, Mapping) and obj.get("kind") not in (None, "Pod"))


def _guarded_resource(req: Mapping[str, Any]) -> guard.Resource | None:
    """ "pods" or "nodes" for an UPDATE the guard decides on; None for anything else."""
    if req.get("operation") != "UPDATE" or req.get("subResource"):
        return None
    kind = req.get("kind")
    if isinstance(kind, Mapping):
        if kind.get("group", "") != "":
            return None
        name = kind.get("kind")
    else:
        obj = req.get("object")
        name = obj.get("kind") if isinstance(obj, Mapping) else None
    return _GUARDED.get(name) if isinstance(name, str) else None


def encode_response(api_version: str, uid: str, decision: admission.Decision) -> dict[str, Any]:
    """The review response for ``decision`` (docs/protocol.md#admissionreview)."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "metadata": {},
            "status": "Failure",
            "message": decision.message,
            "reason": decision.reason,
            "code": decision.code,
        }
    if decision.patch:
        raw = json.dumps(list(decision.patch), separators=(",", ":")).encode()
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(raw).decode("ascii")
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": api_version, "kind": REVIEW_KIND, "response": response}


def _namespace(req: Mapping[str, Any]) -> str:
    pod = req.get("object")
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    return str(req.get("namespace") or meta.get("namespace") or "default")


def _name(req: Mapping[str, Any]) -> str:
    """``namespace/name`` for logs; a pod named by ``generateName`` has no name yet: ``prefix*``."""
    obj = req.get("object")
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    generated = meta.get("generateName")
    name = req.get("name") or meta.get("name") or (f"{generated}*" if generated else "?")
    return f"{req['namespace']}/{name}" if req.get("namespace") else str(name)


class Webhook:
    """``POST /webhook`` handler. Build once per process; ``handle`` is the aiohttp handler."""

    def __init__(
        self,
        config: Config,
        view: AdmissionView,
        *,
        templates: TemplateKeeper | None = None,
        usage: DraReservations | None = None,
    ) -> None:
        """``templates``: the DRA mode's keeper (None: a pod admitted in DRA mode is refused);
        ``usage``: where a DRA pod admitted under a quota is reserved (None: counted once seen)."""
        self._config = config
        self._view = view
        self._templates = templates
        self._usage = usage
        self._keys = Keys(config.annotation_prefix)
        self._trusted = guard.Trusted.from_config(config.webhook)

    def facts(self, namespace: str) -> admission.Facts:
        """Snapshot the namespace's facts (usage is read only when a quota applies)."""
        view = self._view
        memory_limit, cores_limit = view.quota_limits(namespace)
        quota = None
        if memory_limit is not None or cores_limit is not None:
            used_memory, used_cores = view.namespace_gpu_usage(namespace)
            quota = admission.Quota(memory_limit, cores_limit, used_memory, used_cores)
        return admission.Facts(
            namespace_labels=view.namespace_labels(namespace),
            quota=quota,
            largest_gpu_memory_mib=view.largest_gpu_memory_mib(),
            dra_memory_sizes_mib=self._templates.memory_sizes_mib() if self._templates else (),
        )

    def review(self, api_version: str, req: Mapping[str, Any]) -> dict[str, Any]:
        """The review response to one decoded request (the handler minus HTTP and minus the DRA
        mode's template creation: ``areview`` does both)."""
        return encode_response(api_version, str(req["uid"]), self.decision(req))

    async def areview(self, api_version: str, req: Mapping[str, Any]) -> dict[str, Any]:
        """``review``, with the templates a DRA pod's claims name made before the answer."""
        decision = self.decision(req)
        # a dry run must have no side effects (the chart declares sideEffects: NoneOnDryRun): the
        # patch names the templates, and none is made
        if decision.allowed and decision.templates and req.get("dryRun") is not True:
            decision = await self._with_templates(req, decision)
        return encode_response(api_version, str(req["uid"]), decision)

    async def _with_templates(
        self, req: Mapping[str, Any], decision: admission.Decision
    ) -> admission.Decision:
        namespace = _namespace(req)
        # reserved before the wait, so that a pod decided meanwhile sees this one's charge
        usage = self._usage if self._view.quota_limits(namespace) != (None, None) else None
        if usage is not None:
            usage.admitted(namespace, decision.claim_templates, decision.templates)
        if self._templates is None:
            problem = "DRA mode is not served by this webhook (no template keeper)"
        else:
            try:
                await self._templates.ensure(decision.templates)
                return decision
            except Exception as exc:  # the keeper's TemplateError, or a fault: the pod is refused
                problem = str(exc) or type(exc).__name__
        if usage is not None:
            usage.withdraw(namespace, decision.claim_templates)
        log.warning("refused pod %s in DRA mode: %s", _name(req), problem)
        return admission.Decision(
            allowed=False,
            message=f"GPU claim template: {problem}",
            code=503,
            reason="ServiceUnavailable",
            ours=True,
        )

    def decision(self, req: Mapping[str, Any]) -> admission.Decision:
        """The decision on one decoded request: the guard's for an UPDATE, admission's for a pod
        CREATE, allowed unchanged for anything else."""
        guarded = _guarded_resource(req)
        if guarded is not None:
            return self.guard(guarded, req)
        operation = req.get("operation") or "CREATE"
        if operation != "CREATE" or req.get("subResource") or not _is_pod(req):
            return admission.Decision(allowed=True)
        pod = req.get("object")
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        namespace = _namespace(req)
        name = str(req.get("name") or meta.get("name") or meta.get("generateName") or "?")
        try:
            decision = admission.decide(
                pod, namespace=namespace, config=self._config, facts=self.facts(namespace)
            )
        except Exception:
            log.exception("admission of pod %s/%s failed unexpectedly", namespace, name)
            decision = admission.Decision(
                allowed=False,
                message="internal error in the GPU admission webhook",
                code=500,
                reason="InternalError",
            )
        if not decision.allowed:
            log.info("denied pod %s/%s: %s", namespace, name, decision.message)
        elif decision.patch:
            log.debug("mutated pod %s/%s with %d patch operations", namespace, name, len(decision.patch))
        return decision

    def guard(self, resource: guard.Resource, req: Mapping[str, Any]) -> admission.Decision:
        """The update guard's decision on one UPDATE request (logged when it refuses)."""
        decision = guard.decide(
            resource,
            obj=req.get("object"),
            old=req.get("oldObject"),
            user_info=req.get("userInfo"),
            keys=self._keys,
            trusted=self._trusted,
        )
        if not decision.allowed:
            log.warning("refused UPDATE of %s %s: %s", resource, _name(req), decision.message)
        return decision

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            api_version, req = parse_review(body)
        except BadReview as exc:
            log.warning("bad admission review from %s: %s", request.remote, exc)
            return web.Response(status=400, text=f"bad AdmissionReview: {exc}")
        return web.json_response(await self.areview(api_version, req))
