from haze import define_redis_config, env

config = define_redis_config(
    default="default",
    connections={"default": {"url": env("WST_REDIS_URL", "redis://127.0.0.1:6379/0")}},
)
