"""``argparse`` value types shared by the command-line fronts (``conveyor demo``, ``conveyor bench``
and the benchmark scripts): each rejects bad input with a message that says what was expected."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_in_range(minimum: int, below: int | None = None) -> Callable[[str], int]:
    """A type for integers in ``[minimum, below)`` (no upper bound when ``below`` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if below is not None and value >= below:
            raise argparse.ArgumentTypeError(f"must be < {below}, got {value}")
        return value

    return parse
