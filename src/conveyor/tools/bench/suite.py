"""The suite of ``conveyor bench``: its workloads x its loaders, declared with the harness
(:mod:`conveyor.tools.bench.harness`), which runs each in a fresh process and checks it.

A run's process imports this module by its name (``Suite.module``), so it declares
nothing that needs more than numpy at import time.
"""

from __future__ import annotations

from conveyor.tools.bench.harness.declare import Suite, Workload
from conveyor.tools.bench.loaders import LOADERS, torch_problem
from conveyor.tools.bench.workloads import WORKLOADS


def needs_torch(workload: Workload, command: list[str]) -> list[str] | str:
    """The tensor workload's runs, or why they cannot be made: its items are torch's."""
    problem = torch_problem() if workload.key == "tensor" else ""
    return f"the tensor workload needs torch ({problem})" if problem else command


SUITE = Suite(
    name="conveyor-bench",
    title="conveyor bench: conveyor against torch's DataLoader and torchdata 0.7.1's DataLoader2",
    path=__file__,
    module=__name__,
    workloads=WORKLOADS,
    loaders=LOADERS,
    subject="conveyor",
    command=needs_torch,
)
