"""Serving-certificate hot reload: cert-manager and the certgen Job rotate the Secret in place, and
the kubelet swaps the mounted files; new TLS handshakes must use the new pair without a restart.

``CertReloader.check`` compares the files' (mtime, size) with what it last loaded and, when they
changed, loads the pair into the live ``ssl.SSLContext`` (later handshakes use it; open connections
keep theirs). A pair that does not load (half-written, mismatched) is logged and the old one kept.
"""

import asyncio
import logging
import os
import pathlib
import ssl
from collections.abc import Callable

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, int], tuple[int, int]]


class CertReloader:
    def __init__(
        self,
        context: ssl.SSLContext,
        cert_file: pathlib.Path,
        key_file: pathlib.Path,
        *,
        interval_s: float = 30.0,
        stat: Callable[[pathlib.Path], os.stat_result] = os.stat,
    ) -> None:
        self._context = context
        self._cert_file = cert_file
        self._key_file = key_file
        self._interval_s = interval_s
        self._stat = stat
        self._loaded = self._stamp()

    def _stamp(self) -> Stamp | None:
        try:
            cert, key = self._stat(self._cert_file), self._stat(self._key_file)
        except OSError:
            return None
        return (cert.st_mtime_ns, cert.st_size), (key.st_mtime_ns, key.st_size)

    def check(self) -> bool:
        """Reload when the files changed; True when a new pair was loaded."""
        stamp = self._stamp()
        if stamp is None or stamp == self._loaded:
            return False
        try:
            self._context.load_cert_chain(self._cert_file, self._key_file)
        except (OSError, ssl.SSLError) as exc:
            log.error(
                "serving certificate %s changed but does not load (%s); keeping the old one",
                self._cert_file,
                exc,
            )
            return False
        self._loaded = stamp
        log.info("serving certificate reloaded from %s", self._cert_file)
        return True

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled (two stat calls: cheap on the loop)."""
        while True:
            await asyncio.sleep(self._interval_s)
            self.check()
