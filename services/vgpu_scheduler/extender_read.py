"""``RequestReader``: an extender connection's bytes read into requests with ``httptools`` (llhttp).

The parser calls back here as the bytes come: the request line and the headers that matter
(``Content-Length``, ``Expect``), the head held to ``MAX_HEAD_BYTES`` (the connection refuses it,
431); the body held to its path's byte cap (``Verb.max_body_bytes``, else the listener's), refused
(413) as soon as it is declared or read past the cap, before any of it is buffered past it. The
connection is told when a head is complete (``on_head``: it starts the body's timer, or answers an
``Expect``) and handed each complete request (``on_request``); it answers them in order.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httptools

from vgpu_scheduler import listener
from vgpu_scheduler.extender_wire import Verb

# a request head (request line and headers) larger than this is refused (431): llhttp buffers a
# header line whole, however long; kube-scheduler's heads are a few hundred bytes
MAX_HEAD_BYTES = 64 << 10


@dataclass
class Request:
    method: str
    path: str
    body: bytes
    keep_alive: bool


class RequestReader:
    """The request being read on one connection; see the module docstring."""

    def __init__(
        self,
        *,
        verbs: Mapping[str, Verb],
        limits: listener.Limits,
        limit_log: listener.LimitLog,
        on_head: Callable[[], None],
        on_request: Callable[[Request], None],
    ) -> None:
        self._verbs = verbs
        self._limits = limits
        self._limit_log = limit_log
        self._on_head = on_head
        self._on_request = on_request
        self._parser = httptools.HttpRequestParser(self)
        self.peer = "?"  # for the limit log, once the connection knows it
        self._url = b""
        self.method = ""
        self.path = ""  # the URL's path, once the head is complete
        self.in_head = False
        self.reading_body = False
        self.head_bytes = 0  # bytes received since the last head was complete
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._cap = 0
        self.length: int | None = None  # its Content-Length
        self.expect: bytes | None = None  # its Expect header (the connection takes it)
        self.refused: tuple[int, str] | None = None  # refused (413, 417) while being read, and why

    def feed(self, data: bytes) -> None:
        """Parse ``data``; raises ``httptools``' errors (the connection answers them)."""
        if not self.reading_body:
            self.head_bytes += len(data)
        self._parser.feed_data(data)

    def head_over_cap(self) -> bool:
        """The head being read is larger than ``MAX_HEAD_BYTES``."""
        return not self.reading_body and self.head_bytes > MAX_HEAD_BYTES

    def http_version(self) -> str:
        return self._parser.get_http_version()

    def refuse(self, reason: str) -> None:
        """Refuse the request's body (413), logged as a limit hit."""
        self._limit_log.hit("body", f"{self.method} {self.path} from {self.peer}: {reason}")
        self.refused = (413, reason)

    def close(self) -> None:
        """The connection is gone: nothing is parsed after this, and no reference cycle outlives it
        (listener.py: the collector may not look for one until a compaction): the parser holds
        this reader's callbacks, and this reader the connection's."""
        del self._parser, self._on_head, self._on_request

    # --- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self.in_head = True
        self._body = []
        self._body_bytes = 0
        self.length = None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-length":  # llhttp refused it already unless it is digits
            self.length = int(value)
        elif lowered == b"expect":
            self.expect = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.reading_body = True
        self.head_bytes = 0
        self.method = self._parser.get_method().decode("latin-1")
        self.path = self._url_path()
        verb = self._verbs.get(self.path)
        limits = self._limits
        self._cap = (
            limits.max_body_bytes if verb is None or verb.max_body_bytes is None else verb.max_body_bytes
        )
        declared = self.length
        if declared is not None and declared > self._cap:
            self.refuse(f"body of {declared} bytes is over the {self._cap} byte limit")
            return
        self._on_head()

    def on_body(self, body: bytes) -> None:
        if self.refused is not None:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._cap:
            self.refuse(f"body is over the {self._cap} byte limit")
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.reading_body = False
        if self.refused is not None:
            return
        request = Request(self.method, self.path, b"".join(self._body), self._parser.should_keep_alive())
        self._body = []
        self._on_request(request)

    def _url_path(self) -> str:
        try:
            return httptools.parse_url(self._url).path.decode("latin-1") if self._url else ""
        except httptools.HttpParserInvalidURLError:
            return "?"
