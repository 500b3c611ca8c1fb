"""A scheduler extender over real HTTP for the kube-scheduler emulation tests, and their fixtures
(``ext``, ``start_scheduler``, re-exported by conftest)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from vgpu.localcluster.scheduler import SchedulerEmulator

Reply = Callable[[dict[str, Any]], Any]


class Extender:
    """A scheduler extender over real HTTP; tests set ``filter_reply``/``bind_reply`` per case."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.url = ""
        self.filter_calls: list[dict[str, Any]] = []
        self.bind_calls: list[dict[str, Any]] = []
        self.preempt_calls: list[dict[str, Any]] = []
        self.filter_reply: Reply = self.pass_all
        self.bind_reply: Reply = self.bind_for_real
        self.preempt_reply: Reply = lambda args: {"NodeNameToMetaVictims": {}}
        self.called = asyncio.Event()
        self.hang = asyncio.Event()  # never set: a handler waiting on it hangs until shutdown

    @staticmethod
    def pass_all(args: dict[str, Any]) -> Any:
        if args["NodeNames"] is not None:
            return {"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""}
        return {"Nodes": args["Nodes"], "FailedNodes": {}, "Error": ""}

    async def bind_for_real(self, args: dict[str, Any]) -> Any:
        await self.api.bind_pod(args["PodNamespace"], args["PodName"], node=args["Node"], uid=args["PodUID"])
        return {"Error": ""}

    async def _answer(self, reply: Reply, args: dict[str, Any]) -> web.StreamResponse:
        self.called.set()
        result = reply(args)
        if asyncio.iscoroutine(result):
            result = await result
        if isinstance(result, web.StreamResponse):
            return result
        return web.json_response(result)

    async def filter(self, request: web.Request) -> web.StreamResponse:
        assert request.content_type == "application/json"
        args = json.loads(await request.read())
        self.filter_calls.append(args)
        return await self._answer(self.filter_reply, args)

    async def bind(self, request: web.Request) -> web.StreamResponse:
        args = json.loads(await request.read())
        self.bind_calls.append(args)
        return await self._answer(self.bind_reply, args)

    async def preempt(self, request: web.Request) -> web.StreamResponse:
        args = json.loads(await request.read())
        self.preempt_calls.append(args)
        return await self._answer(self.preempt_reply, args)


async def serve_extender(api: Any, aiohttp_server: Any, ssl: Any = None) -> Extender:
    extender = Extender(api)
    app = web.Application()
    app.router.add_post("/sched/filter", extender.filter)
    app.router.add_post("/sched/bind", extender.bind)
    app.router.add_post("/sched/preempt", extender.preempt)
    server = await aiohttp_server(app, ssl=ssl)
    extender.url = str(server.make_url("/sched"))
    return extender


@pytest.fixture
async def ext(api, aiohttp_server):
    return await serve_extender(api, aiohttp_server)


def config(url: str, **entry: Any) -> dict[str, Any]:
    base = {
        "urlPrefix": url,
        "filterVerb": "filter",
        "nodeCacheCapable": True,
        "httpTimeout": "5s",
        "managedResources": [
            {"name": "nvidia.com/gpu", "ignoredByScheduler": True},
            {"name": "nvidia.com/gpumem", "ignoredByScheduler": True},
        ],
    }
    base.update(entry)
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "extenders": [base],
    }


@pytest.fixture
async def start_scheduler(api, status_writer, running):
    started: list[SchedulerEmulator] = []

    def start(
        scheduler_config: dict[str, Any] | None, *, backoff_s: float = 0.05, version: str = "1.36"
    ) -> SchedulerEmulator:
        sched = SchedulerEmulator(
            api,
            scheduler_config=scheduler_config,
            scheduler_name="vgpu-scheduler",
            status_writer=status_writer,
            initial_backoff_s=backoff_s,
            max_backoff_s=max(backoff_s, 0.2),
            version=version,
        )
        running(sched.run())
        started.append(sched)
        return sched

    yield start
    for sched in started:
        await sched.stop()


def bound(pod: dict[str, Any]) -> bool:
    return bool(pod["spec"].get("nodeName"))


def unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False"
        for c in pod.get("status", {}).get("conditions", [])
    )
