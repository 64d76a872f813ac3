# Runs INSIDE real Pyodide under tests/cloudflare/miniflare-harness.mjs, not under pytest.
#
# D1's size limit through Miniflare's real D1 binding (workerd's SQLite, which refuses a
# string, BLOB or row past its limit with SQLITE_TOOBIG): the database driver's
# default max_message_size on a d1:// connection, a dispatch at that size (stored, then
# failed into failed_jobs with its exception), and one past it (PayloadTooLargeError
# naming the job, the size and the cap, nothing stored). The probe writes rows straight
# through the driver: one at the cap, and one of 3,000,000 bytes that D1 refuses itself.
# The last expression (a dict) is printed as JSON by the harness.
# ruff: noqa: F704
import time
import traceback

import js
from haze import App, PayloadTooLargeError, define_database_config, define_job, define_queue_config
from haze._base.message import Message, encode
from haze.connectors.migrations import ensure_queue_tables
from haze.contracts.driver import FailedJob
from haze_cloudflare import bind_env
from haze_cloudflare._js import to_py

H = js.cfHarness
bind_env(H.env)

app = App(
    queue=define_queue_config(
        default="database",
        connections={"database": {"driver": "database", "connection": "main"}},
    ),
    database=define_database_config(
        default="main",
        connections={"main": {"url": "d1://local/haze-d1", "options": {"binding": "DB"}}},
    ),
)


@define_job(name="cf_limits_big")
async def cf_limits_big(payload: dict) -> None:
    pass


async def count(queue):
    rows = to_py(await H.read(f"SELECT COUNT(*) AS n FROM jobs WHERE queue = '{queue}'"))
    return rows[0]["n"]


def sized(queue, size):
    """A body of exactly ``size`` bytes (ASCII) on ``queue``."""
    msg = Message(id=f"lim-{queue}", job="cf_limits_big", payload={"b": ""}, queue=queue)
    pad = size - len(encode(msg))
    msg.payload = {"b": "x" * pad}
    body = encode(msg)
    assert len(body) == size, (len(body), size)
    return body, msg


# The envelope's length moves with the dispatch time's digits: a unix time of this
# century prints as 10 digits, a point and 1 to 7 more (the shortest repr of a double).
TS_DIGITS_MIN, TS_DIGITS_MAX = 12, 18


def envelope(queue, ts_digits):
    """The length of a dispatched cf_limits_big message on ``queue`` with an empty "b",
    its time printed in ``ts_digits`` characters: a payload of ``size - envelope(q,
    TS_DIGITS_MAX)`` bytes stays within ``size`` and one of ``size - envelope(q,
    TS_DIGITS_MIN)`` bytes reaches it, whatever the clock reads at dispatch."""
    msg = app.manager.dispatcher.build(cf_limits_big.with_({"b": ""}), "database", queue)
    msg.ts = float(int(msg.ts))  # e.g. 1765065600.0: the shortest, 12 characters
    return len(encode(msg)) + ts_digits - TS_DIGITS_MIN


async def probe(driver, queue, size):
    """Whether D1 stores a job row whose body is ``size`` bytes."""
    body, msg = sized(queue, size)
    try:
        await driver.enqueue(body, msg, 0)
        return "stored"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:160]}"


async def scenario():
    await ensure_queue_tables(app, "database")
    driver = app.driver("database")
    cap = driver.max_message_size
    out = {"cap": cap}
    out["probe"] = {
        str(n): await probe(driver, f"probe{i}", n) for i, n in enumerate((cap, 3_000_000))
    }
    # a dispatch at the cap (within the few bytes a timestamp's digits vary by) is
    # stored, runs, and can fail into failed_jobs
    at_cap = "x" * (cap - envelope("atcap", TS_DIGITS_MAX))
    await cf_limits_big.dispatch({"b": at_cap}, queue="atcap")
    out["at_cap_rows"] = await count("atcap")
    job = await driver.reserve(["atcap"], 0)
    out["at_cap_len"] = len(job.body)
    failed = FailedJob(
        id=job.message.id,
        name=job.message.job,
        connection="database",
        queue="atcap",
        payload=job.message.payload,
        exception="Traceback (most recent call last):\n" + "  a frame\n" * 2000,
        failed_at=time.time(),
        body=job.body,
    )
    out["at_cap_failed"] = await driver.fail(job, failed)
    # a few bytes more, or a size D1 itself refuses, are refused at dispatch, naming the
    # job, the size and the cap
    for key, size in (("over", cap + 1), ("far_over", 3_000_000)):
        try:
            big = "x" * (size - envelope(key, TS_DIGITS_MIN))
            await cf_limits_big.dispatch({"b": big}, queue=key)
            out[key] = "dispatched"
        except PayloadTooLargeError as e:
            out[key] = str(e)
        except Exception as e:
            out[key] = f"{type(e).__name__}: {str(e)[:300]}"
        out[f"{key}_rows"] = await count(key)
    return out


result = {}
try:
    await app.__aenter__()
    result = await scenario()
except BaseException:
    result["error"] = traceback.format_exc()
result  # noqa: B018 - the harness prints the last expression
