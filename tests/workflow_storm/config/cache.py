from haze import define_cache_config, env

config = define_cache_config(
    default=env("WST_STORE", "db"),
    stores={
        "db": {
            "driver": "database",
            "connection": "main",
            "table": env("WST_CACHE_TABLE", "wst_cache"),
        },
        "redis": {
            "driver": "redis",
            "connection": "default",
            "prefix": env("WST_PREFIX", "wst") + ":store:",
        },
    },
)
