"""The three PATCH kinds the API server accepts, on plain JSON values.

- ``merge_patch``: JSON merge patch (RFC 7386): objects merge recursively, ``null`` deletes a key,
  anything else (lists included) replaces.
- ``strategic_merge_patch``: Kubernetes strategic merge, limited to what our objects need: it is a
  merge patch, except that lists of objects with a known merge key (``containers`` by ``name``,
  ``conditions`` by ``type``, ``env``/``volumes`` by ``name``, ``ownerReferences`` by ``uid``, ...)
  merge element-wise, ``{"$patch": "delete"}`` removes a keyed element, ``{"$patch": "replace"}``
  replaces a map, ``$deleteFromPrimitiveList/<field>`` removes scalars, and ``$setElementOrder/...``
  and ``$retainKeys`` are accepted and ignored. ``finalizers`` merge as a set.
- ``json_patch``: RFC 6902 (add, remove, replace, move, copy, test) with RFC 6901 pointers
  (``~1`` is ``/``, ``~0`` is ``~``; ``-`` appends).

Inputs are never modified; results are new values. A patch that cannot apply raises ``KubeError``
with status 422 (as the API server answers), a patch document of the wrong shape status 400.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from vgpu.localcluster.validation import bad_request, invalid

# field name -> merge key, for lists merged element-wise under strategic merge
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "conditions": "type",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "addresses": "type",
    "hostAliases": "ip",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
SET_LISTS = frozenset({"finalizers"})
_T = TypeVar("_T")


def clone(value: _T) -> _T:
    """A deep copy of a JSON value (much faster than ``copy.deepcopy``)."""
    return cast(_T, _clone(value))


def _clone(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch; returns a new value (``target`` is left as it was)."""
    if not isinstance(patch, dict):
        return clone(patch)
    return _merge_into(clone(target) if isinstance(target, dict) else {}, patch)


def _merge_into(result: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``patch`` merged into ``result``, a copy of the caller's own (one copy of the target in
    all, not one more per level of the patch)."""
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            inner = result.get(key)
            result[key] = _merge_into(inner if isinstance(inner, dict) else {}, value)
        else:
            result[key] = clone(value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a (limited) strategic merge patch; see the module docstring for what is supported."""
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch: the patch must be a JSON object")
    return _smp_map(target if isinstance(target, dict) else {}, patch)


def _smp_map(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: clone(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    if directive is not None:
        raise invalid(f"strategic merge patch: unknown $patch directive {directive!r}")
    result = clone(target)
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key == "$retainKeys":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.partition("/")[2]
            if not isinstance(value, list):
                raise bad_request(f"strategic merge patch: {key} must be a list")
            current = result.get(field)
            if isinstance(current, list):
                result[field] = [v for v in current if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            result[key] = _smp_map(current if isinstance(current, dict) else {}, value)
        elif isinstance(value, list) and key in MERGE_KEYS:
            current = result.get(key)
            result[key] = _smp_keyed_list(
                current if isinstance(current, list) else [], value, MERGE_KEYS[key]
            )
        elif isinstance(value, list) and key in SET_LISTS:
            current = result.get(key)
            merged = list(current) if isinstance(current, list) else []
            merged.extend(v for v in value if v not in merged)
            result[key] = merged
        else:
            result[key] = clone(value)
    return result


def _smp_keyed_list(target: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    result = clone(target)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            # not a keyed element: upstream would fail; we replace the whole list like merge patch
            return [clone(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
        index = next(
            (
                i
                for i, cur in enumerate(result)
                if isinstance(cur, dict) and cur.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
            continue
        if index is None:
            result.append({k: clone(v) for k, v in item.items() if v is not None and k != "$patch"})
        else:
            result[index] = _smp_map(result[index], item)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str):
        raise bad_request(f"json patch: path must be a string, got {path!r}")
    if path == "":
        return []
    if not path.startswith("/"):
        raise invalid(f"json patch: path {path!r} must start with '/'")
    return [_unescape(t) for t in path[1:].split("/")]


def _index(container: list[Any], token: str, *, allow_end: bool, path: str) -> int:
    if allow_end and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise invalid(f"json patch: invalid array index {token!r} in {path!r}")
    index = int(token)
    limit = len(container) if allow_end else len(container) - 1
    if index > limit:
        raise invalid(f"json patch: array index {index} out of range in {path!r}")
    return index


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    cur = doc
    for token in tokens[:-1]:
        if isinstance(cur, dict):
            if token not in cur:
                raise invalid(f"json patch: path {path!r} does not exist (missing {token!r})")
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_index(cur, token, allow_end=False, path=path)]
        else:
            raise invalid(f"json patch: path {path!r} goes through a scalar")
    return cur


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise invalid(f"json patch: path {path!r} does not exist")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, allow_end=False, path=path)]
    raise invalid(f"json patch: path {path!r} goes through a scalar")


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True, path=path), value)
    else:
        raise invalid(f"json patch: cannot add at {path!r}: parent is a scalar")
    return doc


def _remove(doc: Any, path: str) -> tuple[Any, Any]:
    tokens = _pointer(path)
    if not tokens:
        raise invalid("json patch: cannot remove the whole document")
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise invalid(f"json patch: cannot remove {path!r}: it does not exist")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, allow_end=False, path=path))
    raise invalid(f"json patch: cannot remove {path!r}: parent is a scalar")


def json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 JSON patch (a list of operations); returns a new value."""
    if not isinstance(operations, list):
        raise bad_request("json patch: the patch must be a JSON array of operations")
    doc = clone(target)
    for i, op in enumerate(operations):
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise bad_request(f"json patch: operation {i} must be an object with an 'op' string")
        name = op["op"]
        path = op.get("path")
        if not isinstance(path, str):
            raise bad_request(f"json patch: operation {i} needs a 'path' string")
        if name in ("add", "replace", "test") and "value" not in op:
            raise bad_request(f"json patch: operation {i} ({name}) needs a 'value'")
        if name == "add":
            doc = _add(doc, path, clone(op["value"]))
        elif name == "remove":
            doc, _ = _remove(doc, path)
        elif name == "replace":
            _get(doc, path)  # must exist
            doc, _ = _remove(doc, path) if _pointer(path) else (doc, None)
            doc = _add(doc, path, clone(op["value"]))
        elif name in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise bad_request(f"json patch: operation {i} ({name}) needs a 'from' string")
            if name == "move" and (path == source or path.startswith(source + "/")):
                if path == source:
                    continue
                raise invalid(f"json patch: cannot move {source!r} into its own child {path!r}")
            value = clone(_get(doc, source))
            if name == "move":
                doc, _ = _remove(doc, source)
            doc = _add(doc, path, value)
        elif name == "test":
            if _get(doc, path) != op["value"]:
                raise invalid(f"json patch: test operation failed at {path!r}")
        else:
            raise bad_request(f"json patch: unknown operation {name!r}")
    return doc
