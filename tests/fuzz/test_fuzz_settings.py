"""Fuzz the size and duration parsers behind the ``HAZE_*`` variables and every
duration option (``parse_size``, ``parse_duration``, ``parse_backoff``, ``env_size``,
``env_duration``): a value is read, or refused with one line naming the option and the
value (``ValueError`` from the parsers, ``ConfigError`` from the environment readers).
"""

from __future__ import annotations

import math
from typing import Any

from fuzzing import fuzz, integers, json_values, one_line, outcome
from haze._app.config import env_source
from haze._app.env import env_duration, env_size, parse_size
from haze._base.durations import parse_backoff, parse_duration
from haze._base.errors import ConfigError, DelayTooLongError
from hypothesis import example, given
from hypothesis import strategies as st

UNITS = ["", "b", "KB", "kib", "MiB", "gb", "GiB", "ms", "s", "m", "h", "d", "w", "x", "e5"]


@st.composite
def settings_text(draw: st.DrawFn) -> str:
    """A number and a unit, spaced and signed every which way, or any text."""
    if draw(st.booleans()):
        return draw(st.text(max_size=20))
    number = draw(
        st.sampled_from(["0", "1", "1.5", ".5", "5.", "1e3", "-1", "9" * 400, "0.0000001", "٣"])
        | st.integers(0, 10**30).map(str)
        | st.floats(allow_nan=True, allow_infinity=True).map(repr)
    )
    space = draw(st.sampled_from(["", " ", "\t", "\n", "\u00a0"]))
    return space + number + draw(st.sampled_from(["", " "])) + draw(st.sampled_from(UNITS)) + space


@fuzz(500)
@given(settings_text())
def test_a_size_or_a_duration_in_text_is_read_or_refused_in_one_line(text: str) -> None:
    size, error = outcome(ValueError, parse_size, text, "HAZE_HTTP_MAX_BODY")
    assert size >= 1 if error is None else one_line(error) and "HAZE_HTTP_MAX_BODY" in error
    seconds, error = outcome(ValueError, parse_duration, text, "retry_after")
    assert 0 <= seconds < math.inf if error is None else one_line(error) and "retry_after" in error
    with env_source(lambda name: text):
        for read in (env_size, env_duration):
            _, error = outcome(ConfigError, read, "HAZE_HTTP_MAX_BODY", 1)
            assert error is None or (one_line(error) and "HAZE_HTTP_MAX_BODY" in error), error


@fuzz(300)
@given(json_values | integers)
@example(10**400)
@example([1, 10**400])
def test_a_duration_option_of_any_value_is_read_or_refused_in_one_line(value: Any) -> None:
    """Config files are Python: a duration option can be any value, a huge int too."""
    seconds, error = outcome(ValueError, parse_duration, value, "retry_after")
    assert 0 <= seconds < math.inf if error is None else one_line(error) and "retry_after" in error
    _, error = outcome((ValueError, DelayTooLongError), parse_backoff, value, "backoff")
    assert error is None or (one_line(error) and "backoff" in error), error
