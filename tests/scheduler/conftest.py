"""Fixtures: a started local cluster with the real extender answering over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.scheduler.scenario import Cluster


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    c.add_node("node-a")
    c.add_node("node-b")
    await c.start()
    yield c
    await c.stop()
