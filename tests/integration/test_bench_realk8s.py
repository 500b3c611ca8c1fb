"""bench/realk8s's pure parts: the version and config API of a kube-scheduler binary, and the API
server's request counters read from its /metrics text (garbage included)."""

from __future__ import annotations

import pathlib

import pytest

from bench import realk8s

METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",resource="pods",scope="namespace",subresource="binding",verb="POST",version="v1"} 40
apiserver_request_total{code="409",component="apiserver",resource="nodes",scope="resource",subresource="",verb="PATCH",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",resource="nodes",scope="resource",subresource="",verb="PATCH",version="v1"} 80
apiserver_request_total{code="0",component="",resource="",scope="",subresource="/readyz",verb="GET",version=""} 12
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_count{resource="pods",verb="POST"} 7
"""


def test_request_counts_sum_every_code_by_verb_and_resource() -> None:
    assert realk8s.request_counts(METRICS) == {"POST pods/binding": 40.0, "PATCH nodes": 83.0}


@pytest.mark.parametrize("text", ["", "not metrics at all\n", "# TYPE x counter\n"])
def test_request_counts_of_text_without_the_counter_are_empty(text: str) -> None:
    assert realk8s.request_counts(text) == {}


SCHEDULER_METRICS = """\
# TYPE scheduler_scheduling_algorithm_duration_seconds histogram
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.001"} 3
scheduler_scheduling_algorithm_duration_seconds_bucket{le="+Inf"} 5
scheduler_scheduling_algorithm_duration_seconds_sum 0.0125
scheduler_scheduling_algorithm_duration_seconds_count 5
# TYPE scheduler_e2e_scheduling_duration_seconds histogram
scheduler_e2e_scheduling_duration_seconds_bucket{profile="a",result="scheduled",le="+Inf"} 2
scheduler_e2e_scheduling_duration_seconds_sum{profile="a",result="scheduled"} 0.5
scheduler_e2e_scheduling_duration_seconds_count{profile="a",result="scheduled"} 2
scheduler_e2e_scheduling_duration_seconds_bucket{profile="b",result="scheduled",le="+Inf"} 3
scheduler_e2e_scheduling_duration_seconds_sum{profile="b",result="scheduled"} 1.0
scheduler_e2e_scheduling_duration_seconds_count{profile="b",result="scheduled"} 3
# TYPE scheduler_pending_pods gauge
scheduler_pending_pods{queue="active"} 4
# TYPE scheduler_framework_extension_point_duration_seconds histogram
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Filter",profile="a",status="Success",le="+Inf"} 2
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",profile="a",status="Success"} 0.002
scheduler_framework_extension_point_duration_seconds_count{extension_point="Filter",profile="a",status="Success"} 2
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",profile="b",status="Unschedulable"} 0.001
scheduler_framework_extension_point_duration_seconds_count{extension_point="Filter",profile="b",status="Unschedulable"} 1
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Bind",profile="a",status="Success"} 0.5
scheduler_framework_extension_point_duration_seconds_count{extension_point="Bind",profile="a",status="Success"} 2
"""


def test_kube_scheduler_cycle_histograms_sum_every_label_set() -> None:
    assert realk8s.histogram_sums(SCHEDULER_METRICS) == {
        "scheduler_scheduling_algorithm_duration_seconds": (0.0125, 5.0),
        "scheduler_e2e_scheduling_duration_seconds": (1.5, 5.0),
        # the cycle's extension points, each on its own (Bind runs after the cycle: left out)
        "scheduler_Filter_duration_seconds": (0.003, 3.0),
    }


DRA_METRICS = """\
# TYPE scheduler_framework_extension_point_duration_seconds histogram
scheduler_framework_extension_point_duration_seconds_sum{extension_point="PreBind",profile="a",status="Success"} 0.03
scheduler_framework_extension_point_duration_seconds_count{extension_point="PreBind",profile="a",status="Success"} 3
# TYPE scheduler_plugin_execution_duration_seconds histogram
scheduler_plugin_execution_duration_seconds_bucket{extension_point="Filter",plugin="DynamicResources",status="Success",le="+Inf"} 4
scheduler_plugin_execution_duration_seconds_sum{extension_point="Filter",plugin="DynamicResources",status="Success"} 0.004
scheduler_plugin_execution_duration_seconds_count{extension_point="Filter",plugin="DynamicResources",status="Success"} 4
scheduler_plugin_execution_duration_seconds_sum{extension_point="Filter",plugin="DynamicResources",status="Unschedulable"} 0.001
scheduler_plugin_execution_duration_seconds_count{extension_point="Filter",plugin="DynamicResources",status="Unschedulable"} 1
scheduler_plugin_execution_duration_seconds_sum{extension_point="PreBind",plugin="DynamicResources",status="Success"} 0.02
scheduler_plugin_execution_duration_seconds_count{extension_point="PreBind",plugin="DynamicResources",status="Success"} 2
scheduler_plugin_execution_duration_seconds_sum{extension_point="Filter",plugin="NodeResourcesFit",status="Success"} 9
scheduler_plugin_execution_duration_seconds_count{extension_point="Filter",plugin="NodeResourcesFit",status="Success"} 9
"""


def test_kube_schedulers_dra_plugin_and_prebind_are_read_per_extension_point() -> None:
    assert realk8s.histogram_sums(DRA_METRICS) == {
        "scheduler_PreBind_duration_seconds": (0.03, 3.0),  # the binding cycle's, the claim write in it
        "scheduler_DynamicResources.Filter_duration_seconds": (0.005, 5.0),
        "scheduler_DynamicResources.PreBind_duration_seconds": (0.02, 2.0),
        # other plugins' own times are left out
    }


@pytest.mark.parametrize(
    "text", ["", "garbage {{{\n", "# TYPE scheduler_pending_pods gauge\nscheduler_pending_pods 1\n"]
)
def test_kube_scheduler_cycle_histograms_of_other_text_are_empty(text: str) -> None:
    assert realk8s.histogram_sums(text) == {}


def test_cycle_means_are_per_phase_and_leave_out_what_was_not_observed() -> None:
    from bench.throughput_figures import cycle_means

    before = {"scheduler_scheduling_algorithm_duration_seconds": (1.0, 100.0)}
    after = {
        "scheduler_scheduling_algorithm_duration_seconds": (1.5, 300.0),
        "scheduler_e2e_scheduling_duration_seconds": (0.0, 0.0),
    }
    assert cycle_means(before, after) == {"scheduling_algorithm": (2.5, 200)}


@pytest.mark.parametrize(
    ("output", "minor"),
    [
        ("Kubernetes v1.20.2\n", 20),
        ("Kubernetes v1.31.0-rc.1", 31),
        ("Kubernetes v0.0.0-master+faecb196815e2", None),  # built without its version stamped
        ("", None),
    ],
)
def test_minor_version_from_version_output(output: str, minor: int | None) -> None:
    assert realk8s.minor_version(output) == minor


@pytest.mark.parametrize(
    ("minor", "api"),
    [(19, "v1beta1"), (21, "v1beta1"), (22, "v1beta2"), (24, "v1beta3"), (25, "v1"), (None, "v1")],
)
def test_scheduler_config_api_is_the_newest_the_version_reads(minor: int | None, api: str) -> None:
    assert realk8s.scheduler_config_api(minor) == f"kubescheduler.config.k8s.io/{api}"


def test_insecure_port_turned_off_only_where_the_fields_exist() -> None:
    assert realk8s.no_insecure_serving("kubescheduler.config.k8s.io/v1beta1") == {
        "healthzBindAddress": "",
        "metricsBindAddress": "",
    }
    assert realk8s.no_insecure_serving("kubescheduler.config.k8s.io/v1beta3") == {}


def test_binary_prefers_the_directory_then_path(tmp_path: pathlib.Path) -> None:
    local = tmp_path / "kube-scheduler"
    local.write_text("#!/bin/sh\n")
    local.chmod(0o755)
    assert realk8s.binary(tmp_path, "kube-scheduler") == str(local)
    assert realk8s.binary(tmp_path, "sh").endswith("/sh")  # not in the directory: PATH's
    with pytest.raises(FileNotFoundError, match="build-kubernetes"):
        realk8s.binary(tmp_path, "no-such-binary-anywhere")
