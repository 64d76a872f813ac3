"""What every fuzz target shares: its hypothesis settings and JSON-shaped inputs.

CI runs each target with a fixed seed (``derandomize=True``) and a bounded number of
examples, about 60 s for all of them. ``HAZE_FUZZ_SCALE=N`` is the longer run: N times
the examples, each run with new random inputs (hypothesis prints the seed of a failure;
keep it as an ``@example`` of the target).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SCALE = int(os.environ.get("HAZE_FUZZ_SCALE") or 0)


def fuzz(examples: int) -> settings:
    """The settings of a target that tries ``examples`` inputs in CI."""
    return settings(
        max_examples=examples * max(SCALE, 1),
        derandomize=SCALE == 0,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


#: Integers past a float's range too: JSON has no limit on a number's digits.
integers = st.integers() | st.sampled_from([2**63, -(2**63) - 1, 10**308 * 10, -(10**400)])
scalars = (
    st.none()
    | st.booleans()
    | integers
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def one_line(text: str) -> bool:
    """An error a person reads: one line, not empty."""
    return bool(text.strip()) and "\n" not in text


def outcome(
    errors: type[BaseException] | tuple[type[BaseException], ...], fn: Any, *args: Any
) -> tuple[Any, str | None]:
    """``(fn(*args), None)``, or ``(None, message)`` when it raised one of ``errors``:
    any other exception fails the target."""
    try:
        return fn(*args), None
    except errors as e:
        return None, str(e)
