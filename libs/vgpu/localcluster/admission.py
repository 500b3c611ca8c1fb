"""Admission for the local API server: calls webhooks the way kube-apiserver does.

On a pod CREATE and on an UPDATE of a pod or a node (PUT or PATCH of the object itself, not of a
subresource: rules on ``pods`` never match ``pods/status`` or ``pods/binding``), every webhook of
every ``MutatingWebhookConfiguration`` (configs in name order, webhooks in list order), then of
every ``ValidatingWebhookConfiguration``, whose ``rules`` match the operation and the core/v1
resource, whose ``namespaceSelector`` matches the namespace's labels (pods only: cluster-scoped
objects are never skipped by it) and whose ``objectSelector`` matches the object's labels (the old
or the new object's, on UPDATE) is sent a real ``AdmissionReview`` v1 over HTTP(S)
(``clientConfig.url``; the PEM in ``caBundle`` is the only trusted CA when given), with
``userInfo`` the caller's identity (the API server's authenticated user; ``DEFAULT_USER`` when the
caller names none) and, on UPDATE, ``oldObject``. The reply is verified as upstream does
(docs/protocol.md#admissionreview): review apiVersion/kind, ``response.uid`` echo, ``patch`` and ``patchType``
together and ``JSONPatch`` only, and none from a validating webhook. A denial becomes a
client error: code < 400 raised to 400 and the message ``admission webhook "<name>" denied the
request: <message>``. A call failure (transport error, timeout, non-2xx, bad body, failed
verification) with ``failurePolicy: Fail`` (the default) is a 500 ``failed calling webhook
"<name>": ...``; with ``Ignore`` it is logged and the webhook skipped. A patch that does not apply
is a 500 whatever the policy.

``update`` is the UPDATE path both doors use: read the stored object, compute the new one (the
caller's PUT body or patch), admit it, store it with the read resourceVersion as precondition, and
start again (a few times) when another write came in between, as kube-apiserver's
GuaranteedUpdate does. Kinds no webhook configuration can match skip all of this.

Not implemented: ``clientConfig.service`` (use ``url``), ``reinvocationPolicy: IfNeeded`` (each
webhook is called once), ``matchPolicy`` equivalence, ``matchConditions`` (CEL; our webhook
applies the same rule itself), DELETE/CONNECT admission, ValidatingAdmissionPolicy,
``auditAnnotations`` (ignored) and ``warnings`` (logged).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import logging
import ssl
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import aiohttp

from vgpu.core import errors
from vgpu.kube.port import JsonObj
from vgpu.localcluster import kinds, patch, selectors
from vgpu.localcluster.store import Store

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_USER: JsonObj = {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}
UPDATE_ATTEMPTS = 5
ADMITTED = {"pods": ("Pod", "Namespaced"), "nodes": ("Node", "Cluster")}
CONFIG_KINDS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
Operation = Literal["CREATE", "UPDATE"]


class CallFailure(Exception):
    """A webhook call that failed (failurePolicy decides what it means)."""


def _rule_matches(rule: Any, operation: Operation, resource: str) -> bool:
    if not isinstance(rule, Mapping):
        return False

    def has(field: str, *wanted: str) -> bool:
        values = rule.get(field) or []
        return isinstance(values, list) and any(v in wanted for v in values)

    scope = rule.get("scope", "*")
    return (
        has("operations", operation, "*")
        and has("apiGroups", "", "*")
        and has("apiVersions", "v1", "*")
        and has("resources", resource, "*", "*/*")
        and scope in ("*", ADMITTED[resource][1], None)
    )


def _labels(obj: JsonObj | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else {}


@dataclass(frozen=True)
class Attempt:
    """One write being admitted: what kube-apiserver puts in the AdmissionReview request."""

    operation: Operation
    resource: str
    obj: JsonObj
    old: JsonObj | None
    namespace: str | None
    user_info: JsonObj

    def what(self) -> str:
        return f"{self.resource} {self.namespace + '/' if self.namespace else ''}{self.obj['metadata'].get('name', '')}"


class Admission:
    """The admission chain, reading webhook configurations from ``store``."""

    def __init__(self, store: Store, *, user_info: JsonObj | None = None) -> None:
        self._store = store
        self._user_info = user_info or DEFAULT_USER
        self._session: aiohttp.ClientSession | None = None
        self._ssl: dict[str, ssl.SSLContext] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def admits(self, kind: str) -> bool:
        """Whether an UPDATE of ``kind`` may need admission (a webhook configuration exists)."""
        return kind in ADMITTED and any(self._store.list(c).items for c in CONFIG_KINDS)

    def _matching_webhooks(self, config_kind: str, a: Attempt) -> list[JsonObj]:
        operation, resource, obj, old, namespace = a.operation, a.resource, a.obj, a.old, a.namespace
        configs = self._store.list(config_kind).items
        ns_labels: Mapping[str, Any] = {}
        if namespace is not None:
            try:
                ns_labels = self._store.get("namespaces", namespace)["metadata"].get("labels") or {}
            except errors.NotFound:
                ns_labels = {"kubernetes.io/metadata.name": namespace}
        hooks: list[JsonObj] = []
        for config in sorted(configs, key=lambda c: c["metadata"]["name"]):
            for hook in config.get("webhooks") or []:
                if not isinstance(hook, dict) or not any(
                    _rule_matches(r, operation, resource) for r in hook.get("rules") or []
                ):
                    continue
                name = hook.get("name", "?")
                if namespace is not None and not selectors.match_label_selector(
                    hook.get("namespaceSelector"), ns_labels
                ):
                    continue
                matches = selectors.compile_label_selector(
                    hook.get("objectSelector"), where=f"{name}.objectSelector"
                )
                if not (matches(_labels(obj)) or (old is not None and matches(_labels(old)))):
                    continue
                hooks.append(hook)
        return hooks

    async def admit_pod_create(
        self, pod: JsonObj, *, namespace: str, user_info: JsonObj | None = None
    ) -> JsonObj:
        """Run the webhooks on a pod being created; returns the (maybe patched) pod."""
        obj = dict(pod)
        meta = dict(obj.get("metadata") or {}) if isinstance(obj.get("metadata"), dict) else {}
        meta["namespace"] = namespace
        obj["metadata"] = meta
        obj.setdefault("apiVersion", "v1")
        obj.setdefault("kind", "Pod")
        if isinstance(obj.get("spec"), dict):
            obj["spec"] = copy.deepcopy(obj["spec"])  # defaulting writes into the containers
            kinds.default_pod_spec(obj["spec"])
        return await self._admit(
            Attempt("CREATE", "pods", obj, None, namespace, user_info or self._user_info)
        )

    async def update(
        self,
        kind: str,
        name: str,
        change: Callable[[JsonObj], JsonObj],
        *,
        namespace: str | None = None,
        user_info: JsonObj | None = None,
    ) -> JsonObj:
        """UPDATE through admission: ``change(stored)`` gives the new object (the PUT body, or the
        stored object patched); it is admitted and stored if the object did not move meanwhile,
        otherwise the whole is done again (``UPDATE_ATTEMPTS`` times at most)."""
        for attempt in range(UPDATE_ATTEMPTS):
            current = self._store.get(kind, name, namespace=namespace)
            new = copy.deepcopy(change(current))
            meta = new.setdefault("metadata", {})
            if meta.get("resourceVersion") not in (None, "", current["metadata"]["resourceVersion"]):
                return self._store.update(kind, new, namespace=namespace)  # a stale precondition: 409
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            new.setdefault("apiVersion", "v1")
            new.setdefault("kind", ADMITTED[kind][0])
            if namespace is not None:
                meta.setdefault("namespace", namespace)
            admitted = await self._admit(
                Attempt("UPDATE", kind, new, current, namespace, user_info or self._user_info)
            )
            try:
                return self._store.update(kind, admitted, namespace=namespace)
            except errors.Conflict:
                if attempt == UPDATE_ATTEMPTS - 1:
                    raise
                log.debug("admission: %s %s changed while being admitted; again", kind, name)
        raise AssertionError("unreachable")

    async def _admit(self, a: Attempt) -> JsonObj:
        what = a.what()
        for config_kind in CONFIG_KINDS:
            mutating = config_kind == CONFIG_KINDS[0]
            for hook in self._matching_webhooks(config_kind, a):
                name = str(hook.get("name", ""))
                policy = hook.get("failurePolicy", "Fail")
                try:
                    response = await self._call(hook, a, mutating=mutating)
                except CallFailure as exc:
                    if policy == "Ignore":
                        log.warning("admission: webhook %s failed for %s, ignored: %s", name, what, exc)
                        continue
                    raise errors.KubeError(
                        f'Internal error occurred: failed calling webhook "{name}": {exc}',
                        status=500,
                        reason="InternalError",
                    ) from None
                if not response.get("allowed"):
                    raise _denied(name, response.get("status"))
                for warning in response.get("warnings") or []:
                    log.info("admission: webhook %s warns about %s: %s", name, what, warning)
                if "patch" in response:
                    a = replace(a, obj=_apply_patch(name, a.obj, response["patch"]))
        return a.obj

    def _ssl_for(self, hook: JsonObj) -> ssl.SSLContext | None:
        bundle = (hook.get("clientConfig") or {}).get("caBundle")
        if not bundle:
            return None
        ctx = self._ssl.get(bundle)
        if ctx is None:
            try:
                pem = base64.b64decode(bundle, validate=True).decode()
                ctx = ssl.create_default_context(cadata=pem)
            except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
                raise CallFailure(f"invalid caBundle: {exc}") from None
            self._ssl[bundle] = ctx
        return ctx

    async def _call(self, hook: JsonObj, a: Attempt, *, mutating: bool) -> JsonObj:
        config = hook.get("clientConfig") or {}
        url = config.get("url") if isinstance(config, dict) else None
        if not isinstance(url, str) or not url:
            raise CallFailure(
                "clientConfig.url is required by the local API server (service references are not supported)"
            )
        versions = hook.get("admissionReviewVersions") or []
        if "v1" not in versions:
            raise CallFailure(f"none of the admissionReviewVersions {versions} is supported (want v1)")
        try:
            timeout_s = float(hook.get("timeoutSeconds", DEFAULT_TIMEOUT_S))
        except (TypeError, ValueError):
            timeout_s = DEFAULT_TIMEOUT_S
        uid = str(uuid.uuid4())
        kind = {"group": "", "version": "v1", "kind": ADMITTED[a.resource][0]}
        gvr = {"group": "", "version": "v1", "resource": a.resource}
        options = "CreateOptions" if a.operation == "CREATE" else "UpdateOptions"
        request: JsonObj = {
            "uid": uid,
            "kind": kind,
            "resource": gvr,
            "requestKind": kind,
            "requestResource": gvr,
            "name": a.obj["metadata"].get("name", ""),
            "operation": a.operation,
            "userInfo": a.user_info,
            "object": a.obj,
            "oldObject": a.old,
            "dryRun": False,
            "options": {"kind": options, "apiVersion": "meta.k8s.io/v1"},
        }
        if a.namespace is not None:
            request["namespace"] = a.namespace
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        if self._session is None:
            self._session = aiohttp.ClientSession()
        ssl_ctx = self._ssl_for(hook)
        try:
            async with self._session.post(
                url,
                json=review,
                ssl=ssl_ctx if ssl_ctx is not None else True,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                raw = await resp.read()
                if not 200 <= resp.status < 300:
                    raise CallFailure(f"the server responded with HTTP {resp.status}: {raw[:200]!r}")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise CallFailure(f'failed to call webhook: Post "{url}": {type(exc).__name__}: {exc}') from None
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CallFailure(f"received invalid webhook response: {exc}") from None
        return _verify(body, uid, mutating=mutating)


def _verify(body: Any, uid: str, *, mutating: bool = True) -> JsonObj:
    if not isinstance(body, dict):
        raise CallFailure("received invalid webhook response: not a JSON object")
    if body.get("apiVersion") != "admission.k8s.io/v1" or body.get("kind") != "AdmissionReview":
        raise CallFailure(
            f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got "
            f"{body.get('apiVersion')}, Kind={body.get('kind')}"
        )
    response = body.get("response")
    if not isinstance(response, dict):
        raise CallFailure("webhook response was absent")
    if response.get("uid") != uid:
        raise CallFailure(f"expected response.uid={uid!r}, got {response.get('uid')!r}")
    if not isinstance(response.get("allowed", False), bool):
        raise CallFailure("response.allowed must be a boolean")
    has_patch = response.get("patch") not in (None, "")
    patch_type = response.get("patchType")
    if not mutating and (has_patch or patch_type not in (None, "")):
        raise CallFailure("validating webhook may not return response.patch or response.patchType")
    if has_patch != (patch_type not in (None, "")):
        raise CallFailure("webhook returned a patch without a patchType, or a patchType without a patch")
    if patch_type not in (None, "", "JSONPatch"):
        raise CallFailure(f"webhook returned an unsupported patch type {patch_type!r}")
    if has_patch:
        if not isinstance(response["patch"], str):
            raise CallFailure("response.patch must be a base64 string")
        try:
            response["patch"] = json.loads(base64.b64decode(response["patch"], validate=True))
        except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CallFailure(f"received invalid webhook response: patch: {exc}") from None
    else:
        response.pop("patch", None)
    return response


def _denied(name: str, status: Any) -> errors.KubeError:
    status = status if isinstance(status, dict) else {}
    code = status.get("code")
    code = code if isinstance(code, int) and code >= 400 else 400
    message = status.get("message") or status.get("reason") or "without explanation"
    reason = status.get("reason") or ("Forbidden" if code == 403 else "BadRequest")
    return errors.KubeError(
        f'admission webhook "{name}" denied the request: {message}', status=code, reason=str(reason)
    )


def _apply_patch(name: str, obj: JsonObj, operations: Any) -> JsonObj:
    try:
        result = patch.json_patch(obj, operations)
    except errors.KubeError as exc:
        raise errors.KubeError(
            f'Internal error occurred: webhook "{name}" returned a patch that does not apply: {exc}',
            status=500,
            reason="InternalError",
        ) from None
    if not isinstance(result, dict):
        raise errors.KubeError(
            f'Internal error occurred: webhook "{name}" patched the pod into a non-object',
            status=500,
            reason="InternalError",
        )
    return result
