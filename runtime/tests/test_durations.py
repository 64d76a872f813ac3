"""Durations and backoff: every form the seed allows, and the errors for the rest."""

from __future__ import annotations

import pytest
from haze import DelayTooLongError, JobOptionError, define_job
from haze._base.durations import backoff_delay, parse_backoff, parse_delay, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (30, 30.0),
        (1.5, 1.5),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("7d", 7 * 86400.0),
        ("50ms", 0.05),
        ("2.5s", 2.5),
        (" 10s ", 10.0),
    ],
)
def test_parse_duration_accepts_seconds_and_unit_strings(value: object, seconds: float) -> None:
    assert parse_duration(value, "delay") == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value", ["soon", "5 minutes", "10x", "-5s", -1, float("nan"), True, None, [1]]
)
def test_parse_duration_rejects_other_values_naming_option_and_value(value: object) -> None:
    with pytest.raises(ValueError, match=r"^timeout: ") as info:
        parse_duration(value, "timeout")
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_parse_duration_allow_zero_false() -> None:
    with pytest.raises(ValueError, match="greater than 0"):
        parse_duration(0, "timeout", allow_zero=False)


def test_backoff_number_is_constant() -> None:
    b = parse_backoff(10)
    assert [backoff_delay(b, n) for n in (1, 2, 3, 7)] == [10.0, 10.0, 10.0, 10.0]
    assert backoff_delay(parse_backoff(0), 1) == 0.0


def test_backoff_duration_string() -> None:
    b = parse_backoff("5m")
    assert b == 300.0
    assert [backoff_delay(b, n) for n in (1, 2, 3)] == [300.0, 300.0, 300.0]
    assert backoff_delay(parse_backoff("50ms"), 1) == pytest.approx(0.05)


def test_backoff_list_is_indexed_by_retry_and_the_last_entry_repeats() -> None:
    b = parse_backoff([10, "1m"])
    assert b == (10.0, 60.0)
    # retry 1 (before attempt 2) = 10 s, retry 2 (before attempt 3) = 60 s, then 60 s again
    assert [backoff_delay(b, n) for n in (1, 2, 3, 4)] == [10.0, 60.0, 60.0, 60.0]


def test_backoff_exponential_is_two_to_the_n() -> None:
    b = parse_backoff("exponential")
    assert [backoff_delay(b, n) for n in (1, 2, 3, 4, 5)] == [2.0, 4.0, 8.0, 16.0, 32.0]


@pytest.mark.parametrize("value", ["fast", [], ["1s", "later"], -3, {"a": 1}])
def test_bad_backoff_raises_value_error(value: object) -> None:
    with pytest.raises(ValueError, match="backoff"):
        parse_backoff(value)


def test_bad_durations_fail_at_definition_time_naming_option_and_value() -> None:
    async def handler(payload: dict) -> None: ...

    with pytest.raises(ValueError, match=r"timeout.*'thirty'"):
        define_job(name="durations_bad_timeout", timeout="thirty")(handler)
    with pytest.raises(ValueError, match=r"backoff\[1\].*'later'"):
        define_job(name="durations_bad_backoff", backoff=[1, "later"])(handler)
    with pytest.raises(ValueError, match=r"tries"):
        define_job(name="durations_bad_tries", tries=0)(handler)


def test_job_definition_keeps_parsed_options() -> None:
    async def handler(payload: dict) -> None: ...

    job = define_job(name="durations_parsed", tries=3, backoff=[10, 60], timeout="30s")(handler)
    assert job.tries == 3
    assert job.backoff == (10.0, 60.0)
    assert job.timeout == 30.0
    assert job.queue is None  # "default" is applied at dispatch
    plain = define_job(name="durations_defaults")(handler)
    assert (plain.tries, plain.backoff, plain.timeout) == (1, 0.0, None)


def test_pending_delay_parses_durations() -> None:
    async def handler(payload: dict) -> None: ...

    job = define_job(name="durations_pending")(handler)
    assert job.with_({}).delay("1m")._delay == 60.0
    with pytest.raises(ValueError, match="delay"):
        job.with_({}).delay("whenever")


#: Finite numbers of seconds past a float's range: a float reads each as infinity.
PAST_A_FLOAT = [
    pytest.param(10**400, id="10**400"),
    pytest.param(10**5000, id="10**5000"),  # past the ints Python writes as text, too
    pytest.param("9" * 400 + "s", id="400 digits s"),
    pytest.param("9" * 400, id="400 digits"),
    "1e400",
    " 1e999 ",
]


@pytest.mark.parametrize("value", PAST_A_FLOAT)
def test_a_delay_too_long_for_a_float_is_too_long_not_infinite(value: object) -> None:
    with pytest.raises(DelayTooLongError, match=r"^delay: .* is longer than the longest delay"):
        parse_delay(value)
    with pytest.raises(DelayTooLongError, match=r"backoff\[1\]: .* is longer than the longest"):
        parse_backoff([1, value])
    with pytest.raises(DelayTooLongError, match=r"^delay: "):
        define_job(name="durations_huge_delay")(_handler).with_({}).delay(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", PAST_A_FLOAT)
def test_a_duration_too_long_for_a_float_says_so_in_one_short_line(value: object) -> None:
    with pytest.raises(ValueError, match=r"^timeout: .* is too long to be a duration") as info:
        parse_duration(value, "timeout")
    assert len(str(info.value)) < 200 and "finite" not in str(info.value)
    for option in ({"timeout": value}, {"unique": {"for": value}}, {"keep_result": value}):
        with pytest.raises(JobOptionError, match="is too long to be a duration"):
            define_job(name="durations_huge", **option)(_handler)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "value",
    [pytest.param(-(10**5000), id="-10**5000"), "-1e400", "inf", float("inf"), float("nan")],
)
def test_negative_and_infinite_durations_are_still_not_finite_numbers(value: object) -> None:
    with pytest.raises(ValueError, match=r"^delay: duration must be a finite number >= 0") as e:
        parse_delay(value)
    assert not isinstance(e.value, DelayTooLongError) and len(str(e.value)) < 200


def test_the_largest_float_delay_is_too_long() -> None:
    with pytest.raises(DelayTooLongError, match=r"^delay: 1e\+308s is longer"):
        parse_delay(1e308)


async def _handler(payload: object) -> None: ...
