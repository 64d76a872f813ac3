"""A payload JSON cannot write is refused at dispatch on every driver, by every way of
dispatching: a ``PayloadError`` (a ``TypeError``) naming the job and the path, in one
line, and nothing queued. Here: an int of more digits than Python writes as text (its
``sys.get_int_max_str_digits()``, 4,300 by default), as a value and as a dict key, and
a dict key JSON has no text for."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from haze import JobContext, PayloadError, Queue, define_job

RAN: list[Any] = []

BIG = 10**5000  # past CPython's default limit of 4,300 digits


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


@define_job(name="pr_plain")
async def pr_plain(payload: Any) -> None:
    RAN.append(payload)


@define_job(name="pr_full")
async def pr_full(payload: Any, job: JobContext) -> None:
    RAN.append(payload)


def _ways(bad: Any) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Each way of dispatching a job whose payload is ``bad``."""
    return {
        "plain": lambda: pr_plain.dispatch(bad),
        "full": lambda: pr_full.dispatch(bad),
        "with an option": lambda: pr_full.dispatch(bad, queue="q1"),
        "bulk": lambda: Queue.bulk([pr_plain.with_({"ok": 1}), pr_full.with_(bad)]),
        "chain head": lambda: Queue.chain([pr_full.with_(bad), pr_plain.with_({})]).dispatch(),
        "chain link": lambda: Queue.chain([pr_plain.with_({}), pr_full.with_(bad)]).dispatch(),
        # alone: a batch streams its jobs out (sync runs each as it goes), so one
        # refused after others went leaves those to run
        "batch": lambda: Queue.batch([pr_full.with_(bad)]).dispatch(),
        # a callback's payload: refused at dispatch, not when the batch ends
        "batch then": lambda: Queue.batch([pr_plain.with_({})]).then(pr_full.with_(bad)).dispatch(),
        "batch catch": lambda: (
            Queue.batch([pr_plain.with_({})]).catch(pr_full.with_(bad)).dispatch()
        ),
        "chain catch": lambda: (
            Queue.chain([pr_plain.with_({})]).catch(pr_full.with_(bad)).dispatch()
        ),
    }


CASES = {
    "int": ({"n": [1, BIG]}, r"payload\['n'\]\[1\] is an int of about 500[01] digits"),
    "int key": ({"m": {BIG: 1}}, r"payload\['m'\] has a key that is an int of about 500[01]"),
    "int, after an int key": (
        {1: "a", "n": BIG},
        r"payload\['n'\] is an int of about 500[01] digits",
    ),
    "nan key": ({"m": {float("nan"): 1}}, r"payload\['m'\] has a key nan, which JSON"),
}


@pytest.mark.parametrize("way", list(_ways(None)))
@pytest.mark.parametrize("case", list(CASES))
async def test_a_payload_json_cannot_write_is_refused_naming_job_and_path(
    app, done, way: str, case: str
) -> None:
    bad, path = CASES[case]
    with pytest.raises(PayloadError, match=rf'^job "pr_(plain|full)": {path}') as info:
        await _ways(bad)[way]()
    message = str(info.value)
    assert "\n" not in message and len(message) < 300
    assert "Exceeds the limit" not in message
    assert isinstance(info.value, TypeError)
    await done()
    assert RAN == []
    assert await Queue.size() == 0
    assert await Queue.size("q1") == 0


async def test_an_int_within_the_limit_runs(app, done, driver) -> None:
    big = 10 ** (sys.get_int_max_str_digits() - 1)
    if driver.id == "cloudflare":
        # a JavaScript number cannot carry it, and a JSON queue message no BigInt
        with pytest.raises(ValueError, match=r"^job \"pr_plain\": payload\['n'\] is an int of"):
            await pr_plain.dispatch({"n": big})
        return
    await pr_plain.dispatch({"n": big})
    await done()
    assert [{"n": big}] == RAN
