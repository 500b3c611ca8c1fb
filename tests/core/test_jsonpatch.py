"""JSON Patch: escaping, the minimal-patch builder, and RFC 6902 application (with garbage)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu.core import errors, jsonpatch


@pytest.mark.parametrize(
    ("token", "escaped"),
    [
        ("plain", "plain"),
        ("nvidia.com/gpu", "nvidia.com~1gpu"),
        ("a~b", "a~0b"),
        ("~1", "~01"),  # "~" is escaped first, so a literal "~1" does not turn into "/"
        ("/~", "~1~0"),
        (3, "3"),
    ],
    ids=["plain", "slash", "tilde", "literal-tilde-one", "both", "int"],
)
def test_escape_round_trips(token: str | int, escaped: str) -> None:
    assert jsonpatch.escape(token) == escaped
    assert jsonpatch.unescape(escaped) == str(token)


def test_pointer_joins_escaped_tokens() -> None:
    assert (
        jsonpatch.pointer(["metadata", "annotations", "hami.io/vgpu-node"])
        == "/metadata/annotations/hami.io~1vgpu-node"
    )
    assert jsonpatch.pointer([]) == ""
    assert jsonpatch.parse_pointer("/a~1b/~0/0") == ["a/b", "~", "0"]
    with pytest.raises(errors.ParseError, match="must start with '/'"):
        jsonpatch.parse_pointer("a/b")


# --- Builder -------------------------------------------------------------------------------------

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"app": "x"}},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


@pytest.mark.parametrize(
    ("tokens", "value", "ops"),
    [
        (["metadata", "name"], "p", []),
        (["metadata", "name"], "q", [{"op": "replace", "path": "/metadata/name", "value": "q"}]),
        (["spec", "schedulerName"], "s", [{"op": "add", "path": "/spec/schedulerName", "value": "s"}]),
        (
            ["metadata", "annotations", "hami.io/gpu-type"],
            "NVIDIA",
            [{"op": "add", "path": "/metadata/annotations", "value": {"hami.io/gpu-type": "NVIDIA"}}],
        ),
        (
            ["spec", "containers", 0, "resources", "requests", "nvidia.com/gpu"],
            "1",
            [
                {
                    "op": "add",
                    "path": "/spec/containers/0/resources/requests",
                    "value": {"nvidia.com/gpu": "1"},
                }
            ],
        ),
        (
            ["status", "a", "b"],
            1,
            [{"op": "add", "path": "/status", "value": {"a": {"b": 1}}}],
        ),
        (
            ["spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"],
            "2",
            [{"op": "replace", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu", "value": "2"}],
        ),
        (
            ["metadata", "labels", "app"],
            True,
            [{"op": "replace", "path": "/metadata/labels/app", "value": True}],
        ),
    ],
    ids=[
        "equal-no-op",
        "replace",
        "add-key",
        "absent-map-added-whole",
        "absent-requests-added-whole",
        "two-levels-absent",
        "escaped-replace",
        "bool-is-not-string",
    ],
)
def test_set_emits_the_minimal_operation(tokens: list[Any], value: Any, ops: list[dict[str, Any]]) -> None:
    before = copy.deepcopy(POD)
    builder = jsonpatch.Builder(POD)
    builder.set(tokens, value)
    assert builder.ops == ops
    assert before == POD, "the input document must not be modified"
    assert jsonpatch.apply(POD, builder.ops) == builder.doc
    assert jsonpatch.get(builder.doc, tokens) == value


def test_set_over_null_parent_adds_the_whole_map() -> None:
    builder = jsonpatch.Builder({"metadata": {"annotations": None}})
    builder.set(["metadata", "annotations", "k"], "v")
    assert builder.ops == [{"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}]


def test_merge_adds_an_absent_map_in_one_operation_and_keys_one_by_one_otherwise() -> None:
    builder = jsonpatch.Builder({"metadata": {}})
    builder.merge(["metadata", "annotations"], {"a/b": "1", "c": "2"})
    builder.merge(["metadata", "annotations"], {"c": "2", "d": "3"})
    builder.merge(["metadata", "annotations"], {})
    assert builder.ops == [
        {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1", "c": "2"}},
        {"op": "add", "path": "/metadata/annotations/d", "value": "3"},
    ]


def test_append_uses_explicit_indexes_and_adds_an_absent_list() -> None:
    builder = jsonpatch.Builder({"c": {"env": [{"name": "A", "value": "1"}]}, "d": {}})
    builder.append(["c", "env"], {"name": "B", "value": "2"})
    builder.append(["c", "env"], {"name": "C", "value": "3"})
    builder.append(["d", "env"], {"name": "D", "value": "4"})
    assert builder.ops == [
        {"op": "add", "path": "/c/env/1", "value": {"name": "B", "value": "2"}},
        {"op": "add", "path": "/c/env/2", "value": {"name": "C", "value": "3"}},
        {"op": "add", "path": "/d/env", "value": [{"name": "D", "value": "4"}]},
    ]
    with pytest.raises(errors.ParseError, match="expected a list"):
        jsonpatch.Builder({"env": "x"}).append(["env"], 1)


def test_remove_only_what_exists() -> None:
    builder = jsonpatch.Builder({"metadata": {"annotations": {"hami.io/vgpu-node": "n1"}}})
    builder.remove(["metadata", "annotations", "hami.io/vgpu-node"])
    builder.remove(["metadata", "annotations", "absent"])
    assert builder.ops == [{"op": "remove", "path": "/metadata/annotations/hami.io~1vgpu-node"}]
    assert builder.doc == {"metadata": {"annotations": {}}}


def test_set_cannot_invent_a_list_element() -> None:
    with pytest.raises(errors.ParseError, match="list element"):
        jsonpatch.Builder({"spec": {}}).set(["spec", "containers", 0, "name"], "c")


# --- apply (RFC 6902 appendix A and garbage) -----------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "ops", "result"),
    [
        ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux"}], {"foo": "bar", "baz": "qux"}),
        (
            {"foo": ["bar", "baz"]},
            [{"op": "add", "path": "/foo/1", "value": "qux"}],
            {"foo": ["bar", "qux", "baz"]},
        ),
        ({"foo": ["bar"]}, [{"op": "add", "path": "/foo/-", "value": "x"}], {"foo": ["bar", "x"]}),
        ({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
        ({"foo": ["bar", "qux", "baz"]}, [{"op": "remove", "path": "/foo/1"}], {"foo": ["bar", "baz"]}),
        ({"baz": "qux"}, [{"op": "replace", "path": "/baz", "value": "boo"}], {"baz": "boo"}),
        (
            {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
            [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
            {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
        ),
        ({"a": [1]}, [{"op": "copy", "from": "/a", "path": "/b"}], {"a": [1], "b": [1]}),
        ({"baz": "qux"}, [{"op": "test", "path": "/baz", "value": "qux"}], {"baz": "qux"}),
        ({"a/b": 1}, [{"op": "replace", "path": "/a~1b", "value": 2}], {"a/b": 2}),
        ({"a": 1}, [{"op": "replace", "path": "", "value": [1]}], [1]),
    ],
    ids=[
        "add",
        "insert",
        "append-dash",
        "remove",
        "remove-index",
        "replace",
        "move",
        "copy",
        "test",
        "escaped",
        "root",
    ],
)
def test_apply_follows_rfc6902(doc: Any, ops: list[dict[str, Any]], result: Any) -> None:
    before = copy.deepcopy(doc)
    assert jsonpatch.apply(doc, ops) == result
    assert doc == before


@pytest.mark.parametrize(
    ("doc", "ops", "match"),
    [
        ({}, [{"op": "remove", "path": "/a"}], "does not exist"),
        ({}, [{"op": "replace", "path": "/a", "value": 1}], "does not exist"),
        ({}, [{"op": "add", "path": "/a/b", "value": 1}], "parent member"),
        ({"l": [1]}, [{"op": "add", "path": "/l/5", "value": 1}], "out of range"),
        ({"l": [1]}, [{"op": "add", "path": "/l/01", "value": 1}], "out of range"),
        ({"l": [1]}, [{"op": "remove", "path": "/l/-"}], "out of range"),
        ({"s": "x"}, [{"op": "add", "path": "/s/a", "value": 1}], "cannot descend"),
        ({"a": 1}, [{"op": "test", "path": "/a", "value": True}], "test /a failed"),
        ({}, [{"op": "frobnicate", "path": "/a"}], "unknown op"),
        ({}, [{"op": "add", "path": "/a"}], "needs a 'value'"),
        ({}, [{"op": "add", "value": 1}], "missing string member 'path'"),
        ({}, ["add"], "must be an object"),
        ({"a": {"b": 1}}, [{"op": "move", "from": "/a", "path": "/a/c"}], "own child"),
        ({}, [{"op": "copy", "from": "/x", "path": "/y"}], "nothing there"),
        ({}, [{"op": "move", "path": "/y"}], "string 'from'"),
        ({}, [{"op": "remove", "path": ""}], "whole document"),
        ({}, [{"op": "add", "path": "a", "value": 1}], "must start with"),
    ],
    ids=[
        "remove-missing",
        "replace-missing",
        "add-under-missing-parent",
        "index-past-end",
        "leading-zero-index",
        "remove-dash",
        "descend-into-string",
        "test-bool-vs-int",
        "unknown-op",
        "add-without-value",
        "no-path",
        "op-not-object",
        "move-into-child",
        "copy-from-nothing",
        "move-without-from",
        "remove-root",
        "pointer-without-slash",
    ],
)
def test_apply_rejects_what_does_not_apply(doc: Any, ops: list[Any], match: str) -> None:
    with pytest.raises(errors.ParseError, match=match) as info:
        jsonpatch.apply(doc, ops)
    assert info.value.field.startswith("patch[0]")


def test_json_equal_distinguishes_bools_and_nesting() -> None:
    assert jsonpatch.json_equal({"a": [1, 2.0]}, {"a": [1.0, 2]})
    assert not jsonpatch.json_equal({"a": [1]}, {"a": [True]})
    assert not jsonpatch.json_equal({"a": 1}, {"b": 1})
    assert not jsonpatch.json_equal("1", 1)
    assert not jsonpatch.json_equal([1], [1, 2])


# --- property: the builder's ops, applied, give the builder's document ----------------------------

keys = st.sampled_from(["a", "b/c", "~d", "e~1"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3))
json_values = st.recursive(scalars, lambda inner: st.dictionaries(keys, inner, max_size=3), max_leaves=6)
paths = st.lists(keys, min_size=1, max_size=3)
actions = st.lists(
    st.tuples(st.sampled_from(["set", "merge", "remove", "append"]), paths, json_values), max_size=8
)


@settings(max_examples=200, deadline=None)
@given(doc=st.dictionaries(keys, json_values, max_size=3), steps=actions)
def test_builder_ops_replay_to_the_builder_document(doc: dict[str, Any], steps: list[Any]) -> None:
    before = json.dumps(doc, sort_keys=True)
    builder = jsonpatch.Builder(doc)
    for action, tokens, value in steps:
        try:
            if action == "set":
                builder.set(tokens, value)
            elif action == "merge" and isinstance(value, dict):
                builder.merge(tokens, value)
            elif action == "remove":
                builder.remove(tokens)
            elif action == "append":
                builder.append(tokens, value)
        except errors.ParseError:
            continue  # a scalar in the way: refused before any op is recorded
    assert json.dumps(doc, sort_keys=True) == before
    assert jsonpatch.json_equal(jsonpatch.apply(doc, builder.ops), builder.doc)
    for op in builder.ops:
        assert op["op"] in ("add", "replace", "remove")


def test_builder_copies_each_container_once_then_changes_its_copy_in_place() -> None:
    # linear building: the 2nd..nth operation under the same list must not copy that list again
    # (copying it per operation made a 40,000-container pod quadratic: 26 s on the event loop)
    containers = [{"name": f"c{i}", "env": [{"name": "A", "value": "1"}]} for i in range(50)]
    doc = {"spec": {"containers": containers}}
    builder = jsonpatch.Builder(doc)
    builder.append(["spec", "containers", 0, "env"], {"name": "B", "value": "2"})
    copied = builder.doc["spec"]["containers"]
    assert copied is not containers
    for i in range(1, 50):
        builder.append(["spec", "containers", i, "env"], {"name": "B", "value": "2"})
        assert builder.doc["spec"]["containers"] is copied
    # the input is untouched, the values in the operations are untouched, and the ops replay
    assert all(c["env"] == [{"name": "A", "value": "1"}] for c in containers)
    assert all(op["value"] == {"name": "B", "value": "2"} for op in builder.ops)
    assert jsonpatch.apply(doc, builder.ops) == builder.doc


def test_builder_never_changes_a_value_it_handed_out_in_an_operation() -> None:
    builder = jsonpatch.Builder({})
    builder.set(["metadata", "annotations", "a"], "1")  # adds {"annotations": {"a": "1"}} at /metadata
    builder.set(["metadata", "annotations", "b"], "2")
    first, second = builder.ops
    assert first["value"] == {"annotations": {"a": "1"}}
    assert second == {"op": "add", "path": "/metadata/annotations/b", "value": "2"}
    assert builder.doc == {"metadata": {"annotations": {"a": "1", "b": "2"}}}
