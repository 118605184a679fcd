"""How an op becomes a method: ``pipe.map(fn)`` builds ``Mapper(pipe, fn)``.

:meth:`IterDataPipe.register_functional <conveyor.pipes.base.DataPipe.register_functional>`
(torchdata's ``functional_datapipe``) takes an op class, built as ``Op(pipe, *args,
**kwargs)``, or a function called as ``fn(pipe, *args, **kwargs)``, and installs a method
under the name. The method says what it takes: its signature is the op's own, the pipe it
is called on in place of the op's first input (``inspect.signature``, ``help()``, IDEs and
the API reference all read it), and its docstring is the function's, or the class's.

conveyor's own ops register a function written next to each op class, typed and
documented as the method it becomes; their types reach type checkers through the stub
``base.pyi`` (generated from those functions, see ``tests/support/fluent_stub.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

#: What a functional method is made from: an op class or a function.
Op = Callable[..., Any]


def method_signature(op: Op) -> inspect.Signature | None:
    """The signature of the method made from ``op``: ``self`` (the pipe it is called on),
    then the op's parameters after its input; None when ``op``'s signature is not known
    (a builtin, or a class with ``*args`` in C)."""
    try:
        signature = inspect.signature(op)
    except (TypeError, ValueError):  # no signature to read: the method keeps its own
        return None
    params = list(signature.parameters.values())
    if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:  # Op(*sources): the pipe is one of them
        rest = params
    elif params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        rest = params[1:]
    else:  # no input parameter to stand for the pipe: leave the method's own signature
        return None
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return_annotation = signature.return_annotation if not isinstance(op, type) else inspect.Signature.empty
    return signature.replace(parameters=[self_param, *rest], return_annotation=return_annotation)


def make_method(owner: type, name: str, op: Op, aliases: Mapping[str, str]) -> Callable[..., Any]:
    """The method ``owner.<name>``: calls ``op(self, *args, **kwargs)``, first renaming
    the keywords in ``aliases`` (another name -> the op's own) to the op's names."""
    renames = dict(aliases)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        for alias in renames.keys() & kwargs.keys():
            own = renames[alias]
            if own in kwargs:
                raise TypeError(f"{name}() got both {alias}= and {own}=, which name the same argument")
            kwargs[own] = kwargs.pop(alias)
        return op(self, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"{owner.__name__}.{name}"
    method.__module__ = op.__module__
    method.__doc__ = op.__doc__
    signature = method_signature(op)
    if signature is not None:  # what inspect.signature reads; inspect.getsource follows __wrapped__ to the op
        method.__dict__.update(__signature__=signature, __wrapped__=op)
    return method
