"""Per-queue concurrency limits in config/queue.py: the dict form of a connection's
``queues`` (``{"emails": {"concurrency": 5}}``), validated at app start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from haze import App, define_queue_config
from haze._base.errors import ConfigError


def _app(queues: object, driver: str = "memory") -> App:
    return App(
        queue=define_queue_config(
            default="m", connections={"m": {"driver": driver, "queues": queues}}
        )
    )


def test_the_dict_form_gives_the_queue_names_in_order_and_their_limits() -> None:
    app = _app({"emails": {"concurrency": 5}, "default": {}, "low": None})
    assert app.queue_config.connections["m"]["queues"] == ["emails", "default", "low"]
    assert app.queue_config.queue_limits == {
        "m": {"emails": {"max": 5, "release_after": 1.0, "expire_after": 60.0}}
    }


def test_release_after_and_expire_after_may_be_set() -> None:
    app = _app({"q": {"concurrency": 2, "release_after": "250ms", "expire_after": "2m"}})
    assert app.queue_config.queue_limits["m"]["q"] == {
        "max": 2,
        "release_after": 0.25,
        "expire_after": 120.0,
    }


def test_the_list_form_has_no_limits() -> None:
    app = _app(["a", "b"])
    assert app.queue_config.queue_limits == {}


@pytest.mark.parametrize(
    ("queues", "key", "says"),
    [
        ({"emails": {"concurrency": 0}}, r"connections\.m\.queues\.emails\.concurrency", ">= 1"),
        ({"emails": {"concurrency": "5"}}, r"queues\.emails\.concurrency", "expected an integer"),
        ({"emails": {"concurency": 5}}, r"queues\.emails\.concurency", "unknown option"),
        ({"emails": 5}, r"connections\.m\.queues\.emails", "expected a dict"),
        ({"emails": {"expire_after": "1m"}}, r"queues\.emails\.concurrency", "is required"),
        (
            {"emails": {"concurrency": 1, "expire_after": 0}},
            r"queues\.emails\.expire_after",
            "",
        ),
        ({"emails": {"concurrency": 1, "release_after": "x"}}, r"release_after", ""),
        # renewed every third of it, a sub-second lease lapses under a store's latency
        # and the slot goes to another job while this one still runs
        (
            {"emails": {"concurrency": 1, "expire_after": "500ms"}},
            r"queues\.emails\.expire_after",
            "at least 1s",
        ),
        # the names dispatch refuses ("bad name!" is one a job may go to)
        ({"bad,name": {"concurrency": 1}}, r"connections\.m\.queues", "cannot contain a comma"),
        ({}, r"connections\.m\.queues", "non-empty list of queue names, or a dict"),
    ],
)
def test_a_bad_limit_is_a_config_error_naming_file_and_key(
    queues: object, key: str, says: str, tmp_path: Path
) -> None:
    source = tmp_path / "config" / "queue.py"
    source.parent.mkdir()
    source.write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(default='m', connections={'m': {'driver': 'memory', "
        f"'queues': {queues!r}}}}})\n"
    )
    with pytest.raises(ConfigError, match=key) as e:
        App(root=tmp_path)
    assert says in str(e.value)
    assert "queue.py" in str(e.value), "the error names the file"


async def test_the_per_queue_limit_runs_before_global_middleware() -> None:
    """The worker's implicit limit is the outermost middleware: a global middleware
    already runs inside the queue's slot."""
    from haze import JobContext, Queue, define_job

    seen: list[list[str]] = []

    async def global_mw(payload: Any, job: JobContext, call_next: Any) -> Any:
        store = job.app.queue_store
        seen.append([k for k in store._data if ":conc:queue:" in k])
        return await call_next()

    @define_job(name="qlc_job")
    async def qlc_job() -> None:
        return None

    app = App(
        queue=define_queue_config(
            default="m",
            connections={"m": {"driver": "memory", "queues": {"q": {"concurrency": 1}}}},
            middleware=[global_mw],
        )
    )
    async with app:
        await qlc_job.with_().on_queue("q").dispatch()
        await qlc_job.with_().on_queue("other").dispatch()
        await Queue.idle()
    assert seen == [["haze:mw:conc:queue:m:q:slot:0"], []]
