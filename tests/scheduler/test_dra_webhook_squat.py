"""A ResourceClaimTemplate under our name that is not ours: a user of the pod's namespace may create
``vgpu-<hash>`` first, with more in it than we ask (another request, adminAccess, a config, claim
labels) or without our label. The webhook's DRA mode then refuses the pod naming that template and
neither uses nor overwrites it, whether the template is found by the 409 of our create or is in the
watch-fed cache; a template that is ours but for a quantity's written form is still ours."""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from vgpu.core import config, request
from vgpu.core.dra import convert, names
from vgpu.kube.port import ObjectList, WatchEvent
from vgpu.localcluster.client import LocalKubeApi
from vgpu_scheduler import dratemplates

from tests.scheduler.scenario import Cluster
from tests.scheduler.test_dra_webhook import TEMPLATES, claims_in, dra_cluster, gpu_pod, review

ASK = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}  # memory 4Gi in the template


def ours() -> dict[str, Any]:
    """The template the webhook makes for ``ASK`` in namespace ``team``."""
    conf = config.load({"webhook": {"defaultMode": "dra"}})
    pod = gpu_pod("x", **ASK)
    parsed = request.parse_pod(pod, conf, default_count=True)
    conversion = convert.convert(pod, parsed, namespace="team", resources=conf.resources, memory_sizes_mib=())
    (body,) = conversion.templates
    return copy.deepcopy(body)


def _request(t: dict[str, Any]) -> dict[str, Any]:
    got: dict[str, Any] = t["spec"]["spec"]["devices"]["requests"][0]
    return got


def extra_request(t: dict[str, Any]) -> None:
    t["spec"]["spec"]["devices"]["requests"].append({"name": "more", "exactly": {"deviceClassName": "x"}})


def admin_access(t: dict[str, Any]) -> None:
    _request(t)["exactly"]["adminAccess"] = True


def other_class_in_a_config(t: dict[str, Any]) -> None:
    config_entry = {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"deviceClassName": "x"}}}
    t["spec"]["spec"]["devices"]["config"] = [config_entry]


def broader_selector(t: dict[str, Any]) -> None:
    _request(t)["exactly"]["selectors"] = [{"cel": {"expression": "true"}}]


def claim_annotations(t: dict[str, Any]) -> None:
    t["spec"]["metadata"] = {"annotations": {"team.example/x": "y"}}


def no_label(t: dict[str, Any]) -> None:
    del t["metadata"]["labels"]


def label_false(t: dict[str, Any]) -> None:
    t["metadata"]["labels"] = {names.TEMPLATE_LABEL: "false"}


def count_as_bool(t: dict[str, Any]) -> None:
    _request(t)["exactly"]["count"] = True


def memory_written_longhand(t: dict[str, Any]) -> None:
    _request(t)["exactly"]["capacity"]["requests"]["memory"] = "4096Mi"


def empty_claim_metadata(t: dict[str, Any]) -> None:
    t["spec"]["metadata"] = {}


def memory_other_amount(t: dict[str, Any]) -> None:
    _request(t)["exactly"]["capacity"]["requests"]["memory"] = "4097Mi"


def request_name_not_a_quantity(t: dict[str, Any]) -> None:
    _request(t)["name"] = "gpu2"


NOT_OURS: list[tuple[Callable[[dict[str, Any]], None], str]] = [
    (extra_request, "its spec"),
    (admin_access, "its spec"),
    (other_class_in_a_config, "its spec"),
    (broader_selector, "its spec"),
    (claim_annotations, "its spec"),
    (count_as_bool, "its spec"),
    (memory_other_amount, "its spec"),
    (request_name_not_a_quantity, "its spec"),
    (no_label, "not labelled"),
    (label_false, "not labelled"),
]
STILL_OURS = [memory_written_longhand, empty_claim_metadata]


@pytest.mark.parametrize(("change", "why"), NOT_OURS, ids=[c.__name__ for c, _ in NOT_OURS])
def test_a_template_with_anything_more_or_without_our_label_is_not_ours(
    change: Callable[[dict[str, Any]], None], why: str
) -> None:
    stored = ours()
    change(stored)
    reason = dratemplates.not_ours(stored, ours())
    assert reason is not None and why in reason
    # the cache's slimmed copy says the same
    slim = dratemplates.not_ours(dratemplates.slim_template(stored), ours())
    assert slim is not None and why in slim


@pytest.mark.parametrize("change", STILL_OURS, ids=[c.__name__ for c in STILL_OURS])
def test_a_template_the_api_server_wrote_back_is_ours(change: Callable[[dict[str, Any]], None]) -> None:
    stored = ours()
    change(stored)
    assert dratemplates.not_ours(stored, ours()) is None
    assert dratemplates.not_ours(dratemplates.slim_template(stored), ours()) is None


@pytest.mark.parametrize(
    "stored",
    [
        "junk",
        {},
        {"metadata": "junk"},
        {"metadata": {"labels": ["x"]}},
        {"metadata": {"labels": {names.TEMPLATE_LABEL: "true"}}, "spec": 1},
    ],
    ids=["not-an-object", "empty", "metadata-junk", "labels-junk", "spec-junk"],
)
def test_garbage_stored_templates_are_not_ours(stored: Any) -> None:
    assert dratemplates.not_ours(stored, ours()) is not None


class UnwatchedTemplates(LocalKubeApi):
    """The local API whose templates' list and watch never show one (a watch that lags): every
    template the webhook needs is met through its create's 409."""

    async def list(self, kind: Any, **kwargs: Any) -> ObjectList:
        if kind == TEMPLATES:
            kwargs["label_selector"] = f"{kwargs.get('label_selector')},never.example/shown=yes"
        return await super().list(kind, **kwargs)

    def watch(self, kind: Any, **kwargs: Any) -> AsyncIterator[WatchEvent]:
        if kind == TEMPLATES:
            kwargs["label_selector"] = f"{kwargs.get('label_selector')},never.example/shown=yes"
        return super().watch(kind, **kwargs)


@pytest.fixture(params=["after-409", "from-the-cache"])
async def squatted(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Cluster, str]]:
    """A started DRA cluster, and how it meets the templates already in the store."""
    c = dra_cluster(UnwatchedTemplates if request.param == "after-409" else None)
    c.add_node("node-a")
    yield c, request.param
    await c.stop()


async def _post_with(c: Cluster, path: str, stored: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The pod's answer with ``stored`` in the store first, and the resourceVersion it was made at."""
    made = c.store.create(TEMPLATES, stored, namespace="team")
    await c.start()
    if path == "from-the-cache" and names.TEMPLATE_LABEL in stored["metadata"].get("labels", {}):
        assert c.service is not None
        keeper = c.service.dra_templates
        await c.until(lambda: keeper.templates.get("team", stored["metadata"]["name"]) is not None)
    _, out = await c.post("webhook", review(gpu_pod("p", **ASK)))
    response: dict[str, Any] = out["response"]
    return response, made["metadata"]["resourceVersion"]


REFUSED = [extra_request, admin_access, claim_annotations, no_label]


@pytest.mark.parametrize("change", REFUSED, ids=[c.__name__ for c in REFUSED])
async def test_a_squatted_template_refuses_the_pod_and_is_left_as_it_is(
    squatted: tuple[Cluster, str],
    change: Callable[[dict[str, Any]], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    c, path = squatted
    stored = ours()
    change(stored)
    with caplog.at_level(logging.WARNING):
        response, version = await _post_with(c, path, stored)
    name = stored["metadata"]["name"]
    assert response["allowed"] is False and response["status"]["code"] == 503
    message = response["status"]["message"]
    assert f"ResourceClaimTemplate team/{name} exists but is not kube-vgpu's" in message
    assert "neither uses nor overwrites it" in message
    # logged with the pod and its namespace
    assert any("team/p" in r.getMessage() and name in r.getMessage() for r in caplog.records)
    # never overwritten: the user's object is as it was made
    assert c.store.get(TEMPLATES, name, namespace="team")["metadata"]["resourceVersion"] == version
    assert c.service is not None
    if path == "from-the-cache" and change is not no_label:  # refused from memory, no create sent
        assert c.service.dra_templates.creates == 0


@pytest.mark.parametrize("change", STILL_OURS, ids=[c.__name__ for c in STILL_OURS])
async def test_our_template_as_the_api_server_may_write_it_is_used(
    squatted: tuple[Cluster, str], change: Callable[[dict[str, Any]], None]
) -> None:
    c, path = squatted
    stored = ours()
    change(stored)
    response, version = await _post_with(c, path, stored)
    assert response["allowed"] is True
    (claim,) = claims_in(response)
    assert claim["resourceClaimTemplateName"] == stored["metadata"]["name"]
    kept = c.store.get(TEMPLATES, stored["metadata"]["name"], namespace="team")
    assert kept["metadata"]["resourceVersion"] == version
