"""The credit channel: records, the main side's never-blocking writes, the worker's reads."""

from __future__ import annotations

import functools
import multiprocessing
import os
from types import SimpleNamespace

import pytest

from conveyor.pipes import IterableWrapper
from conveyor.workers.child.event_loop import Arrival, Inbox, _receive
from conveyor.workers.parent.pool import WorkerPool
from conveyor.workers.transport.protocol import CREDIT_RECORD, count_credits, credit_records


class _Machine:
    """What the inbox needs of a state machine: the epoch, and somewhere to put credits."""

    def __init__(self, generation: int):
        self.generation = generation
        self.credits = 0

    def grant(self, credits: int) -> None:
        self.credits += credits


def _pipe() -> tuple[multiprocessing.connection.Connection, multiprocessing.connection.Connection]:
    reader, writer = multiprocessing.Pipe(duplex=False)
    return reader, writer


def test_records_count_only_for_their_own_epoch():
    records = credit_records(3, 2) + credit_records(2, 5) + credit_records(3, 1)
    assert len(records) == 8 * CREDIT_RECORD.size
    assert count_credits(records, 3) == 3
    assert count_credits(records, 2) == 5
    assert count_credits(records, 4) == 0
    # generations are compared modulo 2**32, the record's width
    assert count_credits(credit_records(2**32 + 7, 1), 2**32 + 7) == 1
    assert count_credits(credit_records(2**32 + 7, 1), 7) == 1


@pytest.fixture
def pool_with_a_credit_pipe():
    """A pool whose worker 0 is a pipe we read ourselves (no process is started)."""
    pool = WorkerPool(IterableWrapper(range(3)), 1, None, None, None, None)
    reader, writer = _pipe()
    os.set_blocking(writer.fileno(), False)
    pool._workers.append(SimpleNamespace(credit_fd=writer.fileno()))  # type: ignore[arg-type]
    try:
        yield pool, reader
    finally:
        pool._workers.clear()
        pool.close()
        reader.close()
        writer.close()


def _drain(reader: multiprocessing.connection.Connection) -> bytes:
    chunks = []
    while reader.poll(0):
        chunks.append(os.read(reader.fileno(), 1 << 16))
    return b"".join(chunks)


def test_grants_arrive_as_records(pool_with_a_credit_pipe):
    pool, reader = pool_with_a_credit_pipe
    pool.grant(0, 5)
    pool.grant(0, 5, credits=3)
    assert count_credits(_drain(reader), 5) == 4


def test_a_full_credit_pipe_never_blocks_and_the_rest_is_owed(pool_with_a_credit_pipe):
    pool, reader = pool_with_a_credit_pipe
    granted = 0
    while not pool._credits.owed:  # fill the pipe: the write that does not fit is owed, not blocked on
        pool.grant(0, 1, credits=1000)
        granted += 1000
    assert pool._credits.owed[0][0] == 1
    received = count_credits(_drain(reader), 1)
    assert 0 < received < granted
    pool.grant(0, 1)  # the next grant pays what is owed
    while pool._credits.owed:
        received += count_credits(_drain(reader), 1)
        pool.grant(0, 1, credits=0)
    received += count_credits(_drain(reader), 1)
    assert received == granted + 1


def test_credits_owed_for_an_abandoned_epoch_are_dropped(pool_with_a_credit_pipe):
    pool, reader = pool_with_a_credit_pipe
    while not pool._credits.owed:
        pool.grant(0, 1, credits=1000)
    _drain(reader)
    pool.grant(0, 2)
    assert count_credits(_drain(reader), 1) == 0  # nothing more for the old epoch
    assert not pool._credits.owed


def test_a_dead_workers_credit_pipe_is_ignored(pool_with_a_credit_pipe):
    pool, reader = pool_with_a_credit_pipe
    reader.close()
    pool.grant(0, 1)  # EPIPE: the process sentinel reports the death, not the grant
    assert not pool._credits.owed


def test_the_inbox_grants_credits_and_tells_them_from_requests():
    requests_reader, requests_writer = _pipe()
    credits_reader, credits_writer = _pipe()
    machine = _Machine(generation=4)
    receive = functools.partial(_receive, requests_reader)
    inbox = Inbox(requests_reader.fileno(), credits_reader.fileno(), receive, machine)  # type: ignore[arg-type]
    try:
        assert inbox.poll(0) is Arrival.NOTHING
        os.write(credits_writer.fileno(), credit_records(4, 2) + credit_records(3, 7))
        assert inbox.poll(0) is Arrival.CREDITS
        assert machine.credits == 2
        requests_writer.send_bytes(b"\x80\x05N.")  # a pickled None
        os.write(credits_writer.fileno(), credit_records(4, 1))
        assert inbox.poll(0) is Arrival.REQUEST
        assert machine.credits == 3
        assert inbox.recv() is None
        record = credit_records(4, 1)
        os.write(credits_writer.fileno(), record[:1])  # a split record waits for its rest
        assert inbox.poll(0) is Arrival.CREDITS and machine.credits == 3
        os.write(credits_writer.fileno(), record[1:])
        assert inbox.poll(0) is Arrival.CREDITS and machine.credits == 4
        credits_writer.close()
        with pytest.raises(EOFError):
            inbox.poll(0)
    finally:
        for connection in (requests_reader, requests_writer, credits_reader, credits_writer):
            connection.close()
