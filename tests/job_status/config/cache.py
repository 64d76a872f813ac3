from haze import define_cache_config, env

config = define_cache_config(
    default=env("JSTAT_STORE", "db"),
    stores={
        "db": {"driver": "database", "connection": "main"},
        "redis": {
            "driver": "redis",
            "connection": "default",
            "prefix": env("JSTAT_PREFIX", "jstat") + ":store:",
        },
    },
)
