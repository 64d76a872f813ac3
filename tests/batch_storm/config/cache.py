from haze import define_cache_config, env

config = define_cache_config(
    default=env("BST_STORE", "db"),
    stores={
        "db": {
            "driver": "database",
            "connection": "main",
            "table": env("BST_CACHE_TABLE", "bst_cache"),
        },
        "redis": {
            "driver": "redis",
            "connection": "default",
            "prefix": env("BST_PREFIX", "bst") + ":store:",
        },
    },
)
