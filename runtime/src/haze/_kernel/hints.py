"""``did you mean …?`` hints for names the user mistyped (options, jobs, connections)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'tries'?)"`` for the closest choice, or ``""`` when none is close.

    >>> did_you_mean("retries", ["tries", "backoff"])
    " (did you mean 'tries'?)"
    """
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
