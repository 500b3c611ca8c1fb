"""A minimal kubelet device manager for tests: Registration on kubelet.sock, then it dials the
plugin, asks its options, and consumes ListAndWatch into a queue (as kubelet does, docs/protocol.md#how-kubelet-uses-them)."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib

import grpc
from vgpu.kubeletapi.v1beta1 import api_pb2, api_pb2_grpc


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin_dir: pathlib.Path, *, watch: bool = True) -> None:
        """``watch``: open ListAndWatch after a Register (kubelet does); ``reject``: resource names
        whose Register fails (as kubelet answers a name it refuses)."""
        self.plugin_dir = plugin_dir
        self.watch = watch
        self.reject: set[str] = set()
        self.rejected: list[str] = []
        self.registrations: list[api_pb2.RegisterRequest] = []
        self.options: list[api_pb2.DevicePluginOptions] = []
        self.lists: asyncio.Queue[list[tuple[str, str]]] = asyncio.Queue()
        self.stream_ended = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._channels: list[grpc.aio.Channel] = []
        self._registered = asyncio.Condition()

    @property
    def socket(self) -> pathlib.Path:
        return self.plugin_dir / "kubelet.sock"

    async def start(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for channel in self._channels:
            await channel.close(None)
        self._channels.clear()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def restart(self) -> None:
        """What a kubelet restart looks like to a plugin: connections die, the dir is wiped."""
        await self.stop()
        for path in self.plugin_dir.iterdir():
            if not path.is_dir():
                path.unlink()
        await self.start()

    async def Register(self, request, context):
        if request.resource_name in self.reject:
            self.rejected.append(request.resource_name)
            await context.abort(
                grpc.StatusCode.UNKNOWN, f'the ResourceName "{request.resource_name}" is invalid'
            )
        self.registrations.append(request)
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}")
        self._channels.append(channel)
        stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        self.options.append(await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5))
        if self.watch:
            task = asyncio.create_task(self._consume(stub))
            self._tasks.add(task)
        async with self._registered:
            self._registered.notify_all()
        return api_pb2.Empty()

    async def _consume(self, stub: api_pb2_grpc.DevicePluginStub) -> None:
        try:
            async for response in stub.ListAndWatch(api_pb2.Empty()):
                await self.lists.put([(d.ID, d.health) for d in response.devices])
        except grpc.aio.AioRpcError:
            pass
        self.stream_ended.set()

    async def wait_registrations(self, count: int, timeout_s: float = 10.0) -> None:
        async with self._registered:
            await asyncio.wait_for(
                self._registered.wait_for(lambda: len(self.registrations) >= count), timeout_s
            )

    async def next_list(self, timeout_s: float = 10.0) -> list[tuple[str, str]]:
        return await asyncio.wait_for(self.lists.get(), timeout_s)

    async def call(self, endpoint: str):
        """A fresh stub to the plugin at ``endpoint`` (caller closes the channel)."""
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        return channel, api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
