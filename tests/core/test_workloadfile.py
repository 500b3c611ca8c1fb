"""The workload file `vgpu demo` and `vgpu simulate` both read: Pod manifests in every layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpu.core import errors, workloadfile

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workload.yaml"


def manifest(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        **extra,
    }


def keys(items: list[workloadfile.PodItem]) -> list[tuple[str, str]]:
    return [(i.key, i.expect) for i in items]


LAYOUTS = {
    "list": "- {metadata: {name: a}, spec: {containers: [{name: c}]}}\n"
    "- {metadata: {name: b}, spec: {containers: [{name: c}]}}\n",
    "multi-document": "metadata: {name: a}\nspec: {containers: [{name: c}]}\n---\n"
    "metadata: {name: b}\nspec: {containers: [{name: c}]}\n---\n",
    "kubectl-list": "apiVersion: v1\nkind: List\nitems:\n"
    "- {kind: Pod, metadata: {name: a}, spec: {containers: [{name: c}]}}\n"
    "- {kind: Pod, metadata: {name: b}, spec: {containers: [{name: c}]}}\n",
    "short-pods": "pods:\n- {name: a, containers: [{name: c}]}\n- {name: b, containers: [{name: c}]}\n",
}


@pytest.mark.parametrize("text", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_every_layout_gives_the_same_pods(text: str) -> None:
    items = workloadfile.expand(list(yaml.safe_load_all(text)))
    assert keys(items) == [("default/a", "running"), ("default/b", "running")]
    assert all(i.manifest["apiVersion"] == "v1" and i.manifest["kind"] == "Pod" for i in items)


def test_replicas_and_expect_are_ours_and_never_in_the_manifest() -> None:
    items = workloadfile.expand([manifest("w", replicas=2, expect="pending"), manifest("x")])
    assert keys(items) == [("default/w-0", "pending"), ("default/w-1", "pending"), ("default/x", "running")]
    assert all(set(i.manifest) == {"apiVersion", "kind", "metadata", "spec"} for i in items)
    assert items[0].manifest is not items[1].manifest  # replicas are copies
    assert [i.where for i in items] == ["workload[0]", "workload[0]", "workload[1]"]


def test_the_example_is_read_by_both_commands() -> None:
    items = workloadfile.expand(list(yaml.safe_load_all(EXAMPLE.read_text())))
    assert len(items) == 13 and items[0].key == "default/notebook-0"
    assert [i.key for i in items if i.expect == "pending"] == ["default/huge"]
    assert "serving/inference-2" in {i.key for i in items}


@pytest.mark.parametrize(
    ("docs", "field", "message"),
    [
        pytest.param([], "workload", "no pods", id="empty"),
        pytest.param([None], "workload", "no pods", id="only-null-documents"),
        pytest.param(["text"], "workload[0]", "expected a mapping", id="a-string"),
        pytest.param([[["nested"]]], "workload[0]", "expected a mapping", id="a-nested-list"),
        pytest.param([{"kind": "Service", "spec": {}}], "workload[0].kind", "Pod manifest", id="service"),
        pytest.param([{"kind": "List", "items": 3}], "workload.items", "list", id="list-items-bad"),
        pytest.param([{"pods": []}], "workload.pods", "non-empty list", id="pods-empty"),
        pytest.param([{"pods": [], "x": 1}], "workload", "unknown keys ['x']", id="pods-extra-key"),
        pytest.param([{"spec": {"containers": [{}]}}], "workload[0].metadata", "mapping", id="no-metadata"),
        pytest.param(
            [{"metadata": {}, "spec": {"containers": [{}]}}], "workload[0].metadata.name", "", id="no-name"
        ),
        pytest.param([{"metadata": {"name": "a"}}], "workload[0].spec", "mapping", id="no-spec"),
        pytest.param(
            [{"metadata": {"name": "a"}, "spec": {"containers": []}}],
            "workload[0].spec.containers",
            "non-empty",
            id="no-containers",
        ),
        pytest.param([manifest("a", expect="gone")], "workload[0].expect", "running or pending", id="expect"),
        pytest.param([manifest("a", replicas=0)], "workload[0].replicas", "at least 1", id="replicas-0"),
        pytest.param([manifest("a", replicas=True)], "workload[0].replicas", "integer", id="replicas-bool"),
        pytest.param(
            [manifest("a", replicas=10**9)], "workload[0].replicas", "at most", id="replicas-too-many"
        ),
        pytest.param([manifest("a", status={}, other=1)], "workload[0]", "unknown keys", id="unknown-key"),
        pytest.param([manifest("a"), manifest("a")], "workload[1].name", "twice", id="twice"),
        pytest.param([manifest("a-1"), manifest("a", replicas=2)], "workload[1].name", "twice", id="clash"),
    ],
)
def test_garbage_is_a_config_error_naming_the_item(docs: list[Any], field: str, message: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        workloadfile.expand(docs)
    assert info.value.field == field and message in info.value.message
