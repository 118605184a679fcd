"""Arrays and batches built where they are sent: ``conveyor.shared_empty`` in a worker,
``batch().collate()`` and ``conveyor.DataLoader``'s default collate. What arrives is what
a main-process run makes (same values, dtypes, shapes), lives in the very pages the worker
wrote (no copy on the way), and stays valid and unchanged after later items, after
``shutdown()`` and after the worker is gone.

Where an array lives: its offset in the shared file of the worker's ring it is in. The
worker records the offset of what it made; the main process finds the same offset for
what it received only when no copy was made on the way (a copy would go to other pages:
the worker's stay claimed until sent).

torch (and ``conveyor.DataLoader``, which needs it) is imported by the tests that use it:
spawned and forkserver workers import this module for its functions, and need numpy alone."""

from __future__ import annotations

import io
import os
import signal
import sys
from typing import Any

import numpy as np
import pytest

import conveyor
from conveyor import DataLoader2, MultiProcessingReadingService, shared_empty, shared_empty_like
from conveyor.pipes import IterableWrapper
from conveyor.pipes.io.images import npy_array
from conveyor.workers.transport.shared_files import SHM_PREFIX

SIDE = 224
MIB = 1024 * 1024


def mapping_offset(array: Any) -> int | None:
    """Where ``array``'s memory is in a worker's ring: its offset in the ring's shared file
    (read from ``/proc/self/maps``, so the same in the worker and in the main process), or
    None when it is anywhere else."""
    torch = sys.modules.get("torch")  # a tensor exists only where torch is loaded
    address = array.data_ptr() if torch is not None and isinstance(array, torch.Tensor) else array.ctypes.data
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            if low <= address < high:
                in_ring = len(fields) > 5 and f"{SHM_PREFIX}ring-" in fields[5]
                return address - low + int(fields[2], 16) if in_ring else None
    return None


def made_in_place(index: int) -> tuple[int, np.ndarray, int | None]:
    array = shared_empty((MIB,), dtype=np.uint8)
    array.fill(index % 251)
    return index, array, mapping_offset(array)


def image(index: int) -> np.ndarray:
    return np.full((SIDE, SIDE, 3), index % 251, dtype=np.uint8)


def collated_with_offset(batch: Any) -> tuple[np.ndarray, int | None]:
    return batch, mapping_offset(batch)


def loader(pipe: Any, start_method: str) -> DataLoader2:
    return DataLoader2(
        pipe, reading_service=MultiProcessingReadingService(num_workers=2, multiprocessing_context=start_method)
    )


@pytest.mark.timeout(120)
def test_an_array_made_by_shared_empty_arrives_from_the_pages_the_worker_wrote(start_method: str) -> None:
    pipe = IterableWrapper(range(40)).sharding_filter().map(made_in_place)
    dl = loader(pipe, start_method)
    received = list(dl)
    dl.shutdown()
    assert sorted(index for index, _, _ in received) == list(range(40))
    for index, array, offset_in_worker in received:
        assert offset_in_worker is not None, "in a worker, shared_empty makes the array in its ring"
        assert mapping_offset(array) == offset_in_worker, "the array was copied on its way"
        assert array.flags.writeable and array.dtype == np.uint8 and array.shape == (MIB,)
        assert (array == index % 251).all(), "changed after later items or after shutdown()"


@pytest.mark.timeout(120)
def test_a_collated_batch_is_built_in_the_ring_and_equals_a_main_process_batch(start_method: str) -> None:
    pipe = IterableWrapper(range(256)).sharding_filter().map(image).batch(64).collate()
    dl = loader(pipe.map(collated_with_offset), start_method)
    received = list(dl)
    dl.shutdown()
    # what each worker's share (every other item) makes in the main process, batch by batch
    expected = [
        np.stack([image(index) for index in share[start : start + 64]])
        for share in (range(0, 256, 2), range(1, 256, 2))
        for start in range(0, 128, 64)
    ]
    batches = {(int(batch[0, 0, 0, 0]), int(batch[1, 0, 0, 0])): batch for batch, _ in received}
    assert len(batches) == len(expected) == 4
    for want in expected:
        got = batches[int(want[0, 0, 0, 0]), int(want[1, 0, 0, 0])]
        assert got.dtype == want.dtype and got.shape == want.shape == (64, SIDE, SIDE, 3)
        np.testing.assert_array_equal(got, want)
    for batch, offset_in_worker in received:
        assert offset_in_worker is not None and mapping_offset(batch) == offset_in_worker


@pytest.mark.timeout(120)
def test_to_tensor_batches_are_built_in_the_ring_too() -> None:
    import torch

    pipe = IterableWrapper(range(128)).sharding_filter().map(image).batch(64).collate(to_tensor=True)
    dl = loader(pipe, "fork")
    received = list(dl)
    dl.shutdown()
    assert all(isinstance(batch, torch.Tensor) and batch.dtype == torch.uint8 for batch in received)
    assert all(mapping_offset(batch) is not None for batch in received)
    assert sorted(int(batch[0, 0, 0, 0]) for batch in received) == [0, 1]  # each worker's first item


@pytest.mark.timeout(120)
def test_the_drop_in_loaders_default_collate_matches_torchs_and_sends_from_the_ring() -> None:
    import torch

    from conveyor import DataLoader

    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 256

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            return torch.full((3, SIDE, SIDE), index % 251, dtype=torch.uint8), index

    ours = list(DataLoader(Images(), batch_size=64, num_workers=2))
    theirs = list(torch.utils.data.DataLoader(Images(), batch_size=64, num_workers=0))
    assert len(ours) == len(theirs) == 4
    for (images, labels), (want_images, want_labels) in zip(ours, theirs, strict=True):
        assert images.dtype == want_images.dtype and images.shape == want_images.shape
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        assert mapping_offset(images) is not None, "the batch was not built in the worker's ring"


def kept_every_tenth(item: tuple[int, np.ndarray, int | None]) -> bool:
    return item[0] % 10 == 0


@pytest.mark.timeout(180)
def test_arrays_never_sent_give_their_pages_back() -> None:
    """900 MiB made in 2 workers whose rings are far smaller, nine in ten dropped by a
    filter in the worker: every kept one still arrives from the ring (each dropped as it
    is checked), so the dropped ones' pages came back."""
    pipe = IterableWrapper(range(900)).sharding_filter().map(made_in_place).filter(kept_every_tenth)
    dl = loader(pipe, "fork")
    indices, copied = [], []
    for index, array, offset in dl:
        indices.append(index)
        if offset is None or mapping_offset(array) != offset:
            copied.append(index)
    dl.shutdown()
    assert sorted(indices) == list(range(0, 900, 10))
    assert copied == []


def dies_after(item: tuple[int, np.ndarray, int | None]) -> tuple[int, np.ndarray, int | None]:
    if item[0] == 30:
        os.kill(os.getpid(), signal.SIGKILL)
    return item


@pytest.mark.timeout(120)
def test_arrays_received_stay_valid_after_their_worker_dies() -> None:
    pipe = IterableWrapper(range(60)).sharding_filter().map(made_in_place).map(dies_after)
    dl = loader(pipe, "fork")
    received = []
    with pytest.raises(conveyor.errors.WorkerError):
        for item in dl:
            received.append(item)
    dl.shutdown()
    assert received
    for index, array, _ in received:
        assert (array == index % 251).all()
        array[:] = 1  # still writable memory of the user's
        assert int(array.sum()) == MIB


def test_outside_a_worker_they_are_ordinary_numpy_arrays() -> None:
    array = shared_empty((4, MIB // 4), dtype=np.float32)
    assert mapping_offset(array) is None and array.shape == (4, MIB // 4) and array.dtype == np.float32
    fortran = shared_empty((300, 400), dtype=np.int16, order="F")
    assert fortran.flags.f_contiguous and fortran.shape == (300, 400)
    like = shared_empty_like(fortran)
    assert like.flags.f_contiguous and like.dtype == np.int16 and like.shape == (300, 400)
    assert shared_empty_like([[1, 2], [3, 4]], dtype=np.float64, shape=(3,)).shape == (3,)
    assert shared_empty(5).shape == (5,) and shared_empty(5).dtype == np.float64
    with pytest.raises(ValueError, match="order must be 'C' or 'F'"):
        shared_empty(3, order="X")


def fortran_in_worker(index: int) -> tuple[bool, int | None, np.ndarray]:
    array = shared_empty((512, 256), dtype=np.float64, order="F")
    array[...] = index
    return bool(array.flags.f_contiguous), mapping_offset(array), array


@pytest.mark.timeout(120)
def test_a_column_major_array_made_in_a_worker_arrives_column_major() -> None:
    dl = loader(IterableWrapper(range(4)).sharding_filter().map(fortran_in_worker), "fork")
    received = list(dl)
    dl.shutdown()
    for fortran, offset, array in received:
        assert fortran and offset is not None
        assert array.shape == (512, 256) and (array == array[0, 0]).all()


def npy_bytes(index: int) -> bytes:
    saved = io.BytesIO()
    np.save(saved, np.full((256, 1024), index, dtype=np.float32))
    return saved.getvalue()


def read_npy(data: bytes) -> tuple[np.ndarray, int | None]:
    array = npy_array(data)
    return array, mapping_offset(array)


@pytest.mark.timeout(120)
def test_npy_fields_are_read_into_the_ring_and_sent_from_there() -> None:
    dl = loader(IterableWrapper(range(8)).sharding_filter().map(npy_bytes).map(read_npy), "fork")
    received = list(dl)
    dl.shutdown()
    assert sorted(int(array[0, 0]) for array, _ in received) == list(range(8))
    for array, offset in received:
        assert offset is not None and mapping_offset(array) == offset
        assert array.dtype == np.float32 and (array == array[0, 0]).all()
