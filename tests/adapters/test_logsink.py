"""logsink: log lines are written by a thread of their own, never by the caller (the event loop)."""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Iterator

from vgpu import logsink


class RecordingStream(io.StringIO):
    """Remembers which threads wrote to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: set[str] = set()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writers.add(threading.current_thread().name)
        self.writes += 1
        return super().write(text)


@contextlib.contextmanager
def bare_root() -> Iterator[logging.Logger]:
    """The root logger as a fresh process has it (no handlers: pytest's own capture handlers are
    taken off for the test's body), restored afterwards."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    for handler in saved:
        root.removeHandler(handler)
    try:
        yield root
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved:
            root.addHandler(handler)
        root.setLevel(level)


def test_records_are_written_by_the_sink_thread_in_order_and_flushed_on_close() -> None:
    stream = RecordingStream()
    with bare_root() as root:
        sink = logsink.to_stderr(logging.INFO, stream=stream)
        log = logging.getLogger("vgpu.test")
        for i in range(100):
            log.info("line %d for pod %s", i, "ns/p")
        log.debug("not at this level")
        sink.close()
        handlers_after = list(root.handlers)
    lines = stream.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [f"line {i} for pod ns/p" for i in range(100)]
    assert all(" INFO vgpu.test: " in line for line in lines)
    assert threading.current_thread().name not in stream.writers  # the caller never wrote
    assert handlers_after == []  # close takes the queue handler off again
    sink.close()  # twice is harmless


def test_an_already_configured_root_logger_is_left_alone() -> None:
    mine = logging.StreamHandler(io.StringIO())
    stream = RecordingStream()
    with bare_root() as root:
        root.addHandler(mine)
        sink = logsink.to_stderr(logging.DEBUG, stream=stream)
        logging.getLogger("vgpu.test").warning("goes to the handler that was there")
        sink.close()
        handlers_after = list(root.handlers)
    assert handlers_after == [mine] and stream.getvalue() == ""


def test_the_writer_wakes_once_per_batch_not_once_per_record() -> None:
    """Records logged while the writer pauses wait for it and go out together, in one write: waking
    a thread per record costs the event loop more than the record does. ``close`` cuts the pause
    short."""
    stream = RecordingStream()
    with bare_root():
        sink = logsink.to_stderr(logging.INFO, stream=stream, pause_s=3600.0)
        log = logging.getLogger("vgpu.test")
        for i in range(200):
            log.info("bound pod ns/p-%d", i)
        sink.close()  # does not wait out the hour
    assert len(stream.getvalue().splitlines()) == 200
    assert 1 <= sink.batches <= 2  # the first record (maybe a few), then the rest at close
    assert stream.writes == sink.batches  # one write() per batch: each is a system call


class FailingOnce(RecordingStream):
    """A stream whose first write fails (a broken pipe that recovers)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = threading.Event()

    def write(self, text: str) -> int:
        if not self.failed.is_set():
            self.failed.set()
            raise OSError("broken pipe")
        return super().write(text)


def test_a_failed_write_is_reported_and_the_writer_goes_on() -> None:
    stream = FailingOnce()
    with bare_root(), contextlib.redirect_stderr(io.StringIO()) as reported:
        sink = logsink.to_stderr(logging.INFO, stream=stream, pause_s=3600.0)
        log = logging.getLogger("vgpu.test")
        log.info("lost with its batch")
        assert stream.failed.wait(10)
        log.info("written later")
        sink.close()
    assert [line.split(": ", 1)[1] for line in stream.getvalue().splitlines()] == ["written later"]
    assert "OSError: broken pipe" in reported.getvalue()
