"""Which sqs connection serves a record's queue (``haze_lambda.sqs._connection_for``).

Real: haze's App and SqsDriver (boto3 is loaded but no call is made: matching a queue
ARN to a connection is configuration only).
"""

from __future__ import annotations

import pytest
from haze import App, define_queue_config
from haze._base.errors import ConfigError
from haze_lambda.sqs import _connection_for

pytest.importorskip("boto3")

BASE = "https://sqs.eu-west-1.amazonaws.com/123456789012"
ARN = "arn:aws:sqs:eu-west-1:123456789012"


def _app(**urls: str) -> App:
    connections = {name: {"driver": "sqs", "queue_url": url} for name, url in urls.items()}
    return App(queue=define_queue_config(default=next(iter(urls)), connections=connections))


def test_a_fifo_queue_goes_to_the_fifo_connection_of_a_shared_naming_scheme() -> None:
    app = _app(std=f"{BASE}/myapp-{{queue}}", fifo=f"{BASE}/myapp-{{queue}}.fifo")
    driver, url = _connection_for(app, f"{ARN}:myapp-orders.fifo")
    assert (driver.name, driver.fifo, url) == ("fifo", True, f"{BASE}/myapp-orders.fifo")
    driver, url = _connection_for(app, f"{ARN}:myapp-orders")
    assert (driver.name, driver.fifo, url) == ("std", False, f"{BASE}/myapp-orders")


def test_a_queue_two_connections_fit_is_a_config_error() -> None:
    app = _app(a=f"{BASE}/myapp-{{queue}}", b=f"{BASE}/myapp-high-{{queue}}")
    with pytest.raises(ConfigError, match='connections "a", "b"') as e:
        _connection_for(app, f"{ARN}:myapp-high-mail")
    assert "HAZE_SQS_CONNECTION" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_queue_no_connection_serves_is_a_config_error_that_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = _app(std=f"{BASE}/myapp-{{queue}}", fifo=f"{BASE}/myapp-{{queue}}.fifo")
    monkeypatch.setenv("HAZE_SQS_CONNECTION", "std")  # a standard one for a FIFO queue
    with pytest.raises(ConfigError, match=r'connection "std" .*does not serve') as e:
        _connection_for(app, f"{ARN}:myapp-orders.fifo")
    assert "FIFO" in str(e.value)
    monkeypatch.delenv("HAZE_SQS_CONNECTION")
    with pytest.raises(ConfigError, match=r"no sqs connection of config/queue\.py serves"):
        _connection_for(app, f"{ARN}:other-orders")
