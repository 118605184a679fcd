"""How much shared memory the rings take: the memory that backs it (cgroup limits and
/proc/meminfo, read from a fake tree here), the budget's split between workers, smaller
rings when one cannot be reserved, and the loader's one warning."""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path

import pytest

from conveyor import MultiProcessingReadingService
from conveyor.errors import SharedMemoryWarning
from conveyor.workers.transport.shared_memory import (
    RING_BYTES,
    Backing,
    SharedMemory,
    memory_backing,
    plan_rings,
)
from shm_helpers import run_in_private_dev_shm

MiB, GiB = 1 << 20, 1 << 30

V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = (
    "30 23 0:26 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory\n"
    "31 23 0:27 / /sys/fs/cgroup/cpu rw,nosuid shared:10 - cgroup cgroup rw,cpu,cpuacct\n"
)


def fake_root(tmp_path: Path, cgroup: str, mountinfo: str, files: dict[str, str], available_kib: int = 8 << 20) -> Path:
    """A tree with /proc/self/cgroup, /proc/self/mountinfo, /proc/meminfo and cgroup files."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    (tmp_path / "proc/meminfo").write_text(
        f"MemTotal:       {2 * available_kib} kB\nMemFree:        1000 kB\nMemAvailable:   {available_kib} kB\n"
    )
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return tmp_path


def test_without_limits_the_backing_is_memavailable(tmp_path):
    root = fake_root(tmp_path, "0::/user.slice\n", V2_MOUNTS, {"sys/fs/cgroup/user.slice/memory.max": "max\n"})
    assert memory_backing(root, memfd=True) == Backing(8 * GiB, "MemAvailable 8 GiB")


def test_the_smallest_cgroup_v2_limit_on_the_path_counts(tmp_path):
    root = fake_root(
        tmp_path,
        "0::/docker/abc/inner\n",
        V2_MOUNTS,
        {
            "sys/fs/cgroup/docker/memory.max": str(2 * GiB),
            "sys/fs/cgroup/docker/abc/memory.max": str(512 * MiB),
            "sys/fs/cgroup/docker/abc/inner/memory.max": "max",
        },
    )
    backing = memory_backing(root, memfd=True)
    assert backing.bytes == 512 * MiB and "cgroup v2 memory.max" in backing.source


def test_a_cgroup_namespace_reads_the_mount_top(tmp_path):
    # Inside a cgroup namespace /proc/self/cgroup says "/" and the container's limit sits at the top.
    root = fake_root(tmp_path, "0::/\n", V2_MOUNTS, {"sys/fs/cgroup/memory.max": str(256 * MiB)})
    assert memory_backing(root, memfd=True).bytes == 256 * MiB


def test_a_path_outside_the_mounted_cgroup_falls_back_to_the_mount_top(tmp_path):
    mounts = "30 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    root = fake_root(tmp_path, "0::/docker/abc\n", mounts, {"sys/fs/cgroup/memory.max": str(300 * MiB)})
    assert memory_backing(root, memfd=True).bytes == 300 * MiB


def test_cgroup_v1_memory_limit_and_its_no_limit_value(tmp_path):
    root = fake_root(
        tmp_path,
        "4:memory:/process_api/x\n0::/\n",
        V1_MOUNTS,
        {
            "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",  # v1's "no limit"
            "sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": str(1 * GiB),
        },
    )
    backing = memory_backing(root, memfd=True)
    assert backing.bytes == 1 * GiB and "v1" in backing.source
    (root / "sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes").write_text("9223372036854771712")
    assert memory_backing(root, memfd=True).source.startswith("MemAvailable")


def test_no_cgroup_files_and_an_old_meminfo(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       4194304 kB\nMemFree:        1000 kB\n")
    assert memory_backing(tmp_path, memfd=True) == Backing(4 * GiB, "MemTotal 4 GiB")


def test_dev_shm_bounds_only_the_dev_shm_file_fallback(tmp_path):
    root = fake_root(tmp_path, "0::/\n", V2_MOUNTS, {}, available_kib=1 << 40)  # 1 PiB: more than any disk
    (root / "dev/shm").mkdir(parents=True)
    assert memory_backing(root, memfd=True).source.startswith("MemAvailable")
    assert memory_backing(root, memfd=False).source == "/dev/shm's free space"


def test_the_default_budget_is_64_mib_per_worker_within_an_eighth_of_the_backing():
    plenty = Backing(64 * GiB, "MemAvailable")
    assert plan_rings(4, None, plenty).capacity == RING_BYTES
    assert plan_rings(4, None, plenty).cut == ""
    container = Backing(1 * GiB, "cgroup v2 memory.max 1 GiB")  # 128 MiB for all rings
    assert plan_rings(4, None, container).capacity == 32 * MiB
    tiny = Backing(16 * MiB, "cgroup v2 memory.max 16 MiB")  # 2 MiB for 4 rings: under 1 MiB each
    plan = plan_rings(4, None, tiny)
    assert plan.capacity == 0 and "1/8" in plan.cut


def test_an_explicit_budget_is_split_and_cut_to_half_the_backing():
    backing = Backing(1 * GiB, "cgroup v2 memory.max 1 GiB")
    assert plan_rings(2, 100 * MiB, backing).capacity == 50 * MiB
    assert plan_rings(2, 100 * MiB + 123, backing).capacity % 4096 == 0
    plan = plan_rings(2, 2 * GiB, backing)
    assert plan.capacity == 256 * MiB and "over half" in plan.cut
    assert plan_rings(4, 3 * MiB, backing).capacity == 0  # under MIN_RING each: none


def test_a_zero_budget_means_no_rings_and_no_warning(recwarn):
    shared = SharedMemory(2, 0)
    assert shared.ring_capacity == 0 and shared.create_ring(0) is None
    assert not recwarn.list


def _fail_above(limit: int):
    def fallocate(fd: int, offset: int, length: int) -> None:
        if length > limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate(fd, offset, length)

    return fallocate


def _fail_for_files_above(limit: int):
    """A system that cannot back a shared file larger than ``limit`` bytes."""

    def fallocate(fd: int, offset: int, length: int) -> None:
        if os.fstat(fd).st_size > limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate(fd, offset, length)

    return fallocate


def test_a_ring_that_cannot_be_reserved_is_tried_smaller_without_a_warning(recwarn):
    # 8 and 4 MiB rings cannot be reserved when made, 2 MiB can.
    shared = SharedMemory(2, 16 * MiB, fallocate=_fail_for_files_above(3 * MiB))
    ring = shared.create_ring(0)
    try:
        assert ring is not None and ring.capacity == 2 * MiB
        assert shared.ring_capacity == 2 * MiB, "the next worker starts from the size that worked"
    finally:
        assert ring is not None
        ring.close()
    assert not recwarn.list


def test_when_no_ring_can_be_had_the_loader_warns_once_naming_the_cause():
    shared = SharedMemory(3, 12 * MiB, fallocate=_fail_above(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [shared.create_ring(w) for w in range(3)] == [None, None, None]
        shared.piped("a later spill failed too")
    assert len(caught) == 1
    message = str(caught[0].message)
    assert caught[0].category is SharedMemoryWarning and "\n" not in message
    assert "ENOSPC" in message and "shared_memory_budget" in message and "memory limit" in message


def test_the_budget_is_validated():
    for bad in (-1, 1.5, "64M", True):
        with pytest.raises(ValueError, match="shared_memory_budget"):
            MultiProcessingReadingService(2, shared_memory_budget=bad)
    assert MultiProcessingReadingService(2, shared_memory_budget=0).shared_memory_budget == 0


# --- a real tmpfs too small for the ring -------------------------------------------------

TINY_TMPFS_CHECK = """
import os, sys
from conveyor.errors import SharedMemoryError
import conveyor.workers.transport.ring as ring
import conveyor.workers.transport.shared_files as shared_files
shared_files.memfd_create = None  # the /dev/shm file fallback, on the 1 MiB tmpfs mounted there
try:
    ring.ShmRing.create(4 << 20, tag="tiny")
except SharedMemoryError as error:
    print("refused:", error)
print("left:", os.listdir("/dev/shm"))
"""


def test_a_real_tmpfs_too_small_refuses_the_ring_at_creation():
    done = run_in_private_dev_shm(TINY_TMPFS_CHECK, "1m")
    assert done.returncode == 0, done.stderr
    assert "could not be reserved" in done.stdout and "ENOSPC" in done.stdout
    assert "left: []" in done.stdout, "the half-made file was unlinked at creation"


def test_without_memfd_or_a_writable_dev_shm_there_are_no_rings_and_one_warning(tmp_path, monkeypatch):
    import conveyor.workers.transport.shared_files as shared_files

    monkeypatch.setattr(shared_files, "memfd_create", None)
    root = fake_root(tmp_path, "0::/\n", V2_MOUNTS, {})  # no dev/shm in it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shared = SharedMemory(2, None, root=root)
        assert shared.ring_capacity == 0 and shared.create_ring(0) is None
    assert len(caught) == 1 and "neither memfd_create nor a writable /dev/shm" in str(caught[0].message)


def test_without_memfd_the_shared_file_never_has_a_name(monkeypatch):
    """Where memfd_create is missing, the file is made unnamed in /dev/shm (O_TMPFILE): a
    process killed while making it leaves nothing behind, not even for an instant."""
    import conveyor.workers.transport.shared_files as shared_files

    monkeypatch.setattr(shared_files, "memfd_create", None)

    def no_names(path, *args, **kwargs):
        raise AssertionError(f"a named file was made: {path}")

    monkeypatch.setattr(shared_files.os, "unlink", no_names)
    fd = shared_files.anonymous_shared_file("unnamed-test")
    try:
        assert os.readlink(f"/proc/self/fd/{fd}").endswith("(deleted)")
        os.ftruncate(fd, 4096)
        assert os.fstat(fd).st_size == 4096
    finally:
        os.close(fd)
