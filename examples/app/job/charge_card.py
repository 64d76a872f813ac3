from haze import JobContext, define_job


@define_job(tries=2, backoff="50ms")
async def charge_card(payload: dict, job: JobContext) -> None:
    """Always fails: the card is declined, so the job ends in the failed jobs."""
    raise ValueError(f"card {payload['card']} declined")


@charge_card.on_failed
async def _charge_failed(payload: dict, error: BaseException, job: JobContext) -> None:
    job.logger.warning("Giving up on card %s: %s", payload["card"], error)
