"""Queue's calls that name a queue refuse a name no queue can have, with the one-line
error a dispatch to it gets, instead of answering for a queue that cannot exist (0 jobs,
no failed jobs) as if it were merely empty."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from haze import App, Queue, define_job

CALLS: dict[str, Callable[[str], Awaitable[Any]]] = {
    "Queue.size": lambda q: Queue.size(q),
    "Queue.clear": lambda q: Queue.clear(q),
    "Queue.failed": lambda q: Queue.failed(queue=q),
    "Queue.retry": lambda q: Queue.retry(queue=q),
}


@define_job(name="qin_noop")
async def qin_noop(payload: dict[str, Any]) -> None:
    pass


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("mail ", "cannot start or end with whitespace"),
        ("\tmail", "cannot start or end with whitespace"),
        ("a,b", "cannot contain a comma"),
        ("a\x00b", "cannot contain a NUL character"),
        ("", "a queue name must be a string of 1 to 255 characters"),
        ("q" * 256, "a queue name must be a string of 1 to 255 characters"),
    ],
)
async def test_a_queue_name_no_queue_can_have_is_refused_as_at_dispatch(
    app: App, call: str, bad: str, says: str
) -> None:
    with pytest.raises(ValueError, match=says) as at_dispatch:
        await qin_noop.dispatch({}, queue=bad)
    with pytest.raises(ValueError, match=says) as e:
        await CALLS[call](bad)
    message = str(e.value)
    assert message.startswith(f"{call}: ")
    # the same sentence as the dispatch's, after the name of the call
    assert message.split(": ", 1)[1] == str(at_dispatch.value).split(": ", 1)[1]
    assert "\n" not in message.replace(repr(bad), "")


async def test_a_good_queue_name_is_answered_and_none_means_default(app: App) -> None:
    await qin_noop.dispatch({}, queue="mail")
    await qin_noop.dispatch({})
    assert await Queue.size("mail") == 1
    assert await Queue.size() == 1
    assert await Queue.failed(queue="mail") == []
    assert await Queue.clear("mail") == 1
    assert await Queue.clear() == 1
