"""The cores a claim's request asked (``asked.cores``), read from its spec by the result's request
name; garbage is an ``AskError``, never another exception."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu.core.dra import asked


def claim(*requests: Any) -> dict[str, Any]:
    return {"spec": {"devices": {"requests": list(requests)}}}


def exactly(name: str, cores: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": "gpu.kube-vgpu.io"}
    if cores is not None:
        body["capacity"] = {"requests": {"memory": "1Gi", "cores": cores}}
    return {"name": name, "exactly": body}


def first_available(name: str, **subs: Any) -> dict[str, Any]:
    options = []
    for sub, cores in subs.items():
        option: dict[str, Any] = {"name": sub, "deviceClassName": "gpu.kube-vgpu.io"}
        if cores is not None:
            option["capacity"] = {"requests": {"cores": cores}}
        options.append(option)
    return {"name": name, "firstAvailable": options}


@pytest.mark.parametrize(
    ("spec", "name", "cores"),
    [
        (claim(exactly("gpu")), "gpu", 0),
        (claim(exactly("gpu", "0")), "gpu", 0),
        (claim(exactly("gpu", "30")), "gpu", 30),
        (claim(exactly("gpu", 100)), "gpu", 100),  # a number, as YAML may give it
        (claim(exactly("gpu", "500m")), "gpu", 1),  # rounded up, as kube-scheduler rounds it
        (claim(exactly("a", "10"), exactly("b", "20")), "b", 20),
        (claim(first_available("gpu", big="70", small="25", any=None)), "gpu/small", 25),
        (claim(first_available("gpu", big="70", small="25", any=None)), "gpu/any", 0),
    ],
)
def test_the_cores_the_named_request_asked(spec: dict[str, Any], name: str, cores: int) -> None:
    assert asked.cores(spec, request=name) == cores


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=8), c),
        max_leaves=20,
    ),
    st.text(max_size=12),
)
def test_garbage_is_an_ask_error_or_an_answer_in_0_to_100(spec: Any, request: str) -> None:
    for obj in ({"spec": spec}, {"spec": {"devices": {"requests": spec}}}):
        try:
            got = asked.cores(obj, request=request)
        except asked.AskError:
            continue
        assert 0 <= got <= 100
