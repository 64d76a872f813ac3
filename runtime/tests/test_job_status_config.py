"""``track``/``keep_result`` on define_job and in config/queue.py: checked where declared."""

from __future__ import annotations

import pytest
from haze import App, ConfigError, JobStatus, Queue, define_job, define_queue_config
from haze._base.message import MessageDecodeError, decode

MEM = {"memory": {"driver": "memory"}}


def test_define_job_checks_track_and_keep_result() -> None:
    with pytest.raises(ValueError, match="track must be True or False"):
        define_job(name="jsc_bad_track", track="yes")(lambda: None)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="keep_result"):
        define_job(name="jsc_bad_keep", keep_result="soon")(lambda: None)
    with pytest.raises(ValueError, match="keep_result needs a status record"):
        define_job(name="jsc_contra", track=False, keep_result="1h")(lambda: None)
    job = define_job(name="jsc_ok", keep_result="2h")(lambda: None)
    assert job.keep_result == 7200.0 and job.track is None


def test_queue_config_track_and_keep_result() -> None:
    app = App(queue=define_queue_config(connections=MEM, track=True, keep_result="1h"))
    assert app.queue_config.track is True and app.queue_config.keep_result == 3600.0
    with pytest.raises(ConfigError, match="track"):
        App(queue=define_queue_config(connections=MEM, track="yes"))
    with pytest.raises(ConfigError, match="keep_result"):
        App(queue=define_queue_config(connections=MEM, keep_result="forever"))


def test_tracking_meta_follows_job_then_config() -> None:
    from haze._jobs.status import TRACK_TTL, tracking

    plain = App(queue=define_queue_config(connections=MEM))
    on = App(queue=define_queue_config(connections=MEM, track=True, keep_result="1h"))
    assert tracking(None, None, plain) is None
    assert tracking(True, None, plain) == {"track": TRACK_TTL}
    assert tracking(None, 60.0, plain) == {"track": 60.0, "keep": 60.0}
    assert tracking(None, None, on) == {"track": 3600.0, "keep": 3600.0}
    assert tracking(False, None, on) is None
    assert tracking(None, 60.0, on) == {"track": 60.0, "keep": 60.0}


def test_a_message_with_a_bad_track_field_is_refused() -> None:
    body = '{"id": "1", "job": "x", "payload": null, "queue": "default", "meta": {"track": "1d"}}'
    with pytest.raises(MessageDecodeError, match=r"meta\.track"):
        decode(body)


def test_job_status_from_a_record() -> None:
    rec = {
        "id": "a",
        "name": "n",
        "state": "done",
        "attempt": 2,
        "progress": 100,
        "result": {"r": 1},
        "error": None,
        "updated_at": 5.0,
    }
    st = JobStatus.from_record(rec)
    # a plain job's record: nothing sealed
    assert st is not None and st.final and st.to_dict() == {**rec, "encrypted": False}
    assert JobStatus.from_record({"state": "weird"}) is None
    assert JobStatus.from_record(None) is None


async def test_status_wait_cancel_refuse_a_bad_id() -> None:
    async with App(queue=define_queue_config(connections=MEM)):
        for call in (Queue.status, Queue.cancel):
            with pytest.raises(ValueError, match="expected a job id"):
                await call("")
