"""NodeReporter: register annotation on change / when due, the liveness Lease, clean shutdown."""

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Coroutine
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


def make(
    api, ticker: Ticker, *, init_error: str = "", settle_timeout_s: float = 10.0
) -> reporter.NodeReporter:
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
        settle_timeout_s=settle_timeout_s,
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


class HeldOnce:
    """The API as the official adapter behaves (``threads.CallPool``): a call a worker has started
    reaches the server even when its caller is cancelled. The first ``held`` call ((verb, kind))
    reaches it only on ``release()``; every other call at once."""

    def __init__(self, api: Any, held: tuple[str, str]) -> None:
        self._api = api
        self._held = held
        self.sent = asyncio.Event()
        self._arrive = asyncio.Event()
        self._on_its_way: asyncio.Task[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    async def _send(self, verb: str, kind: str, call: Callable[[], Awaitable[Any]]) -> Any:
        if (verb, kind) != self._held or self.sent.is_set():
            return await call()
        self.sent.set()

        async def on_its_way() -> Any:
            await self._arrive.wait()
            return await call()

        self._on_its_way = asyncio.create_task(on_its_way())
        return await asyncio.shield(self._on_its_way)  # a cancelled caller does not stop it

    async def merge_patch(self, kind: str, name: str, patch: dict[str, Any], **kw: Any) -> Any:
        return await self._send("merge_patch", kind, lambda: self._api.merge_patch(kind, name, patch, **kw))

    async def create(self, kind: str, body: dict[str, Any], **kw: Any) -> Any:
        return await self._send("create", kind, lambda: self._api.create(kind, body, **kw))

    async def release(self) -> None:
        self._arrive.set()
        assert self._on_its_way is not None
        await asyncio.gather(self._on_its_way, return_exceptions=True)


async def run_ready_tasks(turns: int = 50) -> None:
    """Bounded loop turns, no timed sleep: every ready task goes as far as it can without waiting."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def abandon(call: Coroutine[Any, Any, Any], slow: HeldOnce) -> None:
    """Start ``call`` and cancel it once its held API call is on its way (a SIGTERM mid-write)."""
    task = asyncio.create_task(call)
    await slow.sent.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_shutdown_waits_for_the_register_write_a_cancelled_publisher_left_in_flight() -> None:
    """SIGTERM mid-PATCH: the publishing loop is cancelled but its 'healthy' PATCH is still on its
    way; shutdown's 'unhealthy' PATCH must land after it, or the node says healthy after the stop."""
    store, api = cluster()
    slow = HeldOnce(api, ("merge_patch", "nodes"))
    rep = make(slow, Ticker())
    await abandon(rep.publish([GPU]), slow)
    stopping = asyncio.create_task(rep.shutdown([GPU]))
    await run_ready_tasks()  # shutdown goes as far as it may while the old PATCH is on its way
    await slow.release()  # the old PATCH reaches the server now
    await stopping
    (after,) = annotations.decode_node_register(notes_of(store, "nodes", NODE)[KEYS.node_register])
    assert after.health is False


async def test_shutdown_waits_for_a_lease_renewal_left_in_flight_before_the_delete() -> None:
    """A cancelled renewal's create still on its way must not re-create the Lease after the DELETE."""
    store, api = cluster()
    slow = HeldOnce(api, ("create", "leases"))
    rep = make(slow, Ticker())
    await abandon(rep.renew_lease(), slow)  # no Lease yet: PATCH NotFound, then create
    stopping = asyncio.create_task(rep.shutdown([GPU]))
    await run_ready_tasks()
    await slow.release()
    await stopping
    assert store.list("leases", namespace="kube-system").items == []


async def test_shutdown_waits_for_a_call_left_in_flight_only_so_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, api = cluster()
    slow = HeldOnce(api, ("merge_patch", "nodes"))
    rep = make(slow, Ticker(), settle_timeout_s=0)
    await abandon(rep.publish([GPU]), slow)
    await rep.shutdown([GPU])  # the old PATCH never arrives: the stop goes on without it
    assert "the register annotation write in flight is still running after 0 s" in caplog.text
    assert store.list("leases", namespace="kube-system").items == []
    await slow.release()


async def test_an_abandoned_write_that_fails_is_logged_and_the_next_write_still_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing(HeldOnce):
        async def merge_patch(self, kind: str, name: str, patch: dict[str, Any], **kw: Any) -> Any:
            async def refused() -> Any:
                raise errors.KubeError("server unavailable", status=503, reason="ServiceUnavailable")

            if self.sent.is_set():
                return await self._api.merge_patch(kind, name, patch, **kw)
            return await self._send("merge_patch", kind, refused)

    store, api = cluster()
    slow = Failing(api, ("merge_patch", "nodes"))
    rep = make(slow, Ticker())
    await abandon(rep.publish([GPU]), slow)
    await slow.release()
    assert await rep.publish([GPU])
    assert "the register annotation write left in flight failed: server unavailable" in caplog.text
    assert annotations.decode_node_register(notes_of(store, "nodes", NODE)[KEYS.node_register]) == [GPU]


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
