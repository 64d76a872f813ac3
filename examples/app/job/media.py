"""A chain: resize the image, publish the post, notify the author."""

from haze import Db, JobContext, define_job


async def record(job: JobContext, what: str) -> None:
    await Db.connection().execute(
        "INSERT INTO outcomes (job, attempt, what) VALUES (?, ?, ?)", (job.name, job.attempt, what)
    )


@define_job(queue="high")
async def resize_image(payload: dict, job: JobContext) -> None:
    await record(job, f"resized image {payload['post_id']}")


@define_job(tries=3)
async def publish_post(payload: dict, job: JobContext) -> None:
    if job.attempt == 1:
        raise ConnectionError("CDN timed out")  # succeeds on the retry; the chain goes on
    await record(job, f"published post {payload['post_id']}")


@define_job
async def notify_author(payload: dict, job: JobContext) -> None:
    await record(job, f"notified author of post {payload['post_id']}")
