"""Mutating admission for the local API server: calls webhooks the way kube-apiserver does.

On pod CREATE, every webhook of every ``MutatingWebhookConfiguration`` in the store (configs in
name order, webhooks in list order) whose ``rules`` match CREATE of core/v1 pods and whose
``namespaceSelector`` (against the namespace's labels) and ``objectSelector`` (against the pod's
labels) match is sent a real ``AdmissionReview`` v1 over HTTP(S) (``clientConfig.url``; the PEM
in ``caBundle`` is the only trusted CA when given). The reply is verified as upstream does
(PROTOCOL.md E.2): review apiVersion/kind, ``response.uid`` echo, ``patch`` and ``patchType``
together and ``JSONPatch`` only. A denial becomes a client error: code < 400 raised to 400 and
the message ``admission webhook "<name>" denied the request: <message>``. A call failure
(transport error, timeout, non-2xx, bad body, failed verification) with ``failurePolicy: Fail``
(the default) is a 500 ``failed calling webhook "<name>": ...``; with ``Ignore`` it is logged and
the webhook skipped. A patch that does not apply is a 500 whatever the policy.

Not implemented: ``clientConfig.service`` (use ``url``), ``reinvocationPolicy: IfNeeded`` (each
webhook is called once), ``matchPolicy`` equivalence, UPDATE/DELETE/CONNECT admission, validating
webhooks, ``auditAnnotations`` (ignored) and ``warnings`` (logged).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import ssl
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp

from vgpu.core import errors
from vgpu.kube.port import JsonObj
from vgpu.localcluster import kinds, patch, selectors
from vgpu.localcluster.store import Store

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_USER: JsonObj = {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}


class CallFailure(Exception):
    """A webhook call that failed (failurePolicy decides what it means)."""


def _rule_matches(rule: Any) -> bool:
    if not isinstance(rule, Mapping):
        return False

    def has(field: str, *wanted: str) -> bool:
        values = rule.get(field) or []
        return isinstance(values, list) and any(v in wanted for v in values)

    scope = rule.get("scope", "*")
    return (
        has("operations", "CREATE", "*")
        and has("apiGroups", "", "*")
        and has("apiVersions", "v1", "*")
        and has("resources", "pods", "*", "*/*")
        and scope in ("*", "Namespaced", None)
    )


class Admission:
    """The mutating admission chain for pod creates, reading webhook configs from ``store``."""

    def __init__(self, store: Store, *, user_info: JsonObj | None = None) -> None:
        self._store = store
        self._user_info = user_info or DEFAULT_USER
        self._session: aiohttp.ClientSession | None = None
        self._ssl: dict[str, ssl.SSLContext] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _matching_webhooks(self, pod: JsonObj, namespace: str) -> list[JsonObj]:
        configs = self._store.list("mutatingwebhookconfigurations").items
        try:
            ns_labels = self._store.get("namespaces", namespace)["metadata"].get("labels") or {}
        except errors.NotFound:
            ns_labels = {"kubernetes.io/metadata.name": namespace}
        pod_labels = (pod.get("metadata") or {}).get("labels") or {}
        hooks: list[JsonObj] = []
        for config in sorted(configs, key=lambda c: c["metadata"]["name"]):
            for hook in config.get("webhooks") or []:
                if not isinstance(hook, dict) or not any(_rule_matches(r) for r in hook.get("rules") or []):
                    continue
                name = hook.get("name", "?")
                if not selectors.match_label_selector(hook.get("namespaceSelector"), ns_labels):
                    continue
                if not selectors.compile_label_selector(
                    hook.get("objectSelector"), where=f"{name}.objectSelector"
                )(pod_labels):
                    continue
                hooks.append(hook)
        return hooks

    async def admit_pod_create(self, pod: JsonObj, *, namespace: str) -> JsonObj:
        """Run the mutating webhooks on a pod being created; returns the (maybe patched) pod."""
        obj = dict(pod)
        meta = dict(obj.get("metadata") or {}) if isinstance(obj.get("metadata"), dict) else {}
        meta["namespace"] = namespace
        obj["metadata"] = meta
        obj.setdefault("apiVersion", "v1")
        obj.setdefault("kind", "Pod")
        if isinstance(obj.get("spec"), dict):
            obj["spec"] = dict(obj["spec"])
            kinds.default_pod_spec(obj["spec"])
        for hook in self._matching_webhooks(obj, namespace):
            name = str(hook.get("name", ""))
            policy = hook.get("failurePolicy", "Fail")
            try:
                response = await self._call(hook, obj, namespace)
            except CallFailure as exc:
                if policy == "Ignore":
                    log.warning(
                        "admission: webhook %s failed for pod %s/%s, ignored: %s",
                        name,
                        namespace,
                        meta.get("name", ""),
                        exc,
                    )
                    continue
                raise errors.KubeError(
                    f'Internal error occurred: failed calling webhook "{name}": {exc}',
                    status=500,
                    reason="InternalError",
                ) from None
            if not response.get("allowed"):
                raise _denied(name, response.get("status"))
            for warning in response.get("warnings") or []:
                log.info(
                    "admission: webhook %s warns about pod %s/%s: %s",
                    name,
                    namespace,
                    meta.get("name", ""),
                    warning,
                )
            if "patch" in response:
                obj = _apply_patch(name, obj, response["patch"])
        return obj

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

    async def _call(self, hook: JsonObj, obj: JsonObj, namespace: str) -> JsonObj:
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
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "name": obj["metadata"].get("name", ""),
                "namespace": namespace,
                "operation": "CREATE",
                "userInfo": self._user_info,
                "object": obj,
                "oldObject": None,
                "dryRun": False,
                "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
            },
        }
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
        return _verify(body, uid)


def _verify(body: Any, uid: str) -> JsonObj:
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
