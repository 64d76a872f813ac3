"""Short job ids for people: what the worker prints, ``queue:failed`` lists and every
command that takes an id accepts.

A haze id is 32 hex digits: a random 64-bit prefix drawn once per process, then a
64-bit counter. Neither half alone tells two jobs apart (one process dispatches many
jobs with one prefix; every process's first job has counter 0), so the short form
keeps 4 hex digits of each: ``a1b2c3d4e5f6a7b8000000000000002a`` → ``a1b2002a``.
Two jobs share a short id only if they come from processes whose prefixes start
alike and their counters agree in the last 16 bits; a command given an ambiguous
short id lists the matches instead of guessing.

Ids from elsewhere (BullMQ jobs added by Node, SQS message ids) are shown whole when
short, else by their last 8 characters, which is where their counters and random
parts are.

>>> short_id("a1b2c3d4e5f6a7b8000000000000002a")
'a1b2002a'
>>> short_id("bullmq:default:7")
'bullmq:default:7'
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from haze._base.errors import AmbiguousIdError

__all__ = ["AmbiguousIdError", "match_id", "short_id"]

_HAZE_ID = re.compile(r"^[0-9a-f]{32}$")
_SHORT_MAX = 16


def short_id(job_id: str) -> str:
    """The short form of a job id, as the worker, ``queue:failed`` and the dashboard
    show it; every command that takes an id takes it too.

    >>> # short_id(await send_invoice.dispatch({...}))  ->  "3f2a0000"
    """
    if _HAZE_ID.match(job_id):
        return job_id[:4] + job_id[-4:]
    if len(job_id) <= _SHORT_MAX:
        return job_id
    return job_id[-8:]


def match_id(token: str, ids: Iterable[str]) -> str | None:
    """The one id among ``ids`` that ``token`` names: the id itself, its short form, or
    (4 characters or more) its beginning or end. None if nothing matches; raises
    :class:`AmbiguousIdError` if several do.

    >>> match_id("a1b2002a", ["a1b2c3d4e5f6a7b8000000000000002a"])
    'a1b2c3d4e5f6a7b8000000000000002a'
    """
    candidates = list(dict.fromkeys(ids))
    if token in candidates:
        return token
    matches = [i for i in candidates if short_id(i) == token]
    if not matches and len(token) >= 4:
        matches = [i for i in candidates if i.startswith(token) or i.endswith(token)]
    if len(matches) > 1:
        raise AmbiguousIdError(token, matches)
    return matches[0] if matches else None
