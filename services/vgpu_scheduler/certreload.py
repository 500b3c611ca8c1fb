"""Serving-certificate hot reload: cert-manager and the certgen Job rotate the Secret in place, and
the kubelet swaps the mounted files; new TLS handshakes must use the new pair without a restart.

``CertReloader.check`` compares the files' (mtime, size) with what it last loaded and, when they
changed, loads the pair into a *new* ``ssl.SSLContext`` (``server_context``). Only a context that
loaded replaces the one in use (``context``, handed to ``on_reload``): later handshakes use it,
open connections keep theirs. Loading into the live context instead would leave it half-changed
when the pair does not match (OpenSSL takes the new certificate, then refuses the key, and every
handshake fails afterwards): a Secret written certificate first, or a truncated key, would take
TLS down. A pair that does not load is logged once, and the old pair kept, until the files
change again.
"""

import asyncio
import logging
import os
import pathlib
import ssl
from collections.abc import Callable

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, int], tuple[int, int]]


def server_context(cert_file: pathlib.Path, key_file: pathlib.Path) -> ssl.SSLContext:
    """A server-side context serving the pair (``OSError`` or ``ssl.SSLError`` when it does not load)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


class CertReloader:
    def __init__(
        self,
        context: ssl.SSLContext,
        cert_file: pathlib.Path,
        key_file: pathlib.Path,
        *,
        interval_s: float = 30.0,
        stat: Callable[[pathlib.Path], os.stat_result] = os.stat,
        load: Callable[[pathlib.Path, pathlib.Path], ssl.SSLContext] = server_context,
    ) -> None:
        """``context`` serves the pair as it is now; ``load`` builds a context from the files."""
        self.context = context  # the context new handshakes use
        # called with each context that replaced the one in use (the Service port's listener)
        self.on_reload: Callable[[ssl.SSLContext], None] | None = None
        self._cert_file = cert_file
        self._key_file = key_file
        self._interval_s = interval_s
        self._stat = stat
        self._load = load
        self._loaded = self._stamp()
        self._refused: Stamp | None = None  # the files as they were when they last did not load

    def _stamp(self) -> Stamp | None:
        try:
            cert, key = self._stat(self._cert_file), self._stat(self._key_file)
        except OSError:
            return None
        return (cert.st_mtime_ns, cert.st_size), (key.st_mtime_ns, key.st_size)

    def check(self) -> bool:
        """Reload when the files changed; True when a new pair is in use."""
        stamp = self._stamp()
        if stamp is None or stamp in (self._loaded, self._refused):
            return False
        try:
            context = self._load(self._cert_file, self._key_file)
        except (OSError, ssl.SSLError) as exc:
            self._refused = stamp
            log.error(
                "serving certificate %s changed but does not load with key %s (%s); still serving the "
                "old pair (said once until the files change again)",
                self._cert_file,
                self._key_file,
                exc,
            )
            return False
        self._loaded, self._refused = stamp, None
        self.context = context
        if self.on_reload is not None:
            self.on_reload(context)
        log.info("serving certificate reloaded from %s", self._cert_file)
        return True

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled (two stat calls: cheap on the loop; a load
        reads two small files and parses them once per change)."""
        while True:
            await asyncio.sleep(self._interval_s)
            self.check()
