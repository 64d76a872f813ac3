"""The ``"workflows"`` connection option: which engine runs a connection's workflows.

``"store"`` (haze's own engine, the default) on every driver; ``"native"`` only on
the drivers whose platform has a durable engine of its own (cloudflare, sqs).
"""

from __future__ import annotations

from typing import Any

import pytest
from haze import App, define_cache_config, define_queue_config
from haze._base.errors import ConfigError

_SQS = {"driver": "sqs", "queue_url": "http://127.0.0.1:1/123/jobs"}
_CF = {"driver": "cloudflare", "binding": "JOBS"}


def _conn(options: dict[str, Any]) -> dict[str, Any]:
    app = App(queue=define_queue_config(default="c", connections={"c": options}))
    return dict(app.queue_config.connections["c"])


@pytest.mark.parametrize("base", [_SQS, _CF], ids=["sqs", "cloudflare"])
def test_store_is_the_default_and_native_is_kept_on_platform_drivers(base: dict[str, Any]) -> None:
    assert _conn(dict(base))["workflows"] == "store"
    assert _conn({**base, "workflows": "store"})["workflows"] == "store"
    assert _conn({**base, "workflows": "native"})["workflows"] == "native"


@pytest.mark.parametrize(
    "options",
    [
        {"driver": "redis", "workflows": "native"},
        {"driver": "memory", "workflows": "native"},
        {"driver": "database", "workflows": "native"},
    ],
    ids=["redis", "memory", "database"],
)
def test_native_elsewhere_is_one_line_naming_the_connection(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as e:
        _conn(options)
    message = str(e.value)
    assert "connections.c.workflows" in message
    assert repr(options["driver"]) in message and '"store"' in message
    assert "\n" not in message


def test_store_is_accepted_on_every_driver() -> None:
    assert "workflows" not in _conn({"driver": "memory", "workflows": "store"})


@pytest.mark.parametrize("value", ["durable", 1, True])
def test_an_unknown_engine_is_one_line(value: object) -> None:
    with pytest.raises(
        ConfigError, match=r'connections\.c\.workflows: expected "store" or "native"'
    ):
        _conn({**_SQS, "workflows": value})


async def test_starting_a_native_cloudflare_workflow_without_credentials_is_one_line() -> None:
    from haze import Workflow, workflow

    @workflow(name="cfg_cf_native")
    async def flow(run: Any) -> None:
        pass

    app = App(
        queue=define_queue_config(
            default="edge",
            store="mem",
            connections={"edge": {**_CF, "workflows": "native"}},
        ),
        cache=define_cache_config(default="mem", stores={"mem": {"driver": "memory"}}),
    )
    async with app:
        with pytest.raises(ConfigError) as e:
            await Workflow.start(flow)
    message = str(e.value)
    # outside a Worker (no Workflow binding bound) the runs are reached through the REST
    # API, which needs the connection's credentials
    assert "needs account_id and api_token" in message and "\n" not in message
