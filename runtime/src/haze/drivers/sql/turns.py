"""Turns: the order the database driver claims rows in.

A row without a group has its due time as its turn, so those rows are claimed in due
order, as they always were. A group's rows take one turn each: a group's new row comes
one turn after the group's last, and never before the queue's first unclaimed row. So a
tenant with 10,000 queued rows holds turns t, t+1, ... t+9,999, and a tenant that
dispatches one job meanwhile gets the turn at the head of the queue: workers take the
groups round-robin.
"""

from __future__ import annotations

from haze._base.message import Message

__all__ = ["group_of", "next_turn"]


def group_of(message: Message | None) -> str | None:
    """The tenant group a message was dispatched in (``meta.group``), if any."""
    meta = message.meta if message is not None else None
    group = meta.get("group") if meta else None
    return group if isinstance(group, str) else None


def next_turn(last: float | None, head: float | None, due: float) -> float:
    """A group's new row's turn: one after the group's last, but never before the
    queue's first unclaimed row (a group back from idle starts there, not behind turns
    it spent long ago); a group alone in an empty queue starts at its due time."""
    if last is None:
        return due if head is None else float(head)
    return float(last) + 1.0 if head is None else max(float(last) + 1.0, float(head))
