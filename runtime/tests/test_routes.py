"""Job routes (``routes`` in ``config/queue.py``): which route a name takes, the
precedence (call site > definition > route > default), every path that dispatches a job
following it (dispatch, delay, retry, chain, batch, schedule, workflow), the places that
list a connection's queues, and each config mistake as one line naming the route."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from haze import (
    App,
    ConfigError,
    JobContext,
    Queue,
    Workflow,
    define_job,
    define_queue_config,
    schedule,
    workflow,
)
from haze._base.routes import JobRoute, JobRoutes
from haze._orchestration import scheduling
from haze._orchestration.scheduling import run_now
from haze._workflows.lambda_runs import native_runs
from haze.build._python import longest_timeout, worker_queues
from haze.build.cloudflare_plan import connection_max_tries
from haze.cli.queue import unconsumed_queues

#: (job, queue, connection, attempt) of every run
runs: list[tuple[str, str, str | None, int]] = []
flaky = {"left": 0}


async def _record(job: JobContext) -> None:
    runs.append((job.name, job.queue, job.connection, job.attempt))


@define_job(name="rt.mail.welcome")
async def rt_welcome(payload: Any, job: JobContext) -> None:
    await _record(job)


@define_job(name="rt.mail.vip", queue="vip")
async def rt_vip(payload: Any, job: JobContext) -> None:
    await _record(job)


@define_job(name="rt.report", tries=2, backoff=0)
async def rt_report(payload: Any, job: JobContext) -> None:
    await _record(job)
    if flaky["left"] > 0:
        flaky["left"] -= 1
        raise RuntimeError("try again")


@define_job(name="rt.plain")
async def rt_plain(payload: Any, job: JobContext) -> None:
    await _record(job)


@define_job(name="rt.mail.timed", timeout="2m", tries=5)
async def rt_timed(payload: Any) -> None:
    pass


@workflow(name="rt.flow.signup")
async def rt_signup(run: Any, user: int) -> int:
    return user


ROUTES = {
    "rt.mail.*": {"queue": "rt-mail", "connection": "side"},
    "rt.report": {"queue": "reports"},
    # The first glob that matches wins: the rt.* jobs above take an earlier row, and the
    # workflow's job "rt.flow.signup" takes this one, never the row after it.
    "rt.*": {"queue": "never"},
    "rt.flow.*": {"queue": "flows"},
}


def routed_app() -> App:
    return App(
        queue=define_queue_config(
            default="memory",
            connections={"memory": {"driver": "memory"}, "side": {"driver": "memory"}},
            routes={**ROUTES, "rt.plain": {"queue": "plain"}},
        )
    )


@pytest.fixture
async def app() -> AsyncIterator[App]:
    runs.clear()
    flaky["left"] = 0
    a = routed_app()
    async with a:
        yield a


@pytest.fixture
def _own_schedules() -> Iterator[None]:
    saved = dict(scheduling._registry)
    scheduling._registry.clear()
    yield
    scheduling._registry.clear()
    scheduling._registry.update(saved)


# --------------------------------------------------------------------------- the table


def test_an_exact_name_wins_over_any_glob_else_the_first_glob_in_order() -> None:
    routes = JobRoutes(
        (
            JobRoute("mail.*", queue="mail"),
            JobRoute("*", queue="catch-all"),
            JobRoute("mail.urgent", queue="urgent"),  # exact: wins though listed last
            JobRoute("m?il.b*", queue="shadowed"),  # mail.bulk took "mail.*" first
        )
    )
    assert routes.match("mail.urgent").queue == "urgent"  # type: ignore[union-attr]
    assert routes.match("mail.bulk.daily").queue == "mail"  # type: ignore[union-attr]
    assert routes.match("report").queue == "catch-all"  # type: ignore[union-attr]
    assert JobRoutes().match("anything") is None
    assert JobRoutes((JobRoute("Mail.*", queue="m"),)).match("mail.x") is None  # case counts
    assert routes.queue_for("mail.bulk", "own") == "own"
    assert routes.connection_for("mail.bulk", None) is None  # the route names no connection


@define_job(name="rt.report[eu]*")
async def rt_glob_named(payload: Any, job: JobContext) -> None:
    await _record(job)


@pytest.mark.parametrize("name", ["report[eu]", "nightly*", "who?", "a[*]?b"])
def test_a_name_with_glob_characters_is_routed_by_its_exact_name(name: str) -> None:
    # the pattern equal to the name wins (an exact route beats every glob), though
    # read as a glob it would not match the name itself ("[eu]" is one character)
    routes = JobRoutes((JobRoute("*", queue="catch-all"), JobRoute(name, queue="exact")))
    assert routes.match(name).queue == "exact"  # type: ignore[union-attr]
    assert routes.match("other").queue == "catch-all"  # type: ignore[union-attr]
    # still a glob for the other names it matches
    assert JobRoutes((JobRoute("report[eu]", queue="g"),)).match("reporte").queue == "g"  # type: ignore[union-attr]


async def test_a_job_named_with_glob_characters_dispatches_to_its_route() -> None:
    app = App(
        queue=define_queue_config(
            default="m",
            connections={"m": {"driver": "memory"}},
            routes={"rt.*": {"queue": "globbed"}, "rt.report[eu]*": {"queue": "exact"}},
        )
    )
    async with app:
        fake = Queue.fake()
        try:
            await rt_glob_named.dispatch({})
            [sent] = fake.recorded("rt.report[eu]*")
        finally:
            Queue.restore()
        assert sent.queue == "exact"


# --------------------------------------------------------------------------- precedence


async def test_call_site_beats_definition_beats_route_beats_default(app: App) -> None:
    await rt_welcome.dispatch({})  # route: queue and connection
    await rt_vip.dispatch({})  # own queue "vip" wins; its connection still from the route
    await rt_welcome.with_({}).on_queue("now").on_connection("memory").dispatch()
    await rt_plain.dispatch({}, queue="kw")  # dispatch() keywords are the call site too
    await Queue.dispatch("rt.report", {})  # by name
    await Queue.idle()
    assert sorted(r[:3] for r in runs) == [
        ("rt.mail.vip", "vip", "side"),
        ("rt.mail.welcome", "now", "memory"),
        ("rt.mail.welcome", "rt-mail", "side"),
        ("rt.plain", "kw", "memory"),
        ("rt.report", "reports", "memory"),
    ]


async def test_a_delayed_job_and_its_retry_stay_where_the_route_sent_it(app: App) -> None:
    flaky["left"] = 1
    await rt_report.with_({}).delay("10ms").dispatch()
    await Queue.idle()
    assert runs == [("rt.report", "reports", "memory", 1), ("rt.report", "reports", "memory", 2)]


async def test_chains_and_batches_follow_the_routes(app: App) -> None:
    await Queue.chain([rt_welcome.with_({}), rt_report.with_({})]).dispatch()
    await Queue.batch([rt_vip.with_({}), rt_plain.with_({})]).dispatch()
    await Queue.idle()
    # A batch keeps its jobs on its own connection (the default here), as it does a
    # definition's connection=: only the route's queue applies inside it.
    assert sorted(r[:3] for r in runs) == [
        ("rt.mail.vip", "vip", "memory"),
        ("rt.mail.welcome", "rt-mail", "side"),
        ("rt.plain", "plain", "memory"),
        ("rt.report", "reports", "memory"),
    ]
    runs.clear()
    # A chain's or batch's own on_queue is the call site: it wins over the routes.
    await Queue.chain([rt_welcome.with_({}), rt_plain.with_({})]).on_queue("c").dispatch()
    await Queue.idle()
    assert sorted(r[:3] for r in runs) == [
        ("rt.mail.welcome", "c", "side"),
        ("rt.plain", "c", "memory"),
    ]


@pytest.mark.usefixtures("_own_schedules")
async def test_a_scheduled_job_follows_its_route(app: App) -> None:
    schedule(rt_report, every="1h", name="rt-hourly")
    await run_now(app, "rt-hourly")
    await Queue.idle()
    assert runs == [("rt.report", "reports", "memory", 1)]


async def test_a_workflow_run_follows_the_route_of_its_name() -> None:
    fake = Queue.fake()
    try:
        async with routed_app():
            await Workflow.start(rt_signup, user=7)
        (started,) = fake.recorded("rt.flow.signup")
        assert started.queue == "never"  # "rt.*" is listed before "rt.flow.*"
    finally:
        Queue.restore()


# --------------------------------------------------------------------------- who consumes


def test_the_queues_listed_for_workers_include_the_routed_ones() -> None:
    app = routed_app()
    side = app.job_queues("side")
    assert side["rt-mail"] == ["rt.mail.timed", "rt.mail.welcome"]
    assert side["vip"] == ["rt.mail.vip"]
    assert "reports" in app.job_queues("memory")
    assert "reports" in app.known_queues("memory")  # queue:failed/retry/size look there
    lines = unconsumed_queues(app, "side", ["default"])
    assert any('rt.mail.timed, rt.mail.welcome use queue "rt-mail"' in ln for ln in lines), lines
    # the docker preset's worker command takes them too ("rt-mail": other test modules
    # register jobs of their own on a "mail" queue)
    assert {"rt-mail", "vip"} <= set(worker_queues(app, "side"))
    assert "reports" in worker_queues(app, "memory")
    assert "rt-mail" not in worker_queues(app, "memory")
    # a job counts where its route pins it: the docker/server stop timeout and the
    # Cloudflare consumer's max_retries see it there only
    routes = app.queue_config.routes
    assert longest_timeout([rt_timed], "side", routes) == 120.0
    assert longest_timeout([rt_timed], "memory", routes) is None
    assert connection_max_tries([rt_timed], "memory", routes) == 1
    assert connection_max_tries([rt_timed], "side", routes) == 5


# --------------------------------------------------------------------------- bad config


def _config(routes: object, **conns: dict[str, Any]) -> App:
    connections = {"memory": {"driver": "memory"}, "sqs_main": {"driver": "memory"}, **conns}
    return App(queue=define_queue_config(default="memory", connections=connections, routes=routes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("routes", "conns", "says"),
    [
        (["mail.*"], {}, "routes: expected a dict of job-name pattern"),
        ({"mail.*": "mail"}, {}, "routes['mail.*']: expected a dict such as"),
        (
            {"mail.*": {"queu": "m"}},
            {},
            "routes['mail.*'].queu: unknown option (did you mean 'queue'?)",
        ),
        ({"": {"queue": "m"}}, {}, "routes: a route's pattern is a job name or a glob"),
        ({"  ": {"queue": "m"}}, {}, "routes: a route's pattern is a job name or a glob"),
        ({" mail.*": {"queue": "m"}}, {}, "cannot start or end with whitespace"),
        ({"mail.*": {}}, {}, "routes['mail.*']: names neither a queue nor a connection"),
        (
            {"reports.*": {"connection": "sqs_mian"}},
            {},
            "routes['reports.*'].connection: unknown queue connection 'sqs_mian' "
            "(did you mean 'sqs_main'?)",
        ),
        (
            {"mail.*": {"queue": "a,b"}},
            {},
            "routes['mail.*'].queue: a queue name cannot contain a comma",
        ),
        ({"mail.*": {"queue": 7}}, {}, "routes['mail.*'].queue: a queue name must be a string"),
        (
            {"mail.*": {"queue": "a:b", "connection": "r"}},
            {"r": {"driver": "redis"}},
            "on a redis connection cannot contain ':'",
        ),
    ],
)
def test_each_route_mistake_is_one_config_error_naming_the_route(
    routes: object, conns: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(routes, **conns)
    message = str(caught.value)
    assert says in message, message
    assert "\n" not in message


def test_no_routes_and_a_route_of_one_field_are_accepted(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert not _config(None).queue_config.routes
        one = _config({"x": {"connection": "sqs_main"}}).queue_config.routes
    assert list(one) == [JobRoute("x", connection="sqs_main")]


def test_a_workflow_routed_to_a_native_sqs_connection_runs_on_its_engine() -> None:
    url = "https://sqs.eu-west-1.amazonaws.com/1/x"
    app = App(
        queue=define_queue_config(
            default="memory",
            connections={
                "memory": {"driver": "memory"},
                "aws": {"driver": "sqs", "queue_url": url, "workflows": "native"},
            },
            routes={"rt.flow.*": {"connection": "aws"}},
        )
    )
    runs_there = native_runs(app, "rt.flow.signup")
    assert runs_there is not None and runs_there.connection == "aws"
