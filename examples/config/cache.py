from haze import define_cache_config

config = define_cache_config(
    default="database",
    stores={
        "database": {"driver": "database", "connection": "main"},
        "memory": {"driver": "memory"},
    },
)
