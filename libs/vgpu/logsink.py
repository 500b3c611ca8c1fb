"""Log records leave the event loop through a queue; one thread writes them to stderr, in batches.

A service's event loop must never block, and writing a log line is a blocking ``write()`` on
stderr: a pipe whose reader is slow (the container runtime's log driver under load, a full
terminal) stalls the caller, and with ``logging.basicConfig`` the caller is whatever coroutine
logged, ``/filter`` included. ``to_stderr`` installs a ``QueueHandler`` on the root logger (the
record is formatted in the logging thread's caller, then only queued) and a writer thread.

The writer wakes for the first record of a batch, writes every record queued by then in one
``write()`` and one flush, and then pauses ``pause_s`` before it looks again: under load it wakes
about 20 times a second, not once per record, and each system call (which hands the GIL over and
back) is paid per batch, not per line. Waking a thread costs its caller more than the line does (the GIL changes hands twice:
about 8 % of the scheduler's CPU at one log line per bind, 250 binds a second), and a line is at
most ``pause_s`` late. ``LogSink.close`` cuts the pause short, writes what is queued and stops the
thread.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import queue
import sys
import threading
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PAUSE_S = 0.05  # between batches: at most this late, at most 1 / PAUSE_S wake-ups a second


class _Writer(threading.Thread):
    """Takes what is queued, writes it, pauses; a ``None`` in the queue ends it (after the rest)."""

    def __init__(
        self,
        records: queue.SimpleQueue[logging.LogRecord | None],
        handler: logging.StreamHandler[TextIO],
        *,
        pause_s: float,
    ) -> None:
        super().__init__(name="vgpu-log-writer", daemon=True)
        self._records = records
        self._handler = handler
        self._pause_s = pause_s
        self.stopping = threading.Event()
        self.batches = 0  # wake-ups that wrote something (tests)

    def run(self) -> None:
        while True:
            batch = [self._records.get()]  # sleeps while nothing is logged
            with contextlib.suppress(queue.Empty):
                while batch[-1] is not None:
                    batch.append(self._records.get_nowait())
            self.batches += 1
            self._write([r for r in batch if r is not None])
            if batch[-1] is None:
                return
            self.stopping.wait(self._pause_s)

    def stop(self) -> None:
        """Cut the pause short, write what is queued and end the thread (waits for it)."""
        self.stopping.set()
        self._records.put(None)
        self.join()

    def _write(self, records: list[logging.LogRecord]) -> None:
        """The records formatted as the handler would, in one write and one flush."""
        handler = self._handler
        lines = []
        for record in records:
            try:
                lines.append(handler.format(record) + handler.terminator)
            except Exception:  # as Handler.emit: a record that cannot be formatted is reported, not fatal
                handler.handleError(record)
        if not lines:
            return
        with handler.lock or contextlib.nullcontext():
            try:
                handler.stream.write("".join(lines))
                handler.flush()
            except Exception:  # a closed or broken stream: report it (stderr) and keep the thread
                handler.handleError(records[0])


class LogSink:
    """The queue between the root logger and the thread that writes; ``close`` flushes and stops."""

    def __init__(self, writer: _Writer | None = None, handler: logging.Handler | None = None) -> None:
        self._writer = writer
        self._handler = handler
        self._closed = False

    @property
    def batches(self) -> int:
        """How many times the writer woke up and wrote (0 for a sink that does nothing)."""
        return self._writer.batches if self._writer is not None else 0

    def close(self) -> None:
        """Write what is queued, stop the writer thread and take the handler off the root logger."""
        if self._closed or self._writer is None or self._handler is None:
            return
        self._closed = True
        logging.getLogger().removeHandler(self._handler)
        self._writer.stop()  # the writer stays, for ``batches``


def to_stderr(
    level: int, *, stream: TextIO | None = None, fmt: str = FORMAT, pause_s: float = PAUSE_S
) -> LogSink:
    """Route every record at ``level`` and above through a queue to ``stream`` (stderr). Like
    ``logging.basicConfig``, does nothing when the root logger already has handlers (an embedding
    program, or a test runner capturing logs, configured logging first)."""
    root = logging.getLogger()
    if root.handlers:
        return LogSink()
    records: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
    out = logging.StreamHandler(stream or sys.stderr)
    out.setFormatter(logging.Formatter(fmt))
    writer = _Writer(records, out, pause_s=pause_s)
    handler = logging.handlers.QueueHandler(records)
    root.addHandler(handler)
    root.setLevel(level)
    writer.start()
    return LogSink(writer, handler)
