"""``/filter``'s body cap is sized as kube-scheduler sends (issue 49, item 8).

With ``nodeCacheCapable`` (the chart's setting) a ``/filter`` body is the pod plus a name per node:
3 MiB + 256 bytes per node (``--extender-max-nodes``), about 4.2 MiB at 5,000 nodes. Before, the cap was
that of whole Node objects in either mode (83 MiB), so a 60 MiB body was read and parsed (4.4 s,
1.6 GB) before it was refused. A body announced over the cap is 413 before any of it is read; a
large body that cannot be ExtenderArgs is 400 before it is parsed.
"""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc
from collections.abc import AsyncIterator

import pytest
from vgpu import gcfreeze
from vgpu.core import errors
from vgpu_scheduler import bodies, limits, routes

from tests.scheduler.scenario import Cluster
from tests.scheduler.test_extender_http import read_response

MIB = 1 << 20


@pytest.fixture
async def extender() -> AsyncIterator[tuple[str, int]]:
    c = Cluster()
    c.add_node("node-a")
    await c.start()
    try:
        assert c.service is not None
        host, port = c.service.extender_address.rsplit(":", 1)
        yield host, int(port)
    finally:
        await c.stop()


def test_the_cap_follows_what_kube_scheduler_sends() -> None:
    names = limits.ListenerLimits.build(max_connections=256, max_nodes=5000)
    objects = limits.ListenerLimits.build(max_connections=256, max_nodes=5000, node_objects=True)
    assert names.filter_max_body_bytes == 3 * MIB + 5000 * 256  # about 4.2 MiB
    assert objects.filter_max_body_bytes == 3 * MIB + 5000 * 16 * 1024  # whole Node objects
    # the largest name the API server takes, as Go's encoder writes it in NodeNames, fits its share
    name = "a" * 253
    go = json.JSONEncoder(separators=(",", ":"))  # as Go writes it
    assert len(go.encode([name, name])) - len(go.encode([name])) <= limits.NODE_NAME_MAX_BYTES
    assert limits.ListenerLimits().filter_max_body_bytes == names.filter_max_body_bytes


async def test_a_body_announced_over_the_cap_is_413_before_it_is_sent(extender: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*extender)
    started = time.perf_counter()
    writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (10 * MIB))
    response = await read_response(reader)  # no byte of the body sent
    assert response.status == 413 and time.perf_counter() - started < 2.0
    assert b"over the" in response.body
    writer.close()


async def test_a_60_mib_body_is_refused_without_reading_it(extender: tuple[str, int]) -> None:
    before = gcfreeze.rss_bytes()
    reader, writer = await asyncio.open_connection(*extender)
    writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (60 * MIB))
    chunk = b'{"Pod":' + b" " * (MIB - 7)

    async def send() -> None:
        for _ in range(60):
            writer.write(chunk)
            await writer.drain()  # blocks once the server no longer reads

    sending = asyncio.create_task(send())
    started = time.perf_counter()
    response = await read_response(reader)
    elapsed_s = time.perf_counter() - started
    sending.cancel()
    await asyncio.gather(sending, return_exceptions=True)
    writer.transport.abort()
    after = gcfreeze.rss_bytes()
    assert response.status == 413 and elapsed_s < 2.0
    assert before is not None and after is not None and after - before < 16 * MIB


def _node_object(i: int) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"gpu-node-{i:05d}",
            "labels": {"kubernetes.io/hostname": f"gpu-node-{i:05d}", "gpu": "on"},
            "annotations": {"hami.io/node-nvidia-register": '[{"id":"GPU-0","count":10,"devmem":40960}]'},
        },
        "spec": {"podCIDR": "10.0.0.0/24", "taints": []},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "images": [{"names": ["registry/image:tag"], "sizeBytes": 123456}],
            "allocatable": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "10"},
        },
    }


POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            json.dumps({"Pod": POD, "Nodes": None, "NodeNames": [f"node-{i:06d}" for i in range(100_000)]}),
            id="100000-node-names",
        ),
        pytest.param(
            json.dumps(
                {"Pod": POD, "Nodes": {"items": [_node_object(i) for i in range(3000)]}, "NodeNames": None}
            ),
            id="3000-node-objects",
        ),
    ],
)
def test_large_bodies_kube_scheduler_sends_pass_the_precheck(body: str) -> None:
    data = body.encode()
    assert len(data) > bodies.PRECHECK_BYTES
    assert bodies.cannot_be_extender_args(data) is None


def test_bodies_up_to_the_precheck_size_are_parsed_as_they_come() -> None:
    small = b"[" + b"{}," * (bodies.PRECHECK_BYTES // 3 - 1) + b"{}]"
    assert len(small) <= bodies.PRECHECK_BYTES and bodies.cannot_be_extender_args(small) is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(
            b"[" + b"{}," * (2 * MIB // 3) + b"{}]", "not a JSON object", id="array-of-empty-objects"
        ),
        pytest.param(b'"' + b"x" * (2 * MIB) + b'"', "not a JSON object", id="one-long-string"),
        pytest.param(
            b'{"Pod":{},"x":[' + b"[]," * (2 * MIB // 3) + b"[]]}", "objects and arrays", id="nested-arrays"
        ),
        pytest.param(
            b'{"Pod":' + b'{"a":' * 250_000 + b"1" + b"}" * 250_001, "objects and arrays", id="deep-nesting"
        ),
    ],
)
def test_a_large_body_that_cannot_be_extender_args_is_refused_unparsed(body: bytes, reason: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(errors.ParseError, match=reason):
            routes.parse_json(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024  # before: the parse built the whole document (25 times the body for `{}`)


async def test_the_refusal_is_a_400_through_the_listener(extender: tuple[str, int]) -> None:
    body = b'{"Pod":{},"x":[' + b"[]," * (2 * MIB // 3) + b"[]]}"
    reader, writer = await asyncio.open_connection(*extender)
    writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    response = await read_response(reader)
    assert response.status == 400 and b"objects and arrays" in response.body
    writer.close()
