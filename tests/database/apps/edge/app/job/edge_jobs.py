"""Jobs of tests/database/test_libsql_edge.py: each run appends ``<key> <pid>`` to the
file named by ``EDGE_RUNS_FILE`` (O_APPEND, one write per line)."""

from __future__ import annotations

import os
from typing import Any

from haze import define_job


@define_job(name="edge_record", tries=5)
async def edge_record(payload: dict[str, Any]) -> None:
    line = f"{payload['k']} {os.getpid()}\n".encode()
    fd = os.open(os.environ["EDGE_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
