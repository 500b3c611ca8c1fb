"""What each verb on a resource does over HTTP: the API server's request handling below routing.

get and list (``?watch=true`` hands over to ``apiwatch``), create (``POST``; pods through
admission), update (``PUT``, whose body must name the URL's object), patch (merge, strategic merge
or JSON patch, by Content-Type), delete (``DeleteOptions``: uid/resourceVersion preconditions and
``gracePeriodSeconds``), the ``status`` subresource and the pod ``binding`` (also the legacy
``namespaces/{ns}/bindings``), which copies the Binding's ``metadata.annotations`` onto the pod
(``Store.bind``), and the pod ``eviction`` (``eviction.py``: a delete that PodDisruptionBudgets
may refuse with 429). Updates of kinds that admission covers (pods and nodes) go through
``admission.Admission`` with the caller's userInfo (``apiauth.USER``). A list answers
``<Kind>List`` with items stripped of kind and apiVersion, as upstream; asked for a ``meta.k8s.io``
Table (``kubectl get``'s Accept), a get or a list answers one (``tables``).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from vgpu.core import errors
from vgpu.kube.port import JsonObj
from vgpu.localcluster import eviction, tables, validation
from vgpu.localcluster.admission import Admission
from vgpu.localcluster.apiauth import USER
from vgpu.localcluster.apipaths import Target, query_flag, status_body
from vgpu.localcluster.apiwatch import TableOf, WatchStreams
from vgpu.localcluster.store import Store

PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
}


class ResourceVerbs:
    """The verbs on ``/api/v1/...`` and ``/apis/{group}/{version}/...`` resources, on one store."""

    def __init__(self, store: Store, *, admission: Admission, watches: WatchStreams) -> None:
        self._store = store
        self._admission = admission
        self._watches = watches

    async def dispatch(self, request: web.Request, t: Target) -> web.StreamResponse:
        """Answer one request on a resource; a refused one raises the ``KubeError`` to send."""
        s = self._store
        kind = t.info.plural
        method = request.method
        if t.subresource not in (None, "status", "binding", "bindings", "eviction") or (
            t.subresource in ("binding", "bindings", "eviction") and (method != "POST" or kind != "pods")
        ):
            raise errors.NotFound(
                f"the server could not find the requested resource ({kind}/{t.subresource})", status=404
            )
        if t.subresource == "status" and not t.info.has_status:
            raise errors.NotFound(f"{kind} has no status subresource", status=404)
        if method == "GET" and t.name is None:
            q = request.query
            if query_flag(q.get("watch")):
                version = tables.table_version(request.headers.get("Accept", ""))
                as_table = None if version is None else self._table_of(request, t, version)
                return await self._watches.serve(request, t, as_table=as_table)
            listed = s.list(
                kind,
                namespace=t.namespace,
                label_selector=q.get("labelSelector"),
                field_selector=q.get("fieldSelector"),
            )
            for item in listed.items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
            if (version := tables.table_version(request.headers.get("Accept", ""))) is not None:
                return self._table(request, t, listed.items, listed.resource_version, version)
            return web.json_response(
                {
                    "kind": f"{t.info.kind}List",
                    "apiVersion": t.info.api_version,
                    "metadata": {"resourceVersion": listed.resource_version},
                    "items": listed.items,
                }
            )
        if method == "GET" and t.name is not None:
            obj = s.get(kind, t.name, namespace=t.namespace)
            if (version := tables.table_version(request.headers.get("Accept", ""))) is not None:
                rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                return self._table(request, t, [obj], rv, version)
            return web.json_response(obj)
        if method == "POST" and t.subresource in ("binding", "bindings"):
            return await self._bind(request, t)
        if method == "POST" and t.subresource == "eviction":
            return await self._evict(request, t)
        if method == "POST" and t.name is None:
            body = await _json_body(request)
            if not isinstance(body, dict):
                raise validation.bad_request(f"{t.info.kind} body must be a JSON object")
            if kind == "pods":
                assert t.namespace is not None
                body = await self._admission.admit_pod_create(
                    body, namespace=t.namespace, user_info=request[USER]
                )
            return web.json_response(s.create(kind, body, namespace=t.namespace), status=201)
        if t.name is None:
            return web.json_response(
                status_body(405, f"{method} is not supported on a collection"), status=405
            )
        if method == "PUT":
            body = await _json_body(request)
            if not isinstance(body, dict):
                raise validation.bad_request(f"{t.info.kind} body must be a JSON object")
            name = (
                (body.get("metadata") or {}).get("name") if isinstance(body.get("metadata"), dict) else None
            )
            if name not in (None, t.name):
                raise validation.bad_request(
                    f"the name of the object ({name}) does not match the name on the URL ({t.name})"
                )
            if isinstance(body.get("metadata"), dict):
                body["metadata"]["name"] = t.name
            if t.subresource is None and self._admission.admits(kind):
                put: JsonObj = body
                return web.json_response(
                    await self._admission.update(
                        kind, t.name, lambda _: put, namespace=t.namespace, user_info=request[USER]
                    )
                )
            return web.json_response(s.update(kind, body, namespace=t.namespace, subresource=t.subresource))
        if method == "PATCH":
            content_type = request.content_type
            patch_type = PATCH_TYPES.get(content_type)
            if patch_type is None:
                raise errors.KubeError(
                    f"the body of the request was in an unknown format - accepted media types include: {', '.join(PATCH_TYPES)}",
                    status=415,
                    reason="UnsupportedMediaType",
                )
            body = await _json_body(request)
            if t.subresource is None and self._admission.admits(kind):
                name = t.name
                return web.json_response(
                    await self._admission.update(
                        kind,
                        name,
                        lambda _: s.patched(kind, name, body, patch_type=patch_type, namespace=t.namespace),
                        namespace=t.namespace,
                        user_info=request[USER],
                    )
                )
            return web.json_response(
                s.patch(
                    kind,
                    t.name,
                    body,
                    patch_type=patch_type,
                    namespace=t.namespace,
                    subresource=t.subresource,
                )
            )
        if method == "DELETE":
            grace: int | None = None
            if request.can_read_body:
                options = await _json_body(request)
                self._check_preconditions(t, options)
                grace = options.get("gracePeriodSeconds")
                if grace is not None and (not isinstance(grace, int) or isinstance(grace, bool) or grace < 0):
                    raise validation.bad_request(
                        "DeleteOptions.gracePeriodSeconds must be a non-negative integer"
                    )
            return web.json_response(s.delete(kind, t.name, namespace=t.namespace, grace_period_s=grace))
        return web.json_response(status_body(405, f"{method} is not supported"), status=405)

    def _check_preconditions(self, t: Target, options: Any) -> None:
        if not isinstance(options, Mapping):
            raise validation.bad_request("DeleteOptions must be a JSON object")
        pre = options.get("preconditions") or {}
        if not isinstance(pre, Mapping):
            raise validation.bad_request("DeleteOptions.preconditions must be an object")
        assert t.name is not None
        meta = self._store.get(t.info.plural, t.name, namespace=t.namespace)["metadata"]
        for field, key in (("uid", "uid"), ("resourceVersion", "resourceVersion")):
            want = pre.get(field)
            if want is not None and want != meta[key]:
                raise errors.Conflict(
                    f"Precondition failed: {field.capitalize() if field == 'uid' else 'ResourceVersion'} in "
                    f"precondition: {want}, {field} in object meta: {meta[key]}",
                    status=409,
                    reason="Conflict",
                )

    def _table(
        self, request: web.Request, t: Target, objects: list[JsonObj], resource_version: str, version: str
    ) -> web.Response:
        """``kubectl get``'s view: the objects as a ``meta.k8s.io`` Table (``tables``)."""
        return web.json_response(self._table_of(request, t, version)(objects, resource_version, True))

    def _table_of(self, request: web.Request, t: Target, version: str) -> TableOf:
        """A function making the Table of some objects (with or without column definitions), for a
        request's ``includeObject``; a bad one is a 400 now."""
        include = request.query.get("includeObject", "Metadata")
        if include not in tables.INCLUDE_OBJECT:
            raise validation.bad_request(
                f"includeObject: Unsupported value: {include!r}: supported values: "
                + ", ".join(f'"{v}"' for v in tables.INCLUDE_OBJECT)
            )

        def table_of(objects: list[JsonObj], resource_version: str, headers: bool) -> JsonObj:
            made = tables.table(
                t.info.plural,
                [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in objects],
                kind=t.info.kind,
                api_version=t.info.api_version,
                resource_version=resource_version,
                now=self._store.now(),
                version=version,
                include_object=include,
            )
            if not headers:
                made["columnDefinitions"] = []
            return made

        return table_of

    async def _bind(self, request: web.Request, t: Target) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict):
            raise validation.invalid("Binding.target: Required value")
        raw_meta = body.get("metadata")
        meta: JsonObj = raw_meta if isinstance(raw_meta, dict) else {}
        name = t.name or meta.get("name")
        if t.name and meta.get("name") not in (None, "", t.name):
            raise validation.bad_request("name in URL does not match name in Binding object")
        if not isinstance(name, str) or not name:
            raise validation.invalid("Binding.metadata.name: Required value")
        node = body["target"].get("name")
        if not isinstance(node, str):
            raise validation.invalid("Binding.target.name: Required value")
        assert t.namespace is not None
        notes = meta.get("annotations")
        if notes is not None and not isinstance(notes, dict):
            raise validation.bad_request("Binding.metadata.annotations: must be an object")
        self._store.bind(
            t.namespace,
            name,
            node=node,
            uid=meta.get("uid") or None,
            resource_version=meta.get("resourceVersion") or None,
            annotations=notes,
        )
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
            status=201,
        )

    async def _evict(self, request: web.Request, t: Target) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise validation.bad_request("Eviction body must be a JSON object")
        raw_meta = body.get("metadata")
        meta: JsonObj = raw_meta if isinstance(raw_meta, dict) else {}
        if meta.get("name") not in (None, "", t.name):
            raise validation.bad_request("name in URL does not match name in Eviction object")
        options = body.get("deleteOptions") or {}
        if not isinstance(options, dict):
            raise validation.bad_request("Eviction.deleteOptions must be an object")
        assert t.namespace is not None and t.name is not None
        eviction.evict(
            self._store, t.namespace, t.name, options=options, now=datetime.datetime.now(datetime.UTC)
        )
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
            status=201,
        )


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise validation.bad_request(f"the request body is not valid JSON: {exc}") from None
