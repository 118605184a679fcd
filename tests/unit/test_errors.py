"""``conveyor.errors``: every exception conveyor exports crosses a process boundary whole.

multiprocessing (a ``Pool``'s result, a ``Connection.send``) and torch's own tests send
exceptions between processes by pickling them, so each class must come back as itself:
its type, message, args and attributes, those its ``__init__`` sets and those added
after it was made (notes included).
"""

from __future__ import annotations

import errno
import pickle

import conveyor.errors as errors

#: Each exported class, made with representative arguments.
EXAMPLES: dict[str, BaseException] = {
    "BranchBufferError": errors.BranchBufferError("branch 1 of fork() would hold 1001 items; raise buffer_size"),
    "CacheTimeoutError": errors.CacheTimeoutError("waited 60 s for /tmp/cache/a.bin (lock a.bin.lock)"),
    "ConveyorError": errors.ConveyorError("something conveyor refused"),
    "DistributedError": errors.DistributedError("rank 3 is gone (connection closed)", (3,)),
    "FrameError": errors.FrameError(2, "worker 2's frame: sequence 7 after 5; the pipe is out of step"),
    "GraphError": errors.GraphError("cannot remove the source IterableWrapper"),
    "HashMismatchError": errors.HashMismatchError("a.bin: sha256 abc != def"),
    "MissingDependencyError": errors.MissingDependencyError("pip install 'conveyor[torch]'"),
    "PauseIteration": errors.PauseIteration("this epoch is paused; call resume() to continue it"),
    "PrefetchTimeoutError": errors.PrefetchTimeoutError("fullsync waited 30 s; rank 1 stalled", 30.0, (1,)),
    "ResumeError": errors.ResumeError("a one-shot iterator cannot replay"),
    "SharedMemoryError": errors.SharedMemoryError(errno.ENOSPC, "cannot reserve 64 MiB for worker 0's ring"),
    "SharedMemoryWarning": errors.SharedMemoryWarning("buffers travel pickled: no ring"),
    "SkipBudgetError": errors.SkipBudgetError("3 items failed, max_skipped=2", [{"stage": "map", "key": "p4"}]),
    "StateError": errors.StateError("state: 'epoch' must be an int"),
    "WorkerDeathError": errors.WorkerDeathError(1, "worker 1 (pid 4242) was killed by signal 9"),
    "WorkerError": errors.WorkerError("worker 0 raised"),
    "WorkerTimeoutError": errors.WorkerTimeoutError("no batch within 5 s from worker 1", [1], 5.0),
}


def test_every_exported_error_pickles_back_to_its_type_message_and_attributes() -> None:
    assert set(EXAMPLES) == set(errors.__all__)  # a class added to the module gets an example here
    for name, error in EXAMPLES.items():
        assert type(error) is getattr(errors, name)
        error.add_note(f"a note on the {name}")
        error.seen_by = "rank 0"  # type: ignore[attr-defined]  # set after it was made, as callers do
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error), name
        assert str(back) == str(error), name
        assert back.args == error.args, name
        assert vars(back) == vars(error), name
        assert back.__notes__ == [f"a note on the {name}"], name
