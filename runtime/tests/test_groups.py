"""Tenant groups: ``define_job(group=...)``, ``.in_group()``, the group carried in the
message (``meta.group``), and the connection option ``"groups"``."""

from __future__ import annotations

from typing import Any

import pytest
from haze import App, JobContext, Queue, define_job, define_queue_config
from haze._base.errors import ConfigError


@define_job(name="groups_by_tenant", group=lambda payload: payload["tenant"])
async def by_tenant(payload: dict[str, Any]) -> None: ...


@define_job(name="groups_fixed", group="billing")
async def fixed(payload: dict[str, Any]) -> None: ...


@define_job(name="groups_none")
async def no_group(payload: dict[str, Any]) -> None: ...


async def test_the_group_rides_in_the_message(app: App) -> None:
    fake = Queue.fake()
    await by_tenant.dispatch({"tenant": "t-1"})
    await fixed.dispatch({})
    await no_group.with_({}).in_group("t-42").dispatch()
    await by_tenant.with_({"tenant": "t-1"}).in_group("t-9").dispatch()  # explicit wins
    await no_group.dispatch({})
    metas = [(d.message.meta or {}).get("group") for d in fake.dispatched]
    assert metas == ["t-1", "billing", "t-42", "t-9", None]


async def test_group_names_are_case_sensitive_and_kept_as_given(app: App) -> None:
    fake = Queue.fake()
    await no_group.with_({}).in_group("Tenant").dispatch()
    await no_group.with_({}).in_group("tenant").dispatch()
    assert [d.message.meta["group"] for d in fake.dispatched] == ["Tenant", "tenant"]


@pytest.mark.parametrize(
    ("group", "said"),
    [
        ("", "1 to 128 characters"),
        ("x" * 129, "1 to 128 characters"),
        (42, "a string"),
        ("a\nb", "line break"),
        ("a\x00b", "NUL"),
        ("a\u2028b", "line break"),  # every separator str.splitlines() breaks at
        ("a\x85b", "line break"),
        ("a\x0bb", "line break"),
        ("a\ud800b", "lone surrogate"),  # UTF-8 cannot store it
    ],
)
def test_a_bad_group_is_one_line_naming_the_rule(group: Any, said: str) -> None:
    with pytest.raises(ValueError, match=said) as e:
        no_group.with_({}).in_group(group)
    assert "\n" not in str(e.value)


async def test_a_group_function_that_fails_is_one_line_naming_the_job(app: App) -> None:
    Queue.fake()
    with pytest.raises(ValueError, match='Job "groups_by_tenant": its group key function') as e:
        await by_tenant.dispatch({"customer": 1})
    assert "KeyError" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="1 to 128 characters"):
        await by_tenant.dispatch({"tenant": ""})


def test_define_job_refuses_a_group_that_is_neither_a_string_nor_a_function() -> None:
    with pytest.raises(ValueError, match="group must be"):
        define_job(name="groups_bad", group=3)(lambda: None)  # type: ignore[arg-type]


def _app(groups: object, driver: str = "database") -> App:
    conn: dict[str, Any] = {"driver": driver, "groups": groups}
    if driver == "database":
        conn["connection"] = "sqlite"
    return App(queue=define_queue_config(default="m", connections={"m": conn}))


def test_the_groups_option_is_read_into_limits() -> None:
    app = _app({"concurrency": 2, "rate": "100/m"})
    groups = app.queue_config.connections["m"]["groups"]
    assert groups == {"concurrency": 2, "rate": (100, 60.0), "expire_after": 30.0}
    app = _app({"rate": "5/s", "expire_after": "1m"}, driver="redis")
    assert app.queue_config.connections["m"]["groups"] == {
        "concurrency": None,
        "rate": (5, 1.0),
        "expire_after": 60.0,
    }


@pytest.mark.parametrize(
    ("groups", "key", "said"),
    [
        ({"concurrency": 0}, "groups.concurrency", ">= 1"),
        ({"rate": "100"}, "groups.rate", '"100/m"'),
        ({"rate": "0/m"}, "groups.rate", '"100/m"'),
        ({"rate": "3/fortnight"}, "groups.rate", '"100/m"'),
        ({"limit": 2}, "groups.limit", "unknown option"),
        # a lease renewed every third of 100ms lapses under any store's latency, so the
        # slot would go to another job while this one runs: the limit silently not held
        ({"expire_after": "100ms"}, "groups.expire_after", "at least 1s"),
        ("fair", "groups", "expected a dict"),
    ],
)
def test_a_bad_groups_option_is_one_config_error(groups: object, key: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as e:
        _app(groups)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_groups_limits_are_refused_where_the_driver_cannot_keep_them() -> None:
    with pytest.raises(ConfigError, match="unknown option"):
        _app({"concurrency": 2}, driver="memory")


RAN: list[Any] = []


@define_job(name="groups_recorded", group=lambda payload: payload["tenant"])
async def recorded(payload: dict[str, Any]) -> None:
    RAN.append(payload)


@pytest.mark.parametrize("where", ["link", "batch in the chain"])
async def test_a_chain_link_with_a_bad_group_fails_the_chains_dispatch(
    app: App, where: str
) -> None:
    # Checked before anything is queued: found later, by the worker dispatching the next
    # link, it would drop the rest of the chain after its first link had run.
    RAN.clear()
    bad = recorded.with_({"customer": 1})
    later: Any = bad if where == "link" else Queue.batch([recorded.with_({"tenant": "b"}), bad])
    with pytest.raises(ValueError, match='Job "groups_recorded": its group key function') as e:
        await Queue.chain([recorded.with_({"tenant": "t-1"}), later]).dispatch()
    assert "KeyError" in str(e.value) and "\n" not in str(e.value)
    await Queue.idle()
    assert RAN == []


@define_job(name="groups_appender", tries=1)
async def appender(payload: dict[str, Any], job: JobContext) -> None:
    link = recorded.with_(payload)
    if "prepend" in payload:
        job.prepend_to_chain(link)
    else:
        job.append_to_chain(link)


@pytest.mark.parametrize("how", ["append", "prepend"])
async def test_a_link_with_a_bad_group_added_from_a_job_fails_that_job(app: App, how: str) -> None:
    # The job that adds it fails (kept in the failed jobs, retried as any failure), not
    # the worker queueing it after the job succeeded, which would lose it and the rest.
    RAN.clear()
    await appender.dispatch({"customer": 1, how: True})
    await Queue.idle()
    [failed] = await Queue.failed()
    assert failed.name == "groups_appender"
    assert 'Job "groups_recorded": its group key function raised KeyError' in failed.exception
    assert RAN == []


async def test_a_group_function_that_raises_is_a_key_function_error_naming_job_and_option(
    app: App,
) -> None:
    from haze.errors import KeyFunctionError

    with pytest.raises(KeyFunctionError) as e:
        await by_tenant.dispatch({"customer": 1})
    said = str(e.value)
    assert said.startswith('Job "groups_by_tenant": its group key function raised KeyError')
    assert "nothing was queued" in said and "\n" not in said
    assert isinstance(e.value.__cause__, KeyError)  # the function's own error
    with pytest.raises(KeyFunctionError):  # a pending dispatch resolves it the same way
        await by_tenant.with_({"customer": 1}).dispatch()
    assert await Queue.size() == 0
