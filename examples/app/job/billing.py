"""A failing job: it uses its two tries and is kept in failed_jobs."""

from haze import JobContext, define_job


@define_job(tries=2)
async def charge_card(payload: dict, job: JobContext) -> None:
    raise ValueError(f"card {payload['card']} declined")
