"""A unique job: a second dispatch while the first is queued is skipped."""

from haze import JobContext, define_job

from .media import record


@define_job(unique={"key": lambda p: p["feed_id"], "for": "10m"})
async def sync_feed(payload: dict, job: JobContext) -> None:
    await record(job, f"synced feed {payload['feed_id']}")
