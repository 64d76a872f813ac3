from haze import JobContext, define_job


@define_job
async def send_reminder(payload: dict, job: JobContext) -> None:
    """Dispatched with a delay."""
    job.logger.info("Reminding user %s", payload["user_id"])
