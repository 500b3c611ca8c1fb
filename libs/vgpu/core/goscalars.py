"""Go's text forms of the scalars in HAMi's annotations (docs/protocol.md#pod-annotations).

HAMi writes its annotation fields with Go's ``strconv`` and ``time`` packages, so Go's rules are the
wire's: device fields are int32s, booleans are what ``strconv.ParseBool`` accepts, times are
``time.RFC3339``. Each parser raises ``AnnotationError`` naming the ``field`` it was reading.
"""

from __future__ import annotations

import datetime

from vgpu.core import errors

INT32_MAX = 2**31 - 1  # HAMi's device fields are Go int32s


def parse_int32(text: str, field: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise errors.AnnotationError(field, f"invalid integer {text[:40]!r}") from None
    if abs(value) > INT32_MAX:
        raise errors.AnnotationError(field, "integer out of range (a 32-bit integer)")
    return value


def parse_bool(text: str, field: str) -> bool:
    # Go's strconv.ParseBool
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise errors.AnnotationError(field, f"invalid boolean {text!r}")


def format_rfc3339(when: datetime.datetime) -> str:
    """Go's time.RFC3339 for a UTC time: ``2026-08-21T06:20:39Z``."""
    when = when.astimezone(datetime.UTC).replace(microsecond=0)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str, field: str) -> datetime.datetime:
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise errors.AnnotationError(field, f"invalid RFC3339 time {text!r}") from None
    if when.tzinfo is None:
        raise errors.AnnotationError(field, f"RFC3339 time {text!r} has no zone")
    return when
