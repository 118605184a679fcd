"""DistributedReadingService, fullsync and SequentialReadingService on real gloo groups
(world sizes 2 and 3, processes on 127.0.0.1)."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import time

import pytest

from conveyor import (
    DataLoader2,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingServiceInterface,
    SeedGenerator,
    SequentialReadingService,
    get_worker_info,
)
from conveyor.errors import DistributedError, GraphError, StateError
from conveyor.pipes import IterableWrapper
from distributed_helpers import Raised, run_ranks, succeeded
from pipeline_helpers import jitter, not_multiple_of_three, tag

pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.timeout(180)


def shuffled(n: int):
    """Shuffle before the sharding point (shared seed), random per item after it."""
    return IterableWrapper(range(n)).shuffle(buffer_size=8).sharding_filter().map(tag).random_map(jitter)


def filtered(n: int):
    return IterableWrapper(range(n)).shuffle(buffer_size=8).sharding_filter().map(tag).filter(not_multiple_of_three)


PIPELINES = {"shuffled": shuffled, "filtered": filtered}


def single_process_epochs(pipeline: str, n: int, seed: int, epochs: int) -> list[list]:
    with DataLoader2(PIPELINES[pipeline](n)) as loader:
        loader.seed(seed)
        return [list(loader) for _ in range(epochs)]


def service(workers: int | None, **options) -> object:
    distributed = DistributedReadingService(timeout=30, **options)
    if workers is None:
        return distributed
    return SequentialReadingService(distributed, MultiProcessingReadingService(workers))


# --- functions run on every rank (module level: the ranks are forked) ------------------


def read_epochs(rank, world, pipeline, n, seed, epochs, workers, options):
    with DataLoader2(PIPELINES[pipeline](n), reading_service=service(workers, **options)) as loader:
        loader.seed(seed)
        out = [list(loader) for _ in range(epochs)]
        rs = loader.reading_service
        dist_rs = rs.reading_services[0] if isinstance(rs, SequentialReadingService) else rs
        return out, dist_rs.last_epoch_summary


def read_rank0_seeded(rank, world, n, seed):
    with DataLoader2(shuffled(n), reading_service=DistributedReadingService(timeout=30)) as loader:
        if rank == 0:
            loader.seed(seed)
        return list(loader)


def save_mid_epoch(rank, world, pipeline, n, seed, cut, workers, options):
    """The full epoch, then the first ``cut`` items and the state after them (JSON)."""
    with DataLoader2(PIPELINES[pipeline](n), reading_service=service(workers, **options)) as loader:
        loader.seed(seed)
        full = list(loader)
        loader.seed(seed)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(cut)]
        state = json.dumps(loader.state_dict())
    return full, head, state


def resume(rank, world, pipeline, n, states, workers, options):
    with DataLoader2(PIPELINES[pipeline](n), reading_service=service(workers, **options)) as loader:
        loader.load_state_dict(json.loads(states[rank]))
        rest = list(loader)
        next_epoch = list(loader)
    return rest, next_epoch


def load_other_ranks_state(rank, world, states):
    loader = DataLoader2(shuffled(23), reading_service=DistributedReadingService(timeout=30))
    try:
        loader.load_state_dict(json.loads(states[(rank + 1) % world]))
    except StateError as err:
        return str(err)
    finally:
        loader.shutdown()
    return "loaded"


def fail_mid_epoch(rank, world, timeout, how):
    """Rank 1 dies (``how="die"``) or stalls past the timeout after a few items; the
    others read on and must get a DistributedError, timed from where they went on."""
    loader = DataLoader2(shuffled(400), reading_service=DistributedReadingService(timeout=timeout, window=4))
    loader.seed(1)
    iterator = iter(loader)
    for _ in range(6):
        next(iterator)
    if rank == 1 and how == "die":
        os._exit(7)
    if rank == 1:
        time.sleep(timeout + 4)
        return "slept"
    started = time.monotonic()
    try:
        for _ in iterator:
            pass
    except DistributedError as err:
        err.elapsed_s = time.monotonic() - started  # type: ignore[attr-defined]
        raise
    finally:
        loader.shutdown()
    return "finished"


def killed_mid_epoch(rank, world, victim):
    """``victim`` is SIGKILLed after a few items; every other rank reads on and returns what
    its DistributedError says, staying until all the others have (a rank leaving closes its
    connections, which would be the next one's first sight; the test helpers' store lives
    in rank 0)."""
    import signal

    import torch.distributed as dist

    loader = DataLoader2(shuffled(400), reading_service=DistributedReadingService(timeout=30, window=4))
    loader.seed(1)
    iterator = iter(loader)
    for _ in range(6):
        next(iterator)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in iterator:
            pass
        outcome = ("finished",)
    except DistributedError as err:
        outcome = (type(err).__name__, str(err), getattr(err, "lost_ranks", None))
    finally:
        loader.shutdown()
    if victim != 0:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"reported/{rank}", "1")
        store.wait([f"reported/{r}" for r in range(world) if r != victim])
    return outcome


def standalone_fullsync(rank, world, sizes, epoch_end, window):
    """Each rank's own uneven source, made even by a user-placed fullsync."""
    pipe = IterableWrapper(range(sizes[rank])).fullsync(timeout=30, epoch_end=epoch_end, window=window)
    with DataLoader2(pipe) as loader:
        return [list(loader) for _ in range(2)]


def resume_standalone(rank, world, sizes, cut):
    """Pad mode, window 4: (full epoch, head + resumed rest, the next epoch after resuming)."""

    def build():
        return IterableWrapper(range(sizes[rank])).map(tag).fullsync(timeout=30, epoch_end="pad", window=4)

    with DataLoader2(build()) as loader:
        full = list(loader)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(cut)]
        state = json.loads(json.dumps(loader.state_dict()))
    with DataLoader2(build()) as loader:
        loader.load_state_dict(state)
        return full, head + list(loader), list(loader)


def first_global_draw(x):
    """(worker, this worker's first draw from the global ``random`` this epoch, or None)."""
    info = get_worker_info()
    first = None if getattr(first_global_draw, "drawn", False) else random.getrandbits(32)
    first_global_draw.drawn = True  # type: ignore[attr-defined]
    return info.worker_id, first


def global_draws_by_worker(rank, world, seed):
    pipe = IterableWrapper(range(8)).sharding_filter().map(first_global_draw)
    with DataLoader2(pipe, reading_service=service(2)) as loader:
        loader.seed(seed)
        return sorted((worker, draw) for worker, draw in loader if draw is not None)


def workers_before_ranks(rank, world):
    """The services in the wrong order: the ranks' split could not reach the workers."""
    service = SequentialReadingService(MultiProcessingReadingService(2), DistributedReadingService(timeout=30))
    loader = DataLoader2(IterableWrapper(range(12)).sharding_filter(), reading_service=service)
    try:
        iter(loader)
    except GraphError as err:
        return str(err)
    finally:
        loader.shutdown()
    return "no error"


def failed_set_up_releases_the_group(rank, world):
    """The multiprocessing service refuses the graph (a non-replicable op with two inputs
    after it); the distributed service, set up before it, must be finalized."""
    pipe = IterableWrapper(range(12)).sharding_filter().fullsync().zip(IterableWrapper(range(12)))
    loader = DataLoader2(pipe, reading_service=service(2))
    errors = []
    for _ in range(2):
        try:
            iter(loader)
        except GraphError as err:
            errors.append(type(err).__name__)
    distributed = loader.reading_service.reading_services[0]
    released = distributed._group is None
    loader.shutdown()
    return errors, released


def conflicting_fullsync(rank, world):
    """A user .fullsync() whose settings differ from the service's: refused, not overridden."""
    pipe = IterableWrapper(range(23)).sharding_filter().fullsync(timeout=30, epoch_end="drop")
    loader = DataLoader2(pipe, reading_service=DistributedReadingService(timeout=30, epoch_end="pad"))
    try:
        iter(loader)
    except GraphError as err:
        message = str(err)
    finally:
        loader.shutdown()
    agreeing = IterableWrapper(range(23)).sharding_filter().fullsync(timeout=30, epoch_end="pad", window=4)
    with DataLoader2(agreeing, reading_service=DistributedReadingService(30, "pad", 4)) as loader:
        return message, len(list(loader))


def load_into_other_worker_count(rank, world, states):
    """A state saved with 2 workers per rank, loaded with 3: refused at load, not at iter()."""
    loader = DataLoader2(shuffled(23), reading_service=service(3))
    try:
        loader.load_state_dict(json.loads(states[rank]))
    except StateError as err:
        return str(err)
    finally:
        loader.shutdown()
    return "loaded"


def counts_by_window(rank, world, sizes, windows, epoch_end):
    """For each window size, the items one epoch yields on this rank."""
    out = []
    for window in windows:
        pipe = IterableWrapper(range(sizes[rank]))
        with DataLoader2(pipe, reading_service=DistributedReadingService(30, epoch_end, window)) as loader:
            out.append(list(loader))
    return out


def ranks_summary_logged(rank, world):
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("conveyor.distributed")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    with DataLoader2(shuffled(23), reading_service=DistributedReadingService(30, "drop", 4)) as loader:
        loader.seed(0)
        list(loader)
    return records


def no_group():
    loader = DataLoader2(shuffled(5), reading_service=DistributedReadingService())
    with pytest.raises(DistributedError, match="init_process_group"):
        iter(loader)
    loader.shutdown()


# --- tests ---------------------------------------------------------------------------------


def test_without_a_process_group_it_says_what_to_call():
    no_group()


def test_bad_arguments_are_refused_at_once():
    with pytest.raises(ValueError, match="epoch_end"):
        DistributedReadingService(epoch_end="wait")
    with pytest.raises(ValueError, match="timeout"):
        DistributedReadingService(timeout=0)
    with pytest.raises(ValueError, match="window"):
        IterableWrapper(range(3)).fullsync(window=0)
    for endless in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            DistributedReadingService(timeout=endless)
    with pytest.raises(TypeError, match="argument 1"):
        SequentialReadingService(DistributedReadingService(), object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        SequentialReadingService()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("workers", [None, 2])
def test_ranks_split_a_shared_shuffle_disjointly_and_match_one_process(world, workers):
    """24 items: each rank gets every world-th item of the single-process epoch, so the
    pre-shard shuffle is identical on all ranks and post-shard randomness goes by item."""
    n, seed = 24, 11
    expected = single_process_epochs("shuffled", n, seed, epochs=2)
    results = succeeded(run_ranks(world, read_epochs, "shuffled", n, seed, 2, workers, {}))
    for rank, (epochs, summary) in enumerate(results):
        for epoch, items in enumerate(epochs):
            assert items == expected[epoch][rank::world], (rank, epoch)
        assert summary.yielded == n // world and summary.dropped == 0 and summary.padded == 0
    assert expected[0] != expected[1]
    assert results == succeeded(run_ranks(world, read_epochs, "shuffled", n, seed, 2, workers, {}))


def test_only_rank_0_seeded_is_enough():
    expected = single_process_epochs("shuffled", 24, 5, epochs=1)[0]
    results = succeeded(run_ranks(2, read_rank0_seeded, 24, 5))
    assert results == [expected[0::2], expected[1::2]]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("epoch_end", ["drop", "pad"])
def test_uneven_shards_yield_equal_counts(world, epoch_end):
    n, seed = 23, 3
    everything = single_process_epochs("shuffled", n, seed, epochs=1)[0]
    options = {"epoch_end": epoch_end, "window": 4}
    results = succeeded(run_ranks(world, read_epochs, "shuffled", n, seed, 1, None, options))
    shards = [everything[rank::world] for rank in range(world)]
    counts = {len(epochs[0]) for epochs, _ in results}
    expected_count = min(map(len, shards)) if epoch_end == "drop" else max(map(len, shards))
    assert counts == {expected_count}
    for rank, (epochs, summary) in enumerate(results):
        items = epochs[0]
        own = shards[rank]
        assert items[: min(len(own), len(items))] == own[: len(items)]
        if epoch_end == "pad":
            assert set(items) == set(own)  # all of its shard, plus repeats of it
            assert summary.padded == expected_count - len(own)
        else:
            assert summary.dropped + len(items) <= len(own)
            assert summary.padded == 0
        assert summary.yielded == expected_count
    union = {x for epochs, _ in results for x in epochs[0]}
    if epoch_end == "pad":
        assert union == set(everything)  # nothing lost
    else:
        assert len(union) == world * expected_count  # disjoint


def test_the_epoch_end_does_not_depend_on_the_window():
    sizes = [13, 7, 10]
    for epoch_end, count in (("drop", 7), ("pad", 13)):
        results = succeeded(run_ranks(3, counts_by_window, sizes, [1, 3, 7, 8, 64], epoch_end))
        for rank, by_window in enumerate(results):
            own = list(range(min(count, sizes[rank])))
            assert all(len(items) == count for items in by_window), (epoch_end, rank)
            assert all(items[: len(own)] == own for items in by_window)
            assert all(set(items) == set(own) for items in by_window)  # pads repeat its own items


def test_a_rank_with_nothing_cannot_pad_but_can_drop():
    dropped = succeeded(run_ranks(2, counts_by_window, [5, 0], [4], "drop"))
    assert dropped == [[[]], [[]]]
    padded = run_ranks(2, counts_by_window, [5, 0], [4], "pad")
    assert padded[0] == [[0, 1, 2, 3, 4]] or isinstance(padded[0], Raised)
    assert isinstance(padded[1], Raised) and padded[1].type_name == "DistributedError"
    assert "nothing to pad with" in padded[1].message


def test_fullsync_stands_alone():
    results = succeeded(run_ranks(2, standalone_fullsync, [9, 4], "drop", 3))
    assert results == [[list(range(4))] * 2, [list(range(4))] * 2]
    results = succeeded(run_ranks(2, standalone_fullsync, [9, 4], "pad", 3))
    assert results[0] == [list(range(9))] * 2
    assert results[1] == [[0, 1, 2, 3, 3, 3, 3, 3, 3]] * 2  # its last window, [3], repeated


def test_the_summary_goes_to_logging_not_stdout(capfd):
    results = succeeded(run_ranks(2, ranks_summary_logged))
    assert capfd.readouterr().out == ""
    for rank, records in enumerate(results):
        assert len(records) == 1
        assert f"epoch 0 ended on rank {rank}/2 after 11 items" in records[0]
    assert "dropped 1 item read ahead" in results[0][0]


@pytest.mark.parametrize(
    ("pipeline", "workers", "epoch_end", "cut"),
    [
        ("shuffled", None, "drop", 5),
        ("shuffled", None, "pad", 11),  # rank 1 is padding when it saves
        ("filtered", None, "drop", 1),
        ("shuffled", 2, "drop", 6),
        ("filtered", 2, "pad", 5),
    ],
)
def test_each_rank_resumes_mid_epoch_exactly(pipeline, workers, epoch_end, cut):
    n, seed, options = 23, 8, {"epoch_end": epoch_end, "window": 4}
    saved = succeeded(run_ranks(2, save_mid_epoch, pipeline, n, seed, cut, workers, options))
    states = [state for _, _, state in saved]
    resumed = succeeded(run_ranks(2, resume, pipeline, n, states, workers, options))
    for (full, head, _), (rest, _) in zip(saved, resumed, strict=True):
        assert head + rest == full
    uninterrupted = succeeded(run_ranks(2, read_epochs, pipeline, n, seed, 2, workers, options))
    assert [epochs[1] for epochs, _ in uninterrupted] == [next_epoch for _, next_epoch in resumed]


@pytest.mark.parametrize("cut", [8, 9, 10])
def test_a_rank_that_pads_from_an_earlier_window_resumes_exactly(cut):
    """Rank 1's 8 items fill two windows exactly: its third window is all pads, repeating
    the second; a state saved there must rebuild them."""
    results = succeeded(run_ranks(2, resume_standalone, [11, 8], cut))
    for full, resumed, next_epoch in results:
        assert resumed == full == next_epoch
    assert results[1][0] == [tag(i) for i in [*range(8), 4, 5, 6]]


def test_worker_seeds_derive_by_rank_then_by_worker():
    seed = 21
    results = succeeded(run_ranks(2, global_draws_by_worker, seed))
    for rank, draws in enumerate(results):
        for worker, draw in draws:
            expected = random.Random(SeedGenerator(seed).for_epoch(0).spawn(rank).spawn(worker).global_rng_seed())
            assert draw == expected.getrandbits(32), (rank, worker)
    assert len({draw for draws in results for _, draw in draws}) == 4  # 2 ranks x 2 workers


def test_distributed_after_workers_is_refused_not_duplicated():
    messages = succeeded(run_ranks(2, workers_before_ranks))
    assert all("put DistributedReadingService before MultiProcessingReadingService" in m for m in messages)


def test_a_failed_set_up_releases_what_the_earlier_services_hold():
    for errors, released in succeeded(run_ranks(2, failed_set_up_releases_the_group)):
        assert errors == ["GraphError", "GraphError"] and released


def test_a_users_fullsync_must_agree_with_the_service():
    for message, count in succeeded(run_ranks(2, conflicting_fullsync)):
        assert "set them in one place" in message and "epoch_end='pad'" in message
        assert count == 12  # pad: the longer shard


def test_a_composed_state_is_checked_whole_at_load():
    saved = succeeded(run_ranks(2, save_mid_epoch, "shuffled", 23, 0, 5, 2, {}))
    messages = succeeded(run_ranks(2, load_into_other_worker_count, [state for _, _, state in saved]))
    assert all("num_workers=2" in m for m in messages), messages


def test_a_state_loaded_on_another_rank_is_refused():
    saved = succeeded(run_ranks(2, save_mid_epoch, "shuffled", 23, 0, 3, None, {}))
    # Each rank's state holds every rank's part; take each rank's own part out of it.
    envelopes = [json.loads(state) for _, _, state in saved]
    assert envelopes[0] == envelopes[1]
    parts = [envelopes[rank]["parts"][rank] for rank in range(2)]
    messages = succeeded(run_ranks(2, load_other_ranks_state, parts))
    assert "saved on rank 1 of 2, loaded on rank 0 of 2" in messages[0]
    assert "saved on rank 0 of 2, loaded on rank 1 of 2" in messages[1]


@pytest.mark.timing
def test_a_killed_rank_becomes_an_error_on_the_others():
    timeout = 20
    results = run_ranks(2, fail_mid_epoch, timeout, "die")
    assert results[1].type_name == "Died"
    error = results[0]
    assert isinstance(error, Raised) and error.type_name == "DistributedError", error
    assert "rank 0 of 2" in error.message
    assert error.elapsed_s < timeout  # a closed connection is noticed, not waited out


@pytest.mark.timing
def test_a_stalled_rank_becomes_an_error_within_the_timeout():
    timeout = 2
    results = run_ranks(3, fail_mid_epoch, timeout, "stall")
    for rank in (0, 2):
        error = results[rank]
        # torchdata's name for it, a DistributedError (fail_mid_epoch caught it as one)
        assert isinstance(error, Raised) and error.type_name == "PrefetchTimeoutError", error
        # the stalled rank is named, and how it was seen: it had not come to the agreement
        # (first hand, or through the note of the other rank, which timed out first)
        first_line = error.message.splitlines()[0]
        assert re.search(r"rank (\d+) \(on ", first_line).group(1) == "1", first_line
        assert re.search(r"rank 1 \(on [^)]+\) sent nothing within 2 s: not come to this collective", first_line)
        assert f"seen by rank {rank} of 3" in first_line and "timeout=2 s" in first_line
        assert "Check rank 1's log" in first_line
        assert error.elapsed_s < timeout + 5


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_is_named_on_the_others(victim):
    """Issue 31: rank ``victim`` of 3 is SIGKILLed mid-epoch; each other rank's error names
    it (not the rank reporting) and says how it was seen. Rank 0 hosts the job's store
    here, so its death also takes the store: the names come from what was read at set-up."""
    results = run_ranks(3, killed_mid_epoch, victim)
    assert results[victim] == Raised("Died", f"rank {victim} exited with -9")
    for rank in {0, 1, 2} - {victim}:
        type_name, message, lost = results[rank]
        assert type_name == "DistributedError", message
        assert lost == (victim,), message
        assert "could not be told" not in message, message
        # the rank found lost comes with its host: the victim, seen first hand or through
        # another survivor's failure (gloo's ring may leave a survivor waiting on a survivor)
        assert re.search(r"rank (\d+) \(on ", message).group(1) == str(victim), message
        assert re.search(r"(closed|reset) its connection \(gloo: [^)]*\[127\.0\.0\.1\]:\d+", message), message
        assert f"seen by rank {rank} of 3" in message and f"Check rank {victim}'s log" in message
        assert len(message) < 1500


def test_in_process_services_compose_too():
    """Sequential works for any services, not only distributed ones."""
    pipe = IterableWrapper(range(10)).sharding_filter().map(tag)
    with DataLoader2(pipe, reading_service=SequentialReadingService(MultiProcessingReadingService(2))) as loader:
        loader.seed(1)
        iterator = iter(loader)
        head = [next(iterator) for _ in range(4)]
        state = loader.state_dict()
    with DataLoader2(
        IterableWrapper(range(10)).sharding_filter().map(tag),
        reading_service=SequentialReadingService(MultiProcessingReadingService(2)),
    ) as loader:
        loader.load_state_dict(state)
        assert head + list(loader) == [tag(i) for i in range(10)]
    with pytest.raises(TypeError, match="_NotCheckpointable does not implement"):
        DataLoader2(
            pipe, reading_service=SequentialReadingService(InProcessReadingService(), _NotCheckpointable())
        ).load_state_dict(state)


class _NotCheckpointable(ReadingServiceInterface):
    def initialize(self, datapipe):
        return datapipe


def fullsync_paused_and_reset(rank, world):
    """torchdata's drill: pause a fullsync in its epoch, start a new iteration, read on."""
    pipe = IterableWrapper(range(7 + rank)).sharding_filter().prefetch(2).fullsync(timeout=30)
    first = iter(pipe)
    head = next(first)
    pipe.pause()
    again = list(pipe)  # a new pass: not paused
    pipe.resume()
    return head, again


def test_a_paused_fullsync_lets_a_new_iteration_run():
    results = succeeded(run_ranks(2, fullsync_paused_and_reset))
    assert results == [(0, list(range(7))), (0, list(range(7)))]
