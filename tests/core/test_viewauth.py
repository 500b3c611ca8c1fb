"""The live views' token checks as pure functions (core/viewauth.py): the Authorization header,
the review bodies, reading the answers (garbage is never an allow) and the verdict cache."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core import viewauth


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def", "abc.def"),
        ("bearer abc", "abc"),
        ("  Bearer   abc  ", "abc"),
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer a b", None),
        ("Bearerabc", None),
    ],
    ids=repr,
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert viewauth.bearer_token(header) == token


def test_the_review_bodies() -> None:
    assert viewauth.token_review("t") == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "t"},
    }
    user = viewauth.User("u", "uid-1", ("g",), {"authentication.kubernetes.io/node-name": ("n1",)})
    assert viewauth.access_review(user, "/metrics") == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "u",
            "groups": ["g"],
            "uid": "uid-1",
            "extra": {"authentication.kubernetes.io/node-name": ["n1"]},
            "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
        },
    }


def test_user_of_an_authenticated_review() -> None:
    answer = {"status": {"authenticated": True, "user": {"username": "u", "groups": ["a", "b"]}}}
    assert viewauth.user_of(answer) == viewauth.User("u", "", ("a", "b"), {})


@pytest.mark.parametrize(
    "answer",
    [{}, {"status": {}}, {"status": {"authenticated": False, "user": {"username": "u"}}}, {"status": None}],
    ids=["no-status", "empty-status", "not-authenticated", "null-status"],
)
def test_user_of_an_unauthenticated_review_is_none(answer: Any) -> None:
    assert viewauth.user_of(answer) is None


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("x", "TokenReview: expected an object"),
        ({"status": []}, "TokenReview.status: expected an object"),
        ({"status": {"authenticated": True}}, "TokenReview.status.user: expected an object"),
        ({"status": {"authenticated": True, "user": {"username": 1}}}, "username: expected a non-empty"),
        ({"status": {"authenticated": True, "user": {"username": "u", "uid": 1}}}, "uid: expected a string"),
        ({"status": {"authenticated": True, "user": {"username": "u", "groups": [1]}}}, "groups: expected"),
        (
            {"status": {"authenticated": True, "user": {"username": "u", "extra": {"k": [1]}}}},
            "extra: expected",
        ),
    ],
    ids=["not-an-object", "status-list", "no-user", "username", "uid", "groups", "extra"],
)
def test_garbage_token_reviews_are_refused(answer: Any, message: str) -> None:
    with pytest.raises(viewauth.BadReview, match=message):
        viewauth.user_of(answer)


@pytest.mark.parametrize(
    ("answer", "allowed"),
    [
        ({"status": {"allowed": True}}, True),
        ({"status": {"allowed": True, "denied": True}}, False),
        ({"status": {"allowed": "true"}}, False),
        ({"status": {}}, False),
        ({}, False),
    ],
    ids=["allowed", "denied-wins", "string-true", "empty", "no-status"],
)
def test_allowed(answer: Any, allowed: bool) -> None:
    assert viewauth.allowed(answer) is allowed


@given(
    st.recursive(
        st.none() | st.booleans() | st.text(max_size=3),
        lambda c: (
            st.lists(c)
            | st.dictionaries(
                st.sampled_from(
                    ["status", "authenticated", "user", "username", "groups", "extra", "allowed"]
                ),
                c,
            )
        ),
        max_leaves=10,
    )
)
def test_any_answer_is_a_user_none_or_bad_review_and_never_raises_otherwise(answer: Any) -> None:
    with contextlib.suppress(viewauth.BadReview):
        viewauth.user_of(answer)
    with contextlib.suppress(viewauth.BadReview):
        viewauth.allowed(answer)


def test_verdicts_expire_and_the_oldest_go() -> None:
    v = viewauth.Verdicts(ttl_s=10, max_entries=2)
    key = viewauth.token_key("secret")
    assert "secret" not in key and len(key) == 64
    v.put(key, "/metrics", viewauth.Verdict.ALLOWED, "u", now=0)
    assert v.get(key, "/metrics", now=9.9) == (viewauth.Verdict.ALLOWED, "u")
    assert v.get(key, "/ui", now=1) is None
    assert v.get(key, "/metrics", now=10) is None and len(v) == 0
    for i in range(3):
        v.put(f"k{i}", "/metrics", viewauth.Verdict.FORBIDDEN, "u", now=0)
    assert len(v) == 2 and v.get("k0", "/metrics", now=1) is None
    with pytest.raises(ValueError):
        viewauth.Verdicts(max_entries=0)
