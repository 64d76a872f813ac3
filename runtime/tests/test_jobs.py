"""define_job: forms, options, the registry and duplicate names."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from haze import (
    DuplicateJobError,
    JobContext,
    JobDefinition,
    JobDefinitionError,
    PendingDispatch,
    UnknownJobError,
    define_job,
)
from haze._jobs.definition import get_job, registered_jobs
from haze.errors import JobOptionError


@define_job
async def jobs_bare(payload: dict) -> str:
    return f"bare {payload['n']}"


@define_job(tries=3, backoff=[10, 60], timeout="30s", queue="emails", name="jobs_send_invoice")
async def jobs_options(payload: dict, job: JobContext) -> None:
    pass


@define_job(name="jobs_plain")
def jobs_plain(payload: dict, job: JobContext) -> tuple[Any, Any]:
    return payload, job


@define_job(name="jobs_no_args")
async def jobs_no_args() -> str:
    return "none"


@define_job(name="jobs_dup_name")
async def jobs_dup_first(payload: dict) -> None:
    pass


def _decorator_lines(text: str) -> list[int]:
    """Line numbers in this file where ``text`` starts a (stripped) line."""
    lines = Path(__file__).read_text().splitlines()
    return [i for i, line in enumerate(lines, 1) if line.strip() == text]


DUP_LINE, SECOND_DUP_LINE = _decorator_lines('@define_job(name="jobs_dup_name")')


def test_bare_decorator_uses_the_function_name() -> None:
    assert isinstance(jobs_bare, JobDefinition)
    assert jobs_bare.name == "jobs_bare"
    assert get_job("jobs_bare") is jobs_bare
    assert "jobs_bare" in registered_jobs()
    assert (jobs_bare.tries, jobs_bare.backoff, jobs_bare.timeout, jobs_bare.queue) == (
        1,
        0.0,
        None,
        None,
    )


def test_options_are_kept() -> None:
    j = jobs_options
    assert j.name == "jobs_send_invoice"
    assert (j.tries, j.backoff, j.timeout, j.queue) == (3, (10.0, 60.0), 30.0, "emails")
    assert j.is_async
    assert not jobs_plain.is_async


async def test_calling_a_job_runs_the_handler_directly() -> None:
    assert await jobs_bare({"n": 1}) == "bare 1"
    assert await jobs_no_args() == "none"
    ctx = object()
    assert jobs_plain({"a": 1}, ctx) == ({"a": 1}, ctx)  # type: ignore[arg-type]


def test_with_returns_a_pending_dispatch() -> None:
    p = jobs_options.with_({"invoice_id": 1}).on_queue("high").delay("1m").on_connection("sync")
    assert isinstance(p, PendingDispatch)
    assert (p.job, p.payload, p._queue, p._delay, p._connection) == (
        jobs_options,
        {"invoice_id": 1},
        "high",
        60.0,
        "sync",
    )
    assert p.to_link() == {
        "job": "jobs_send_invoice",
        "payload": {"invoice_id": 1},
        "queue": "high",
        "connection": "sync",
        "delay": 60.0,
    }


def test_on_failed_registers_the_failed_handler() -> None:
    @define_job(name="jobs_on_failed")
    async def j(payload: dict) -> None: ...

    @j.on_failed
    async def failed(payload: dict, error: BaseException, job: JobContext) -> None: ...

    assert j.failed is failed
    with pytest.raises(ValueError, match="on_failed"):
        j.on_failed("nope")  # type: ignore[arg-type]


def test_failed_option_is_the_same_as_on_failed() -> None:
    async def failed(payload: Any, error: BaseException, job: JobContext) -> None: ...

    @define_job(name="jobs_failed_option", failed=failed)
    async def j(payload: dict) -> None: ...

    assert j.failed is failed


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"tries": 0}, "tries"),
        ({"tries": "3"}, "tries"),
        ({"backoff": "sometimes"}, "backoff"),
        ({"timeout": 0}, "timeout"),
        ({"queue": ""}, "queue"),
        ({"connection": 5}, "connection"),
        ({"unique": "yes"}, "unique"),
        ({"unique": {"until": "forever"}}, "until"),
        ({"middleware": "mw"}, "middleware"),
        ({"middleware": [1]}, r"middleware\[0\]"),
        ({"after_commit": "yes"}, "after_commit"),
        ({"failed": 3}, "failed"),
    ],
)
def test_invalid_options_raise_value_error_at_definition(
    options: dict[str, Any], match: str
) -> None:
    async def handler(payload: dict) -> None: ...

    name = "jobs_invalid_" + "_".join(options)
    with pytest.raises(ValueError, match=match) as info:
        define_job(name=name, **options)(handler)
    assert name in str(info.value)  # the error says which job


def test_define_job_rejects_options_with_the_bare_form() -> None:
    async def handler(payload: dict) -> None: ...

    with pytest.raises(TypeError):
        define_job(handler, tries=2)  # type: ignore[call-overload]


def test_unknown_job_name() -> None:
    with pytest.raises(UnknownJobError, match="no job named 'jobs_never_defined'") as info:
        get_job("jobs_never_defined")
    assert isinstance(info.value, LookupError)


def test_two_different_jobs_with_the_same_name_name_both_files_and_lines() -> None:
    with pytest.raises(DuplicateJobError) as info:

        @define_job(name="jobs_dup_name")
        async def jobs_dup_second(payload: dict) -> None:
            pass

    msg = str(info.value)
    assert '"jobs_dup_name"' in msg
    assert f"{__file__}:{DUP_LINE}" in msg
    assert f"{__file__}:{SECOND_DUP_LINE}" in msg
    assert get_job("jobs_dup_name") is jobs_dup_first  # the first one stays registered


def test_a_job_in_another_file_with_the_same_name(tmp_path: Path) -> None:
    other = tmp_path / "other_jobs.py"
    other.write_text(
        "from haze import define_job\n\n"
        "@define_job(name='jobs_dup_name')\n"
        "async def handler(payload):\n"
        "    pass\n"
    )
    spec = importlib.util.spec_from_file_location("jobs_dup_other_module", other)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(DuplicateJobError) as info:
        spec.loader.exec_module(module)
    assert f"{other}:3" in str(info.value)
    assert f"{__file__}:{DUP_LINE}" in str(info.value)


def _define_at_the_same_place() -> JobDefinition[Any]:
    @define_job(name="jobs_same_place")
    async def handler(payload: dict) -> None:
        pass

    return handler


def test_redefining_the_same_function_at_the_same_place_is_not_a_duplicate() -> None:
    first = _define_at_the_same_place()
    second = _define_at_the_same_place()  # e.g. a module imported twice, or reloaded
    assert first is not second
    assert get_job("jobs_same_place") is second


def test_reimporting_a_module_is_not_a_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "reimported_jobs.py"
    path.write_text(
        "from haze import define_job\n\n"
        "@define_job(name='jobs_reimported')\n"
        "async def handler(payload):\n"
        "    pass\n"
    )
    for i in range(2):
        spec = importlib.util.spec_from_file_location(f"jobs_reimported_{i}", path)
        assert spec is not None
        assert spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert get_job("jobs_reimported").origin == f"{path}:3"


def test_define_jobs_options_are_one_list() -> None:
    # define_job's overload takes **JobOptions; JobDefinition takes the same keywords.
    import inspect

    from haze._jobs.definition import JobDefinition
    from haze._jobs.options import JobOptions

    keywords = [
        name
        for name, p in inspect.signature(JobDefinition.__init__).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "origin"
    ]
    assert list(JobOptions.__annotations__) == keywords


def _yields(payload: object) -> Any:
    yield payload


async def _yields_async(payload: object) -> Any:
    yield payload


class _YieldingCall:
    def __call__(self, payload: object) -> Any:
        yield payload


@pytest.mark.parametrize(
    "handler",
    [_yields, _yields_async, _YieldingCall(), functools.partial(_yields_async)],
    ids=["generator", "async generator", "callable object", "partial"],
)
def test_a_generator_handler_is_refused_at_definition(handler: Any) -> None:
    """Calling a generator function runs none of its body: a job run that way would
    count as done with nothing done."""
    with pytest.raises(JobDefinitionError, match=r'^job "jobs_gen" \(.*\): the handler yields'):
        define_job(name="jobs_gen")(handler)


@pytest.mark.parametrize("name", ["report\x00", "two\nlines", "tab\there", "del\x7f", "c1\x85"])
def test_a_job_name_with_a_control_character_is_refused(name: str) -> None:
    # A NUL in a job name cost the job its failed record on PostgreSQL; a newline cuts
    # the worker's log lines. One line names the job and the character.
    with pytest.raises(JobOptionError, match="cannot hold control characters") as info:
        define_job(name=name)(lambda payload: None)
    assert "\n" not in str(info.value)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize(
    "name", ["names.emails.send", "names Report: Q1/Q2", "names té ✓", "n" * 200]
)
def test_a_job_name_of_printable_characters_is_kept(name: str) -> None:
    assert define_job(name=name)(lambda payload: None).name == name
