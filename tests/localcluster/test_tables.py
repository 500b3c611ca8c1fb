"""Server-side printing (``tables``): the columns and cells kubectl prints for a real kube-apiserver."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from vgpu.localcluster import tables

NOW = datetime.datetime(2027, 1, 15, 8, 0, 0, tzinfo=datetime.UTC)
T0 = "2027-01-15T07:55:00Z"  # five minutes before NOW


@pytest.mark.parametrize(
    ("accept", "version"),
    [
        ("application/json;as=Table;v=v1;g=meta.k8s.io", "v1"),
        # what kubectl sends: the Table versions it knows, then plain JSON
        (
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,"
            "application/json",
            "v1",
        ),
        ("application/json; as=Table; v=v1beta1; g=meta.k8s.io", "v1beta1"),
        ("application/json;as=Table;v=v2;g=meta.k8s.io,application/json;as=Table;v=v1;g=meta.k8s.io", "v1"),
        ("application/json", None),
        ("application/json, application/json;as=Table;v=v1;g=meta.k8s.io", None),  # JSON first
        ("*/*", None),
        ("", None),
        ("application/yaml,application/json;as=Table;v=v1;g=meta.k8s.io", "v1"),  # YAML we do not speak
        ("application/json;as=Table;v=v1;g=other.io", None),
        ("application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io", None),
        (";;;,,,=;as", None),  # garbage
        ("application/json;as;v;g", None),
    ],
)
def test_the_accept_header_picks_the_table_version(accept: str, version: str | None) -> None:
    assert tables.table_version(accept) == version


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (302, "5m2s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 600, "3h10m"),
        (30 * 3600, "30h"),
        (50 * 3600, "2d2h"),
        (8 * 86400, "8d"),
        (400 * 86400, "400d"),
        (3 * 365 * 86400 + 86400, "3y1d"),
        (10 * 365 * 86400, "10y"),
    ],
)
def test_ages_read_as_kubectl_prints_them(seconds: float, shown: str) -> None:
    assert tables.human_duration(seconds) == shown


def cells(plural: str, obj: dict[str, Any]) -> list[Any]:
    table = tables.table(plural, [obj], kind="X", api_version="v1", resource_version="7", now=NOW)
    [row] = table["rows"]
    return list(row["cells"])


def header(plural: str) -> list[tuple[str, int]]:
    table = tables.table(plural, [], kind="X", api_version="v1", resource_version="7", now=NOW)
    return [(c["name"], c["priority"]) for c in table["columnDefinitions"]]


def test_the_columns_of_a_real_server() -> None:
    assert header("pods") == [
        ("Name", 0),
        ("Ready", 0),
        ("Status", 0),
        ("Restarts", 0),
        ("Age", 0),
        ("IP", 1),
        ("Node", 1),
        ("Nominated Node", 1),
        ("Readiness Gates", 1),
    ]
    assert [n for n, p in header("nodes") if p == 0] == ["Name", "Status", "Roles", "Age", "Version"]
    assert [n for n, p in header("events") if p == 0] == ["Last Seen", "Type", "Reason", "Object", "Message"]
    assert header("leases") == [("Name", 0), ("Holder", 0), ("Age", 0)]
    assert header("namespaces") == [("Name", 0), ("Status", 0), ("Age", 0)]
    assert header("priorityclasses") == [("Name", 0), ("Created At", 0)]  # upstream's default


RUNNING = {"running": {"startedAt": T0}}


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        pytest.param(
            {"status": {"phase": "Pending"}, "spec": {"containers": [{}, {}]}},
            ["0/2", "Pending", 0],
            id="pending",
        ),
        pytest.param(
            {
                "spec": {"containers": [{}]},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [{"ready": True, "restartCount": 2, "state": RUNNING}],
                },
            },
            ["1/1", "Running", 2],
            id="running",
        ),
        pytest.param(
            {
                "spec": {"containers": [{}]},
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}],
                },
            },
            ["0/1", "ContainerCreating", 0],
            id="waiting",
        ),
        pytest.param(
            {
                "spec": {"containers": [{}]},
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [{"state": {"terminated": {"exitCode": 3}}}],
                },
            },
            ["0/1", "ExitCode:3", 0],
            id="exit-code",
        ),
        pytest.param(
            {
                "spec": {"containers": [{}]},
                "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"},
            },
            ["0/1", "UnexpectedAdmissionError", 0],
            id="status-reason",
        ),
        pytest.param(
            {
                "metadata": {"deletionTimestamp": T0},
                "spec": {"containers": [{}]},
                "status": {"phase": "Running"},
            },
            ["0/1", "Terminating", 0],
            id="terminating",
        ),
        pytest.param({"spec": "garbage", "status": ["x"]}, ["0/0", "", 0], id="garbage"),
    ],
)
def test_pod_status_column(pod: dict[str, Any], want: list[Any]) -> None:
    obj = {"metadata": {"name": "p", "creationTimestamp": T0, **pod.pop("metadata", {})}, **pod}
    row = cells("pods", obj)
    assert row[0] == "p" and row[1:4] == want and row[4] == "5m"


def test_pod_wide_columns() -> None:
    pod = {
        "metadata": {"name": "p", "creationTimestamp": "not a time"},
        "spec": {"nodeName": "n1", "containers": [{}], "readinessGates": [{"conditionType": "x"}]},
        "status": {
            "podIP": "10.0.0.9",
            "nominatedNodeName": "n2",
            "conditions": [{"type": "x", "status": "True"}],
        },
    }
    assert cells("pods", pod)[4:] == ["<unknown>", "10.0.0.9", "n1", "n2", "1/1"]
    assert cells("pods", {"metadata": {"name": "q"}})[4:] == [
        "<unknown>",
        "<none>",
        "<none>",
        "<none>",
        "<none>",
    ]


def test_node_row() -> None:
    node = {
        "metadata": {"name": "n1", "creationTimestamp": T0, "labels": {"node-role.kubernetes.io/gpu": ""}},
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "10.1.1.1"}],
            "nodeInfo": {"kubeletVersion": "v1.30.0", "osImage": "Ubuntu"},
        },
    }
    assert cells("nodes", node) == [
        "n1",
        "Ready,SchedulingDisabled",
        "gpu",
        "5m",
        "v1.30.0",
        "10.1.1.1",
        "<none>",
        "Ubuntu",
        "<unknown>",
        "<unknown>",
    ]
    assert cells("nodes", {"metadata": {"name": "n2"}, "status": {"conditions": "x"}})[1:3] == [
        "Unknown",
        "<none>",
    ]


def test_event_row() -> None:
    event = {
        "metadata": {"name": "p.1"},
        "involvedObject": {"kind": "Pod", "name": "p", "fieldPath": "spec.containers{c}"},
        "type": "Warning",
        "reason": "FailedScheduling",
        "message": " 0/3 nodes are available \n",
        "source": {"component": "default-scheduler"},
        "firstTimestamp": "2027-01-15T07:00:00Z",
        "lastTimestamp": T0,
        "count": 4,
    }
    assert cells("events", event) == [
        "5m",
        "Warning",
        "FailedScheduling",
        "pod/p",
        "spec.containers{c}",
        "default-scheduler",
        "0/3 nodes are available",
        "60m",
        4,
        "p.1",
    ]
    # an events.k8s.io-style singleton: no count, only eventTime, the reporting controller
    single = {
        "metadata": {"name": "e"},
        "eventTime": T0,
        "reportingComponent": "vgpu",
        "reportingInstance": "h",
    }
    assert cells("events", single) == ["5m", "", "", "", "", "vgpu, h", "", "5m", 1, "e"]


def test_lease_and_namespace_rows_and_the_default() -> None:
    lease = {"metadata": {"name": "l", "creationTimestamp": T0}, "spec": {"holderIdentity": "node-a"}}
    assert cells("leases", lease) == ["l", "node-a", "5m"]
    namespace = {"metadata": {"name": "ns", "creationTimestamp": T0}, "status": {"phase": "Active"}}
    assert cells("namespaces", namespace) == ["ns", "Active", "5m"]
    assert cells("priorityclasses", {"metadata": {"name": "high", "creationTimestamp": T0}}) == ["high", T0]


@pytest.mark.parametrize(
    ("include", "want"),
    [
        (
            "Metadata",
            {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "l"}},
        ),
        ("Object", {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", "metadata": {"name": "l"}}),
        ("None", None),
    ],
)
def test_each_row_carries_the_object_as_asked(include: str, want: dict[str, Any] | None) -> None:
    table = tables.table(
        "leases",
        [{"metadata": {"name": "l"}}],
        kind="Lease",
        api_version="coordination.k8s.io/v1",
        resource_version="9",
        now=NOW,
        include_object=include,
    )
    assert (table["kind"], table["apiVersion"], table["metadata"]) == (
        "Table",
        "meta.k8s.io/v1",
        {"resourceVersion": "9"},
    )
    assert table["rows"][0].get("object") == want
