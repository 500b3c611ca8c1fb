"""The three patch kinds on plain JSON: RFC 7386, (limited) strategic merge, RFC 6902."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core import errors
from vgpu.localcluster import patch

DOC: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {
        "containers": [
            {"name": "main", "image": "i", "env": [{"name": "A", "value": "1"}]},
            {"name": "side", "image": "s"},
        ],
        "tolerations": [{"key": "t"}],
    },
}


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        ({"metadata": {"labels": {"a": None, "c": "3"}}}, {"b": "2", "c": "3"}),
        ({"metadata": {"labels": None}}, None),
        ({"metadata": {"labels": {}}}, {"a": "1", "b": "2"}),
    ],
    ids=["set-and-delete", "delete-map", "empty-is-noop"],
)
def test_merge_patch_labels(p: dict[str, Any], expected: Any) -> None:
    out = patch.merge_patch(DOC, p)
    assert out["metadata"].get("labels") == expected
    assert DOC["metadata"]["labels"] == {"a": "1", "b": "2"}  # input untouched


def test_merge_patch_replaces_lists() -> None:
    out = patch.merge_patch(DOC, {"spec": {"containers": [{"name": "only"}]}})
    assert out["spec"]["containers"] == [{"name": "only"}]


def test_strategic_merges_keyed_lists_and_honours_directives() -> None:
    out = patch.strategic_merge_patch(
        DOC,
        {
            "metadata": {"labels": {"a": None}, "finalizers": ["y", "x"]},
            "spec": {
                "containers": [
                    {"name": "main", "env": [{"name": "B", "value": "2"}]},
                    {"name": "side", "$patch": "delete"},
                    {"name": "new", "image": "n"},
                ],
                "tolerations": [{"key": "u"}],
                "$setElementOrder/containers": [{"name": "main"}, {"name": "new"}],
            },
        },
    )
    assert out["metadata"]["labels"] == {"b": "2"}
    assert out["metadata"]["finalizers"] == ["x", "y"]
    assert out["spec"]["containers"] == [
        {"name": "main", "image": "i", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
        {"name": "new", "image": "n"},
    ]
    assert out["spec"]["tolerations"] == [{"key": "u"}]  # no merge key: replaced


def test_strategic_replace_and_delete_from_primitive_list() -> None:
    out = patch.strategic_merge_patch(
        DOC,
        {
            "metadata": {
                "labels": {"$patch": "replace", "z": "9"},
                "$deleteFromPrimitiveList/finalizers": ["x"],
            }
        },
    )
    assert out["metadata"]["labels"] == {"z": "9"} and out["metadata"]["finalizers"] == []


@pytest.mark.parametrize(
    "bad", [[1], "x", {"metadata": {"$patch": "explode"}}], ids=["list", "string", "bad-directive"]
)
def test_strategic_garbage(bad: Any) -> None:
    with pytest.raises(errors.KubeError) as exc:
        patch.strategic_merge_patch(DOC, bad)
    assert exc.value.status in (400, 422)


def test_json_patch_all_operations_and_escapes() -> None:
    ops = [
        {"op": "add", "path": "/metadata/annotations", "value": {"hami.io/x": "1", "a~b": "2"}},
        {"op": "test", "path": "/metadata/annotations/hami.io~1x", "value": "1"},
        {"op": "test", "path": "/metadata/annotations/a~0b", "value": "2"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "10"},
        {"op": "remove", "path": "/metadata/labels/b"},
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "last"}},
        {"op": "add", "path": "/spec/containers/0", "value": {"name": "first"}},
        {"op": "copy", "from": "/metadata/labels", "path": "/metadata/copied"},
        {"op": "move", "from": "/metadata/finalizers", "path": "/metadata/moved"},
    ]
    out = patch.json_patch(DOC, ops)
    assert out["metadata"]["annotations"] == {"hami.io/x": "1", "a~b": "2"}
    assert out["metadata"]["labels"] == {"a": "10"} and out["metadata"]["copied"] == {"a": "10"}
    assert [c["name"] for c in out["spec"]["containers"]] == ["first", "main", "side", "last"]
    assert "finalizers" not in out["metadata"] and out["metadata"]["moved"] == ["x"]
    assert "annotations" not in DOC["metadata"]


@pytest.mark.parametrize(
    ("ops", "status"),
    [
        ([{"op": "add", "path": "/metadata/annotations/x", "value": "y"}], 422),
        ([{"op": "remove", "path": "/nope"}], 422),
        ([{"op": "replace", "path": "/nope", "value": 1}], 422),
        ([{"op": "test", "path": "/metadata/name", "value": "q"}], 422),
        ([{"op": "add", "path": "/spec/containers/9", "value": {}}], 422),
        ([{"op": "add", "path": "/spec/containers/01", "value": {}}], 422),
        ([{"op": "move", "from": "/metadata", "path": "/metadata/x"}], 422),
        ([{"op": "add", "path": "no-slash", "value": 1}], 422),
        ([{"op": "frobnicate", "path": "/x"}], 400),
        ([{"op": "add", "path": "/x"}], 400),
        ([{"op": "copy", "path": "/x"}], 400),
        ([{"path": "/x"}], 400),
        ([{"op": "add", "path": 5, "value": 1}], 400),
        ({"op": "add"}, 400),
        (["x"], 400),
    ],
    ids=[
        "add-under-missing-parent",
        "remove-missing",
        "replace-missing",
        "test-fails",
        "index-out-of-range",
        "leading-zero-index",
        "move-into-child",
        "path-without-slash",
        "unknown-op",
        "add-without-value",
        "copy-without-from",
        "no-op",
        "path-not-string",
        "not-a-list",
        "op-not-object",
    ],
)
def test_json_patch_garbage(ops: Any, status: int) -> None:
    with pytest.raises(errors.KubeError) as exc:
        patch.json_patch(DOC, ops)
    assert exc.value.status == status


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@given(
    st.dictionaries(st.text(max_size=4), json_values, max_size=4),
    st.dictionaries(st.text(max_size=4), json_values, max_size=4),
)
def test_merge_patch_is_idempotent(target: dict[str, Any], p: dict[str, Any]) -> None:
    once = patch.merge_patch(target, p)
    assert patch.merge_patch(once, p) == once


def _rfc7386(target: Any, p: Any) -> Any:
    """RFC 7386's MergePatch pseudocode, word for word (copies as Python's deepcopy does)."""
    if isinstance(p, dict):
        result = copy.deepcopy(target) if isinstance(target, dict) else {}
        for name, value in p.items():
            if value is None:
                result.pop(name, None)
            else:
                result[name] = _rfc7386(result.get(name), value)
        return result
    return copy.deepcopy(p)


def _containers(value: Any) -> list[int]:
    """ids of every dict and list inside ``value`` (itself included)."""
    if isinstance(value, dict):
        return [id(value), *(i for v in value.values() for i in _containers(v))]
    if isinstance(value, list):
        return [id(value), *(i for v in value for i in _containers(v))]
    return []


@given(
    st.dictionaries(st.text(max_size=4), json_values, max_size=4),
    st.dictionaries(st.text(max_size=4), json_values, max_size=4),
)
def test_merge_patch_is_rfc_7386_and_shares_nothing_with_its_inputs(
    target: dict[str, Any], p: dict[str, Any]
) -> None:
    before = (copy.deepcopy(target), copy.deepcopy(p))
    out = patch.merge_patch(target, p)
    assert out == _rfc7386(target, p)
    assert (target, p) == before  # inputs untouched
    # the stored object may be changed in place later: it must not alias the old version or the patch
    assert not set(_containers(out)) & set(_containers(target) + _containers(p))
