from haze import JobContext, define_job


@define_job(tries=3, backoff=["50ms", "100ms"], timeout="30s", queue="emails")
async def send_invoice(payload: dict, job: JobContext) -> None:
    """Fails on its first attempt (a flaky mail server), then succeeds."""
    job.logger.info("Sending invoice %s (attempt %d)", payload["invoice_id"], job.attempt)
    if job.attempt == 1:
        raise ConnectionError("mail server did not answer")
