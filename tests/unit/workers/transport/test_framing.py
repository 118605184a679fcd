"""Frames on a worker's response pipe: whatever a read brings is split exactly."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

from conveyor.workers.transport.framing import HEADER, READ_SIZE, FrameReader, write_frame

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def pipe():
    reader, writer = os.pipe()
    yield reader, writer
    for fd in (reader, writer):
        with contextlib.suppress(OSError):  # closed by the test
            os.close(fd)


def test_one_read_returns_every_frame_waiting(pipe):
    reader, writer = pipe
    bodies = [b"first", b"", b"third" * 100]
    for body in bodies:
        write_frame(writer, body)
    assert [bytes(frame) for frame in FrameReader(reader).read()] == bodies


def test_a_header_split_between_reads_is_kept_for_the_next(pipe):
    reader, writer = pipe
    frames = FrameReader(reader)
    whole = HEADER.pack(3) + b"abc"
    os.write(writer, whole[:5])
    assert frames.read() == []
    os.write(writer, whole[5:])
    assert [bytes(frame) for frame in frames.read()] == [b"abc"]


def test_a_frame_larger_than_the_pipe_is_read_whole_while_it_is_written(pipe):
    reader, writer = pipe
    body = bytes(range(256)) * (4 * READ_SIZE // 256 + 7)  # several pipe-fulls
    sender = threading.Thread(target=write_frame, args=(writer, body))
    sender.start()
    frames, reads = FrameReader(reader), 0
    received: list[memoryview] = []
    while not received:
        received = frames.read()  # blocks only until some bytes are there, like after a poll
        reads += 1
    sender.join(10)
    assert len(received) == 1 and bytes(received[0]) == body
    assert reads > 1  # one read never brings more than the pipe holds


def test_a_closed_pipe_and_a_frame_cut_short_are_end_of_file(pipe):
    reader, writer = pipe
    os.write(writer, HEADER.pack(100) + b"only part of it")
    os.close(writer)
    frames = FrameReader(reader)
    assert frames.read() == []  # begun, not complete
    with pytest.raises(EOFError, match="middle of a message"):
        frames.read()
    with pytest.raises(EOFError, match="closed its response pipe"):
        FrameReader(reader).read()


def test_a_write_cut_short_by_a_signal_is_finished(pipe, monkeypatch):
    reader, writer = pipe
    real_writev = os.writev

    def interrupted_writev(fd, buffers):  # as when a signal lands in a long write
        data = b"".join(buffers)
        return real_writev(fd, [data[:11]])

    monkeypatch.setattr("conveyor.workers.transport.framing.os.writev", interrupted_writev)
    write_frame(writer, b"a body that did not fit at once")
    assert [bytes(frame) for frame in FrameReader(reader).read()] == [b"a body that did not fit at once"]


def test_an_interrupted_read_leaves_the_stream_in_step(pipe, monkeypatch):
    reader, writer = pipe
    frames = FrameReader(reader)
    os.write(writer, HEADER.pack(10) + b"01234")
    assert frames.read() == []
    real_readv = os.readv

    def interrupted(fd, buffers):
        monkeypatch.setattr("conveyor.workers.transport.framing.os.readv", real_readv)
        raise KeyboardInterrupt  # Ctrl-C while the main process waits for the rest

    monkeypatch.setattr("conveyor.workers.transport.framing.os.readv", interrupted)
    with pytest.raises(KeyboardInterrupt):
        frames.read()
    write_frame_rest = b"56789" + HEADER.pack(3) + b"end"
    os.write(writer, write_frame_rest)
    assert [bytes(frame) for frame in frames.read()] == [b"0123456789"]
    assert [bytes(frame) for frame in frames.read()] == [b"end"]
