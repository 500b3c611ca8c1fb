"""Log records leave the event loop through a queue; one thread writes them to stderr.

A service's event loop must never block, and writing a log line is a blocking ``write()`` on
stderr: a pipe whose reader is slow (the container runtime's log driver under load, a full
terminal) stalls the caller, and with ``logging.basicConfig`` the caller is whatever coroutine
logged, ``/filter`` included. ``to_stderr`` installs a ``QueueHandler`` on the root logger (the
record is formatted in the logging thread's caller, then only queued) and a ``QueueListener``
thread that does the writing. ``LogSink.close`` stops the thread after writing what is queued.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogSink:
    """The queue between the root logger and the thread that writes; ``close`` flushes and stops."""

    def __init__(
        self, listener: logging.handlers.QueueListener | None = None, handler: logging.Handler | None = None
    ) -> None:
        self._listener = listener
        self._handler = handler

    def close(self) -> None:
        """Write what is queued, stop the writer thread and take the handler off the root logger."""
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
        if self._listener is not None:
            self._listener.stop()
        self._listener = self._handler = None


def to_stderr(level: int, *, stream: TextIO | None = None, fmt: str = FORMAT) -> LogSink:
    """Route every record at ``level`` and above through a queue to ``stream`` (stderr). Like
    ``logging.basicConfig``, does nothing when the root logger already has handlers (an embedding
    program, or a test runner capturing logs, configured logging first)."""
    root = logging.getLogger()
    if root.handlers:
        return LogSink()
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    writer = logging.StreamHandler(stream or sys.stderr)
    writer.setFormatter(logging.Formatter(fmt))
    listener = logging.handlers.QueueListener(records, writer)
    handler = logging.handlers.QueueHandler(records)
    root.addHandler(handler)
    root.setLevel(level)
    listener.start()
    return LogSink(listener, handler)
