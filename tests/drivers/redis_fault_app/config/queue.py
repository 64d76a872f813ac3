"""The Redis fault tests' worker app: one ``redis`` connection on the test's private
redis-server, tuned by environment variables (see ``tests/drivers/redis_fault_harness.py``)."""

from haze import define_queue_config, env

config = define_queue_config(
    default="r",
    connections={
        "r": {
            "driver": "redis",
            "url": env("RFX_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": env("RFX_PREFIX", "rfx"),
            "queues": ["default"],
            "retry_after": env("RFX_RETRY_AFTER", "30s"),
        }
    },
)
