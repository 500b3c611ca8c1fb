"""Headless Chromium driven over the Chrome DevTools Protocol (a websocket, aiohttp's client).

``async with Browser.launch(path, profile_dir) as browser:`` starts Chromium on a free debugging port
(``--remote-debugging-port=0``; the URL is read from the line Chromium prints), and ``await
browser.new_page(width=..., height=...)`` opens a tab. A ``Page`` navigates, evaluates JavaScript
(promises awaited, values returned as JSON) and captures PNG screenshots. Only what the browser
tests need; no new dependency.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

# headless Chromium as root on a machine with no outside network (no background connections)
HEADLESS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
FLAGS = (
    *HEADLESS,
    "--hide-scrollbars",
    "--force-color-profile=srgb",
    "--ignore-certificate-errors",  # the tests' throwaway serving certificates
    "--remote-debugging-port=0",
)
_LISTENING = re.compile(rb"DevTools listening on (ws://\S+)")


class CdpError(Exception):
    """The browser answered a command with an error, or JavaScript threw."""


class Browser:
    def __init__(self, proc: asyncio.subprocess.Process, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._proc = proc
        self._ws = ws
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._waiters: list[tuple[str, str | None, asyncio.Future[dict[str, Any]]]] = []
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="cdp-reader")

    @classmethod
    @contextlib.asynccontextmanager
    async def launch(cls, chromium: str, profile_dir: Path) -> AsyncIterator[Browser]:
        proc = await asyncio.create_subprocess_exec(
            chromium,
            *FLAGS,
            f"--user-data-dir={profile_dir}",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stderr is not None
        drain: asyncio.Task[None] | None = None
        try:
            async with asyncio.timeout(60):
                while not (found := _LISTENING.search(line := await proc.stderr.readline())):
                    if not line:
                        raise CdpError("chromium exited before listening")
            drain = asyncio.create_task(_drain(proc.stderr), name="chromium-stderr")
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(found.group(1).decode(), max_msg_size=0)
                browser = cls(proc, ws)
                try:
                    yield browser
                finally:
                    await browser._close()
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            if drain is not None:
                await drain

    async def _close(self) -> None:
        with contextlib.suppress(CdpError, ConnectionError, TimeoutError):
            async with asyncio.timeout(5):
                await self.send("Browser.close")
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await self._proc.wait()

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            body = json.loads(message.data)
            if "id" in body:
                future = self._replies.pop(body["id"], None)
                if future is not None and not future.done():
                    future.set_result(body)
                continue
            for waiter in list(self._waiters):
                method, session, future = waiter
                if body.get("method") == method and session in (None, body.get("sessionId")):
                    self._waiters.remove(waiter)
                    if not future.done():
                        future.set_result(body.get("params") or {})
        for future in self._replies.values():
            if not future.done():
                future.set_exception(CdpError("the browser closed the connection"))

    async def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> Any:
        """One command; its ``result``, or ``CdpError``."""
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[ident] = future
        body: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            body["sessionId"] = session
        await self._ws.send_str(json.dumps(body))
        reply = await future
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def expect(self, method: str, *, session: str | None = None) -> asyncio.Future[dict[str, Any]]:
        """A future for the next event ``method`` (register before causing it)."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters.append((method, session, future))
        return future

    async def new_page(self, *, width: int, height: int) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        await page.send("Page.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self._browser = browser
        self._session = session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self._browser.send(method, params, session=self._session)

    async def navigate(self, url: str) -> None:
        loaded = self._browser.expect("Page.loadEventFired", session=self._session)
        result = await self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CdpError(f"navigating to {url}: {result['errorText']}")
        await loaded

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` (a promise is awaited); ``CdpError`` if it throws."""
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True}
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise CdpError(str((details.get("exception") or {}).get("description") or details.get("text")))
        return result["result"].get("value")

    async def screenshot(self) -> bytes:
        """The viewport as PNG."""
        result = await self.send("Page.captureScreenshot", {"format": "png"})
        return base64.b64decode(result["data"])


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass
