"""Rotated serving certificates are used by new handshakes without a restart."""

from __future__ import annotations

import asyncio
import datetime
import os
import pathlib
import ssl

from cryptography import x509
from vgpu.localcluster import certs
from vgpu_scheduler.certreload import CertReloader

NOW = datetime.datetime(2026, 11, 23, tzinfo=datetime.UTC)


async def served_serial(context: ssl.SSLContext) -> int:
    """The serial number of the certificate a real TLS handshake with ``context`` presents."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    try:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


def rotate(tmp_path: pathlib.Path, live: certs.ServingCerts, name: str) -> int:
    """Write a new pair over the live files (as a Secret update does); return the new serial."""
    fresh = certs.make_serving_certs(tmp_path / name, now=NOW)
    os.replace(fresh.cert_file, live.cert_file)
    os.replace(fresh.key_file, live.key_file)
    stamp = live.cert_file.stat().st_mtime_ns + 1_000_000_000  # a distinct mtime even on coarse clocks
    os.utime(live.cert_file, ns=(stamp, stamp))
    return x509.load_pem_x509_certificate(live.cert_file.read_bytes()).serial_number


async def test_new_handshakes_use_the_rotated_certificate(tmp_path: pathlib.Path) -> None:
    live = certs.make_serving_certs(tmp_path / "live", now=NOW)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(live.cert_file, live.key_file)
    reloader = CertReloader(context, live.cert_file, live.key_file)
    first = await served_serial(context)
    assert not reloader.check()  # nothing changed
    second = rotate(tmp_path, live, "rotated")
    assert second != first
    assert reloader.check()
    assert await served_serial(context) == second
    assert not reloader.check()


async def test_a_broken_pair_keeps_the_old_certificate(tmp_path: pathlib.Path) -> None:
    live = certs.make_serving_certs(tmp_path / "live", now=NOW)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(live.cert_file, live.key_file)
    reloader = CertReloader(context, live.cert_file, live.key_file)
    first = await served_serial(context)
    other = certs.make_serving_certs(tmp_path / "other", now=NOW)
    os.replace(other.key_file, live.key_file)  # a key that does not match the certificate
    stamp = live.key_file.stat().st_mtime_ns + 1_000_000_000
    os.utime(live.key_file, ns=(stamp, stamp))
    assert not reloader.check()
    assert await served_serial(context) == first
    live.key_file.unlink()  # a missing file is not a reload either
    assert not reloader.check()
