"""A batch: import rows in parallel, then report once."""

import asyncio

from haze import JobContext, define_job

from .media import record


@define_job
async def import_rows(payload: dict, job: JobContext) -> None:
    await asyncio.sleep(0.02)  # pretend to work, so the progress bar has something to show


@define_job
async def import_finished(payload: dict, job: JobContext) -> None:
    await record(job, f"import {payload['name']!r} finished")
