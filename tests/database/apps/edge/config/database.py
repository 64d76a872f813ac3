"""The libSQL edge tests' worker app: one sqld (or a proxy in front of it), its token
and request timeout from the environment."""

from haze import define_database_config, env

config = define_database_config(
    default="main",
    connections={
        "main": {
            "url": env("EDGE_DB_URL", "http://127.0.0.1:1"),
            "auth_token": env("EDGE_TOKEN", None),
            "options": {"timeout": env("EDGE_TIMEOUT", "30s")},
        }
    },
)
