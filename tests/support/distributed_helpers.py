"""Run a function on every rank of a real gloo process group on 127.0.0.1.

``run_ranks(world_size, fn, *args)`` starts one process per rank, each initialising the
default group over TCP, calls ``fn(rank, world_size, *args)`` and returns the results by
rank. A rank that raises returns ``Raised(type name, message)`` instead; a rank that
never answers fails the test after ``deadline_s`` (its process is killed: no orphans).

torch is imported by ``run_ranks``, before it forks the ranks, not with this module: a
test module that imports this one may also hand functions to spawned or forkserver
workers, each of which imports that test module again, and would import torch with it.
"""

from __future__ import annotations

import datetime
import multiprocessing
import socket
import traceback
from dataclasses import dataclass
from multiprocessing import connection
from typing import Any


@dataclass(frozen=True)
class Raised:
    type_name: str
    message: str
    elapsed_s: float | None = None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, answer: Any, fn: Any, args: tuple[Any, ...]) -> None:
    import torch.distributed as dist  # the forking parent's (run_ranks)

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    # init_process_group can return on one rank while another is still connecting (torch
    # adds no barrier unless TORCH_DIST_INIT_BARRIER=1): a rank that then finished at once
    # and destroyed the group would fail the other's connection, on a loaded machine.
    dist.barrier()
    try:
        outcome: Any = fn(rank, world_size, *args)
    except Exception as err:
        outcome = Raised(type(err).__name__, f"{err}\n{traceback.format_exc()}", getattr(err, "elapsed_s", None))
    answer.send(outcome)
    # No barrier: a test may have made another rank die; leave the group where it stands
    # (a rank that leaves closes its connections, as a failed rank of a real job does).
    dist.destroy_process_group()


def succeeded(results: list[Any]) -> list[Any]:
    """``results`` if no rank raised; otherwise fail with every failed rank's message."""
    failed = [f"rank {rank}: {r.type_name}: {r.message}" for rank, r in enumerate(results) if isinstance(r, Raised)]
    if failed:
        raise AssertionError("\n".join(failed))
    return results


def run_ranks(world_size: int, fn: Any, *args: Any, deadline_s: float = 60.0) -> list[Any]:
    import torch.distributed  # noqa: F401 - here, so that every forked rank has it already

    context = multiprocessing.get_context("fork")
    port = free_port()
    pipes = [context.Pipe(duplex=False) for _ in range(world_size)]
    processes = [
        context.Process(target=_rank_main, args=(rank, world_size, port, pipes[rank][1], fn, args))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    for _, sending in pipes:
        sending.close()
    outcomes: dict[int, Any] = {}
    pending = {pipes[rank][0]: rank for rank in range(world_size)}
    # A rank's death shows on its process's sentinel: its answer pipe stays open while the
    # other ranks, which inherited it, live on.
    sentinels = {processes[rank].sentinel: rank for rank in range(world_size)}
    try:
        while pending:
            ready = connection.wait([*pending, *(s for s, r in sentinels.items() if r in pending.values())], deadline_s)
            if not ready:
                raise AssertionError(f"ranks {sorted(pending.values())} gave no result within {deadline_s} s")
            for waited in ready:
                receiving = next((pipe for pipe, rank in pending.items() if pipe is waited), None)
                if receiving is None:  # a sentinel: the process ended; its answer may still be in the pipe
                    rank = sentinels[waited]
                    receiving = pipes[rank][0]
                    if receiving not in pending:
                        continue
                    if not receiving.poll():
                        processes[rank].join(5)
                        del pending[receiving]
                        outcomes[rank] = Raised("Died", f"rank {rank} exited with {processes[rank].exitcode}")
                        continue
                rank = pending.pop(receiving)  # type: ignore[call-overload]
                try:
                    outcomes[rank] = receiving.recv()  # type: ignore[union-attr]
                except EOFError:  # it died before answering
                    outcomes[rank] = Raised("Died", f"rank {rank} exited with {processes[rank].exitcode}")
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
        for receiving, _ in pipes:
            receiving.close()
    return [outcomes[rank] for rank in range(world_size)]
