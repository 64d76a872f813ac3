"""Describing an exception in text, which must never fail.

A job may raise anything: an exception whose ``str()`` raises, or recurses through a
deeply nested argument (``RecursionError``), or is megabytes long. The failure path
records and logs it, so each description here falls back to the type name and a
truncated ``repr`` of its arguments, is capped at ``MAX_ERROR_TEXT`` bytes, and shows a
NUL character as the four characters ``\x00`` (a failed-jobs table on PostgreSQL
cannot store NUL, and a record that cannot be stored must not cost the job).
"""

from __future__ import annotations

import reprlib
import traceback

__all__ = ["MAX_ERROR_TEXT", "cap_text", "error_line", "error_text", "format_error"]

#: The most bytes of UTF-8 kept of an exception's description (a failed record's text).
MAX_ERROR_TEXT = 64 * 1024

_short = reprlib.Repr()
_short.maxlevel = 3
_short.maxstring = 200
_short.maxother = 200


def cap_text(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """``text`` (made storable: encodable as UTF-8, NUL shown as ``\\x00``) if it fits in
    ``limit`` bytes; else its head and tail (a traceback's last lines name the error)
    around a note of what was cut.

    >>> len(cap_text("x" * 100_000).encode()) <= MAX_ERROR_TEXT
    True
    >>> cap_text("report" + chr(0) + ".csv")
    'report\\\\x00.csv'
    """
    if "\x00" in text:  # PostgreSQL text cannot hold NUL: a failure must still be kept
        text = text.replace("\x00", "\\x00")
    # "replace": a lone surrogate (which no database or JSON encoder takes) becomes "?"
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return data.decode("utf-8")
    head = data[: limit // 4].decode("utf-8", "ignore")
    tail = data[-(limit // 2) :].decode("utf-8", "ignore")
    cut = len(data) - len(head.encode()) - len(tail.encode())
    return f"{head}\n... [{cut} bytes cut] ...\n{tail}"


def _args(error: BaseException) -> str:
    try:
        return _short.repr(error.args)
    except Exception:  # a hostile __repr__ or args
        return "<unprintable>"


def error_text(error: BaseException) -> str:
    """``str(error)``, or a truncated repr of its arguments when that fails; capped.

    >>> class Bad(Exception):
    ...     def __str__(self) -> str: raise RuntimeError
    >>> error_text(Bad("a", 1))
    "('a', 1)"
    """
    try:
        text = str(error)
    except Exception:  # RecursionError (a deeply nested argument) included
        text = _args(error)
    return cap_text(text)


def error_line(error: BaseException) -> str:
    """``Type: text`` (just ``Type`` when the text is empty), never raising."""
    text = error_text(error)
    name = type(error).__name__
    return f"{name}: {text}" if text else name


def format_error(error: BaseException) -> str:
    """The traceback of ``error`` as text, ending with ``error_line``; capped."""
    try:
        frames = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    except Exception:  # a chained exception that cannot be described either
        frames = ""
    lines = frames.rstrip().splitlines()
    if lines and "str() failed>" in lines[-1]:
        # traceback's own fallback drops the arguments: say what they were
        frames = "\n".join([*lines[:-1], error_line(error)])
    return cap_text(frames.strip() or error_line(error))
