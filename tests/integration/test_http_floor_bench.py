"""bench/http_floor_bench: every kind of server answers the client's keep-alive PATCHes (the bare
protocol too, whose request framing is the bench's own), and each side's CPU is measured. Asserts
behaviour only, never timings."""

from __future__ import annotations

import datetime
import pathlib

import pytest
from vgpu.localcluster import certs

from bench import http_floor_bench


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", http_floor_bench.SERVERS)
async def test_every_server_answers_a_run_of_keep_alive_patches(kind: str, tmp_path: pathlib.Path) -> None:
    certs.make_serving_certs(tmp_path, now=datetime.datetime.now(datetime.UTC))
    got = await http_floor_bench.measure(kind, requests=300, cert_dir=tmp_path)
    assert got["client_us"] > 0  # this process did the client's work
    assert 0 < got["p50_ms"] <= got["p99_ms"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["app", "app-tls"])
async def test_offloaded_patches_are_made_by_the_helper(kind: str, tmp_path: pathlib.Path) -> None:
    """Through ``OffloadedKubeApi`` (TLS trusted from the CA file in the child too): the helper
    made every request, so it used CPU of its own."""
    certs.make_serving_certs(tmp_path, now=datetime.datetime.now(datetime.UTC))
    got = await http_floor_bench.measure(kind, requests=300, cert_dir=tmp_path, client="offloaded")
    assert got["client_us"] > 0 and got["helper_us"] > 0
    assert 0 < got["p50_ms"] <= got["p99_ms"]


def test_raw_server_answers_only_once_a_request_body_is_complete() -> None:
    """Headers split from their body, and two requests in one segment: one answer per request,
    each sent when that request's body is in."""
    sent: list[bytes] = []

    class Transport:
        def write(self, data: bytes) -> None:
            sent.append(data)

    protocol = http_floor_bench._RawHttp()
    protocol._transport = Transport()  # type: ignore[assignment]
    protocol.data_received(b"PATCH /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
    assert sent == []
    protocol.data_received(b"12345GET /b HTTP/1.1\r\ncontent-length: 0\r\n\r\nPATCH /c HTTP/1.1\r\n")
    assert len(sent) == 2 and all(http_floor_bench.ANSWER in answer for answer in sent)
    protocol.data_received(b"Content-Length: 2\r\n\r\n{}")
    assert len(sent) == 3


def test_requests_below_one_are_refused() -> None:
    with pytest.raises(SystemExit):
        http_floor_bench.parse_args(["--requests", "0"])
