"""The no-op job body every peer runs: one 16-byte O_APPEND write of (t_enq, t_start).

The same method as shared/tools/peerbench: the runner counts records by file size and
computes drain rate and latency from the timestamps (~2 µs per record, for every peer).
"""

from __future__ import annotations

import json
import os
import struct
import time

REC = struct.Struct("dd")
RECORD_FILE = os.environ.get("BENCH_RECORDS", "/tmp/haze-bench-records.bin")
_fd: int | None = None
_pid: int | None = None


def record(t_enq: float) -> None:
    global _fd, _pid
    t = time.time()
    if _fd is None or _pid != os.getpid():
        _fd = os.open(RECORD_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _pid = os.getpid()
    os.write(_fd, REC.pack(float(t_enq), t))


def read() -> list[tuple[float, float]]:
    try:
        with open(RECORD_FILE, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return [REC.unpack_from(data, i * REC.size) for i in range(len(data) // REC.size)]


def count() -> int:
    try:
        return os.path.getsize(RECORD_FILE) // REC.size
    except FileNotFoundError:
        return 0


def reset() -> None:
    # Truncate in place: a running worker keeps its O_APPEND descriptor, and unlinking
    # would send its later records to a deleted file.
    try:
        os.truncate(RECORD_FILE, 0)
    except FileNotFoundError:
        pass


def emit(**kw: object) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def paced(n: int, rate: float):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    for i in range(n):
        d = t0 + i / rate - time.perf_counter()
        if d > 0:
            time.sleep(d)
        yield i
