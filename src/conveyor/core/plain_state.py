"""Users' states as plain JSON-safe data, and back, unchanged.

The states of user objects (a sampler's, a dataset's: anything :class:`Stateful`) may hold
what JSON cannot: torch tensors (``torch.get_rng_state()``), numpy arrays and scalars,
tuples, bytes, sets, dicts with keys that are not strings. :func:`encode` turns such a
value into JSON-safe data, tagging what needs it as ``{"__conveyor__": <tag>, ...}``;
:func:`decode` gives back an equal value of the same types. Anything else is a
:class:`~conveyor.errors.StateError` at :func:`encode` time, naming the object and the key
path, never a state that fails to load later. Loading never runs code: tags name a fixed
set of value kinds.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Protocol, runtime_checkable

import numpy as np

from conveyor.core.torch_support import loaded_torch, require_torch
from conveyor.errors import StateError

TAG = "__conveyor__"
#: The longest path shown in an error.
_PATH_LIMIT = 200


@runtime_checkable
class Stateful(Protocol):
    """torchdata's protocol: an object (dataset, sampler, iterator) whose position a
    checkpoint keeps, through ``state_dict()`` and ``load_state_dict(state)``."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def keeps_state(obj: Any) -> bool:
    """Whether ``obj`` follows the :class:`Stateful` protocol (callable ``state_dict`` and
    ``load_state_dict``): a sampler, dataset or iterator that keeps its own position."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def encode(value: Any, owner: str) -> Any:
    """``value`` as JSON-safe data (see the module); ``owner`` names whose state it is."""
    return _encode(value, owner, "")


def _encode(value: Any, owner: str, path: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and type(value) is int:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {TAG: "float", "repr": repr(value)}
    if type(value) is list:
        return [_encode(v, owner, f"{path}[{i}]") for i, v in enumerate(value)]
    if type(value) is tuple:
        return {TAG: "tuple", "items": [_encode(v, owner, f"{path}[{i}]") for i, v in enumerate(value)]}
    if type(value) in (set, frozenset):
        items = sorted((_encode(v, owner, f"{path}{{}}") for v in value), key=repr)
        return {TAG: type(value).__name__, "items": items}
    if type(value) is dict:
        if all(type(k) is str and k != TAG for k in value):
            return {k: _encode(v, owner, f"{path}.{k}") for k, v in value.items()}
        pairs = [[_encode(k, owner, f"{path}<key>"), _encode(v, owner, f"{path}[{k!r}]")] for k, v in value.items()]
        return {TAG: "dict", "pairs": pairs}
    if isinstance(value, (bytes, bytearray)):
        return {TAG: type(value).__name__, "b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, np.ndarray) and value.dtype != object:
        return _array("ndarray", value, path)
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return {TAG: "npscalar", "dtype": value.dtype.str, "value": _encode(value.item(), owner, path)}
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized:
            raise _refused(owner, path, f"a {value.layout} tensor")
        cpu = value.detach().to("cpu").contiguous()
        name = str(cpu.dtype).removeprefix("torch.")
        raw = cpu.reshape(-1).view(torch.uint8).numpy().tobytes() if cpu.numel() else b""
        data = base64.b64encode(raw).decode("ascii")
        return {TAG: "tensor", "dtype": name, "shape": list(cpu.shape), "b64": data}
    raise _refused(owner, path, f"a {type(value).__name__}")


def _array(tag: str, array: np.ndarray, path: str) -> dict[str, Any]:
    contiguous = np.ascontiguousarray(array)
    data = base64.b64encode(contiguous.tobytes()).decode("ascii")
    return {TAG: tag, "dtype": contiguous.dtype.str, "shape": list(contiguous.shape), "b64": data}


def _refused(owner: str, path: str, what: str) -> StateError:
    where = path.lstrip(".") or "(the state itself)"
    if len(where) > _PATH_LIMIT:
        where = "..." + where[-_PATH_LIMIT:]
    return StateError(
        f"the state of {owner} holds {what} at {where}, which a checkpoint cannot keep as plain data: "
        "keep ints, floats, strings, bools, None, lists, dicts, tuples, sets, bytes, numpy arrays "
        "and torch tensors in state_dict()"
    )


def decode(data: Any, owner: str) -> Any:
    """The value :func:`encode` turned into ``data``; a malformed tag is a ``StateError``."""
    return _decode(data, owner)


def _decode(data: Any, owner: str) -> Any:
    if type(data) is list:
        return [_decode(v, owner) for v in data]
    if type(data) is not dict:
        return data
    tag = data.get(TAG)
    if tag is None:
        return {k: _decode(v, owner) for k, v in data.items()}
    try:
        return _decode_tagged(tag, data, owner)
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise StateError(f"the state of {owner}: a malformed {tag!r} value ({type(err).__name__}: {err})") from None


def _decode_tagged(tag: Any, data: dict[str, Any], owner: str) -> Any:
    if tag == "tuple":
        return tuple(_decode(v, owner) for v in data["items"])
    if tag in ("set", "frozenset"):
        items = [_decode(v, owner) for v in data["items"]]
        return set(items) if tag == "set" else frozenset(items)
    if tag == "dict":
        return {_decode(k, owner): _decode(v, owner) for k, v in data["pairs"]}
    if tag == "float":
        return float(data["repr"])
    if tag in ("bytes", "bytearray"):
        raw = base64.b64decode(data["b64"].encode("ascii"), validate=True)
        return raw if tag == "bytes" else bytearray(raw)
    if tag == "ndarray":
        dtype = np.dtype(data["dtype"])
        if dtype.hasobject:
            raise ValueError("object arrays are not state")
        raw = base64.b64decode(data["b64"].encode("ascii"), validate=True)
        return np.frombuffer(raw, dtype=dtype).reshape(data["shape"]).copy()
    if tag == "npscalar":
        dtype = np.dtype(data["dtype"])
        if dtype.hasobject:
            raise ValueError("object scalars are not state")
        return dtype.type(data["value"])
    if tag == "tensor":
        torch = require_torch(f"restoring the state of {owner}")
        dtype = getattr(torch, data["dtype"])
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"no torch dtype {data['dtype']!r}")
        raw = base64.b64decode(data["b64"].encode("ascii"), validate=True)
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(data["shape"]).clone() if raw else torch.empty(data["shape"], dtype=dtype)
    raise ValueError(f"unknown tag {tag!r}")
