from haze import JobContext, define_job

ran: list[tuple[str, str]] = []


@define_job(name="cf_sched_report")
async def report(payload: dict, job: JobContext) -> None:
    ran.append((payload["kind"], (job.message.meta or {}).get("fire_at")))
