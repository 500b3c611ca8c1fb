"""``realk8s.kube_scheduler``'s ``feature_gates`` reach the real kube-scheduler (marked ``realk8s``):
the throughput bench's ``--scheduler-feature-gates`` measures a DRA pod without kube-scheduler's
nominatedNodeName write, and a gate that did not take would measure the default silently. Read
from kube-scheduler's own ``kubernetes_feature_enabled`` series."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from vgpu.kube import kubeconfig

from bench import realk8s

pytestmark = [pytest.mark.realk8s, pytest.mark.dra]

GATE = "NominatedNodeNameForExpectation"  # beta and on by default from 1.35


def _enabled(metrics_text: str, gate: str) -> float | None:
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "kubernetes_feature_enabled" and sample.labels.get("name") == gate:
                return sample.value
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("gates", "expected"), [("", 1.0), (f"{GATE}=false", 0.0)])
async def test_the_feature_gates_given_are_the_ones_kube_scheduler_runs_with(
    k8s_bin: pathlib.Path, plane: realk8s.ControlPlane, tmp_path: pathlib.Path, gates: str, expected: float
) -> None:
    kube = kubeconfig.write_kubeconfig(
        tmp_path / "kubeconfig", server=plane.url, token=plane.token, ca_pem=plane.ca_file.read_bytes()
    )
    config = tmp_path / "scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(kube)},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    async with realk8s.kube_scheduler(
        k8s_bin,
        config=config,
        kubeconfig_path=kube,
        log_path=tmp_path / "kube-scheduler.log",
        feature_gates=gates,
    ) as scheduler:
        assert _enabled(await scheduler.metrics(plane.token), GATE) == expected
