"""Queue names in config/queue.py follow the dispatch rule: 1 to 255 characters."""

from __future__ import annotations

import pytest
from haze import App, define_queue_config
from haze._base.errors import ConfigError


def _app(queues: list[object]) -> App:
    return App(
        queue=define_queue_config(
            default="m", connections={"m": {"driver": "memory", "queues": queues}}
        )
    )


def test_a_configured_queue_name_may_have_255_characters() -> None:
    app = _app(["q" * 255, "high"])
    assert app.queue_config.connections["m"]["queues"] == ["q" * 255, "high"]


@pytest.mark.parametrize(
    ("queue", "says"),
    [
        ("q" * 256, "1 to 255 characters, got a name of 256 characters"),
        ("", "got a name of 0 characters"),
        (5, "got 5"),
        ("emails,eu", "cannot contain a comma"),
        (" emails", "cannot start or end with whitespace"),
        ("a\x00b", "NUL character"),
    ],
)
def test_a_bad_configured_queue_name_is_a_config_error_naming_the_key(
    queue: object, says: str
) -> None:
    with pytest.raises(ConfigError, match=r"connections\.m\.queues\[0\]") as e:
        _app([queue])
    assert says in str(e.value)
