"""The throughput bench's HAMi pod search (``bench.throughput_hamisearch.HamiSearchAllocator._pending_pod``)
called directly against canned API answers: which pod it takes, and which reads it makes."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from vgpu.core import errors
from vgpu.kube.port import JsonObj, ObjectList
from vgpu_device_plugin.hostfs import HostFs

from bench.throughput_hamisearch import HamiSearchAllocator
from tests.device_plugin.builders import KEYS, NODE, config

LOCK_TIME = "2026-11-23T01:00:00Z"


def pod(
    namespace: str,
    name: str,
    *,
    phase: str = "Pending",
    bind_phase: str | None = "allocating",
    bind_time: str | None = "100",
    node: str | None = NODE,
) -> JsonObj:
    """A pod on NODE that HAMi's search takes, unless a keyword says otherwise (None: no annotation)."""
    notes = {
        key: value
        for key, value in (
            (KEYS.bind_phase, bind_phase),
            (KEYS.bind_time, bind_time),
            (KEYS.assigned_node, node),
        )
        if value is not None
    }
    return {
        "metadata": {"namespace": namespace, "name": name, "annotations": notes},
        "spec": {"nodeName": NODE},
        "status": {"phase": phase},
    }


class CannedApi:
    """The API server's answers, given up front: the node, the pods a GET finds, the LIST's items
    (in the order given: the API server's). Records every call."""

    def __init__(self, *, lock: str | None, pods: list[JsonObj]) -> None:
        notes = {} if lock is None else {KEYS.node_lock: lock}
        self.node: JsonObj = {"metadata": {"name": NODE, "annotations": notes}}
        self.pods = pods
        self.calls: list[tuple[str, ...]] = []

    async def get(self, kind: str, name: str, *, namespace: str | None = None) -> JsonObj:
        self.calls.append(("get", kind, namespace or "", name))
        if kind == "nodes" and name == NODE:
            return self.node
        for p in self.pods if kind == "pods" else []:
            if (p["metadata"]["namespace"], p["metadata"]["name"]) == (namespace, name):
                return p
        raise errors.NotFound(f"{kind} {namespace}/{name} not found", status=404)

    async def list(self, kind: str, **selectors: Any) -> ObjectList:
        assert (kind, selectors) == ("pods", {"field_selector": f"spec.nodeName={NODE}"})
        self.calls.append(("list", kind))
        return ObjectList(items=self.pods, resource_version="7")


class NoView:
    """The plugin's watch caches: HAMi's search reads the API server, never these."""

    def pods(self) -> list[JsonObj]:
        raise AssertionError("read the watch caches")

    def pod(self, namespace: str, name: str) -> JsonObj | None:
        raise AssertionError("read the watch caches")

    def node(self) -> JsonObj | None:
        raise AssertionError("read the watch caches")


async def search(api: CannedApi, tmp_path: pathlib.Path) -> JsonObj | None:
    cfg = config()
    allocator = HamiSearchAllocator(
        api=api,  # type: ignore[arg-type]  # get and list are all the search calls
        view=NoView(),
        node=NODE,
        config=cfg,
        keys=KEYS,
        refs={},
        host=HostFs(tmp_path, hook_path=cfg.hook_path),
    )
    return await allocator._pending_pod()


def name_of(found: JsonObj | None) -> str | None:
    return None if found is None else f"{found['metadata']['namespace']}/{found['metadata']['name']}"


GET_NODE = ("get", "nodes", "", NODE)
LIST = ("list", "pods")
# with no lock, each of these would be taken but for one thing; "z/match" comes after them
NEAR_MISSES = {
    "not-pending": pod("a", "running", phase="Running"),
    "no-bind-time": pod("a", "no-bind-time", bind_time=None),
    "bind-phase-failed": pod("a", "failed", bind_phase="failed"),
    "no-bind-phase": pod("a", "no-bind-phase", bind_phase=None),
    "other-node": pod("a", "other-node", node="gpu-node-2"),
    "no-vgpu-node": pod("a", "no-vgpu-node", node=None),
}


async def test_a_lock_gives_its_holder_whatever_its_phase(tmp_path: pathlib.Path) -> None:
    holder = pod("b", "holder", phase="Running", bind_phase="success")
    api = CannedApi(lock=f"{LOCK_TIME},b,holder", pods=[pod("a", "match"), holder])
    assert await search(api, tmp_path) is holder  # what the API server answered, as it answered it
    assert api.calls == [GET_NODE, ("get", "pods", "b", "holder")]  # no LIST


async def test_a_lock_whose_holder_is_gone_finds_no_pod(tmp_path: pathlib.Path) -> None:
    api = CannedApi(lock=f"{LOCK_TIME},b,gone", pods=[pod("a", "match")])
    assert await search(api, tmp_path) is None
    assert api.calls == [GET_NODE, ("get", "pods", "b", "gone")]  # no LIST


@pytest.mark.parametrize(
    "lock",
    [
        "not-a-time",
        "not-a-time,b,holder",
        "not-a-time,,",  # HAMi still parses the time of a lock without a holder
        f"{LOCK_TIME},b",
        f"{LOCK_TIME},b,holder,x",
    ],
    ids=["bare-garbage", "bad-time", "bad-time-no-holder", "two-parts", "four-parts"],
)
async def test_an_unparseable_lock_finds_no_pod(tmp_path: pathlib.Path, lock: str) -> None:
    api = CannedApi(lock=lock, pods=[pod("a", "match"), pod("b", "holder")])
    assert await search(api, tmp_path) is None
    assert api.calls == [GET_NODE]


@pytest.mark.parametrize(
    "lock",
    [None, LOCK_TIME, f"{LOCK_TIME},,", f"{LOCK_TIME},b,", f"{LOCK_TIME},,holder"],
    ids=["no-lock", "legacy", "empty-namespace-and-name", "empty-name", "empty-namespace"],
)
async def test_without_a_holder_named_the_node_s_pods_are_listed(
    tmp_path: pathlib.Path, lock: str | None
) -> None:
    api = CannedApi(lock=lock, pods=[pod("b", "holder", phase="Running"), pod("c", "match")])
    assert name_of(await search(api, tmp_path)) == "c/match"
    assert api.calls == [GET_NODE, LIST]  # no GET of a pod, with an empty name or any other


async def test_the_list_s_first_match_is_taken_not_the_oldest_bind(tmp_path: pathlib.Path) -> None:
    api = CannedApi(
        lock=None,
        pods=[
            *NEAR_MISSES.values(),
            pod("b", "z-newer", bind_time="300"),
            pod("c", "a-older", bind_time="100"),
        ],
    )
    assert name_of(await search(api, tmp_path)) == "b/z-newer"


@pytest.mark.parametrize("miss", list(NEAR_MISSES), ids=list(NEAR_MISSES))
async def test_a_near_miss_is_skipped(tmp_path: pathlib.Path, miss: str) -> None:
    api = CannedApi(lock=None, pods=[NEAR_MISSES[miss], pod("z", "match")])
    assert name_of(await search(api, tmp_path)) == "z/match"


@pytest.mark.parametrize("bind_phase", ["allocating", "success"])
async def test_both_bind_phases_are_taken(tmp_path: pathlib.Path, bind_phase: str) -> None:
    api = CannedApi(lock=None, pods=[pod("a", "only", bind_phase=bind_phase)])
    assert name_of(await search(api, tmp_path)) == "a/only"


async def test_no_match_finds_no_pod(tmp_path: pathlib.Path) -> None:
    api = CannedApi(lock=None, pods=list(NEAR_MISSES.values()))
    assert await search(api, tmp_path) is None
