"""Arrays made where they will be sent: :func:`shared_empty` and :func:`shared_empty_like`.

In a worker process, a large array made by these lives in the worker's shared memory
(its ring), and the transport sends it to the main process without copying it: the
main process hands the user the very memory the worker wrote. Everywhere else (the main
process, a thread worker, a thread of the worker other than the one that runs its
pipeline), they make an ordinary array. The worker runtime installs where the memory
comes from (:func:`install_allocator`); this module only asks.

``batch().collate()``, ``conveyor.DataLoader``'s default collate and
``map_batches`` outputs stacked by :func:`conveyor.pipes.default_collate` build their
batches with them.
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any, SupportsIndex, cast

import numpy as np

#: Gives ``nbytes`` of shared memory as a writable uint8 array, or None (make an ordinary one).
Allocator = Callable[[int], "np.ndarray | None"]

_installed: tuple[int, Allocator] | None = None  # (thread that may use it, the allocator)


def install_allocator(allocate: Allocator | None) -> None:
    """The worker runtime's: arrays :func:`shared_empty` makes on the calling thread come
    from ``allocate`` from now on (None: ordinary arrays again). Only that thread uses
    it, since the memory's bookkeeping has one writer."""
    global _installed
    _installed = None if allocate is None else (threading.get_ident(), allocate)


def shared_empty(shape: SupportsIndex | Sequence[SupportsIndex], dtype: Any = float, order: str = "C") -> np.ndarray:
    """A new array, uninitialized, in the memory it will be sent through (numpy's ``empty``).

    In a worker of ``MultiProcessingReadingService`` or ``conveyor.DataLoader``, a large
    array (64 KiB and up) is made in the worker's shared memory, and an item that carries
    it reaches the main process without a copy: fill it, and return it in an item (as it
    is, or as ``torch.from_numpy(array)``). Anywhere else, and for small or object
    arrays, it is ``numpy.empty``. The main process receives it as any other array:
    writable, and valid for as long as the user holds it.

    Once an item carrying it is sent, the array is the main process's: don't write to it
    again in the worker (as with torch's shared-memory tensors). An array never sent
    gives its memory back when the worker drops it.

    Args:
        shape: The array's shape (an int for one dimension).
        dtype: Its data type (numpy's default: ``float``).
        order: ``"C"`` (row-major, the default) or ``"F"`` (column-major).

    Returns:
        A writable ``numpy.ndarray`` of that shape and dtype.

    Example:
        >>> from conveyor import shared_empty
        >>> image = shared_empty((224, 224, 3), dtype="uint8")
        >>> image.fill(7)
        >>> int(image.sum()) == 7 * 224 * 224 * 3
        True
    """
    if order not in ("C", "F"):
        raise ValueError(f"shared_empty: order must be 'C' or 'F', got {order!r}")
    # Not isinstance(shape, SupportsIndex): a runtime protocol check walks the type's
    # attributes on every call, and this runs once per array a worker makes.
    if hasattr(type(shape), "__index__"):
        sizes: tuple[int, ...] = (operator.index(cast(SupportsIndex, shape)),)
    else:
        sizes = tuple(operator.index(size) for size in cast(Sequence[SupportsIndex], shape))
    kind = np.dtype(dtype)
    installed = _installed
    if installed is not None and not kind.hasobject and installed[0] == threading.get_ident():
        nbytes = kind.itemsize * math.prod(sizes)
        if nbytes > 0 and all(size >= 0 for size in sizes):
            raw = installed[1](nbytes)
            if raw is not None:
                if order == "F":
                    return raw.view(kind).reshape(sizes[::-1]).T
                return raw.view(kind).reshape(sizes)
    return np.empty(sizes, dtype=kind, order=order)  # type: ignore[call-overload]


def shared_empty_like(
    prototype: Any,
    dtype: Any = None,
    order: str = "K",
    shape: SupportsIndex | Sequence[SupportsIndex] | None = None,
) -> np.ndarray:
    """A new array with ``prototype``'s shape and dtype, made as :func:`shared_empty`
    makes one (numpy's ``empty_like``).

    Args:
        prototype: An array (or anything ``numpy.asarray`` takes) whose shape and dtype
            the new array has.
        dtype: Its data type instead of ``prototype``'s.
        order: ``"C"``, ``"F"``, or ``"K"``/``"A"`` (the default): column-major when
            ``prototype`` is Fortran-contiguous and not C-contiguous, else row-major.
        shape: Its shape instead of ``prototype``'s.

    Returns:
        A writable ``numpy.ndarray``.

    Example:
        >>> import numpy as np
        >>> from conveyor import shared_empty_like
        >>> batch = shared_empty_like(np.zeros((64, 3), dtype=np.float32))
        >>> batch.shape, batch.dtype
        ((64, 3), dtype('float32'))
    """
    array = prototype if isinstance(prototype, np.ndarray) else np.asarray(prototype)
    if order in ("K", "A"):
        fortran = array.flags.f_contiguous and not array.flags.c_contiguous
        order = "F" if fortran else "C"
    return shared_empty(array.shape if shape is None else shape, array.dtype if dtype is None else dtype, order=order)


#: Batch arrays being filled row by row as their items arrive
#: (:class:`conveyor.core.batch_rows.BatchRows`), by the id of their first row: (the batch
#: array, its rows so far). :func:`stack` and :func:`stack_tensors` given exactly those
#: rows return the batch array instead of stacking them again.
GATHERED: dict[int, tuple[Any, list[Any]]] = {}


def gathered_batch(values: Sequence[Any]) -> Any:
    """The batch array whose rows ``values`` are, all of them in order, or None."""
    if not values or not GATHERED:
        return None
    entry = GATHERED.get(id(values[0]))
    if entry is None:
        return None
    batch, rows = entry
    if len(values) != len(rows) or any(value is not row for value, row in zip(values, rows, strict=True)):
        return None
    return batch if len(rows) == len(batch) else batch[: len(rows)]


def stack(arrays: Sequence[Any]) -> np.ndarray:
    """``numpy.stack(arrays)``, into an array :func:`shared_empty` makes when the arrays
    agree in shape and dtype (a batch built where it will be sent); the same values,
    dtype and errors as ``numpy.stack`` otherwise."""
    gathered = gathered_batch(arrays)
    if gathered is not None:
        return gathered
    if _installed is None or not arrays:
        return np.stack(arrays)
    first = arrays[0]
    shape, kind = first.shape, first.dtype
    if any(type(array) is not np.ndarray or array.shape != shape or array.dtype != kind for array in arrays):
        return np.stack(arrays)
    return np.stack(arrays, out=shared_empty((len(arrays), *shape), kind))


_NUMPY_DTYPES: dict[Any, np.dtype[Any] | None] = {}  # torch dtype -> numpy's (None: numpy has none)


def stack_tensors(tensors: Sequence[Any]) -> Any:
    """``torch.stack(tensors)``, into memory :func:`shared_empty` makes when the tensors
    are plain CPU tensors that agree in shape and dtype and numpy has that dtype; the same
    values, dtype and errors as ``torch.stack`` otherwise."""
    import torch

    gathered = gathered_batch(tensors)
    if gathered is not None:
        return gathered
    if _installed is None or not tensors:
        return torch.stack(list(tensors))
    first = tensors[0]
    shape, kind = first.shape, first.dtype
    plain = first.device.type == "cpu" and first.layout == torch.strided and not first.requires_grad
    if not plain or any(
        type(tensor) is not torch.Tensor or tensor.shape != shape or tensor.dtype != kind for tensor in tensors
    ):
        return torch.stack(list(tensors))
    numpy_kind = numpy_dtype(kind)
    if numpy_kind is None:
        return torch.stack(list(tensors))
    out = torch.from_numpy(shared_empty((len(tensors), *shape), numpy_kind))
    return torch.stack(list(tensors), out=out)


def numpy_dtype(torch_dtype: Any) -> np.dtype[Any] | None:
    """numpy's dtype for a torch dtype, or None where numpy has none (``bfloat16``...)."""
    if torch_dtype not in _NUMPY_DTYPES:
        import torch

        try:
            _NUMPY_DTYPES[torch_dtype] = torch.empty(0, dtype=torch_dtype).numpy().dtype
        except TypeError:  # bfloat16 and others numpy lacks
            _NUMPY_DTYPES[torch_dtype] = None
    return _NUMPY_DTYPES[torch_dtype]
