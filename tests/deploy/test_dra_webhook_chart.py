"""The chart's side of the webhook's DRA mode: ``dra.defaultMode`` reaches the config file the
scheduler loads, the schema refuses a mode it does not know, and the scheduler may keep its
templates and read the slices (tests/deploy/test_rbac.py checks the rules equal the code's calls)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from vgpu.core import config

from tests.deploy import rendering


def _config(values: dict[str, Any] | None) -> config.Config:
    raw = rendering.embedded_yaml(rendering.render(values).one("ConfigMap", f"{rendering.FULLNAME}-config"))
    return config.load(raw)


@pytest.mark.parametrize(
    ("values", "mode"),
    [
        (None, config.AdmissionMode.EXTENDER),
        ({"dra": {"defaultMode": "dra"}}, config.AdmissionMode.DRA),
        # the config file's own key, where given, wins over the chart's shortcut
        (
            {"dra": {"defaultMode": "dra"}, "config": {"webhook": {"defaultMode": "extender"}}},
            config.AdmissionMode.EXTENDER,
        ),
    ],
    ids=["default", "dra", "config-key-wins"],
)
def test_default_mode_reaches_the_schedulers_config(
    values: dict[str, Any] | None, mode: config.AdmissionMode
) -> None:
    assert _config(values).webhook.default_mode is mode


def test_the_schema_refuses_an_unknown_mode() -> None:
    with (
        rendering.helm.Chart.load(str(rendering.CHART_DIR)) as chart,
        pytest.raises(rendering.helm.HelmError, match=re.escape("value must be one of")),
    ):
        chart.validate_schema({"dra": {"defaultMode": "DRA-please"}})


def test_the_scheduler_keeps_templates_and_reads_slices() -> None:
    role = rendering.render().one("ClusterRole", f"{rendering.FULLNAME}-scheduler")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules[(("resource.k8s.io",), ("resourceclaimtemplates",))] == {"get", "list", "watch", "create"}
    assert rules[(("resource.k8s.io",), ("resourceslices",))] == {"list", "watch"}


def test_the_webhook_declares_its_side_effect() -> None:
    hook = rendering.render().one("MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["sideEffects"] == "NoneOnDryRun"
