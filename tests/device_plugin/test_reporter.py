"""NodeReporter: register annotation on change / when due, the liveness Lease, clean shutdown."""

import datetime

from vgpu.core import annotations
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
