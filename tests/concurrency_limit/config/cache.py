from haze import define_cache_config, env

config = define_cache_config(
    default=env("CLS_STORE", "db"),
    stores={
        "db": {
            "driver": "database",
            "connection": "main",
            "table": env("CLS_CACHE_TABLE", "cls_cache"),
        },
        "redis": {
            "driver": "redis",
            "connection": "default",
            "prefix": env("CLS_PREFIX", "cls") + ":store:",
        },
    },
)
