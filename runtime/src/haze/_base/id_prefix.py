"""Job ids: a random 64-bit prefix per process, then a 64-bit counter.

Its own small module so that what needs only ``new_id_prefix`` (a Worker's entry
module, at an isolate's cold start) does not load the message envelope.

>>> len(new_id())
32
"""

from __future__ import annotations

import itertools
import os

__all__ = ["new_id", "new_id_prefix"]

_prefix = ""
_counter = itertools.count()


def new_id() -> str:
    """A fresh id: 32 lowercase hex characters, unique across processes.

    A 64-bit random prefix per process and a 64-bit counter: one syscall per process
    instead of one per job, and ``next()`` on the counter is atomic, so threads never
    share an id. The prefix is drawn at the first id, never at import: a process forked
    after it (``register_at_fork``) and a Python Worker isolate started from a memory
    snapshot (``new_id_prefix`` at its first request) each draw their own.
    """
    global _prefix
    if not _prefix:
        _prefix = os.urandom(8).hex()
    return f"{_prefix}{next(_counter):016x}"


def new_id_prefix() -> None:
    """Draw the id prefix again at the next id: this process's memory was copied (a
    fork, or a Worker isolate restored from a snapshot) and may share it."""
    global _prefix
    _prefix = ""


if hasattr(os, "register_at_fork"):  # not on Windows or Pyodide (no fork there)
    os.register_at_fork(after_in_child=new_id_prefix)
