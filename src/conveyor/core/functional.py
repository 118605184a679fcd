"""How an op becomes a method: ``pipe.map(fn)`` builds ``Mapper(pipe, fn)``.

:meth:`IterDataPipe.register_functional <conveyor.pipes.base.DataPipe.register_functional>`
(torchdata's ``functional_datapipe``) takes an op class, built as ``Op(pipe, *args,
**kwargs)``, or a function called as ``fn(pipe, *args, **kwargs)``, and installs a method
under the name. The method says what it takes: its signature is the op's own, the pipe it
is called on in place of the op's first input (``inspect.signature``, ``help()``, IDEs and
the API reference all read it), and its docstring is the function's, or the class's.

conveyor's own ops register a function written next to each op class, typed and
documented as the method it becomes; their types reach type checkers through the stub
``base.pyi`` (generated from those functions, see ``tests/support/fluent_stub.py``). Such a
function names the class it builds (``builds=``), and the class's docstring gets the
function's ``Args:`` (:func:`document_op_class`): the parameters are described once, in
the function, for the method and the class alike.
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


def document_op_class(cls: type, owner: type, name: str, op: Op) -> None:
    """Give op class ``cls`` the ``Args:`` of its functional method ``owner.<name>``
    (the function ``op`` it is built by), so ``help(cls)`` and the API reference
    describe the class's parameters from the one text written for the method.

    The class's docstring says what the op does; its parameters are the method's, after
    the input the method is called on, which gets a line of its own. Entries of the
    method that the class does not take (``*others``, which the class takes as
    ``*sources``) are left out. A class that documents its ``Args:`` itself is left as
    it is, and so is one built by a function without an ``Args:`` section.
    """
    own = inspect.cleandoc(cls.__doc__ or "")
    entries = _args_entries(inspect.cleandoc(op.__doc__ or ""))
    if "Args:" in own or not entries:
        return
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):  # no signature to match the entries to
        return
    if not params:
        return
    first, call = params[0], f"``.{name}()``"
    if first.kind is inspect.Parameter.VAR_POSITIONAL:
        lines = [f"*{first.name}: The pipes it reads, in order: the one {call} is called on, then the others."]
    else:
        lines = [f"{first.name}: The pipe it reads: the one {call} is called on."]
    taken = {param.name for param in params[1:]}
    lines += [line for entry, body in entries if entry.lstrip("*") in taken for line in body]
    method = f":meth:`~{owner.__module__}.{owner.__qualname__}.{name}`"
    text = f"{own}\n\nThe same op as {method}, whose parameters it takes after its input.\n\nArgs:\n"
    cls.__doc__ = text + "\n".join(f"    {line}" if line else "" for line in lines) + "\n"


def _args_entries(doc: str) -> list[tuple[str, list[str]]]:
    """The entries of a Google-style ``Args:`` section: ``(name, lines)``, each entry's
    lines dedented to the section's level (its first line starts with ``name:``)."""
    lines = doc.splitlines()
    if "Args:" not in lines:
        return []
    entries: list[tuple[str, list[str]]] = []
    for line in lines[lines.index("Args:") + 1 :]:
        if line and not line.startswith(" "):  # the next section
            break
        text = line[4:]
        if text and not text.startswith(" ") and ":" in text:
            entries.append((text.split(":", 1)[0], [text]))
        elif entries:
            entries[-1][1].append(text)
    for _, body in entries:
        while body and not body[-1]:
            body.pop()
    return entries
