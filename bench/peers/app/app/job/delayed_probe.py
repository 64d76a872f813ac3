"""bench/scale.py's delayed-job probe: one 24-byte O_APPEND record (id, due, start) per run.

The runner checks that every id ran exactly once and how late it started.
"""

import os
import struct
import time

from haze import define_job

_REC = struct.Struct("ddd")
_FILE = os.environ.get("BENCH_DELAYED_RECORDS", "/tmp/haze-bench-delayed.bin")
_fd: list[int] = []


@define_job(queue="bench")
async def delayed_probe(payload: dict) -> None:
    t = time.time()
    if not _fd:
        _fd.append(os.open(_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    os.write(_fd[0], _REC.pack(float(payload["id"]), float(payload["due"]), t))
