"""The per-process id prefix: drawn at the first id, never at import, and again in a
forked child (real ``os.fork()``, real interpreters)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from haze._base import message as message
from haze._base.message import new_id

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork() here")


def test_importing_haze_draws_no_prefix() -> None:
    code = "import haze, haze._base.message, haze._base.id_prefix as m; print(repr(m._prefix))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "''"


def test_one_prefix_per_process_then_a_counter() -> None:
    a, b = new_id(), new_id()
    assert len(a) == len(b) == 32
    assert a[:16] == b[:16]
    assert int(b[16:], 16) > int(a[16:], 16)


def _id_in_child() -> tuple[str, str]:
    """An id drawn in a forked child; the child exits without running atexit handlers."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read)
            os.write(write, new_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read()
    os.waitpid(pid, 0)
    return child, new_id()


@needs_fork
def test_a_forked_child_draws_its_own_prefix() -> None:
    before = new_id()
    child, after = _id_in_child()
    assert len(child) == 32
    assert child[:16] != before[:16], "the child would share the parent's ids"
    assert after[:16] == before[:16], "the parent keeps its prefix"


@needs_fork
def test_a_child_forked_before_any_id_draws_its_own_too() -> None:
    message.new_id_prefix()  # as if this process had drawn no id yet
    child, parent = _id_in_child()
    assert child[:16] != parent[:16]
