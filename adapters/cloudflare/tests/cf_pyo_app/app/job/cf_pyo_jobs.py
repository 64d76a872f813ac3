"""Jobs for the Pyodide scenarios; each records (name, key, attempt) in state.runs."""

from cf_pyo_app import state
from haze import JobContext, define_job, rate_limited


def _run(name, payload, job):
    state.runs.append([name, payload.get("key"), job.attempt])


def _count(name, key):
    return sum(1 for r in state.runs if r[0] == name and r[1] == key)


@define_job()
async def cf_pyo_ok(payload: dict, job: JobContext) -> None:
    _run("ok", payload, job)
    state.runs[-1].append(payload)


@define_job(tries=3, backoff=[2, 5])
async def cf_pyo_flaky(payload: dict, job: JobContext) -> None:
    _run("flaky", payload, job)
    if job.attempt < payload["ok_at"]:
        raise RuntimeError(f"flaky attempt {job.attempt}")


@define_job(tries=3, backoff=2)
async def cf_pyo_release(payload: dict, job: JobContext) -> None:
    n = _count("release", payload["key"])
    _run("release", payload, job)
    if n == 0:
        raise RuntimeError("the first run fails: a retry uses a try")
    if n == 1:
        job.release(3)  # a new message; no try used


@define_job(tries=2, backoff=1)
async def cf_pyo_dead(payload: dict, job: JobContext) -> None:
    _run("dead", payload, job)
    raise ValueError(f"dead {payload['key']}")


@cf_pyo_dead.on_failed
async def _dead_failed(payload: dict, error: BaseException, job: JobContext) -> None:
    state.failed_calls.append([payload["key"], str(error), job.attempt])


@define_job(tries=5, backoff=1)
async def cf_pyo_many(payload: dict, job: JobContext) -> None:
    _run("many", payload, job)
    raise RuntimeError("never works")


@define_job(unique={"key": lambda p: str(p["key"]), "for": "1h"})
async def cf_pyo_unique(payload: dict, job: JobContext) -> None:
    _run("unique", payload, job)


@define_job(middleware=[rate_limited("cf_pyo_rl", max=1, per="1h")])
async def cf_pyo_limited(payload: dict, job: JobContext) -> None:
    _run("limited", payload, job)
