"""Each run appends ``<schedule> <fire_at> <pid>`` to SCHED_RUNS (O_APPEND: one write
per line, so lines from several processes never interleave)."""

import os

from haze import JobContext, define_job


@define_job(name="sched_proc_tick")
async def tick(payload: dict, job: JobContext) -> None:
    meta = job.message.meta or {}
    line = f"{meta.get('schedule')} {meta.get('fire_at')} {os.getpid()}\n"
    fd = os.open(os.environ["SCHED_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
