"""Coverage-guided fuzzing of the same parsers with atheris (libFuzzer), for longer runs
than CI's hypothesis targets. atheris is not a dependency of the project: it ships wheels
for some Pythons and platforms only. Run it from an environment that has it, e.g.::

    uv venv /tmp/atheris && uv pip install --python /tmp/atheris/bin/python atheris
    PYTHONPATH=runtime/src:.venv/lib/python3.11/site-packages /tmp/atheris/bin/python \\
        tests/fuzz/atheris_run.py envelope -max_total_time=60 -seed=1

Targets: ``envelope`` (``decode`` of any bytes), ``settings`` (the size and duration
parsers), ``bullmq`` (the redis driver's failed-hash reader), ``auth`` (the HTTP
endpoint's authentication of headers and body). Each input must end as the parser's own
error; anything else is a crash that libFuzzer reports with the input that caused it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import atheris
from fuzzing import one_line, outcome

with atheris.instrument_imports():
    from haze._app.env import parse_size
    from haze._base.durations import parse_duration
    from haze._base.errors import MessageDecodeError
    from haze._base.message import FailedJob, decode
    from haze.drivers.redis import RedisDriver
    from haze.integrations.http_dispatch import authorize


def envelope(data: bytes) -> None:
    _, error = outcome(MessageDecodeError, decode, data)
    assert error is None or one_line(error), error
    FailedJob.from_body(
        data.decode("utf-8", "replace"), id=None, connection="c", queue="q", exception="E",
        failed_at=0,
    )  # fmt: skip


def settings(data: bytes) -> None:
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(64)
    for parse in (parse_size, parse_duration):
        _, error = outcome(ValueError, parse, text, "HAZE_X")
        assert error is None or (one_line(error) and "HAZE_X" in error), error


_driver = RedisDriver("fuzz", {"url": "redis://127.0.0.1:1/0"}, None)


def bullmq(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    row = [fdp.ConsumeUnicodeNoSurrogates(40) if fdp.ConsumeBool() else None for _ in range(5)]
    assert _driver.failed._record("q", "7", row).id


def auth(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    names = ("authorization", "x-haze-signature", "x-haze-timestamp")
    headers = {n: fdp.ConsumeUnicodeNoSurrogates(40) for n in names if fdp.ConsumeBool()}
    answer = authorize(headers, fdp.ConsumeBytes(64), "secret")
    assert answer is None or 400 <= answer.status < 500


TARGETS: dict[str, Callable[[bytes], None]] = {
    "envelope": envelope,
    "settings": settings,
    "bullmq": bullmq,
    "auth": auth,
}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
