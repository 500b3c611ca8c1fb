"""The local CA's server certificate is trusted for 127.0.0.1 by a real TLS handshake."""

from __future__ import annotations

import asyncio
import datetime
import pathlib
import ssl

from vgpu.localcluster import certs


async def test_server_cert_verifies_against_the_ca_over_a_real_handshake(tmp_path: pathlib.Path) -> None:
    paths = certs.make_serving_certs(tmp_path, now=datetime.datetime.now(datetime.UTC))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(paths.cert_file, paths.key_file)
    client_ctx = ssl.create_default_context(cafile=str(paths.ca_file))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
        writer.write(b"ping\n")
        assert await reader.readline() == b"ping\n"
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
    assert paths.key_file.stat().st_mode & 0o777 == 0o600
    assert b"BEGIN CERTIFICATE" in paths.ca_pem()
