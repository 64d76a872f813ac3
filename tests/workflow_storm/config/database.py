from haze import define_database_config, env

config = define_database_config(
    default="main",
    connections={"main": {"url": env("WST_DB_URL", "sqlite:///storage/wst.db")}},
)
