"""The OpenTelemetry test's worker app: one redis connection on the test's key prefix."""

from haze import define_queue_config, env

config = define_queue_config(
    default="r",
    connections={
        "r": {
            "driver": "redis",
            "url": env("OTX_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": env("OTX_PREFIX", "otx"),
            "queues": ["default"],
        }
    },
)
