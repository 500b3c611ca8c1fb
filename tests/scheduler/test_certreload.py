"""Rotated serving certificates are used by new handshakes without a restart; a pair that does not
load (a certificate written before its key, a truncated or foreign key) leaves the old pair serving
and is logged once until the files change again (issue 49, item 2)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import pathlib
import ssl
from collections.abc import Callable

import pytest
from cryptography import x509
from vgpu.localcluster import certs
from vgpu_scheduler import certreload
from vgpu_scheduler.app import SchedulerService
from vgpu_scheduler.certreload import CertReloader

from tests.scheduler.scenario import Cluster

NOW = datetime.datetime(2026, 11, 23, tzinfo=datetime.UTC)


async def presented_serial(host: str, port: int) -> int:
    """The serial number of the certificate the server at ``host:port`` presents in a handshake."""
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    _reader, writer = await asyncio.open_connection(host, port, ssl=client)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


async def served_serial(context: ssl.SSLContext) -> int:
    """The serial number of the certificate a real TLS handshake with ``context`` presents."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    try:
        return await presented_serial("127.0.0.1", server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


def touch(path: pathlib.Path) -> None:
    """A distinct mtime even on coarse clocks."""
    stamp = path.stat().st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


def rotate(tmp_path: pathlib.Path, live: certs.ServingCerts, name: str) -> int:
    """Write a new pair over the live files (as a Secret update does); return the new serial."""
    fresh = certs.make_serving_certs(tmp_path / name, now=NOW)
    os.replace(fresh.cert_file, live.cert_file)
    os.replace(fresh.key_file, live.key_file)
    touch(live.cert_file)
    return x509.load_pem_x509_certificate(live.cert_file.read_bytes()).serial_number


async def test_new_handshakes_use_the_rotated_certificate(tmp_path: pathlib.Path) -> None:
    live = certs.make_serving_certs(tmp_path / "live", now=NOW)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(live.cert_file, live.key_file)
    reloader = CertReloader(context, live.cert_file, live.key_file)
    first = await served_serial(reloader.context)
    assert not reloader.check()  # nothing changed
    second = rotate(tmp_path, live, "rotated")
    assert second != first
    assert reloader.check()
    assert await served_serial(reloader.context) == second
    assert not reloader.check()


async def test_a_broken_pair_keeps_the_old_certificate(tmp_path: pathlib.Path) -> None:
    live = certs.make_serving_certs(tmp_path / "live", now=NOW)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(live.cert_file, live.key_file)
    reloader = CertReloader(context, live.cert_file, live.key_file)
    first = await served_serial(reloader.context)
    other = certs.make_serving_certs(tmp_path / "other", now=NOW)
    os.replace(other.key_file, live.key_file)  # a key that does not match the certificate
    touch(live.key_file)
    assert not reloader.check()
    assert await served_serial(reloader.context) == first
    live.key_file.unlink()  # a missing file is not a reload either
    assert not reloader.check()


def _cert_before_key(tmp_path: pathlib.Path, live: certs.ServingCerts) -> None:
    other = certs.make_serving_certs(tmp_path / "next", now=NOW)
    os.replace(other.cert_file, live.cert_file)  # the key is not written yet
    touch(live.cert_file)


def _truncated_key(_: pathlib.Path, live: certs.ServingCerts) -> None:
    data = live.key_file.read_bytes()
    live.key_file.write_bytes(data[: len(data) // 2])
    touch(live.key_file)


def _garbage_cert(_: pathlib.Path, live: certs.ServingCerts) -> None:
    live.cert_file.write_bytes(b"-----BEGIN CERTIFICATE-----\n\x00\xff not base64\n")
    touch(live.cert_file)


BROKEN = [
    pytest.param(_cert_before_key, id="certificate-written-before-its-key"),
    pytest.param(_truncated_key, id="truncated-key"),
    pytest.param(_garbage_cert, id="garbage-certificate"),
]


@pytest.mark.parametrize("breaks", BROKEN)
async def test_the_service_port_keeps_serving_the_old_pair_when_the_new_one_does_not_load(
    tmp_path: pathlib.Path,
    breaks: Callable[[pathlib.Path, certs.ServingCerts], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    live = certs.make_serving_certs(tmp_path / "live", now=NOW)
    context = certreload.server_context(live.cert_file, live.key_file)
    cluster = Cluster()
    service = SchedulerService(cluster.config, cluster.api)
    address = await service.start(host="127.0.0.1", port=0, ssl_context=context)
    host, port = address.rsplit(":", 1)
    reloader = CertReloader(context, live.cert_file, live.key_file)
    reloader.on_reload = service.use_ssl_context
    try:
        first = await presented_serial(host, int(port))
        second = rotate(tmp_path, live, "rotated")
        assert reloader.check()
        assert await presented_serial(host, int(port)) == second != first  # the listener switched
        with caplog.at_level(logging.ERROR, logger=certreload.__name__):
            breaks(tmp_path, live)
            assert not reloader.check()
            for _ in range(3):  # every 30 s in the binary: one line, not one per check
                assert not reloader.check()
                assert await presented_serial(host, int(port)) == second
        [line] = [r.getMessage() for r in caplog.records]
        assert "does not load" in line and "still serving the old pair" in line
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger=certreload.__name__):
            touch(live.cert_file)  # changed again, still broken: said again, once
            assert not reloader.check() and not reloader.check()
        assert len(caplog.records) == 1
        third = rotate(tmp_path, live, "fixed")  # the whole pair, at last
        assert reloader.check()
        assert await presented_serial(host, int(port)) == third
    finally:
        await service.stop()
