"""Messages for the common first-hour mistakes: each names what is wrong and what to do."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haze import (
    App,
    ConfigError,
    JobContext,
    JobDefinitionError,
    Queue,
    UnknownJobError,
    define_job,
    define_queue_config,
)


@define_job(name="msg_send_invoice")
async def msg_send_invoice(payload: dict[str, Any]) -> None: ...


def test_an_unknown_define_job_option_suggests_the_right_one() -> None:
    with pytest.raises(JobDefinitionError) as info:

        @define_job(retries=3)  # type: ignore[call-overload]
        async def nightly(payload: dict[str, Any]) -> None: ...

    assert str(info.value).startswith(f'job "nightly" ({__file__}:'), (
        info.value
    )  # the job and where it is defined, as a wrong value names them
    assert "unknown option 'retries' (did you mean 'tries'?)" in str(info.value)
    assert isinstance(info.value, TypeError)
    with pytest.raises(JobDefinitionError, match="unknown option 'zzz'; options: name, tries"):
        define_job(zzz=1)(lambda payload: None)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("source", "extra"),
    [
        ("def handler(payload, job, extra): ...", "'extra'"),
        ("async def handler(payload, job, a, b): ...", "'a', 'b'"),
        ("def handler(payload, *, flag): ...", "'flag'"),
    ],
)
def test_a_handler_that_cannot_be_called_with_payload_and_job_is_refused(
    source: str, extra: str
) -> None:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(JobDefinitionError) as info:
        define_job(name=f"msg_bad_{len(extra)}")(namespace["handler"])
    message = str(info.value)
    assert "must be callable as (payload) or (payload, job)" in message
    assert f"also requires {extra}" in message


@pytest.mark.parametrize(
    "source",
    [
        "async def handler(job: JobContext, payload): ...",
        "async def handler(job: 'JobContext', payload: dict): ...",
        "def handler(ctx, payload): ...",
        "async def handler(job: JobContext): ...",
        "async def handler(job, data): ...",
        "async def handler(ctx, data: dict): ...",
        "async def handler(payload: JobContext): ...",
    ],
)
def test_a_handler_with_the_job_first_is_refused_when_defined(source: str) -> None:
    namespace: dict[str, Any] = {"JobContext": JobContext}
    exec(source, namespace)
    name = f"msg_swapped_{abs(hash(source))}"
    with pytest.raises(JobDefinitionError) as info:
        define_job(name=name)(namespace["handler"])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f'job "{name}" (')
    assert "the handler's first parameter receives the payload" in message
    suggested = message.rsplit("write the handler as ", 1)[1]
    first, second = suggested.strip("()").split(", ")
    assert first != second.split(":")[0], f"two parameters of one name: {suggested}"


@pytest.mark.parametrize(
    "source",
    [
        "async def handler(job, ctx): ...",  # the payload is a job posting
        "async def handler(job): ...",
        "async def handler(payload, job): ...",
    ],
)
def test_a_handler_whose_second_parameter_is_the_context_is_accepted(source: str) -> None:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    define_job(name=f"msg_ok_{abs(hash(source))}")(namespace["handler"])


def test_a_dispatch_never_awaited_warns_with_the_jobs_name() -> None:
    # dropped at once (CPython frees it when the statement ends): the warning is now
    with pytest.warns(RuntimeWarning) as caught:
        msg_send_invoice.dispatch({"id": 1})  # type: ignore[unused-coroutine]
    messages = [str(w.message) for w in caught]
    ours = [m for m in messages if "msg_send_invoice" in m]
    assert len(ours) == 1, messages
    assert "did you forget `await`?" in ours[0]
    assert "nothing was queued" in ours[0]
    assert not [m for m in messages if "was never awaited" in m and m not in ours], messages
    assert caught[0].filename == __file__, "the warning points at the line that dispatched"


async def test_an_awaited_dispatch_does_not_warn(app: App) -> None:
    import gc
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await msg_send_invoice.dispatch({"id": 1})
        task = asyncio.ensure_future(msg_send_invoice.dispatch({"id": 2}))
        await task
        await msg_send_invoice.with_({"id": 3}).dispatch()
        gc.collect()
    await Queue.idle()


async def test_a_dispatch_driven_by_hand_queues_once_and_one_closed_unstarted_does_not_warn(
    app: App,
) -> None:
    import gc
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        coro = msg_send_invoice.dispatch({"id": 1})
        with pytest.raises(StopIteration) as stop:
            coro.send(None)  # the memory dispatch does not suspend
        assert isinstance(stop.value.value, str) and len(stop.value.value) == 32
        closed = msg_send_invoice.dispatch({"id": 2})
        closed.close()  # never started: nothing queued, no warning
        del closed
        gc.collect()
    assert await Queue.size() == 1
    await Queue.idle()


def test_a_mistyped_connection_from_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from haze import env

    monkeypatch.setenv("QUEUE_CONNECTION", "reddis")
    with pytest.raises(ConfigError) as info:
        App(
            queue=define_queue_config(
                default=env("QUEUE_CONNECTION", "memory"),
                connections={"memory": {"driver": "memory"}, "redis": {"driver": "redis"}},
            )
        )
    message = str(info.value)
    assert "'reddis' (from the environment variable QUEUE_CONNECTION)" in message
    assert "did you mean 'redis'?" in message


@pytest.mark.parametrize(
    "source",
    [
        "def handler(): ...",
        "def handler(payload): ...",
        "async def handler(payload, job): ...",
        "def handler(payload, job=None, extra=1): ...",
        "def handler(payload, *, flag=False, **options): ...",
        "def handler(*args): ...",
    ],
)
def test_handlers_haze_can_call_are_accepted(source: str) -> None:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    define_job(name=f"msg_ok_{abs(hash(source))}")(namespace["handler"])


async def test_a_keyword_only_default_is_not_given_the_job(app: App) -> None:
    seen: list[Any] = []

    @define_job(name="msg_kw_only")
    async def kw_only(payload: Any, *, flag: bool = False) -> None:
        seen.append((payload, flag))

    await kw_only.dispatch(1)
    await Queue.idle()
    assert seen == [(1, False)], "called as (payload): the job is not passed as flag"


async def test_an_unknown_job_name_suggests_the_registered_one(app: App) -> None:
    with pytest.raises(UnknownJobError) as info:
        await Queue.dispatch("msg_send_invoce", {})
    assert str(info.value).startswith(
        "no job named 'msg_send_invoce' (did you mean 'msg_send_invoice'?);"
    )


def test_an_unknown_connection_lists_the_configured_ones() -> None:
    app = App(
        queue=define_queue_config(
            default="redis",
            connections={"memory": {"driver": "memory"}, "redis": {"driver": "memory"}},
        )
    )
    with pytest.raises(ConfigError) as info:
        app.connection_name("redsi")
    message = str(info.value)
    assert "unknown queue connection 'redsi' (did you mean 'redis'?)" in message
    assert "defined in " in message and __file__ in message
    assert message.endswith(": memory, redis")


def test_an_unknown_connection_without_config_says_there_is_no_file(tmp_path: Any) -> None:
    (tmp_path / "app").mkdir()
    with pytest.raises(ConfigError) as info:
        App(root=tmp_path).connection_name("redis")
    assert f"there is no config/queue.py under {tmp_path}" in str(info.value)
    assert "built-in memory" in str(info.value)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"unique": 10}, "unique"),
        ({"unique": {"for": [1]}}, "unique['for']"),
        ({"tries": "3"}, "tries"),
        ({"backoff": object()}, "backoff"),
        ({"timeout": [1]}, "timeout"),
        ({"queue": 5}, "queue"),
        ({"middleware": 5}, "middleware"),
        ({"after_commit": "y"}, "after_commit"),
        ({"failed": 5}, "failed"),
        ({"max_exceptions": "2"}, "max_exceptions"),
        ({"debounce": 5j}, "debounce"),
        ({"debounce": 1, "max_wait": "x"}, "max_wait"),
        ({"dont_retry": 5}, "dont_retry"),
        ({"dont_retry": [5]}, "dont_retry"),
        ({"track": "x"}, "track"),
        ({"keep_result": "x"}, "keep_result"),
        ({"group": 5}, "group"),
        ({"group": ""}, "group"),
        ({"fail_on_timeout": "yes"}, "fail_on_timeout"),
        ({"encrypted": "no"}, "encrypted"),
        ({"name": 5}, "name"),
    ],
)
def test_a_bad_define_job_option_is_one_haze_line_naming_the_job_and_the_option(
    options: dict[str, Any], option: str
) -> None:
    async def handler(payload: Any) -> None: ...

    handler.__name__ = f"msg_bad_option_{option}"
    with pytest.raises(JobDefinitionError) as info:
        define_job(**options)(handler)
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, ValueError)  # a bad value stays a ValueError too
    assert message.startswith('job "'), message
    assert f"): {option}" in message, message


def test_define_job_on_something_that_is_not_a_function_is_a_haze_error() -> None:
    with pytest.raises(JobDefinitionError, match="the handler must be a function, got 5"):
        define_job(name="msg_not_a_function")(5)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="pass options as @define_job"):
        define_job(msg_send_invoice.handler, tries=2)  # type: ignore[call-overload]
