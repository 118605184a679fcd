"""``HeldItems``: the items of an input a pass holds, named in its state by their offsets
from the oldest one, and held again on a resume by re-reading the input from there."""

from __future__ import annotations

import pytest

from conveyor.core.passes import Pass, PassContext, State
from conveyor.errors import StateError
from conveyor.pipes import IterableWrapper
from conveyor.pipes.held_items import HeldItems

LETTERS = IterableWrapper(list("abcdefghij"))


def opened(state: State | None = None, what: str = "input") -> tuple[HeldItems, Pass]:
    """Held items of a pass over ``LETTERS`` opened at ``state``, and that pass."""
    source = PassContext().open(LETTERS, state)
    return HeldItems(source, LETTERS, what), source


def read(held: HeldItems, source: Pass, hold: bool) -> int:
    """Read the next item as an op does (inline), holding it or not; its index."""
    before = source.state()
    next(source.items)
    index = held.count
    if hold:
        held.befores[index] = before
    held.count = index + 1
    return index


def saved(held: HeldItems) -> tuple[State, int, list[int]]:
    """What a state holds: the anchor, the items read since, the offsets held."""
    return held.anchor(), held.read(), held.offsets()


def test_nothing_held_anchors_at_the_input_as_it_is() -> None:
    held, source = opened()
    assert saved(held) == ({"index": 0}, 0, [])
    for _ in range(3):
        read(held, source, hold=False)
    assert saved(held) == ({"index": 3}, 0, [])
    assert held.oldest() == 3  # nothing held: the next item's index
    assert 2 not in held


def test_the_anchor_follows_the_oldest_item_held_as_items_leave_out_of_order() -> None:
    held, source = opened()
    for hold in (False, True, True, False, True, False):  # items 1, 2 and 4 held, 6 read
        read(held, source, hold)
    assert saved(held) == ({"index": 1}, 5, [0, 1, 3])
    assert held.oldest() == 1  # offsets count from it
    assert 4 in held and 3 not in held

    del held.befores[2]  # a younger item leaves: the anchor stays
    assert saved(held) == ({"index": 1}, 5, [0, 3])
    del held.befores[1]  # the oldest leaves: the anchor moves to the next oldest, offsets shift
    assert saved(held) == ({"index": 4}, 2, [0])
    assert held.oldest() == 4

    assert read(held, source, hold=True) == 6  # indices never shift
    assert saved(held) == ({"index": 4}, 3, [0, 2])
    del held.befores[4]
    assert saved(held) == ({"index": 6}, 1, [0])
    del held.befores[6]
    assert saved(held) == ({"index": 7}, 0, [])


def test_a_replay_from_the_anchor_holds_again_what_was_held() -> None:
    first, source = opened()
    for hold in (False, True, False, True, True, False, False):  # 1, 3 and 4 held, 7 read
        read(first, source, hold)
    del first.befores[3]
    anchor, count, offsets = saved(first)
    assert (anchor, count, offsets) == ({"index": 1}, 6, [0, 3])

    again, source = opened(anchor)
    replayed = list(again.replay(count, offsets))
    assert replayed == list(enumerate("bcdefg"))  # every item since the anchor, with its offset
    assert [index for index, _ in replayed if index in again] == [0, 3]
    assert saved(again) == (anchor, count, offsets)
    assert again.count == count
    assert source.state() == {"index": 7}  # where the first pass was

    del again.befores[0]  # and it goes on as the first would
    assert read(again, source, hold=False) == 6
    assert saved(again) == ({"index": 4}, 4, [0])  # e, f, g and h


def test_a_replay_with_nothing_held_reads_nothing() -> None:
    held, source = opened({"index": 4})
    assert list(held.replay(5, [])) == []
    assert held.count == 0
    assert source.state() == {"index": 4}
    assert saved(held) == ({"index": 4}, 0, [])


def test_an_input_that_ends_before_the_resumed_position_is_a_state_error() -> None:
    held, _ = opened({"index": 7}, what="reference input")  # 3 items left of the 6 to re-read
    replay = held.replay(6, [0, 2])
    assert [next(replay) for _ in range(3)] == [(0, "h"), (1, "i"), (2, "j")]
    with pytest.raises(StateError, match=r"the reference input ended 3 items before the resumed position"):
        next(replay)
    assert held.count == 3
