"""RFC 6902 JSON Patch: build minimal patches against a document, and apply patches (pure).

``Builder`` records the operations that turn a document into the wanted one while keeping its own
view of the patched document, so each later operation sees the earlier ones:

- ``set`` emits nothing when the value is already there, ``replace`` when a different value is,
  and ``add`` otherwise; when the parent object is missing it adds the whole nested object at the
  first missing ancestor (``add /metadata/annotations {"k": "v"}``, never an ``add`` under a parent
  the API server does not have, docs/protocol.md#admissionreview);
- ``merge`` sets several keys of one object and adds the whole object in one operation when absent;
- ``append`` adds to the end of a list by explicit index (or the whole list when absent);
- ``remove`` removes a member that exists.

Tokens are plain strings and ints; ``pointer`` escapes them (``~`` → ``~0``, ``/`` → ``~1``). The
input document is never mutated: the builder copies each container on a changed path once (copy on
write) and changes its own copies in place after that, so building is linear in the number of
operations plus the size of the containers touched (a 40,000-container pod is not quadratic).
``apply`` is the inverse check (tests, and servers that receive a patch); it supports add, remove,
replace, move, copy and test and raises ``ParseError`` naming the operation that does not apply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict

from vgpu.core import errors

Token = str | int
OpName = Literal["add", "remove", "replace", "move", "copy", "test"]


class Operation(TypedDict):
    """One RFC 6902 operation as it goes on the wire."""

    op: OpName
    path: str
    value: NotRequired[Any]
    # "from" is a keyword, so move/copy ops are built as plain dicts and read with .get("from")


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def escape(token: Token) -> str:
    """One reference token: ``~`` becomes ``~0`` and ``/`` becomes ``~1`` (in that order)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def pointer(tokens: Sequence[Token]) -> str:
    """The JSON Pointer for ``tokens``: ``("metadata", "annotations", "a/b")`` → ``/metadata/annotations/a~1b``."""
    return "".join("/" + escape(t) for t in tokens)


def parse_pointer(path: str, *, field: str = "path") -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise errors.ParseError(field, f"JSON pointer {path!r} must start with '/'")
    return [unescape(t) for t in path[1:].split("/")]


def get(doc: Any, tokens: Sequence[Token]) -> Any:
    """The value at ``tokens`` or ``MISSING`` (a JSON null counts as present)."""
    node = doc
    for token in tokens:
        node = _child(node, token)
        if node is MISSING:
            return MISSING
    return node


def _child(node: Any, token: Token) -> Any:
    if isinstance(node, dict):
        return node.get(token if isinstance(token, str) else str(token), MISSING)
    if isinstance(node, list):
        index = _list_index(token, len(node), allow_end=False)
        return MISSING if index is None else node[index]
    return MISSING


def _list_index(token: Token, length: int, *, allow_end: bool) -> int | None:
    if isinstance(token, int):
        index = token
    elif token == "-":
        index = length
    elif token.isdigit() and (token == "0" or not token.startswith("0")):
        index = int(token)
    else:
        return None
    limit = length if allow_end else length - 1
    return index if 0 <= index <= limit else None


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: unlike Python's ``==``, ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and bool(a == b)


# --- applying one change without mutating the input -----------------------------------------------


def _updated(doc: Any, tokens: Sequence[Token], op: OpName, value: Any, field: str) -> Any:
    """A copy of ``doc`` with ``op`` (add, remove or replace) done at ``tokens``; copies the path only."""
    if not tokens:
        if op == "remove":
            raise errors.ParseError(field, "cannot remove the whole document")
        return value
    head, rest = tokens[0], tokens[1:]
    if isinstance(doc, dict):
        key = str(head)
        out = dict(doc)
        if rest:
            if key not in doc:
                raise errors.ParseError(
                    field, f"path {pointer(tokens)}: parent member {key!r} does not exist"
                )
            out[key] = _updated(doc[key], rest, op, value, field)
        elif op == "add":
            out[key] = value
        elif key not in doc:
            raise errors.ParseError(field, f"{op} {pointer(tokens)}: member {key!r} does not exist")
        elif op == "remove":
            del out[key]
        else:
            out[key] = value
        return out
    if isinstance(doc, list):
        adding = op == "add" and not rest
        index = _list_index(head, len(doc), allow_end=adding)
        if index is None:
            raise errors.ParseError(
                field, f"path {pointer(tokens)}: index {head!r} out of range for {len(doc)} items"
            )
        items = list(doc)
        if rest:
            items[index] = _updated(doc[index], rest, op, value, field)
        elif op == "add":
            items.insert(index, value)
        elif op == "remove":
            del items[index]
        else:
            items[index] = value
        return items
    raise errors.ParseError(field, f"path {pointer(tokens)}: cannot descend into a {type(doc).__name__}")


def apply(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """``doc`` with every operation applied in order (RFC 6902); the input is left untouched."""
    for i, raw in enumerate(ops):
        field = f"patch[{i}]"
        if not isinstance(raw, Mapping):
            raise errors.ParseError(field, "an operation must be an object")
        name, path = raw.get("op"), raw.get("path")
        if not isinstance(path, str):
            raise errors.ParseError(field, "missing string member 'path'")
        tokens = parse_pointer(path, field=f"{field}.path")
        if name in ("add", "replace", "test") and "value" not in raw:
            raise errors.ParseError(field, f"{name} needs a 'value'")
        if name in ("add", "replace", "remove"):
            doc = _updated(doc, tokens, name, raw.get("value"), field)
        elif name == "test":
            if not json_equal(get(doc, tokens), raw["value"]):
                raise errors.ParseError(field, f"test {path} failed")
        elif name in ("move", "copy"):
            source = raw.get("from")
            if not isinstance(source, str):
                raise errors.ParseError(field, f"{name} needs a string 'from'")
            from_tokens = parse_pointer(source, field=f"{field}.from")
            value = get(doc, from_tokens)
            if value is MISSING:
                raise errors.ParseError(field, f"{name} from {source}: nothing there")
            if name == "move":
                if tokens[: len(from_tokens)] == from_tokens and len(tokens) > len(from_tokens):
                    raise errors.ParseError(field, f"cannot move {source} into its own child {path}")
                doc = _updated(doc, from_tokens, "remove", None, field)
            doc = _updated(doc, tokens, "add", value, field)
        else:
            raise errors.ParseError(field, f"unknown op {name!r}")
    return doc


# --- building a minimal patch --------------------------------------------------------------------


class Builder:
    """Collects the operations that turn ``doc`` into the wanted document, smallest first."""

    def __init__(self, doc: Any) -> None:
        self._doc = doc
        self._ops: list[Operation] = []
        # the containers this builder copied and may change in place, by id; holding them keeps
        # their ids from being reused by an object the builder does not own
        self._owned: dict[int, Any] = {}

    @property
    def ops(self) -> list[Operation]:
        return list(self._ops)

    @property
    def doc(self) -> Any:
        """The document with every recorded operation applied (the input is not modified)."""
        return self._doc

    def get(self, tokens: Sequence[Token]) -> Any:
        return get(self._doc, tokens)

    def _own(self, node: Any) -> Any:
        """``node`` itself when the builder owns it, else a shallow copy it owns from now on."""
        if id(node) in self._owned:
            return node
        copy = dict(node) if isinstance(node, dict) else list(node)
        self._owned[id(copy)] = copy
        return copy

    def _writable_parent(self, tokens: Sequence[Token]) -> Any:
        """The container holding ``tokens[-1]``, owned (copied once) along the whole path."""
        pointer_text = pointer(tokens)
        if not isinstance(self._doc, dict | list):
            raise errors.ParseError("builder", f"path {pointer_text}: the document is not a container")
        self._doc = node = self._own(self._doc)
        for token in tokens[:-1]:
            child = _child(node, token)
            if not isinstance(child, dict | list):
                raise errors.ParseError(
                    "builder", f"path {pointer_text}: parent {token!r} is not a container"
                )
            owned = self._own(child)
            if owned is not child:
                if isinstance(node, dict):
                    node[str(token)] = owned
                else:
                    index = _list_index(token, len(node), allow_end=False)
                    assert index is not None  # _child found it
                    node[index] = owned
            node = owned
        return node

    def _change(self, op: OpName, tokens: Sequence[Token], value: Any) -> None:
        """Do ``op`` on the builder's own document, in place (what ``_updated`` does by copying)."""
        if not tokens:
            if op == "remove":
                raise errors.ParseError("builder", "cannot remove the whole document")
            self._doc = value
            return
        parent, last = self._writable_parent(tokens), tokens[-1]
        if isinstance(parent, dict):
            key = str(last)
            if op != "add" and key not in parent:
                raise errors.ParseError("builder", f"{op} {pointer(tokens)}: member {key!r} does not exist")
            if op == "remove":
                del parent[key]
            else:
                parent[key] = value
            return
        index = _list_index(last, len(parent), allow_end=op == "add")
        if index is None:
            raise errors.ParseError(
                "builder", f"path {pointer(tokens)}: index {last!r} out of range for {len(parent)} items"
            )
        if op == "add":
            parent.insert(index, value)
        elif op == "remove":
            del parent[index]
        else:
            parent[index] = value

    def _emit(self, op: OpName, tokens: Sequence[Token], value: Any = MISSING) -> None:
        operation: Operation = {"op": op, "path": pointer(tokens)}
        if value is not MISSING:
            operation["value"] = value
        self._change(op, tokens, None if value is MISSING else value)
        self._ops.append(operation)

    def _first_missing(self, tokens: Sequence[Token]) -> tuple[int, Any]:
        """(depth of the first absent or null ancestor of the last token, None), or (len-1, parent)
        when every ancestor exists."""
        node = self._doc
        for depth, token in enumerate(tokens[:-1]):
            node = _child(node, token)
            if node is MISSING or node is None:
                return depth, None
        return len(tokens) - 1, node

    def set(self, tokens: Sequence[Token], value: Any) -> None:
        """Make ``tokens`` hold ``value`` with the fewest operations (none if it already does)."""
        depth, parent = self._first_missing(tokens)
        if depth < len(tokens) - 1:
            nested = value
            for token in reversed(tokens[depth + 1 :]):
                if isinstance(token, int):
                    raise errors.ParseError(pointer(tokens), "cannot create a list element by index")
                nested = {token: nested}
            self._emit("add", tokens[: depth + 1], nested)
            return
        current = _child(parent, tokens[-1])
        if current is MISSING:
            self._emit("add", tokens, value)
        elif not json_equal(current, value):
            self._emit("replace", tokens, value)

    def merge(self, tokens: Sequence[Token], members: Mapping[str, Any]) -> None:
        """Set each member of the object at ``tokens``; one ``add`` of the whole object if absent."""
        if not members:
            return
        current = get(self._doc, tokens)
        if current is MISSING or current is None:
            self.set(tokens, dict(members))
            return
        for key, value in members.items():
            self.set([*tokens, key], value)

    def append(self, tokens: Sequence[Token], value: Any) -> None:
        """Add ``value`` at the end of the list at ``tokens`` (adding ``[value]`` when absent)."""
        current = get(self._doc, tokens)
        if current is MISSING or current is None:
            self.set(tokens, [value])
            return
        if not isinstance(current, list):
            raise errors.ParseError(pointer(tokens), "expected a list")
        self._emit("add", [*tokens, len(current)], value)

    def remove(self, tokens: Sequence[Token]) -> None:
        if get(self._doc, tokens) is not MISSING:
            self._emit("remove", tokens)
