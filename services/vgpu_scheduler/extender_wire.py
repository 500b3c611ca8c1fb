"""The extender listener's verbs and their answers: what ``POST <path>`` does, and the bytes it answers.

A verb takes the request body and returns a ``Reply`` (an HTTP status and a JSON body, or a body
encoded already, ``RawJson``); an inline verb (``/filter``) is answered in the loop turn that read
the request, an async one (``/bind``, ``/preempt``) runs as a task (``extender_conn.py``).
``encode`` writes the whole HTTP/1.1 response in one piece, so each answer is one write.
"""

import http
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# one encoder for every answer (json.dumps with options builds one per call); no NaN or Infinity,
# which are not JSON: a verb that returns one answers 500 rather than a body Go cannot decode
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class RawJson:
    """A body encoded already: a verb with a large answer builds its text in slices of its own
    (``/preempt``), where encoding it whole would hold the loop for one long step."""

    data: bytes


@dataclass(frozen=True)
class Reply:
    """An answer: HTTP status and the JSON body (a value to encode, or ``RawJson``)."""

    status: int
    body: object


InlineVerb = Callable[[bytes], Reply]  # answered in the turn that read the request
AsyncVerb = Callable[[bytes], Awaitable[Reply]]  # a task of its own


@dataclass(frozen=True)
class Verb:
    """What ``POST <path>`` does, and the largest body it takes (``None``: the listener's cap)."""

    call: InlineVerb | AsyncVerb
    inline: bool
    max_body_bytes: int | None = None


def encode(reply: Reply, *, close: bool) -> bytes:
    """The whole HTTP/1.1 response for ``reply``."""
    given = reply.body
    body = given.data if type(given) is RawJson else _ENCODER.encode(given).encode()
    try:
        phrase = http.HTTPStatus(reply.status).phrase
    except ValueError:
        phrase = ""
    connection = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {reply.status} {phrase}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n{connection}\r\n"
    )
    return head.encode("latin-1") + body


def encode_unserved(reply: Reply, *, close: bool, head: bool, allow: str = "") -> bytes:
    """A 404 or 405 (off the hot path): with ``Allow`` when given, and without the body for a
    ``HEAD`` request (RFC 9110 9.3.2: the ``Content-Length`` says what a GET would have had)."""
    data = encode(reply, close=close)
    if allow:
        data = data.replace(b"\r\n", f"\r\nAllow: {allow}\r\n".encode("latin-1"), 1)
    return data[: data.index(b"\r\n\r\n") + 4] if head else data
