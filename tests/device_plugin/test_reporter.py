"""NodeReporter: register annotation on change / when due, the liveness Lease, clean shutdown."""

import datetime
from typing import Any

import pytest
from vgpu.core import annotations, errors
from vgpu.core.device import Gpu, GpuUuid
from vgpu_device_plugin import reporter

from tests.device_plugin.builders import GPU_A, KEYS, NODE, cluster, notes_of

GPU = Gpu(GpuUuid(GPU_A), 0, 10, 40960, 100, "NVIDIA A100")


class Ticker:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(api, ticker: Ticker, *, init_error: str = "") -> reporter.NodeReporter:
    when = datetime.datetime(2026, 11, 23, 1, 2, 3, 123456, tzinfo=datetime.UTC)
    return reporter.NodeReporter(
        api,
        node=NODE,
        keys=KEYS,
        lease_namespace="kube-system",
        lease_duration_s=40,
        register_interval_s=300,
        clock=lambda: when,
        monotonic=ticker,
        init_error=init_error,
    )


async def test_register_annotation_written_on_change_and_when_due() -> None:
    store, api = cluster()
    ticker = Ticker()
    rep = make(api, ticker)
    assert await rep.publish([GPU])
    assert annotations.decode_node_register(notes_of(store, "nodes", NODE)[KEYS.node_register]) == [GPU]
    assert not await rep.publish([GPU])  # unchanged and not due
    unhealthy = Gpu(GPU.uuid, 0, 10, 40960, 100, "NVIDIA A100", health=False)
    assert await rep.publish([unhealthy])
    assert '"health"' not in notes_of(store, "nodes", NODE)[KEYS.node_register]
    ticker.now += 300
    assert await rep.publish([unhealthy])  # due again: a heartbeat of the inventory


async def test_lease_created_then_renewed_then_released_on_shutdown() -> None:
    store, api = cluster()
    rep = make(api, Ticker())
    await rep.renew_lease()
    lease = store.get("leases", f"vgpu-device-plugin-{NODE}", namespace="kube-system")
    assert lease["spec"] == {
        "holderIdentity": NODE,
        "leaseDurationSeconds": 40,
        "renewTime": "2026-11-23T01:02:03.123456Z",
        "acquireTime": "2026-11-23T01:02:03.123456Z",
    }
    rv = lease["metadata"]["resourceVersion"]
    await rep.renew_lease()
    assert (
        store.get("leases", f"vgpu-device-plugin-{NODE}", namespace="kube-system")["metadata"][
            "resourceVersion"
        ]
        != rv
    )
    await rep.publish([GPU])
    await rep.shutdown([GPU])
    assert store.list("leases", namespace="kube-system").items == []
    (after,) = annotations.decode_node_register(notes_of(store, "nodes", NODE)[KEYS.node_register])
    assert after.health is False
    await rep.shutdown([GPU])  # twice is fine (lease already gone)


class Recording:
    """The API with every Lease call recorded as (verb, resourceVersion sent or None)."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self.calls: list[tuple[str, str | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    async def replace(self, kind: str, body: dict[str, Any], **kw: Any) -> Any:
        self.calls.append(("replace", body["metadata"].get("resourceVersion")))
        return await self._api.replace(kind, body, **kw)

    async def merge_patch(self, kind: str, name: str, patch: dict[str, Any], **kw: Any) -> Any:
        if kind == "leases":
            self.calls.append(("merge_patch", None))
        return await self._api.merge_patch(kind, name, patch, **kw)

    async def create(self, kind: str, body: dict[str, Any], **kw: Any) -> Any:
        self.calls.append(("create", None))
        return await self._api.create(kind, body, **kw)


LEASE = f"vgpu-device-plugin-{NODE}"


async def test_lease_renewed_by_a_put_of_the_one_last_written_as_kubelet_does() -> None:
    """A PUT costs kube-apiserver less than a PATCH; its resourceVersion makes it a compare-and-swap."""
    store, api = cluster()
    recording = Recording(api)
    rep = make(recording, Ticker())
    await rep.renew_lease()  # nothing written yet: the PATCH finds no Lease, so it is created
    created = store.get("leases", LEASE, namespace="kube-system")
    await rep.renew_lease()
    await rep.renew_lease()
    renewed = store.get("leases", LEASE, namespace="kube-system")
    assert recording.calls == [
        ("merge_patch", None),
        ("create", None),
        ("replace", created["metadata"]["resourceVersion"]),
        ("replace", recording.calls[3][1]),
    ]
    assert recording.calls[3][1] != created["metadata"]["resourceVersion"]  # the second PUT's answer
    assert renewed["spec"]["acquireTime"] == created["spec"]["acquireTime"]  # kept, as kubelet keeps it
    assert renewed["spec"]["holderIdentity"] == NODE


@pytest.mark.parametrize("meanwhile", ["written", "deleted"])
async def test_lease_written_or_deleted_by_someone_else_is_still_renewed(meanwhile: str) -> None:
    store, api = cluster()
    recording = Recording(api)
    rep = make(recording, Ticker())
    await rep.renew_lease()
    if meanwhile == "written":  # another writer: our PUT's resourceVersion is stale now
        store.patch("leases", LEASE, {"spec": {"holderIdentity": "someone"}}, namespace="kube-system")
    else:
        store.delete("leases", LEASE, namespace="kube-system")
    recording.calls.clear()
    await rep.renew_lease()
    got = store.get("leases", LEASE, namespace="kube-system")
    assert got["spec"]["holderIdentity"] == NODE
    if meanwhile == "written":
        assert recording.calls == [("replace", recording.calls[0][1]), ("merge_patch", None)]
    else:
        assert recording.calls == [
            ("replace", recording.calls[0][1]),
            ("merge_patch", None),
            ("create", None),
        ]
    recording.calls.clear()
    await rep.renew_lease()  # and the next renewal is a PUT again
    assert [verb for verb, _ in recording.calls] == ["replace"]


async def test_lease_renewal_errors_other_than_conflict_reach_the_caller() -> None:
    """The manager logs a failed renewal and tries at the next tick; nothing is swallowed here."""

    class Refusing(Recording):
        async def replace(self, kind: str, body: dict[str, Any], **kw: Any) -> Any:
            raise errors.KubeError("forbidden", status=403, reason="Forbidden")

    store, api = cluster()
    rep = make(Refusing(api), Ticker())
    await rep.renew_lease()
    with pytest.raises(errors.KubeError, match="forbidden"):
        await rep.renew_lease()
    await rep.renew_lease()  # what it last wrote was forgotten: a PATCH, which the API allows
    assert store.get("leases", LEASE, namespace="kube-system")["spec"]["holderIdentity"] == NODE


async def test_init_error_is_written_beside_an_empty_inventory_and_cleared_when_fine() -> None:
    store, api = cluster()
    failing = make(api, Ticker(), init_error="NVML not available: NVML Shared Library Not Found")
    assert await failing.publish([])
    notes = notes_of(store, "nodes", NODE)
    assert notes[KEYS.node_register] == "[]"
    assert notes[KEYS.node_plugin_error] == "NVML not available: NVML Shared Library Not Found"
    # a later plugin that started fine removes the stale reason
    assert await make(api, Ticker()).publish([GPU])
    assert KEYS.node_plugin_error not in notes_of(store, "nodes", NODE)
